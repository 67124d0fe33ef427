"""Output identity: every request of every system against one reference.

The reference is the official-style loop (`trd/testing/reference.py`, kv_cache=True), run
on every prompt any system serves, at the longest output length that prompt is served with. Decoding
is greedy with EOS ignored and R-Stitch decides from the sequence so far, so the
loop's first L tokens are its output at max_tokens = L: one reference run per prompt
covers every length. A request is identical when the digest of its output (token ids
AND the model that produced each) equals the reference's for the same prompt and length.

    reference table (in the JSON):  {prompt digest: {"256": output digest, "2048": ...}}
    each record:                    {"prompt": digest, "output": digest, ...}

`identity()` reads only the JSON, so the report recomputes it and an edited digest is
caught there too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


def digest_ids(ids: Sequence[int]) -> str:
    return hashlib.sha1(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def digest_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def digest_output(ids: Sequence[int], models: Sequence[str]) -> str:
    body = json.dumps([list(ids), list(models)], separators=(",", ":"))
    return hashlib.sha1(body.encode()).hexdigest()[:16]


class Reference:
    """The reference outputs by prompt digest, at the longest length each was run."""

    def __init__(self) -> None:
        self.outputs: dict[str, tuple[list[int], list[str]]] = {}
        self.lengths: dict[str, set[int]] = {}  # lengths compared against, per prompt

    def add(self, prompt: Sequence[int], ids: Sequence[int], models: Sequence[str]) -> None:
        key = digest_ids(prompt)
        if len(ids) >= len(self.outputs.get(key, ((), ()))[0]):
            self.outputs[key] = (list(ids), list(models))

    def has(self, prompt: Sequence[int], length: int) -> bool:
        out = self.outputs.get(digest_ids(prompt))
        return out is not None and len(out[0]) >= length

    def divergence(self, prompt: Sequence[int], ids: Sequence[int], models: Sequence[str]) -> int:
        """First output position where (id, model) differs from the reference, or -1.

        Also notes the length, so `table()` holds a reference digest for it."""
        key, length = digest_ids(prompt), len(ids)
        self.lengths.setdefault(key, set()).add(length)
        ref_ids, ref_models = self.outputs.get(key, ([], []))
        if len(ref_ids) < length:
            return -1  # no reference this long: `identity` counts it as unchecked
        mine, ref = zip(ids, models, strict=True), zip(ref_ids, ref_models, strict=True)
        pairs = zip(mine, ref, strict=False)  # the reference may be longer
        return next((i for i, (a, b) in enumerate(pairs) if a != b), -1)

    def table(self) -> dict[str, dict[str, str]]:
        """Reference digests of every (prompt, length) a run was compared at."""
        out: dict[str, dict[str, str]] = {}
        for key, lengths in self.lengths.items():
            ids, models = self.outputs.get(key, ([], []))
            out[key] = {str(n): digest_output(ids[:n], models[:n]) for n in sorted(lengths)
                        if len(ids) >= n}  # fmt: skip
        return out


def run_outputs(run: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every request of a run, all repeats: the kept one's records and the others'."""
    yield from run["records"]
    for repeat in run.get("other_repeats", []):
        yield from repeat


def identity(runs: list[dict[str, Any]], table: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Per run (reference runs excepted): requests compared, identical, without reference."""
    out = []
    for run in runs:
        if run.get("reference"):
            continue
        compared = identical = missing = 0
        first: list[int] = []
        for rec in run_outputs(run):
            ref = table.get(rec["prompt"], {}).get(str(rec["output_tokens"]))
            if ref is None:
                missing += 1
                continue
            compared += 1
            identical += rec["output"] == ref
            if rec["output"] != ref and rec.get("diverges_at", -1) >= 0:
                first.append(rec["diverges_at"])
        out.append({
            "system": run["system"], "workload": run["workload"], "n": run["n"],
            "max_tokens": run["max_tokens"], "compared": compared, "identical": identical,
            "no_reference": missing, "first_divergence": min(first) if first else None,
        })  # fmt: skip
    return out


def differing(ident: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any] | None:
    """The identity entry of `run` when any of its requests differs or went unchecked."""
    for entry in ident:
        key = (entry["system"], entry["workload"], entry["n"])
        if key == (run["system"], run["workload"], run["n"]):
            bad = entry["identical"] < entry["compared"] or entry["no_reference"] > 0
            return entry if bad else None
    return None
