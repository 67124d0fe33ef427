"""Incremental detokenization and stop strings over the fixture byte-level BPE tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from trd.frontend.stream import TextStream

TEXT = "héllo wörld 🙂 日本語 — naïve café"


@pytest.fixture(scope="module")
def tok(tiny_models: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_models["small"] / "tokenizer.json"))


class Fed:
    """A stream over its own id list, fed like a request's output grows."""

    def __init__(
        self, tok: Tokenizer, stops: list[str] | None = None, keep_stop: bool = False
    ) -> None:
        self.ids: list[int] = []
        self.stream = TextStream(tok, self.ids, stops or [], keep_stop)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        return self.stream.update()

    def finish(self) -> str:
        return self.stream.finish()

    @property
    def stopped(self) -> bool:
        return self.stream.stopped


def feed(stream: Fed, ids: list[int]) -> list[str]:
    return [stream.push([i]) for i in ids] + [stream.finish()]


def test_multibyte_characters_split_across_tokens_never_leak_replacement_chars(
    tok: Tokenizer,
) -> None:
    ids = tok.encode(TEXT).ids
    # The fixture splits these characters into byte tokens that decode to U+FFFD alone.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    deltas = feed(Fed(tok), ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT


def test_chunks_of_several_tokens_give_the_same_text(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT).ids
    stream = Fed(tok)
    out = [stream.push(ids[i : i + 3]) for i in range(0, len(ids), 3)]
    assert "".join([*out, stream.finish()]) == TEXT


def test_special_tokens_are_not_shown(tok: Tokenizer) -> None:
    ids = [*tok.encode("abc").ids, 0, *tok.encode(" def").ids]  # 0 = <|endoftext|>
    assert "".join(feed(Fed(tok), ids)) == "abc def"


def test_stop_string_across_token_boundaries_is_cut_and_never_leaked(tok: Tokenizer) -> None:
    text = "alpha beta\nSTOPHERE gamma delta"
    ids = tok.encode(text).ids
    stream = Fed(tok, ["HERE g"])
    sent = ""
    for i in ids:
        sent += stream.push([i])
        # Never a character past the cut, not even one that might begin the stop string.
        assert "alpha beta\nSTOP".startswith(sent)
        if stream.stopped:
            break
    assert stream.stopped
    assert sent + stream.finish() == "alpha beta\nSTOP"
    assert stream.push(tok.encode(" more").ids) == ""


def test_earliest_stop_string_wins(tok: Tokenizer) -> None:
    stream = Fed(tok, ["gamma", "beta"])
    out = "".join(feed(stream, tok.encode("alpha beta gamma").ids))
    assert out == "alpha " and stream.stopped


@pytest.mark.parametrize(
    ("stops", "text", "kept"),
    [(["HERE g"], "alpha beta\nSTOPHERE gamma delta", "alpha beta\nSTOPHERE g"),
     (["gamma", "beta"], "alpha beta gamma", "alpha beta"),
     (["wö"], TEXT, "héllo wö"), (["🙂 日"], TEXT, "héllo wörld 🙂 日")],
)  # fmt: skip
def test_include_stop_str_in_output_keeps_the_stop_string_and_nothing_after(
    tok: Tokenizer, stops: list[str], text: str, kept: str
) -> None:
    stream = Fed(tok, stops, keep_stop=True)
    out = "".join(feed(stream, tok.encode(text).ids))
    assert (out, stream.stopped) == (kept, True)


def test_held_back_prefix_is_released_when_no_stop_follows(tok: Tokenizer) -> None:
    stream = Fed(tok, ["xyz!"])
    ids = tok.encode("abc xy").ids
    released = "".join(stream.push([i]) for i in ids)
    assert released == "abc "  # "xy" could still become "xyz!"
    assert stream.finish() == "xy"
    assert not stream.stopped


@pytest.mark.parametrize("keep_stop", [False, True])
def test_tokens_arriving_together_end_at_the_one_that_completes_a_stop(
    tok: Tokenizer, keep_stop: bool
) -> None:
    """A speculating engine commits several tokens at once: the tokens served (`read`,
    what usage, token ids and producers count) end where one token at a time would."""
    ids = tok.encode(TEXT).ids
    for stop in ("wörld", "ö", "日本", "naïve"):
        alone = Fed(tok, [stop], keep_stop)
        text_alone = "".join(feed(alone, ids))
        for size in (2, 3, 5, len(ids)):
            chunked = Fed(tok, [stop], keep_stop)
            out = [chunked.push(ids[i : i + size]) for i in range(0, len(ids), size)]
            assert "".join([*out, chunked.finish()]) == text_alone, (stop, size)
            assert chunked.stream.read == alone.stream.read < len(ids), (stop, size)
