"""The one-page text summary of a GPU check's results (gpu_check.json)."""

from __future__ import annotations

from typing import Any


def summary(results: dict[str, Any]) -> str:
    lines = [f"GPU check: {results.get('status', '')}".rstrip()]
    for name, r in results.items():
        if not isinstance(r, dict):
            continue
        verdict = "PASS" if r.get("ok") else "FAIL"
        lines.append(f"\n[{verdict}] {name} ({r.get('seconds', '?')} s) {r.get('error', '')}")
        lines += _details(name, r)
    return "\n".join(lines) + "\n"


def _details(name: str, r: dict[str, Any]) -> list[str]:
    if name == "versions":
        keys: tuple[str, ...] = (
            "device", "compute_capability", "nvidia_smi", "torch", "torch_cuda", "nvcc",
            "flashinfer", "mps_control", "kernel",
        )  # fmt: skip
        return [f"  {k}: {r.get(k)}" for k in keys if k in r]
    if name == "attention":
        return [
            f"  {c['case']:15} {c['heads']!s:14} "
            + (f"out {c['out_err']:.2e}  kv {c['kv_err']:.1e}" if "out_err" in c else c["error"])
            + ("" if c["ok"] else "   <-- FAIL")
            for c in r.get("cases", [])
        ]
    if name == "engines":
        out = [f"  float32 on CUDA refused: {r.get('float32_refused')}"]
        for pair in ("fixtures", "shaped"):
            e = r.get(pair, {})
            out.append(f"  {pair}: graphs on == off: {e.get('equal')} {e.get('mismatch', '')}"
                       f"{e.get('error', '')}")  # fmt: skip
            if "as_designed" in e:
                out.append(f"  {pair}: tokens as the weights make them: {e['as_designed']} "
                           f"{e.get('design_mismatch', '')}")  # fmt: skip
            for key in ("step_ms_graphs_True", "step_ms_graphs_False"):
                for model, ms in e.get(key, {}).items():
                    out.append(f"  step ms {model:20} graphs {key[-5:].strip('_'):5} {ms}")
            if "memory" in e:
                out.append(f"  memory: {e['memory']}")
        return out
    if name == "throughput":
        out = []
        for g in ("graphs_on", "graphs_off"):
            for n, row in r.get(g, {}).items():
                out.append(f"  {g:10} N={n:>7}: {row}")
        out.append(f"  official-style loop: {r.get('official')}; "
                   f"tokens equal: {r.get('tokens_equal_official')}")  # fmt: skip
        return out
    if name == "mps":
        keys = ("control", "completion", "engines", "seen", "daemon_exit", "mps_dir_removed")
        return [f"  {k}: {r.get(k)}" for k in keys if k in r]
    return []
