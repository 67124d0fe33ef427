"""The agent-trajectory workload without serving: its texts, turns and perfect hit rate.

A fake system (each answer = the prompt's last tokens reversed) stands in for a server,
so the conversations, the closed loop and `perfect_hits` are checked exactly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trd.bench.compare.agent import SHAPES, AgentShape, conversations, perfect_hits, scaled_shape
from trd.bench.compare.agent_run import read_pace, turn_log
from trd.bench.compare.agent_table import agent_table
from trd.bench.compare.cli import main as compare_main
from trd.bench.datasets import Conversation
from trd.bench.load import TokenTarget, run_load
from trd.bench.record import Record

SHAPE = AgentShape(turns=3, system_tokens=40, tool_tokens=12, answer_tokens=5)
COMPARE = [sys.executable, "-m", "trd.daemon", "bench", "compare"]


class Echo(TokenTarget):
    """Each answer: the prompt's last tokens reversed, by the small model (or the first
    by the large one, with `large_first`)."""

    def __init__(self, large_first: bool = False) -> None:
        super().__init__(["small", "large"], SHAPE.answer_tokens)
        self.large_first = large_first

    async def generate(self, ids: list[int]) -> tuple[float, float, list[int], list[int]]:
        await asyncio.sleep(0)
        out = (ids if self.large_first else ids[::-1])[: self.max_tokens]
        models = [int(self.large_first and i == 0) for i in range(len(out))]
        return (0.25, 0.5, out, models) if self.large_first else (0.01, 0.02, out, models)


def run(convs: list[Conversation], n: int, target: TokenTarget | None = None,
        pace: dict[tuple[int, int], float] | None = None) -> list[Record]:  # fmt: skip
    records, _ = asyncio.run(run_load(target or Echo(), convs, max_concurrency=n, pace=pace))
    return records


def test_conversations_share_the_system_prompt_and_nothing_else(
    tiny_models: dict[str, Path],
) -> None:
    convs = conversations(tiny_models["small"], SHAPE, 4)
    assert len({tuple(c.system or []) for c in convs}) == 1 and len(convs[0].system or []) == 40
    tools = [tuple(t) for c in convs for t in c.turns]
    assert len(set(tools)) == 12 and all(len(t) == 12 for t in tools)
    assert conversations(tiny_models["small"], SHAPE, 4) == convs  # deterministic
    assert SHAPES["tiny"].longest <= 800  # the fixtures serve 1,024 tokens at most


def test_each_turn_resends_the_whole_conversation(tiny_models: dict[str, Path]) -> None:
    convs = conversations(tiny_models["small"], SHAPE, 3)
    records = run(convs, 2)
    for c, conv in enumerate(convs):
        seq: list[int] = [i for i in conv.system or [] if isinstance(i, int)]
        got = sorted((r for r in records if r.conversation == c), key=lambda r: r.turn)
        for t, turn in enumerate(got):
            assert turn.prompt_ids == seq + [i for i in conv.turns[t] if isinstance(i, int)]
            seq = (turn.prompt_ids or []) + (turn.token_ids or [])
        assert len(seq) == SHAPE.longest


def test_perfect_hits_count_whole_blocks_seen_before(tiny_models: dict[str, Path]) -> None:
    convs = conversations(tiny_models["small"], SHAPE, 2)
    hits, asked = perfect_hits(run(convs, 1), page_size=8)
    # Conversation 0: turn 1 nothing; turns 2, 3 their previous prompt + answer (57 and
    # 74 tokens: 7 and 9 blocks). Conversation 1: turn 1 the system prompt (5 blocks).
    assert asked == 2 * (52 + 69 + 86)
    assert hits == (7 + 9) * 8 + (5 + 7 + 9) * 8


def test_turn_log_says_when_each_turn_was_sent_and_who_made_its_first_token(
    tiny_models: dict[str, Path],
) -> None:
    convs = conversations(tiny_models["small"], SHAPE, 2)
    log = turn_log(run(convs, 2, Echo(large_first=True)))
    assert len(log) == 6 and log[0]["sent_s"] == 0.0
    assert [e["sent_s"] for e in log] == sorted(e["sent_s"] for e in log)
    assert sorted((e["conv"], e["turn"]) for e in log) == [
        (c, t) for c in (0, 1) for t in (0, 1, 2)
    ]
    first = log[0]
    assert (first["ttft_s"], first["latency_s"], first["first"]) == (0.25, 0.5, "large")
    assert first["prompt"] == 52 and first["tokens_per_model"] == {"large": 1, "small": 4}


def test_a_paced_turn_waits_for_its_time_and_for_its_previous_answer(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    convs = conversations(tiny_models["small"], SHAPE, 2)
    pace = {(1, 0): 0.3, (0, 2): 0.2}  # conversation 1 starts late; 0's last turn waits
    records = run(convs, 2, pace=pace)
    start = min(r.sent for r in records)
    sent = {(r.conversation, r.turn): r.sent - start for r in records}
    assert sent[(1, 0)] >= 0.3 and sent[(0, 2)] >= 0.2
    assert sent[(0, 0)] < 0.1 and sent[(1, 1)] > sent[(1, 0)]
    # An earlier run's standard-serving arrivals, read back per N.
    log = [{"conv": c, "turn": t, "sent_s": s} for (c, t), s in sent.items()]
    runs = [{"system": "tokenrouterd", "n": 2, "turn_log": []},
            {"system": "std", "n": 2, "turn_log": log}]  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"runs": runs}))
    assert read_pace(path) == {2: sent}


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`bench compare ARGV`'s usage error, in this process (its checks come before any
    model is loaded): what it printed on stderr."""
    with pytest.raises(SystemExit) as exc:
        compare_main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_a_pace_file_without_standard_serving_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"runs": [{"system": "tokenrouterd", "n": 4, "turn_log": []}]}))
    err = refusal(["--agent", "--agent-pace", str(path)], capsys)
    assert f"--agent-pace: {path} holds no standard-serving run with a turn log" in err


def test_a_pace_file_that_is_not_an_agent_run_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path, text in ((tmp_path / "missing.json", None), (tmp_path / "junk.json", "[1, 2]")):
        if text is not None:
            path.write_text(text)
        err = refusal(["--agent", "--agent-pace", str(path)], capsys)
        assert f"--agent-pace: {path} is not an agent run's JSON" in err


def test_a_pace_from_other_conversations_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    # An earlier run of N=2 with 2 turns a conversation; this run asks for 3.
    log = [{"conv": c, "turn": t, "sent_s": 0.0} for c in (0, 1) for t in (0, 1)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"runs": [{"system": "std", "n": 2, "turn_log": log}]}))
    argv = [*COMPARE, "--pair", "tiny", "--agent", "--agent-n", "2",
            "--agent-turns", "3", "--agent-per-worker", "1", "--agent-pace", str(path),
            "--out", str(tmp_path / "out.json")]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "--agent-pace: the earlier run's turns at N=2 are not this run's" in out.stderr
    assert not (tmp_path / "out.json").exists()


def test_table_says_which_targets_were_met() -> None:
    def run(system: str, ttft: float, tput: float, hit: float | None = None) -> dict:
        r = {"system": system, "n": 4, "ttft_p50": ttft, "ttft_p99": ttft, "ttft1_p50": ttft,
             "tpot_mean": 0.01, "throughput": tput, "perfect_hit_rate": 0.95,
             "diverging_turns": 0, "turns": 24}  # fmt: skip
        return r if hit is None else {**r, "hit_rate": {"small": hit}}

    runs = [run("tokenrouterd", 0.01, 300, 0.9), run("tokenrouterd_nocache", 0.06, 100, 0.0),
            run("std", 0.02, 50)]  # fmt: skip
    lines = agent_table({"runs": runs})
    row = "| tokenrouterd | 4 | 10.0 | 10.0 | 10.0 | 10.00 | 300.0 | 90.0% / 95.0% | 0/24 |"
    assert row in lines
    assert lines[-1] == (
        "- N=4: TTFT p50 (turn >= 2) 6.0x lower with the cache (target 5x: met); throughput "
        "3.00x (target 2x: met); TTFT 10.0 ms vs standard serving's 20.0 ms (target <=: met); "
        "hit rate 95% of perfect (target 90%: met)"
    )
    # Without the entry engine's hit rate the target is not judged (was: 0%, missed).
    bare = [{k: v for k, v in runs[0].items() if k != "hit_rate"}]
    assert agent_table({"runs": bare})[-1].endswith(
        "hit rate not measured (target 90%: not judged)"
    )
    # A daemon on all the cores is judged against its own cache-off twin (tokenrouterd_ahead
    # too); standard serving on all the cores is reported beside, not judged.
    wide = [run("tokenrouterd_ahead", 0.012, 320, 0.93), run("std_wide", 0.025, 60),
            run("tokenrouterd_wide_nocache", 0.036, 200)]  # fmt: skip
    lines = agent_table({"runs": [*runs, *wide]})
    assert lines[-2].startswith("- N=4: TTFT p50 (turn >= 2) 6.0x lower")
    assert lines[-2].endswith("(target 90%: met); std_wide: 25.0 ms")
    assert lines[-1] == (
        "- N=4, tokenrouterd_ahead: TTFT p50 (turn >= 2) 3.0x lower with the cache (target "
        "5x: missed); throughput 1.60x (target 2x: missed); TTFT 12.0 ms vs standard "
        "serving's 20.0 ms (target <=: met); hit rate 98% of perfect (target 90%: met); "
        "std_wide: 25.0 ms"
    )
    # A run without standard serving (--agent-systems) judges what it has.
    assert agent_table({"runs": runs[:2]})[-1] == (
        "- N=4: TTFT p50 (turn >= 2) 6.0x lower with the cache (target 5x: met); throughput "
        "3.00x (target 2x: met); hit rate 95% of perfect (target 90%: met)"
    )


def test_a_scaled_shape_keeps_the_prompts_and_cuts_turns_and_answers() -> None:
    full = SHAPES["demo"]
    small = scaled_shape("demo", 3, 32)
    assert (small.system_tokens, small.tool_tokens) == (full.system_tokens, full.tool_tokens)
    assert (small.turns, small.answer_tokens) == (3, 32)
    assert scaled_shape("demo", None, None) == full


def test_an_unknown_agent_system_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(["--agent", "--agent-systems", "tokenrouterd,tokenrouterd_lpm"], capsys)
    assert "--agent-systems: unknown tokenrouterd_lpm; known: official," in err


def test_standard_servers_step_as_many_tokens_as_the_daemon(
    tiny_models: dict[str, Path],
) -> None:
    """Like for like: the standard servers ran the engine default (1,024 tokens a step)
    against the daemon's 2,048 until 2026-12-04, which shortened their prefill steps."""
    import inspect

    from trd.bench.compare.systems import daemon_config, start_std_servers
    from trd.bench.server import std_server_argv

    daemon = daemon_config({"m": tiny_models["small"]}, 0.1, {}, 1024, 512)["engine"]
    std = inspect.signature(start_std_servers).parameters
    argv = std_server_argv(Path("/m"), max_batch_tokens=std["max_batch_tokens"].default,
                           threads=std["threads"].default)  # fmt: skip
    given = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert int(given["--max-batch-tokens"]) == daemon["max_batch_tokens"]
    assert int(given["--threads"]) == daemon["threads"]
    assert "--no-prefix-cache" in std_server_argv(Path("/m"), prefix_cache=False)


def test_a_step_of_no_tokens_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(["--agent", "--agent-max-batch-tokens", "0"], capsys)
    assert "--agent-max-batch-tokens: 0 is below 1" in err
