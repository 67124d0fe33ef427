"""Planning flashinfer twice on one wrapper waits until the first plan's upload has run.

flashinfer's plan() stages the step's work indices in one pinned host buffer per wrapper
and queues their copy to the device without waiting; a second plan() before that copy has
run overwrites what the first step's kernels read (mini-sglang PR 103, vLLM PR 32799). A
long prompt's chunks at an idle engine and the engine's per-request retry plan one wrapper
back to back. Without a GPU, a stand-in for the flashinfer module records every plan and
every event, and the backend runs on the `meta` device (a double of the external library
only; the backend under test is ours)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from trd.models.attention import BatchLayout
from trd.models.attention import flashinfer_paged as fp

META = torch.device("meta")


class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []


class FakeEvent:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def record(self) -> None:
        self.rec.log.append(("record", self))

    def synchronize(self) -> None:
        self.rec.log.append(("sync", self))


def fake_flashinfer(rec: Recorder) -> types.ModuleType:
    class Wrapper:
        def __init__(self, workspace: torch.Tensor, layout: str, **kwargs: Any) -> None:
            self.kind = (
                "prefill" if self.__class__.__name__.startswith("BatchPrefill") else "decode"
            )

        def reset_workspace_buffer(self, *buffers: torch.Tensor) -> None:
            pass

        def plan(self, *args: Any, **kwargs: Any) -> None:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            rec.log.append(("plan", (self, [t.device.type for t in tensors])))

        def run(self, q: torch.Tensor, kv: Any) -> torch.Tensor:
            return q

    module = types.ModuleType("flashinfer")
    for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"):
        setattr(module, name, type(name, (Wrapper,), {}))
    return module


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer(rec))
    monkeypatch.setattr(fp, "_pinned", torch.from_numpy)  # pinning needs a CUDA build
    monkeypatch.setattr(fp, "new_event", lambda: FakeEvent(rec))
    props = types.SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    return rec


def check_order(log: list[tuple[str, Any]]) -> int:
    """Every plan of a wrapper after its first waits on the event recorded right after
    that wrapper's previous plan; returns how many plans waited."""
    after: dict[int, FakeEvent] = {}  # wrapper -> the event recorded after its last plan
    synced: set[int] = set()
    waited = 0
    for i, (what, obj) in enumerate(log):
        if what == "sync":
            synced.add(id(obj))
        elif what == "plan":
            wrapper = obj[0]
            if id(wrapper) in after:
                assert id(after[id(wrapper)]) in synced, f"plan {i} did not wait: {log}"
                waited += 1
            assert log[i + 1][0] == "record", "no event recorded after a plan"
            after[id(wrapper)] = log[i + 1][1]
    return waited


def test_a_long_prompts_chunks_and_decodes_plan_in_order(rec: Recorder) -> None:
    backend = fp.FlashInferPagedAttention(META, (16, 8, 128), torch.bfloat16)
    table = list(range(200))
    for start in range(0, 3072, 1024):  # three chunks of one 3072-token prompt, back to back
        backend.plan(BatchLayout([1024], [start], [table], 16))
    for pos in (3072, 3073):  # then decodes: the other wrapper
        backend.plan(BatchLayout([1], [pos], [table], 16))
    plans = [obj for what, obj in rec.log if what == "plan"]
    assert [w.kind for w, _ in plans] == ["prefill"] * 3 + ["decode"] * 2
    assert check_order(rec.log) == 3  # chunks 2 and 3, the second decode
    # Page indices go to the device before plan(); indptr and lengths stay on the host
    # (flashinfer reads them there): prefill (qo, kv_indptr, indices, last), decode without qo.
    assert plans[0][1] == ["cpu", "cpu", "meta", "cpu"]
    assert plans[-1][1] == ["cpu", "meta", "cpu"]


def test_the_harness_sees_plans_that_do_not_wait(rec: Recorder) -> None:
    log: list[tuple[str, Any]] = []
    wrapper, e1, e2 = object(), FakeEvent(rec), FakeEvent(rec)
    log += [("plan", (wrapper, [])), ("record", e1), ("plan", (wrapper, [])), ("record", e2)]
    with pytest.raises(AssertionError, match="did not wait"):
        check_order(log)
