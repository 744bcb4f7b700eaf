"""The side stream's L2 prefetch kernels (`flint_kernels.l2_prefetch`): which lines each asks for, from the addresses
its record mode writes instead of the PTX hint (the interpreter has no PTX; tests on a GPU run them for real through
the decode graphs, tests/test_weights_ahead.py; `prefetch_chunks` keeps the signature its manifest entry was recorded
with, so it has no record mode). A prefetch changes no result, so the lines are what there is to
check: every line of what the next kernels read, and nothing outside the tensors."""

from __future__ import annotations

import pytest
import torch
from flint_kernels import l2_prefetch as lp

LINE = lp.LINE


def _lines(t: torch.Tensor) -> set[int]:
    first = t.data_ptr() // LINE * LINE
    return set(range(first, t.data_ptr() + t.numel() * t.element_size(), LINE))


def _on_lines(shape: tuple[int, ...]) -> torch.Tensor:
    """Random FP32 values starting on a 128-byte line, as every CUDA allocation does (a CPU one need not)."""
    n = torch.Size(shape).numel()
    buf = torch.empty(n + LINE // 4)
    skip = (-buf.data_ptr() % LINE) // 4
    return buf[skip : skip + n].view(shape).normal_()


def _asked(record: torch.Tensor) -> set[int]:
    return {a for a in record.tolist() if a != 0}


def test_indexed_rows_are_the_picked_experts_whole() -> None:
    """The routed experts' rows of each tensor (codes and scales of another width), an index out of range or
    negative asking for nothing."""
    codes = torch.randint(0, 255, (9, 64, 40), dtype=torch.uint8)  # 2,560-byte rows: 20 lines
    scales = torch.randn(9, 300)  # 1,200-byte rows, not on line boundaries
    table = lp.indexed_table([codes, scales], torch.device("cpu"))
    assert table[:, 3].tolist() == [9, 9] and table[:, 1].tolist() == [2560, 1200]
    ids = torch.tensor([[4, 0], [8, 11], [-1, 4]])
    row_lines = int(table[:, 2].max())
    grid = ids.numel() * table.shape[0] * -(-row_lines // lp.CHUNK_LINES)
    record = torch.zeros(grid * lp.CHUNK_LINES, dtype=torch.int64)
    lp.prefetch_indexed(ids, table, row_lines, record)
    want = set().union(*(_lines(t[e]) for e in (0, 4, 8) for t in (codes, scales)))
    assert _asked(record) == want


@pytest.mark.parametrize("window", [None, 40])
def test_kv_blocks_are_each_sequences_newest_within_its_window(window: int | None) -> None:
    """Each sequence's newest `max_blocks` blocks of K and V (from its block table row, the window's bound for a
    sliding layer), none for an empty sequence; a freed block (-1) asks for the newest instead."""
    bs, num_blocks = 16, 40
    k, v = _on_lines((num_blocks, bs, 2, 8)), _on_lines((num_blocks, bs, 2, 8))  # 1,024-byte blocks: 8 lines
    g = torch.Generator().manual_seed(3)
    tables = torch.randperm(num_blocks, generator=g)[:32].reshape(4, 8).to(torch.int32)
    tables[3, 2] = -1  # freed (asked for only without a window)
    seq_lens = torch.tensor([0, 5, 70, 120], dtype=torch.int32)
    max_blocks = 6
    record = torch.zeros(lp.kv_program_count(tables, seq_lens, max_blocks) * 2 * 4 * 8, dtype=torch.int64)
    lp.prefetch_kv(k, v, tables, seq_lens, max_blocks, window, record)
    want: set[int] = set()
    for s, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        last = (n - 1) // bs
        lowest = max(last - max_blocks + 1, 0)
        if window:
            lowest = max(lowest, max(n - window, 0) // bs)
        for b in range(lowest, last + 1):
            blk = int(tables[s, b]) if int(tables[s, b]) >= 0 else int(tables[s, last])
            want |= _lines(k[blk]) | _lines(v[blk])
    assert _asked(record) == want
    # Blocks: 1 + 5 + 6 without a window (one of the 6 freed, so the newest twice), 1 + 4 + 3 within 40 keys.
    assert len(want) == 2 * 8 * (11 if window is None else 8)


def test_kv_of_a_cache_off_its_lines_asks_for_nothing() -> None:
    k = _on_lines((9, 16, 2, 8))
    shifted = torch.empty(k.numel() + 1)[1:].view(k.shape)  # 4 bytes past a line
    tables = torch.arange(9, dtype=torch.int32)[None]
    record = torch.zeros(64 * 8, dtype=torch.int64)
    lp.prefetch_kv(shifted, shifted, tables, torch.tensor([100], dtype=torch.int32), 4, None, record)
    assert not _asked(record)
    lp.prefetch_kv(k, k, tables, torch.tensor([100], dtype=torch.int32), 4, None, record)
    assert len(_asked(record)) == 4 * 8
