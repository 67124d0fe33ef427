"""GlimpRouter's start thresholds for the HumanEval run (`hevalkit/systems.py`).

GlimpRouter hands a whole step to the large model when the small model's probe entropy
(top-20, nats) at the step's first token is at or above its threshold. This script reads
the small model's own completions (a `humaneval.py run` JSON of the `small` system),
cuts each into steps as the policy does (`trd/policies/steps.py`: a blank line ends a
step), takes the probe entropy at each step's start from one forward of the small model
over prompt + completion, and prints, for each target share of tokens, the threshold at
which the steps it would hand over hold that share of the tokens. The share control
moves the threshold from there during a run; a start near the target spends fewer
tokens away from it.

    cd scripts && ../.venv/bin/python glimp_thresholds.py --small SMALL_DIR \\
        --answers RUNS/small.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from hevalkit.nll import Scorer
from hevalkit.problems import load_problems

from trd.policies.glimp import top_entropy
from trd.policies.params import GlimpParams
from trd.policies.steps import StepTable, token_texts

SHARES = (0.1, 0.2, 0.3, 0.5)


def steps_of(table: StepTable, tokens: list[int], step_tokens: int) -> list[tuple[int, int]]:
    """(start, length) of each step of a completion, as GlimpPolicy._scan cuts them."""
    starts, tail = [0], 0
    for i, token in enumerate(tokens):
        tail = table.advance(tail, token)
        if (tail == 2 or i + 1 - starts[-1] >= step_tokens) and i + 1 < len(tokens):
            starts.append(i + 1)
    ends = [*starts[1:], len(tokens)]
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def threshold_for(entropies: np.ndarray, lengths: np.ndarray, share: float) -> float:
    """The lowest entropy at which the steps at or above it hold at most `share` of the
    tokens, taking the steps from the most uncertain down (at least that one)."""
    order = np.argsort(-entropies)
    held = np.cumsum(lengths[order]) / lengths.sum()
    taken = int(np.searchsorted(held, share, side="right"))
    return float(entropies[order][max(taken - 1, 0)])


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--small", type=Path, required=True, help="the small model's folder")
    ap.add_argument("--answers", type=Path, required=True, help="its humaneval.py run JSON")
    args = ap.parse_args()
    run = json.loads(args.answers.read_text())
    by_id = {p.task_id: p for p in load_problems()}
    scorer = Scorer(args.small)
    table = StepTable.of(token_texts(args.small, int(scorer.model.config.vocab_size)))
    step_tokens = GlimpParams().step_tokens
    entropies, lengths = [], []
    for done, answer in enumerate(run["answers"], 1):
        prompt = scorer.prompt_ids(by_id[answer["task_id"]], run["prompt"])
        tokens = scorer.tokenizer(answer["completion"], add_special_tokens=False)["input_ids"]
        if not tokens:
            continue
        logits = scorer.model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0]
        at = logits[len(prompt) - 1 :].float()  # row i predicts completion token i
        for start, length in steps_of(table, tokens, step_tokens):
            entropies.append(float(top_entropy(at[start : start + 1])[0]))
            lengths.append(length)
        if done % 20 == 0:
            print(f"  {done}/{len(run['answers'])} completions", flush=True)
    h, n = np.array(entropies), np.array(lengths)
    print(f"{len(h)} steps, {int(n.sum())} tokens of {len(run['answers'])} completions")
    for share in SHARES:
        print(f"  {share:.0%} of the tokens: threshold {threshold_for(h, n, share):.3f}")


if __name__ == "__main__":
    main()
