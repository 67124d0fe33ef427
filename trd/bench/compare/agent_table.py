"""The agent workload's table: every run, then each N's targets, met or missed.

Each daemon with its prefix cache on is judged against its cache-off twin (`CACHE_OFF`)
and standard serving: TTFT from the second turn on 5x lower, throughput 2x, TTFT at most
standard serving's, the entry engine's hit rate 90% of a perfect cache's.
"""

from __future__ import annotations

from typing import Any

# The daemons with the cache on that the table judges, each against its cache-off twin.
CACHE_OFF = {
    "tokenrouterd": "tokenrouterd_nocache",
    "tokenrouterd_wide": "tokenrouterd_wide_nocache",
    "tokenrouterd_ahead": "tokenrouterd_wide_nocache",
}


def agent_table(result: dict[str, Any]) -> list[str]:
    """The markdown table of an agent run, then each N's targets, met or missed."""
    lines = [
        "| system | N | TTFT p50 turn>=2 (ms) | TTFT p99 turn>=2 (ms) | TTFT p50 turn 1 (ms) "
        "| TPOT (ms) | output tok/s | hit rate: entry engine / perfect | diverging turns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        hit = r.get("hit_rate", {}).get("small")
        hits = f"{hit:.1%} / {r['perfect_hit_rate']:.1%}" if hit is not None else "-"
        lines.append(
            f"| {r['system']} | {r['n']} | {1e3 * r['ttft_p50']:.1f} | {1e3 * r['ttft_p99']:.1f} "
            f"| {1e3 * r['ttft1_p50']:.1f} | {1e3 * r['tpot_mean']:.2f} | {r['throughput']:.1f} "
            f"| {hits} | {r['diverging_turns']}/{r['turns']} |"
        )
    by = {(r["system"], r["n"]): r for r in result["runs"]}
    for n in sorted({r["n"] for r in result["runs"]}):
        for name, off_name in CACHE_OFF.items():
            if (on := by.get((name, n))) is not None:
                parts = targets(on, by.get((off_name, n)), by.get(("std", n)))
                if (wide := by.get(("std_wide", n))) is not None:
                    parts.append(f"std_wide: {1e3 * wide['ttft_p50']:.1f} ms")
                label = f"N={n}" if name == "tokenrouterd" else f"N={n}, {name}"
                lines.append(f"- {label}: " + "; ".join(parts))
    return lines


def targets(
    on: dict[str, Any], off: dict[str, Any] | None, std: dict[str, Any] | None
) -> list[str]:
    """The targets of one cache-on daemon's run, against its cache-off twin and standard
    serving where the run has them."""
    parts = []
    if off is not None:
        ttft, tput = off["ttft_p50"] / on["ttft_p50"], on["throughput"] / off["throughput"]
        parts += [f"TTFT p50 (turn >= 2) {ttft:.1f}x lower with the cache (target 5x: "
                  f"{met(ttft >= 5)})", f"throughput {tput:.2f}x (target 2x: "
                  f"{met(tput >= 2)})"]  # fmt: skip
    if std is not None:
        ok = met(on["ttft_p50"] <= std["ttft_p50"])
        parts.append(f"TTFT {1e3 * on['ttft_p50']:.1f} ms vs standard serving's "
                     f"{1e3 * std['ttft_p50']:.1f} ms (target <=: {ok})")  # fmt: skip
    measured = on.get("hit_rate", {}).get("small")
    if measured is None:  # the entry engine's counters did not move between snapshots
        parts.append("hit rate not measured (target 90%: not judged)")
    else:
        hit = measured / on["perfect_hit_rate"]
        parts.append(f"hit rate {hit:.0%} of perfect (target 90%: {met(hit >= 0.9)})")
    return parts


def met(ok: bool) -> str:
    return "met" if ok else "missed"
