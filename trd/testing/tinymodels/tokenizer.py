"""The fixture tokenizer: byte-level BPE, vocab 2048, ChatML chat template.

Every fixture model shares it, as the models of one routing deployment share
theirs. Byte-level means any Unicode text round-trips exactly.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trd.testing.tinymodels.corpus import corpus

VOCAB_SIZE = 2048
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Order fixes the ids: EOS is 0, which doubles as the padding id.
SPECIAL_TOKENS = (EOS, IM_START, IM_END)
EOS_ID = 0

# Qwen's ChatML layout without tool calls.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer() -> Tokenizer:
    """BPE on the train split; same corpus and order give the same merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus("train"), trainer=trainer)
    return tok


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers view, which writes tokenizer_config.json with the template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json into out_dir."""
    wrap(tok).save_pretrained(out_dir)
