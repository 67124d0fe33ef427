"""Each completion's mean negative log-likelihood under the large model (nats per token).

The large model (transformers, in this process, bfloat16 by default) reads the prompt
exactly as the daemon rendered it (the tokenizer's chat template with the assistant turn
continued) followed by the completion's tokens, in one forward; the mean is over the
completion's tokens. The completion is re-tokenized from its text (the tokens the
daemon sampled are not returned), so it scores the text the user gets. A completion
already scored (the same problem and text in another system) is not scored again.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hevalkit.problems import Problem


class Scorer:
    def __init__(self, folder: Path, dtype: torch.dtype = torch.bfloat16, threads: int = 1) -> None:
        torch.set_num_threads(threads)  # one: the CPU is shared with the daemon's engines
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        self.model.eval()
        self.cache: dict[tuple[str, str, str], float] = {}

    def prompt_ids(self, problem: Problem, style: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            problem.messages(style),
            tokenize=False,
            continue_final_message=True,
            add_generation_prompt=False,
        )
        return list(self.tokenizer(str(text), add_special_tokens=False)["input_ids"])

    @torch.inference_mode()
    def nll(self, problem: Problem, completion: str, style: str = "body") -> float:
        """Mean NLL of `completion` after the problem's prompt; NaN for an empty one."""
        key = (problem.task_id, completion, style)
        if key in self.cache:
            return self.cache[key]
        target = self.tokenizer(completion, add_special_tokens=False)["input_ids"]
        if not target:
            return math.nan
        prompt = self.prompt_ids(problem, style)
        ids = torch.tensor([prompt + target])
        hidden = self.model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1 : -1]
        logits = self.model.lm_head(hidden).float()  # only the completion's positions
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(1, torch.tensor(target).unsqueeze(1)).squeeze(1)
        value = float(-picked.mean())
        self.cache[key] = value
        return value
