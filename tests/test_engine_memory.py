"""What an engine's memory is made of, and that nothing in it grows with traffic alone.

The figures every process reports (`trd/engines/memory.py`); the weights and the rings
resident from the start, not page by page as traffic first touches them (an engine's
resident size grew for hours that way: issue 54); the compiled-grammar cache bounded by
its setting. Under load, tests/test_e2e_memory.py (slow) and the soak mix's guard in
tests/test_e2e_structured.py.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import torch

from trd.engines.memory import Trimmer, heap, resident
from trd.grammar.compile import Grammars, grammar_for
from trd.ipc.eventfd import EventFd
from trd.ipc.ring import Ring
from trd.models.checkpoint import read_checkpoint
from trd.models.loader import load_model

MIB = 1 << 20


def mapping(address: int) -> tuple[int, int, str]:
    """Size and resident bytes of the mapping holding `address`, and what it maps."""
    found: tuple[int, str] | None = None  # the mapping's size and name
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            start, end = (int(x, 16) for x in head[0].split("-"))
            found = (end - start, head[-1]) if start <= address < end else None
        elif found is not None and line.startswith("Rss:"):
            return found[0], int(head[1]) * 1024, found[1]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_resident_is_the_sum_of_its_parts_and_empty_for_no_process() -> None:
    r = resident()
    assert r["rss_bytes"] == r["anon_bytes"] + r["file_bytes"] + r["shmem_bytes"] > 0
    assert resident(os.getpid()).keys() == r.keys()
    assert resident(2**31) == {}


def test_heap_counts_what_is_allocated_and_freed() -> None:
    before = heap()["heap_in_use_bytes"]
    blocks = [bytearray(8 << 10) for _ in range(2048)]  # 16 MiB of malloc'd blocks
    grown = heap()["heap_in_use_bytes"] - before
    del blocks
    assert 15 * MIB < grown < 20 * MIB
    assert heap()["heap_in_use_bytes"] - before < MIB


def test_trimmer_gives_a_fragmented_heap_back_only_when_due() -> None:
    """Blocks freed between blocks still held stay resident (free() returns only an
    arena's top); a due Trimmer gives their pages back, one not due or under its slack
    leaves them."""
    blocks = [bytearray(64 << 10) for _ in range(1024)]  # 64 MiB, below mmap's threshold
    held = blocks[::16]  # every 16th kept, the last one too: nothing freed is at the top
    held.append(blocks[-1])
    del blocks
    rss = resident()["anon_bytes"]
    assert heap()["heap_free_bytes"] > 48 * MIB
    slack = Trimmer(interval=0.0, slack=1 << 40)
    assert not slack.tick(1.0) and slack.trims == 0
    trimmer = Trimmer(interval=60.0, slack=0)
    assert trimmer.tick(100.0) and trimmer.trims == 1
    assert rss - resident()["anon_bytes"] > 40 * MIB  # the freed blocks' pages went back
    assert not trimmer.tick(159.0) and trimmer.trims == 1  # not due yet
    assert trimmer.tick(160.0) and trimmer.trims == 2
    assert len(held) == 65


def test_weights_are_resident_once_loaded(tiny_models: dict[str, Path]) -> None:
    """A weight in the checkpoint's dtype is a view of the file: every page of it is read
    at load, the embedding's too, which a forward reads only row by row."""
    ckpt = read_checkpoint(tiny_models["large"])
    model = load_model(ckpt, "float32", torch.device("cpu"))
    size, rss, name = mapping(model.model.embed_tokens.weight.data_ptr())
    file = ckpt.weight_files[0].resolve()
    assert name == str(file) and size >= file.stat().st_size
    data = sum(p.numel() * p.element_size() for p in model.parameters())
    assert rss >= data > MIB


def test_a_rings_pages_are_resident_in_every_process_that_maps_it() -> None:
    """Without it each page of a 4 MiB ring becomes resident when the write position first
    reaches it: hours of tokens at tens of bytes a frame."""
    name, efd = f"trd-test-{uuid.uuid4().hex[:12]}", EventFd()
    shmem = resident()["shmem_bytes"]
    ring = Ring.create(name, 2 * MIB, efd)
    try:
        assert resident()["shmem_bytes"] - shmem >= 2 * MIB
        view = Ring.attach(name, efd)  # a second mapping, as an engine's
        assert resident()["shmem_bytes"] - shmem >= 4 * MIB
        view.close()
    finally:
        ring.unlink()
        ring.close()
        efd.close()


def test_compiled_grammars_are_kept_up_to_the_cache_size(tiny_models: dict[str, Path]) -> None:
    grammars = Grammars(tiny_models["small"], [0], size=2)
    texts = [grammar_for("regex", f"[a-z]{{1,{n}}}") for n in (3, 4, 5)]
    for text in texts[:2]:
        grammars.matcher(text)
    grammars.matcher(texts[0])  # used again: the second is now the least recent
    grammars.matcher(texts[2])
    assert len(grammars) == 2 and list(grammars._compiled) == [texts[0], texts[2]]
