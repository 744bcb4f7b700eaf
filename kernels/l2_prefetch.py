"""L2 prefetch hints (PTX, sm_90+): bytes a later read will need, requested early so their DRAM latency overlaps other
work. A hint changes no result: L2 is where every SM's reads and writes meet, so a line written after its prefetch
is read as written. The CPU interpreter has no PTX: callers pass their PREFETCH switches off there.

* `prefetch_lines`: one `prefetch.global.L2` per pointer (a 128-byte line each), e.g. the decode attention's first
  key tiles before its PDL wait.
* `prefetch_chunks`: a launch of its own that asks L2 for whole tensors, listed in a `chunk_table` (each program one
  chunk of lines). The decode graph runs it on a side stream, a layer ahead of the kernels that read those weights
  (`flint_engine.weights_ahead`), so their reads meet L2 instead of DRAM without any kernel of the step waiting.

A bulk `cp.async.bulk.prefetch.L2` of the routed experts' weights from the router's top-k program was measured far
slower on the H200 (2026-12-01) and removed: see docs/performance.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE = 128  # bytes a prefetch asks for
CHUNK_LINES = 256  # lines a `prefetch_chunks` program asks for (32 KB)


@triton.jit
def prefetch_lines(ptrs):
    """Ask for the 128-byte lines at `ptrs` in L2 (no registers held, no result)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


def chunk_table(tensors: list[torch.Tensor], device: torch.device, lines: int = CHUNK_LINES) -> torch.Tensor:
    """The 128-byte lines holding `tensors` (each a dense block of memory) as chunks of at most `lines` lines:
    int64 [chunks, 2] of (address of the first line, lines), on `device`, for `prefetch_chunks`."""
    rows: list[tuple[int, int]] = []
    for t in tensors:
        if t.numel() == 0:
            continue
        if not t.is_contiguous():
            raise ValueError(f"cannot prefetch a strided tensor {tuple(t.shape)} as one block of lines")
        first = t.data_ptr() // LINE * LINE
        count = -(-(t.data_ptr() + t.numel() * t.element_size() - first) // LINE)
        rows += [(first + i * LINE, min(lines, count - i)) for i in range(0, count, lines)]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 2).to(device)


@triton.jit
def _ask(addresses, record_ptr, slot, RECORD: tl.constexpr):
    """Prefetch the lines at int64 `addresses`; with RECORD, store the addresses at `record_ptr + slot` instead (the
    interpreter's tests: it has no PTX)."""
    if RECORD:
        tl.store(record_ptr + slot, addresses)
    else:
        prefetch_lines(addresses.to(tl.pointer_type(tl.int8)))


@triton.jit
def _prefetch_chunks_kernel(table_ptr, LINES: tl.constexpr):
    """Program p asks L2 for the lines of chunk p of the table (`chunk_table`); a short chunk repeats its last line."""
    p = tl.program_id(0).to(tl.int64)
    first = tl.load(table_ptr + 2 * p)
    count = tl.load(table_ptr + 2 * p + 1)
    line = tl.minimum(tl.arange(0, LINES).to(tl.int64), count - 1)
    prefetch_lines((first + line * 128).to(tl.pointer_type(tl.int8)))


def no_prefetch(table: torch.Tensor) -> None:
    """`prefetch_chunks`'s reference: a hint changes no result, so without it nothing happens."""


def prefetch_chunks(table: torch.Tensor) -> None:
    """Ask L2 for every line of `table` (`chunk_table`), one program a chunk; no result, launched without PDL (it
    waits for nothing but what its stream orders before it). CUDA sm_90+ only: the hint is PTX."""
    if table.shape[0] == 0:
        return
    _prefetch_chunks_kernel[(table.shape[0],)](table, LINES=CHUNK_LINES, num_warps=4)


def indexed_table(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """For `prefetch_indexed`: each tensor [E, ...] (contiguous) as (address, bytes between rows of dim 0, lines a
    row spans, E), int64 [len(tensors), 4] on `device`."""
    rows = []
    for t in tensors:
        if not t.is_contiguous() or t.dim() < 1:
            raise ValueError(f"cannot prefetch rows of a strided or 0-d tensor {tuple(t.shape)}")
        stride = t.stride(0) * t.element_size()
        # One line more than the row needs when its rows do not start on a line.
        lines = -(-stride // LINE) + (1 if (t.data_ptr() % LINE or stride % LINE) else 0)
        rows.append((t.data_ptr(), stride, lines, t.shape[0]))
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 4).to(device)


@triton.jit
def _prefetch_indexed_kernel(index_ptr, table_ptr, record_ptr, LINES: tl.constexpr, RECORD: tl.constexpr):
    """Program (i, r, c): lines [c * LINES, (c + 1) * LINES) of row index[i] of the table's tensor r (none for an
    index outside its rows)."""
    i = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2).to(tl.int64)
    row = tl.load(index_ptr + i).to(tl.int64)
    base = tl.load(table_ptr + 4 * r)
    stride = tl.load(table_ptr + 4 * r + 1)
    count = tl.load(table_ptr + 4 * r + 2)
    rows = tl.load(table_ptr + 4 * r + 3)
    start = c * LINES
    if row >= 0 and row < rows and start < count:
        k = tl.arange(0, LINES).to(tl.int64)
        first = (base + row * stride) // 128 * 128
        # This row's own lines (`count` is the most any row spans).
        line = tl.minimum(start + k, (base + row * stride + stride - 1) // 128 - first // 128)
        slot = ((i * tl.num_programs(1) + r) * tl.num_programs(2) + c) * LINES + k
        _ask(first + line * 128, record_ptr, slot, RECORD)


def prefetch_indexed(
    index: torch.Tensor, table: torch.Tensor, row_lines: int, record: torch.Tensor | None = None
) -> None:
    """Ask L2 for row index[i] (any int dtype; outside the tensor's rows: none) of each tensor of `table`
    (`indexed_table`), whose rows span at most `row_lines` lines, e.g. the experts a router picked. CUDA sm_90+ only;
    `record` (int64, one slot a program and line, zeros) takes the addresses instead (tests)."""
    n = index.numel()
    if n == 0 or table.shape[0] == 0:
        return
    grid = (n, table.shape[0], triton.cdiv(row_lines, CHUNK_LINES))
    rec = record if record is not None else table
    _prefetch_indexed_kernel[grid](
        index.reshape(-1), table, rec, LINES=CHUNK_LINES, RECORD=record is not None, num_warps=4
    )


@triton.jit(do_not_specialize=["k_addr", "v_addr", "num_seqs", "window", "max_blocks"])
def _prefetch_kv_kernel(
    tables_ptr, seq_lens_ptr, record_ptr, k_addr, v_addr, num_seqs, stride_table, window, max_blocks,
    CACHE_BLOCK: tl.constexpr, BLOCK_LINES: tl.constexpr, BLOCKS: tl.constexpr, RECORD: tl.constexpr,
):  # fmt: skip
    """Program (s, j): K and V lines of BLOCKS of sequence s's last `max_blocks` cache blocks (within `window` keys
    when it is > 0), counted back from its newest; a freed block (-1) is replaced by the newest."""
    s = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    n = tl.load(seq_lens_ptr + s)
    if n > 0:
        last = (n - 1) // CACHE_BLOCK
        lowest = tl.maximum(last - max_blocks + 1, 0)
        if window > 0:
            lowest = tl.maximum(lowest, tl.maximum(n - window, 0) // CACHE_BLOCK)
        b = last - (j * BLOCKS + tl.arange(0, BLOCKS))
        b = tl.where(b >= lowest, b, last)
        newest = tl.load(tables_ptr + s * stride_table + last).to(tl.int64)
        blk = tl.load(tables_ptr + s * stride_table + b).to(tl.int64)
        blk = tl.where(blk >= 0, blk, newest)
        k = tl.arange(0, BLOCK_LINES).to(tl.int64)
        offs = blk[:, None] * (BLOCK_LINES * 128) + k[None, :] * 128
        slot = ((s * tl.num_programs(1) + j) * 2 * BLOCKS + tl.arange(0, BLOCKS)[:, None]) * BLOCK_LINES + k[None, :]
        _ask(k_addr + offs, record_ptr, slot, RECORD)
        _ask(v_addr + offs, record_ptr, slot + BLOCKS * BLOCK_LINES, RECORD)


def prefetch_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_blocks: int,
    window: int | None,
    record: torch.Tensor | None = None,
) -> None:
    """Ask L2 for the K and V blocks [num_blocks, block_size, Hkv, D] of each sequence's newest `max_blocks` cache
    blocks (only those within `window` keys of its end for a sliding layer), from its block table row; a sequence of
    length 0 asks for nothing. CUDA sm_90+ only; `record` (int64, one slot a program and line) takes the addresses
    instead (tests)."""
    num_seqs = seq_lens.shape[0]
    block_bytes = k_cache[0].numel() * k_cache.element_size()
    dense = k_cache.stride(0) * k_cache.element_size() == block_bytes and v_cache.stride() == k_cache.stride()
    on_lines = (k_cache.data_ptr() | v_cache.data_ptr() | block_bytes) % LINE == 0
    if num_seqs == 0 or max_blocks <= 0 or not dense or not on_lines:
        return
    blocks = 4
    per_seq = min(max_blocks, block_tables.shape[1])
    grid = (num_seqs, triton.cdiv(per_seq, blocks))
    _prefetch_kv_kernel[grid](
        block_tables, seq_lens, record if record is not None else seq_lens, k_cache.data_ptr(), v_cache.data_ptr(),
        num_seqs, block_tables.stride(0), window or 0, per_seq, CACHE_BLOCK=k_cache.shape[1],
        BLOCK_LINES=block_bytes // LINE, BLOCKS=blocks, RECORD=record is not None, num_warps=4,
    )  # fmt: skip


def kv_program_count(block_tables: torch.Tensor, seq_lens: torch.Tensor, max_blocks: int) -> int:
    """Programs `prefetch_kv` launches (for sizing its `record`)."""
    return seq_lens.shape[0] * triton.cdiv(min(max_blocks, block_tables.shape[1]), 4)
