"""CUDA-graph buckets and padding, without a GPU: which graph a step gets, where padded
rows write, and what flashinfer is told (its plan arrays are plain numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from trd.engines.buckets import GraphShape, graph_shapes, pick_shape
from trd.engines.padding import pad_step
from trd.engines.spec import EngineSettings, SettingError
from trd.models.attention.base import BatchLayout
from trd.models.attention.flashinfer_paged import plan_arrays

PS = 4  # page size
SCRATCH = 99  # the page past the allocator's
SHAPES = graph_shapes(EngineSettings().graph_batches(), EngineSettings().graph_extend_lens)


def test_default_buckets_are_captured_largest_first() -> None:
    assert len(SHAPES) == 9 * 4  # 9 batch sizes x (decode + 3 extend lengths)
    assert SHAPES[0] == GraphShape(64, 8) and SHAPES[0].tokens == 513
    assert [s.tokens for s in SHAPES] == sorted((s.tokens for s in SHAPES), reverse=True)


@pytest.mark.parametrize(
    ("q_lens", "shape"),
    [
        ([1, 1, 1], GraphShape(4, 1)),  # decode: the smallest batch bucket that holds it
        ([1] * 64, GraphShape(64, 1)),
        ([1] * 65, None),  # more rows than any bucket: eager
        ([1, 3, 2], GraphShape(4, 4)),  # extend: fewest tokens (4x4+1 < 4x8+1)
        ([2], GraphShape(1, 2)),
        ([8] * 64, GraphShape(64, 8)),
        ([9, 1], None),  # a row longer than any extend bucket: eager
        ([30], None),  # a prompt: eager
    ],
)
def test_a_step_gets_the_smallest_bucket_that_holds_it(
    q_lens: list[int], shape: GraphShape | None
) -> None:
    assert pick_shape(q_lens, SHAPES) == shape


def test_buckets_above_max_batch_size_are_not_captured() -> None:
    settings = EngineSettings(max_batch_size=20, graph_batch_sizes=(1, 8, 16, 32))
    shapes = graph_shapes(settings.graph_batches(), settings.graph_extend_lens)
    assert {s.batch for s in shapes} == {1, 8, 16}
    assert pick_shape([1] * 17, shapes) is None


@pytest.mark.parametrize("bad", [[], [4, 2], [0, 1], [1, 1], (1, True)])
def test_bucket_lists_must_increase(bad: list[int]) -> None:
    with pytest.raises(SettingError, match=r"engine\.graph_batch_sizes: .*increasing integers"):
        EngineSettings(graph_batch_sizes=bad)  # type: ignore[arg-type]


def step(q_lens: list[int], starts: list[int], tables: list[list[int]]) -> BatchLayout:
    return BatchLayout(q_lens, starts, tables, PS)


# Three real rows: a decode at position 9 (pages 3, 7, 1), an extend of 3 at 5 (pages 2, 8),
# a 2-token extend from empty (page 5). Their pages are 1, 2, 3, 5, 7, 8.
REAL = step([1, 3, 2], [9, 5, 0], [[3, 7, 1], [2, 8], [5]])
IDS = [11, 21, 22, 23, 31, 32]


def test_padding_keeps_real_rows_and_puts_dummies_on_the_scratch_page() -> None:
    padded = pad_step(REAL, IDS, GraphShape(4, 4), SCRATCH)
    lay = padded.layout
    assert lay.q_lens == [1, 3, 2, 1, 10]  # 4 x 4 + 1 = 17 tokens: the slack row takes 10
    assert lay.kv_starts == [9, 5, 0, 0, 0]
    assert lay.page_tables[:3] == REAL.page_tables
    assert lay.page_tables[3:] == [[SCRATCH], [SCRATCH] * 3]
    assert padded.ids.tolist() == IDS + [0] * 11
    assert padded.positions.tolist() == [9, 5, 6, 7, 0, 1, 0, *range(10)]
    assert padded.last.tolist() == [0, 3, 5, 6]  # one logits row per batch row


def test_padded_rows_write_only_the_scratch_page() -> None:
    """The KV slots flashinfer writes: the real tokens' are the unpadded step's, every
    other token's is in the scratch page, so no request's pages are touched."""
    unpadded = plan_arrays(REAL)["write_slots"]
    for shape in (GraphShape(4, 4), GraphShape(8, 8), GraphShape(3, 8)):
        slots = plan_arrays(pad_step(REAL, IDS, shape, SCRATCH).layout)["write_slots"]
        assert slots[: len(IDS)].tolist() == unpadded.tolist()
        assert set((slots[len(IDS) :] // PS).tolist()) == {SCRATCH}


def test_decode_padding_fills_the_batch_with_one_token_dummies() -> None:
    real = step([1, 1], [4, 0], [[6, 2], [0]])
    padded = pad_step(real, [5, 6], GraphShape(4, 1), SCRATCH)
    assert padded.layout.q_lens == [1, 1, 1, 1]
    assert padded.layout.page_tables == [[6, 2], [0], [SCRATCH], [SCRATCH]]
    assert padded.positions.tolist() == [4, 0, 0, 0]
    assert padded.last.tolist() == [0, 1, 2, 3]


def test_a_full_extend_bucket_still_has_its_slack_row() -> None:
    real = step([2, 2], [0, 6], [[1], [4, 3]])
    padded = pad_step(real, [1, 2, 3, 4], GraphShape(2, 2), SCRATCH)
    assert padded.layout.q_lens == [2, 2, 1]  # 2 x 2 + 1 tokens, 3 rows, whatever the step
    assert padded.last.tolist() == [1, 3]


def test_a_step_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit graph"):
        pad_step(REAL, IDS, GraphShape(2, 4), SCRATCH)


def test_plan_arrays_describe_a_full_last_page() -> None:
    # Row 0 ends exactly at a page boundary (8 tokens = 2 full pages of 4).
    lay = step([1, 3], [7, 0], [[4, 6], [9]])
    a = plan_arrays(lay)
    assert a["qo_indptr"].tolist() == [0, 1, 4]
    assert a["kv_indptr"].tolist() == [0, 2, 3]
    assert a["kv_indices"].tolist() == [4, 6, 9]
    assert a["last_page_len"].tolist() == [4, 3]
    assert a["write_slots"].tolist() == [6 * PS + 3, 9 * PS, 9 * PS + 1, 9 * PS + 2]
    assert all(v.dtype == np.int32 for k, v in a.items() if k != "write_slots")
