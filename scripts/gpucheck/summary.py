"""The one-page text summary of a GPU check's results (gpu_check.json), rewritten after
every stage: the first line is the verdict so far."""

from __future__ import annotations

from typing import Any

from trd.bench.stages import verdict


def summary(results: dict[str, Any], stages: tuple[str, ...]) -> str:
    status = results.get("status") or verdict(results, stages)
    lines = [f"{status}\nGPU check{' (dry run, CPU)' if _dry(results) else ''}"]
    for name, r in results.items():
        if not isinstance(r, dict):
            continue
        mark = "PASS" if r.get("ok") else "FAIL"
        lines.append(f"\n[{mark}] {name} ({r.get('seconds', '?')} s) {r.get('error', '')}")
        lines += _details(name, r)
    return "\n".join(lines) + "\n"


def _dry(results: dict[str, Any]) -> bool:
    return bool(results.get("versions", {}).get("dry_run"))


def _details(name: str, r: dict[str, Any]) -> list[str]:
    if name == "versions":
        keys: tuple[str, ...] = (
            "device", "compute_capability", "nvidia_smi", "driver", "python", "torch",
            "torch_cuda", "nvcc", "ninja", "flashinfer", "mps_control", "mps_binary_versions",
            "kernel",
        )  # fmt: skip
        return [f"  {k}: {r.get(k)}" for k in keys if k in r]
    if name == "attention":
        out = [f"  compile s per head_dim: {r.get('compile_s')}; head_dim 32 gets: "
               f"{r.get('head_dim_32_backend')}"]  # fmt: skip
        return out + [
            f"  {c['case']:15} {c['heads']!s:14} "
            + (f"out {c['out_err']:.2e}  kv {c['kv_err']:.1e}" if "out_err" in c else c["error"])
            + ("" if c["ok"] else "   <-- FAIL")
            for c in r.get("cases", [])
        ]
    if name == "throughput":
        return [f"  {g:10} N={n:>7}: {row}" for g in ("graphs_on", "graphs_off")
                for n, row in r.get(g, {}).items()]  # fmt: skip
    keys = {
        "checkpoints": ("models",),
        "engines": ("float32_refused", "equal", "mismatch", "as_designed", "design_mismatch",
                    "graphs_on", "graphs_off", "qwen2-small", "qwen2-large"),
        "mps": ("control", "tokens_exact", "mismatch", "engines", "mps_clients", "seen",
                "daemon_exit", "mps_dir_removed"),
        "suite": ("passed", "failures", "errors", "skipped"),
        "memory": ("nvml_mib", "planned_mib", "nvml_within_plan", "pool_mib",
                   "planned_graphs_mib", "pool_within_plan", "reserved_mib",
                   "outside_torch_mib", "planned_outside_mib", "dry_run"),
    }.get(name, ())  # fmt: skip
    return [f"  {k}: {r.get(k)}" for k in keys if k in r]
