"""`tokenrouterd eval nll`: each HumanEval completion's mean negative log-likelihood under
the large model (nats per token).

The large model (transformers, in this process, bfloat16 by default) reads the prompt
exactly as the daemon rendered it (the tokenizer's chat template with the assistant turn
continued) followed by the completion's tokens; the mean is over the completion's
tokens. The prompt's KV is computed once per problem and reused for every system's
completion of it. The completion is re-tokenized from its text (not every server
returns the tokens it sampled), so it scores the text the user gets. A completion
already scored (the same problem and text in another file) is not scored again.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trd.evals.humaneval.problems import Problem, load_problems


class Scorer:
    def __init__(self, folder: Path, dtype: torch.dtype = torch.bfloat16, threads: int = 1) -> None:
        torch.set_num_threads(threads)  # one: the CPU is shared with the daemon's engines
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        self.model.eval()
        self.cache: dict[tuple[str, str, str], float] = {}
        self._last_prompt: tuple[tuple[str, str], torch.Tensor, Any] | None = None

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
        last, kv = self._prompt(problem, style)
        # The prompt's KV is computed once per problem (the systems' completions of one
        # problem share it, a prompt being 3-4 times a completion's length); a copy per
        # completion, since the forward extends the cache it is given.
        ids = torch.tensor([target])
        out = self.model.model(input_ids=ids, cache=copy.deepcopy(kv), use_cache=True)
        hidden = torch.cat([last, out.last_hidden_state[0, :-1]])  # the positions before each
        logits = self.model.lm_head(hidden).float()
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(1, torch.tensor(target).unsqueeze(1)).squeeze(1)
        value = float(-picked.mean())
        self.cache[key] = value
        return value

    def _prompt(self, problem: Problem, style: str) -> tuple[torch.Tensor, Any]:
        """(the last prompt position's hidden state, (1, H); the prompt's KV), kept for
        the last problem asked."""
        key = (problem.task_id, style)
        if self._last_prompt is None or self._last_prompt[0] != key:
            ids = torch.tensor([self.prompt_ids(problem, style)])
            out = self.model.model(input_ids=ids, use_cache=True)
            self._last_prompt = (key, out.last_hidden_state[0, -1:], out.cache)
        return self._last_prompt[1], self._last_prompt[2]


SAVE_EVERY = 8  # problems scored between two writes of the files


def main(argv: list[str] | None = None) -> int:
    """`tokenrouterd eval nll --model DIR FILE...`: each completion's mean NLL under the
    model (the large one), written into the files' records as `nll`, problem by problem
    (the files' completions of a problem share its prompt's KV); the files are rewritten
    every SAVE_EVERY problems, so a run cut off keeps its work, and a rerun skips what
    is scored."""
    p = argparse.ArgumentParser(prog="tokenrouterd eval nll", description=main.__doc__)
    p.add_argument("files", type=Path, nargs="+", help="`eval humaneval` result files")
    p.add_argument("--model", type=Path, required=True, help="the scoring model's folder")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: a daemon may share the CPU)")  # fmt: skip
    args = p.parse_args(argv)
    bodies = {path: json.loads(path.read_text()) for path in args.files}
    todo: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for body in bodies.values():
        run = body["runs"][0]
        for rec in run["records"]:
            if rec.get("nll") is None:
                todo.setdefault(rec["task_id"], []).append((rec, run["settings"]["prompt"]))
    print(f"{sum(map(len, todo.values()))} completions of {len(todo)} problems to score")
    if not todo:
        return 0
    by_id = {p.task_id: p for p in load_problems()}
    scorer = Scorer(args.model, threads=args.threads)
    for done, (task_id, recs) in enumerate(sorted(todo.items()), 1):
        for rec, style in recs:
            nll = scorer.nll(by_id[task_id], rec["completion"], style)
            rec["nll"] = None if math.isnan(nll) else nll
        if done % SAVE_EVERY == 0 or done == len(todo):
            for path, body in bodies.items():
                path.write_text(json.dumps(body, indent=1) + "\n")
            print(f"  {done}/{len(todo)} problems scored", flush=True)
    return 0
