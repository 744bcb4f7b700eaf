"""Grouping the prefill MoE's pairs by expert in three Triton launches instead of ~25 PyTorch ones.

`align` serves the Triton grouped kernels (blocks of BLOCK_M pairs of one expert); `sort` the grouped GEMM of
`moe_grouped_gemm` (each sorted row's token, each pair's row, each expert's end row), with the same launches.

`align_ref` (moe_align.py) sorts with a stable argsort, counts with scatter_add and finds each block's expert with
cumsums and a searchsorted: on the H200 ~25 launches and ~150 us a layer at 8K tokens (radix sort passes, scans,
index kernels). Here: (1) every pair adds 1 to its expert's count (atomics); (2) one program turns the counts into
each expert's first sorted row and block range, and finds each block's expert by a binary search over the block
ends; (3) every pair takes the next row of its expert's range (atomics) and writes its index there.

The order of pairs within one expert then depends on scheduling, unlike the stable reference; nothing computed from
it does: the grouped GEMM's rows are independent (each pair's h and y land at the pair's own index, and the slots
are summed in slot order), so the MoE's output is the same bit for bit. The block table (`meta`) equals the
reference's exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_align import max_blocks
from .pdl import launch_options, pdl_entry

_BLOCK = 1024  # pairs per program of the count and scatter launches
_CHUNK = 1024  # blocks per step of the block-table program


# The pair and block counts change with every batch: not specialised on, so no batch compiles a new variant.
@triton.jit(do_not_specialize=["P"])
def _count_kernel(ids_ptr, counts_ptr, P, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """counts[e] += pairs routed to e (counts zeroed by the caller)."""
    pdl_entry(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    e = tl.load(ids_ptr + offs, mask=ok, other=0).to(tl.int32)
    tl.atomic_add(counts_ptr + e, 1, mask=ok, sem="relaxed")


@triton.jit
def _block_table(
    counts, start, nblocks, block_end, scratch_ptr, meta_ptr, E, n_blocks, BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr, STEPS: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """meta[b] = (expert, first row, rows) for every block b of `nblocks` [E_PAD] an expert (their running sum
    `block_end`; BLOCK_M rows each, an expert's last as many as it has left), the expert found by a binary search for
    the first block end above b (searchsorted, right); blocks past the total hold 0 rows."""
    ex = tl.arange(0, E_PAD)
    e_ok = ex < E
    # The per-expert values the blocks gather, by expert: block ends, first blocks, first rows, counts.
    tl.store(scratch_ptr + ex, block_end, mask=e_ok)
    tl.store(scratch_ptr + E_PAD + ex, block_end - nblocks, mask=e_ok)
    tl.store(scratch_ptr + 2 * E_PAD + ex, start, mask=e_ok)
    tl.store(scratch_ptr + 3 * E_PAD + ex, counts, mask=e_ok)
    tl.debug_barrier()  # the stores above are read back by other threads of this program
    for b0 in range(0, n_blocks, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        b_ok = b < n_blocks
        lo = tl.zeros((CHUNK,), dtype=tl.int32)
        hi = tl.zeros((CHUNK,), dtype=tl.int32) + E
        for _ in tl.static_range(STEPS):  # lo = the first expert whose block end is above b (E if none)
            active = lo < hi
            mid = (lo + hi) // 2
            right = tl.load(scratch_ptr + mid, mask=active, other=0) <= b
            lo = tl.where(active & right, mid + 1, lo)
            hi = tl.where(active & ~right, mid, hi)
        valid = lo < E
        e = tl.minimum(lo, E - 1)
        j = b - tl.load(scratch_ptr + E_PAD + e)
        row0 = tl.load(scratch_ptr + 2 * E_PAD + e) + j * BLOCK_M
        rows = tl.minimum(tl.maximum(tl.load(scratch_ptr + 3 * E_PAD + e) - j * BLOCK_M, 0), BLOCK_M)
        rows = tl.where(valid, rows, 0)
        tl.store(meta_ptr + b * 3, e, mask=b_ok)
        tl.store(meta_ptr + b * 3 + 1, row0, mask=b_ok)
        tl.store(meta_ptr + b * 3 + 2, rows, mask=b_ok)


@triton.jit(do_not_specialize=["n_blocks"])
def _blocks_kernel(
    counts_ptr, cursor_ptr, scratch_ptr, meta_ptr, E, n_blocks, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr,
    STEPS: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program: cursor[e] = e's first sorted row; meta = `_block_table` of blocks of BLOCK_M rows."""
    pdl_entry(PDL)
    ex = tl.arange(0, E_PAD)
    e_ok = ex < E
    counts = tl.load(counts_ptr + ex, mask=e_ok, other=0)
    nblocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(nblocks, axis=0)
    start = tl.cumsum(counts, axis=0) - counts
    tl.store(cursor_ptr + ex, start, mask=e_ok)
    _block_table(counts, start, nblocks, block_end, scratch_ptr, meta_ptr, E, n_blocks, BLOCK_M, E_PAD, STEPS, CHUNK)


@triton.jit(do_not_specialize=["P"])
def _scatter_kernel(ids_ptr, cursor_ptr, order_ptr, P, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """order[next row of e's range] = p for every pair p routed to e."""
    pdl_entry(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    e = tl.load(ids_ptr + offs, mask=ok, other=0).to(tl.int32)
    row = tl.atomic_add(cursor_ptr + e, 1, mask=ok, sem="relaxed")
    tl.store(order_ptr + row, offs.to(tl.int64), mask=ok)


@triton.jit(do_not_specialize=["P"])
def _rank_kernel(ids_ptr, cursor_ptr, src_ptr, pos_ptr, P, TOPK: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """For every pair p routed to e: its row r = the next of e's range; src[r] = p's token, pos[p] = r."""
    pdl_entry(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    e = tl.load(ids_ptr + offs, mask=ok, other=0).to(tl.int32)
    row = tl.atomic_add(cursor_ptr + e, 1, mask=ok, sem="relaxed")
    tl.store(src_ptr + row, (offs // TOPK).to(tl.int64), mask=ok)
    tl.store(pos_ptr + offs, row.to(tl.int64), mask=ok)


def _flat(topk_ids: torch.Tensor) -> torch.Tensor:
    ids = topk_ids.reshape(-1)
    return ids if ids.is_contiguous() else ids.contiguous()


def _cursors(ids: torch.Tensor, num_experts: int, meta: torch.Tensor | None = None, block_m: int = 1) -> torch.Tensor:
    """Each expert's first sorted row (int32 [E]) from one memset and two launches (the counts, then the block-table
    program, which also fills `meta` [B, 3] for blocks of `block_m` rows when given); the rank or scatter launch then
    moves each cursor past its expert's rows."""
    e_pad = triton.next_power_of_2(num_experts)
    # counts | cursors | scratch (4 rows of e_pad): one allocation, one memset.
    work = torch.zeros(2 * num_experts + 4 * e_pad, dtype=torch.int32, device=ids.device)
    counts, cursor, scratch = work[:num_experts], work[num_experts : 2 * num_experts], work[2 * num_experts :]
    p = ids.numel()
    if p == 0:
        return cursor
    opts = launch_options(ids.device)
    _count_kernel[(triton.cdiv(p, _BLOCK),)](ids, counts, p, BLOCK=_BLOCK, num_warps=4, **opts)
    # With no block table asked for, the block-table program only sets each expert's first row.
    _blocks_kernel[(1,)](
        counts, cursor, scratch, scratch if meta is None else meta, num_experts, 0 if meta is None else meta.shape[0],
        BLOCK_M=block_m, E_PAD=e_pad, STEPS=num_experts.bit_length(), CHUNK=_CHUNK, num_warps=4, **opts,
    )  # fmt: skip
    return cursor


def sort(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sort_ref`'s (src, pos, offs) in four launches (a memset, the counts, the first rows, the ranks); within an
    expert the rows' order may differ from the stable reference's."""
    ids = _flat(topk_ids)
    p = ids.numel()
    src = torch.empty(p, dtype=torch.int64, device=ids.device)
    pos = torch.empty(p, dtype=torch.int64, device=ids.device)
    cursor = _cursors(ids, num_experts)
    if p:
        _rank_kernel[(triton.cdiv(p, _BLOCK),)](
            ids, cursor, src, pos, p, TOPK=topk_ids.shape[-1], BLOCK=_BLOCK, num_warps=4, **launch_options(ids.device)
        )
    return src, pos, cursor  # each cursor has moved past its expert's last row: the end rows


def sort_blocks(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sort`'s (src, pos) with `align`'s block table over the sorted rows: meta int32 [B, 3] = (expert, first sorted
    row, rows) per block of at most `block_m` rows of one expert, B = `max_blocks` (the rest hold 0 rows)."""
    ids = _flat(topk_ids)
    p = ids.numel()
    src = torch.empty(p, dtype=torch.int64, device=ids.device)
    pos = torch.empty(p, dtype=torch.int64, device=ids.device)
    meta = torch.empty((max_blocks(p, num_experts, block_m), 3), dtype=torch.int32, device=ids.device)
    if p:
        cursor = _cursors(ids, num_experts, meta, block_m)
        _rank_kernel[(triton.cdiv(p, _BLOCK),)](
            ids, cursor, src, pos, p, TOPK=topk_ids.shape[-1], BLOCK=_BLOCK, num_warps=4, **launch_options(ids.device)
        )
    return src, pos, meta


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`align_ref`'s (order, meta, blocks) from Triton launches; within an expert the pairs' order may differ."""
    ids = _flat(topk_ids)
    p = ids.numel()
    n_blocks = max_blocks(p, num_experts, block_m)
    order = torch.empty(p, dtype=torch.int64, device=ids.device)
    meta = torch.empty((n_blocks, 3), dtype=torch.int32, device=ids.device)
    if p:
        cursor = _cursors(ids, num_experts, meta, block_m)
        _scatter_kernel[(triton.cdiv(p, _BLOCK),)](
            ids, cursor, order, p, BLOCK=_BLOCK, num_warps=4, **launch_options(ids.device)
        )
    return order, meta, n_blocks
