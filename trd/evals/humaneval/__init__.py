"""HumanEval pass@1 of any OpenAI-compatible server: the problems and the prompt
(`problems.py`), the sandbox (`sandbox.py`), the run (`run.py`), the comparison of result
files (`compare.py`), the completions' NLL under the large model (`nll.py`)."""
