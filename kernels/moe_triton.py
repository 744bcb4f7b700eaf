"""Triton routed experts (SwiGLU, routing weight after the down projection) with `moe_ref`'s numerics.

Per (token, slot) pair p = t * k + s with expert e: gate|up = x[t] @ w13[e]^T (FP32 accumulation, per-segment
global scale, each rounded to x.dtype), h = round(round(silu(gate)) * up), y = round(h @ w2[e]^T * scale), and
out[t] = round(sum over s in slot order of FP32(y) * topk_weights[t, s]). The shared expert stays separate.

Decode (up to `MoEPaths.decode_max_tokens`, 32-64 tokens from the H200's crossovers): no sorting at all. Kernel 1
runs one program per (pair, I-tile[, K split]) and fuses SiLU-and-mul into its epilogue, writing h [T*k, I]; kernel
2 runs one program per (pair, H-tile) and reduces the k slots of a token in the same launch, deterministically: each
slot stores its weighted FP32 product to a workspace and the program that arrives last on the (token, H-tile)
counter sums the k products in slot order and rounds once (`split_k_triton`'s semaphore with the slot as the
split index). NVFP4 pairs use the FMA GEMV of `gemv_triton` (BLOCK_M = 1); BF16 pairs use tensor cores (16-row
tiles, one real row), which measured faster. With `MoEConfig.expert_major` (NVFP4, shared expert apart; the H200
table from 33 tokens) kernel 1 runs expert-major instead: one program per (I-tile, expert) finds the expert's pairs
in the ids with a cumsum and decodes each weight once for two of them at a time (an odd last pair on the one-row
path), which the sm_90 SASS puts at ~3.2 instructions per weight and token against ~5 per pair. Expert-major tiles
on tensor cores (`use_dot`, shared expert apart) run the prefill's grouped launches below instead, their blocks
found in the unsorted ids (program (tile, expert, chunk) ranks the expert's pairs with a cumsum; empty blocks return
at once), so each expert's weights are read once per tile for all its pairs, with no sort launches; the sum over
slots is the reduce launch, or with `MoEConfig.slots_in_down` the down launch itself (a counter per token and output
tile, the last arrival adds the slots in order), which then also folds the shared expert in at any decode size: its
blocks of BLOCK_M tokens come first in both launches and arrive as one more slot, added after the routed sum is
rounded. (On the H200 that measured slower than the reduce launch with the shared expert apart, BF16 b32 16.0 vs
13.7 ms, so no table sets it. Keeping the reduce launch, with those blocks' rounded output stored after the pairs'
y for it to add, lost too: BF16 b32 12.87 -> 14.19 ms, thirty-sixth session; removed.)

Prefill: pairs are grouped by expert on the device (`moe_align_triton`: counts, each expert's rows and a
shape-bounded number of blocks, each mapped to its expert and row range; blocks past the real total do nothing), so
no host sync happens. A grouped GEMM with tl.dot computes each block of up to BLOCK_M pairs of one expert against
that expert's weight tile (NVFP4 decoded in registers), with the SiLU-and-mul epilogue for gate|up and the rounded
expert output y [T*k, H] for down; a last kernel sums each token's k slots in slot order and adds the shared
expert's output (run apart) in x's dtype. Every result is independent of scheduling, so both paths are
deterministic and CUDA-graph capturable. Two other prefill paths take batches by the table's token thresholds
(`MoEPaths`): torch's grouped GEMM (`moe_grouped_gemm`, CUTLASS) first, then the TMA-fed tensor-core launches of
`moe_grouped_tma_triton` (gate_up with SiLU-and-mul in its epilogue, down; BF16 experts or NVFP4's BF16 copies).
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import torch
import triton
import triton.language as tl

from . import (
    activation_triton,
    gemv_triton,
    moe_down_slots_triton,
    moe_grouped_gemm,
    moe_grouped_tma_triton,
    rmsnorm_triton,
    tuning,
)
from .configs import MoEConfig, MoEPaths
from .gemv_triton import (
    _INTERPRET,
    NORM_MAX_N,
    _finish_row,
    decode_mode,
    fma_weights,
    nvfp4_group_dot,
    nvfp4_x8,
    precision_for,
    tile_matmul,
)
from .linear import NVFP4Weight, ScaledWeight, Weight
from .moe import SharedExpert, moe_add_rms_norm_ref, moe_ref
from .moe_align_triton import align
from .nvfp4_decode_triton import MAX_SEGMENTS, segment_bounds, segment_scale
from .pdl import launch_options, pdl_entry
from .split_k_triton import COUNTER_SLOTS, choose_split_k, counters, is_last, split_k_arrive, split_k_reduce

# Portable defaults of `paths_config` (the H200's measured crossovers; its table records them).
# Up to this many tokens the per-pair decode kernels run; above it the sorted grouped GEMM.
DECODE_MAX_TOKENS_BF16 = 32
DECODE_MAX_TOKENS_NVFP4 = 64
# Up to this many tokens the shared expert runs inside the decode launches. Folded, each token reads the shared
# weights on its own (no reuse across tokens), so at some batch three separate launches that read them once win.
# Measured on the H200 up to 8 tokens (see kernels/tuning/nvidia-h200.json); the crossover between 8 and 32 is not
# measured yet.
SHARED_FOLD_MAX_TOKENS_BF16 = 8
SHARED_FOLD_MAX_TOKENS_NVFP4 = 16


@triton.jit
def _pair_rows(ids_ptr, order_ptr, meta_ptr, pid_r, GROUPED: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, pair indices [BLOCK_M], valid mask) of program row `pid_r`: one pair, or one expert block."""
    r = tl.arange(0, BLOCK_M)
    if GROUPED:
        e = tl.load(meta_ptr + pid_r * 3)
        row0 = tl.load(meta_ptr + pid_r * 3 + 1)
        nrows = tl.load(meta_ptr + pid_r * 3 + 2)
        m_ok = r < nrows
        pairs = tl.load(order_ptr + row0 + r, mask=m_ok, other=0)
    else:
        e = tl.load(ids_ptr + pid_r)
        m_ok = r == 0
        pairs = tl.zeros((BLOCK_M,), dtype=tl.int64) + pid_r
    return e.to(tl.int64), pairs.to(tl.int64), m_ok


@triton.jit
def _ranked_pairs(ids_ptr, e, first, n_pairs, P_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """(pair indices [BLOCK_M], count): the pairs routed to expert e ranked first .. first + BLOCK_M - 1 in pair
    order (0 past the last) and how many of the n_pairs it has, by scanning the ids (decode-sized) with a cumsum."""
    p = tl.arange(0, P_PAD)
    match = (tl.load(ids_ptr + p, mask=p < n_pairs, other=-1) == e).to(tl.int32)
    rank = tl.cumsum(match, axis=0) - 1
    r = first + tl.arange(0, BLOCK_M)
    hit = (match[:, None] > 0) & (rank[:, None] == r[None, :])
    return tl.sum(tl.where(hit, p[:, None], 0), axis=0).to(tl.int64), tl.sum(match, axis=0)


@triton.jit
def _expert_rows(ids_ptr, pid_r, n_pairs, chunks, P_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, pair indices [BLOCK_M], valid mask, any valid) of program row `pid_r` of the unsorted grouped
    launch: chunk pid_r % chunks of expert pid_r // chunks, i.e. that expert's pairs ranked chunk * BLOCK_M onward."""
    e = pid_r // chunks
    first = (pid_r % chunks) * BLOCK_M
    pairs, count = _ranked_pairs(ids_ptr, e, first, n_pairs, P_PAD, BLOCK_M)
    return e.to(tl.int64), pairs, first + tl.arange(0, BLOCK_M) < count, first < count


# Counts that change with every batch (pairs, chunks, shared rows) are not specialised on (== 1, multiple of 16):
# each new class would compile a variant while serving (flint_engine/late_compiles.py), for loop bounds and masks
# that gain nothing from it.
@triton.jit(do_not_specialize=["n_shared_rows", "n_pairs", "chunks"])
def _moe_gate_up_kernel(
    x_ptr,
    ids_ptr,
    order_ptr,
    meta_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    ws_ptr,
    cnt_ptr,
    H,
    INTER,
    TOPK,
    stride_xt,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_h,
    seg1,
    seg2,
    seg3,
    k_per_split,
    sw_ptr,
    ss_ptr,
    sgs_ptr,
    stride_swn,
    stride_ssn,
    sseg1,
    sseg2,
    sseg3,
    n_shared_rows,
    shared_parts,
    shared_inter,
    n_pairs,
    chunks,
    NVFP4: tl.constexpr,
    GSCALE: tl.constexpr,
    GROUPED: tl.constexpr,
    EXPERT: tl.constexpr,
    SHARED: tl.constexpr,
    EVEN_K: tl.constexpr,
    WORDS: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    P_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """h[p, j] = round(round(silu(gate_pj)) * up_pj) for the pairs of this program and BLOCK_I columns j.

    EXPERT (with GROUPED): program rows are (expert, chunk) blocks found in the unsorted ids (`_expert_rows`); a
    block without pairs returns at once.

    SHARED (decode sizes): the shared expert, cut into `shared_parts` INTER-wide parts per token, writes h rows
    token * parts + part (so each token's shared h is one contiguous row) and the routed pair p h row T * parts + p.
    Per-pair decode: program rows below `n_shared_rows` (= T * parts) are the shared expert, row v being token
    v // parts, part v % parts. EXPERT: the first parts * chunks rows are, row v being part v // chunks of the
    BLOCK_M tokens of chunk v % chunks; the expert blocks follow.
    """
    pid_i = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_k = tl.program_id(2)
    n_tokens = n_pairs // TOPK
    if EXPERT:
        pair_row = pid_r - shared_parts * chunks if SHARED else pid_r
    else:
        pair_row = pid_r - n_shared_rows if SHARED else pid_r
    # Routed programs need the router's expert ids (the previous kernel's) first, so they wait for the previous grid
    # (PDL) here; shared-expert programs use none of them and wait in `tile_matmul`, after their first weight loads.
    # (Waiting again there is a no-op.) The ids a shared program reads below are not used.
    if pair_row >= 0:
        pdl_entry(PDL)
    if EXPERT:
        e, pairs, m_ok, any_ok = _expert_rows(ids_ptr, tl.maximum(pair_row, 0), n_pairs, chunks, P_PAD, BLOCK_M)
        if pair_row >= 0:  # noqa: SIM102 (Triton returns early only from a plain if)
            if not any_ok:
                return
    else:
        e, pairs, m_ok = _pair_rows(ids_ptr, order_ptr, meta_ptr, tl.maximum(pair_row, 0), GROUPED, BLOCK_M)
    x_off = (pairs // TOPK) * stride_xt
    h_rows = pairs + n_tokens * shared_parts if SHARED else pairs
    w_base = w_ptr + e * stride_we
    s_base = s_ptr + e * stride_se
    gs_base = gs_ptr + e * stride_gse
    col0 = pid_r * 0
    up_off = INTER
    wn, sn = stride_wn, stride_sn
    b1, b2, b3 = seg1, seg2, seg3
    if SHARED:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton compiles them apart)
        if pair_row < 0:
            if EXPERT:
                toks = (pid_r % chunks) * BLOCK_M + tl.arange(0, BLOCK_M)
                m_ok = toks < n_tokens
                x_off = toks.to(tl.int64) * stride_xt
                h_rows = toks.to(tl.int64) * shared_parts + pid_r // chunks
                col0 = (pid_r // chunks) * INTER
            else:
                x_off = tl.zeros((BLOCK_M,), dtype=tl.int64) + (pid_r // shared_parts).to(tl.int64) * stride_xt
                h_rows = tl.zeros((BLOCK_M,), dtype=tl.int64) + pid_r
                col0 = (pid_r % shared_parts) * INTER
            w_base, s_base, gs_base = sw_ptr, ss_ptr, sgs_ptr
            up_off = shared_inter
            wn, sn = stride_swn, stride_ssn
            b1, b2, b3 = sseg1, sseg2, sseg3
    # 2*BLOCK_I weight rows: gate rows j then up rows I + j, so one x tile feeds both.
    r2 = tl.arange(0, 2 * BLOCK_I)
    j = pid_i * BLOCK_I + (r2 % BLOCK_I)
    rows = col0 + j + (r2 >= BLOCK_I).to(tl.int32) * up_off
    row_ok = j < INTER
    k_start = pid_k * k_per_split
    k_end = tl.minimum(H, k_start + k_per_split)
    acc = tile_matmul(
        w_base, s_base, rows.to(tl.int64), row_ok, x_ptr, x_off, m_ok,
        k_start, k_end, wn, sn, NVFP4, USE_DOT, PRECISION, EVEN_K, WORDS, 2 * BLOCK_I, BLOCK_M,
        BLOCK_K, PDL,
    )  # fmt: skip
    jj = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    store_ok = (jj < INTER)[:, None] & m_ok[None, :]
    if SPLIT_K > 1:
        tile = pid_r * tl.num_programs(0) + pid_i
        acc, arrived = split_k_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, m_ok, SPLIT_K, 2 * BLOCK_I, BLOCK_M)
        store_ok = store_ok & is_last(arrived, SPLIT_K, BLOCK_I)[:, None]
    if GSCALE:
        acc = acc * segment_scale(gs_base, rows, row_ok, b1, b2, b3)[:, None]
    _silu_mul_store(acc, h_ptr, h_rows, stride_h, jj, store_ok, BLOCK_I, BLOCK_M)


@triton.jit
def _silu_mul_store(acc, h_ptr, h_rows, stride_h, jj, store_ok, BLOCK_I: tl.constexpr, BLOCK_M: tl.constexpr):
    """h = round(round(silu(round(gate))) * round(up)) of the FP32 gate|up accumulator [2 BLOCK_I, BLOCK_M] (gate
    rows first), stored to h rows `h_rows`, columns jj: the reference rounds gate and up to the activation dtype,
    then silu, then the product."""
    xdt = h_ptr.dtype.element_ty
    y = acc.to(xdt)
    gate, up = tl.split(tl.permute(tl.reshape(y, (2, BLOCK_I, BLOCK_M)), (1, 2, 0)))
    g32 = gate.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(xdt)
    h = (act.to(tl.float32) * up.to(tl.float32)).to(xdt)
    tl.store(h_ptr + h_rows[None, :] * stride_h + jj[:, None], h, mask=store_ok)


@triton.jit
def _expert_pairs(ids_ptr, e, c0, P, P_PAD: tl.constexpr):
    """(pair c0, pair c0 + 1, count): the c0-th and next of the pairs routed to expert e (in pair order; 0 past the
    last) and how many of the P pairs it has (`_ranked_pairs` for two)."""
    pairs, count = _ranked_pairs(ids_ptr, e, c0, P, P_PAD, 2)
    two = tl.arange(0, 2)
    return tl.sum(tl.where(two == 0, pairs, 0), axis=0), tl.sum(tl.where(two == 1, pairs, 0), axis=0), count


@triton.jit
def _two_rows_nvfp4(
    w_base, s_base, rows, row_ok, x_ptr, xo0, xo1, H, stride_wn, stride_sn, EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`tile_matmul`'s NVFP4 FMA path for two x rows at once: each weight group's sixteen values are built once
    and multiplied into both rows, in the same order as for one row (the interpreter gives the
    one-row kernel's result bit for bit; on a GPU the compiler may order the final in-register sums differently).
    Returns two FP32 [BLOCK_N, 1]."""
    G: tl.constexpr = BLOCK_K // 16
    acc0 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        groups, sc = fma_weights(
            w_base, s_base, rows, row_ok, k0, H, stride_wn, stride_sn, True, EVEN_K, BLOCK_N, BLOCK_K
        )
        offs_g = k0 // 16 + tl.arange(0, G)
        a0, a1, a2, a3, a4, a5, a6, a7 = nvfp4_x8(x_ptr, xo0, offs_g, 0, H, EVEN_K)
        a8, a9, a10, a11, a12, a13, a14, a15 = nvfp4_x8(x_ptr, xo0, offs_g, 8, H, EVEN_K)
        b0, b1, b2, b3, b4, b5, b6, b7 = nvfp4_x8(x_ptr, xo1, offs_g, 0, H, EVEN_K)
        b8, b9, b10, b11, b12, b13, b14, b15 = nvfp4_x8(x_ptr, xo1, offs_g, 8, H, EVEN_K)
        # The two calls build the same codes from the same groups: the compiler keeps one copy (common
        # subexpressions), so each weight value is decoded once for both rows.
        acc0 += nvfp4_group_dot(groups, sc, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)
        acc1 += nvfp4_group_dot(groups, sc, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15)
    # 2**62 undoes the offset (exact), as in tile_matmul.
    out0 = tl.sum(acc0, axis=1, keep_dims=True) * 4.611686018427388e18
    return out0, tl.sum(acc1, axis=1, keep_dims=True) * 4.611686018427388e18


@triton.jit(do_not_specialize=["P"])
def _moe_gate_up_expert_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    H,
    INTER,
    TOPK,
    stride_xt,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_h,
    seg1,
    seg2,
    seg3,
    EVEN_K: tl.constexpr,
    P_PAD: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """`_moe_gate_up_kernel`'s decode path (NVFP4, no shared expert) expert-major: program (I-tile, expert e) finds
    e's pairs in the router's ids itself and computes their h rows two at a time, each weight decoded once for both
    (a last odd pair on the one-row path); an expert without pairs returns at once. The per-pair
    kernel's h (bit for bit in the interpreter; on the H200 a few roundings differ, see `_two_rows_nvfp4`)."""
    pid_i = tl.program_id(0)
    e = tl.program_id(1)
    pdl_entry(PDL)  # the ids are the router's, the previous kernel's
    p0, p1, count = _expert_pairs(ids_ptr, e, 0, P, P_PAD)
    if count == 0:
        return
    r2 = tl.arange(0, 2 * BLOCK_I)
    j = pid_i * BLOCK_I + (r2 % BLOCK_I)
    rows = (j + (r2 >= BLOCK_I).to(tl.int32) * INTER).to(tl.int64)  # gate rows j then up rows INTER + j
    row_ok = j < INTER
    e64 = e.to(tl.int64)
    w_base = w_ptr + e64 * stride_we
    s_base = s_ptr + e64 * stride_se
    scale = segment_scale(gs_ptr + e64 * stride_gse, rows, row_ok, seg1, seg2, seg3)[:, None]
    jj = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    one = tl.zeros((1,), dtype=tl.int64)
    col_ok = (jj < INTER)[:, None] & (one == 0)[None, :]
    for c0 in range(0, count, 2):
        if c0 > 0:
            p0, p1, count = _expert_pairs(ids_ptr, e, c0, P, P_PAD)
        xo0 = (p0 // TOPK) * stride_xt
        if c0 + 1 < count:
            acc0, acc1 = _two_rows_nvfp4(
                w_base, s_base, rows, row_ok, x_ptr, xo0, (p1 // TOPK) * stride_xt, H, stride_wn, stride_sn, EVEN_K,
                2 * BLOCK_I, BLOCK_K,
            )  # fmt: skip
            _silu_mul_store(acc0 * scale, h_ptr, one + p0, stride_h, jj, col_ok, BLOCK_I, 1)
            _silu_mul_store(acc1 * scale, h_ptr, one + p1, stride_h, jj, col_ok, BLOCK_I, 1)
        else:
            acc0 = tile_matmul(
                w_base, s_base, rows, row_ok, x_ptr, one + xo0, one == 0, 0, H, stride_wn, stride_sn,
                True, False, "tf32", EVEN_K, 0, 2 * BLOCK_I, 1, BLOCK_K, False,
            )  # fmt: skip
            _silu_mul_store(acc0 * scale, h_ptr, one + p0, stride_h, jj, col_ok, BLOCK_I, 1)


@triton.jit(do_not_specialize=["n_shared_tokens", "n_pairs", "chunks"])
def _moe_down_kernel(
    h_ptr,
    ids_ptr,
    order_ptr,
    meta_ptr,
    tw_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    H,
    INTER,
    stride_h,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_out,
    seg1,
    seg2,
    seg3,
    sw_ptr,
    ss_ptr,
    sgs_ptr,
    stride_swn,
    stride_ssn,
    sseg1,
    sseg2,
    sseg3,
    n_shared_tokens,
    shared_parts,
    shared_inter,
    res_ptr,
    nw_ptr,
    hn_ptr,
    res_out_ptr,
    row_cnt_ptr,
    eps,
    n_pairs,
    chunks,
    NVFP4: tl.constexpr,
    GSCALE: tl.constexpr,
    GROUPED: tl.constexpr,
    EXPERT: tl.constexpr,
    SLOTS_HERE: tl.constexpr,
    SHARED: tl.constexpr,
    EVEN_K: tl.constexpr,
    WORDS: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    TOPK: tl.constexpr,
    NSLOTS: tl.constexpr,
    NORM: tl.constexpr,
    N_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    P_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """y = round(h[p] @ w2[e]^T * scale). GROUPED: store y[p]. Else reduce the token's TOPK slots into out[t].
    EXPERT (with GROUPED): the blocks come from the unsorted ids, as in `_moe_gate_up_kernel`; with SLOTS_HERE too,
    the token's slots are reduced into out[t] in this launch (`_reduce_slots`) instead of by `_moe_reduce_kernel`.

    SHARED (decode only): program rows below `n_shared_tokens` are each token's shared expert (its h is the
    contiguous `shared_inter` columns at h row token * shared_parts), arriving as slot TOPK with weight 1; the last
    arrival rounds the routed sum, then adds the shared output and rounds again, as the reference's BF16 add.
    """
    # Decode (not GROUPED): the expert ids and routing weights read before `tile_matmul` waits for the previous grid
    # come from the router, which ran before the gate_up kernel and so has completed (a PDL kernel is launched only
    # once its predecessor has passed its own wait); the weights stream before the wait, h (gate_up's) after it.
    if GROUPED:
        pdl_entry(PDL)
    pid_n = tl.program_id(0)
    pid_r = tl.program_id(1)
    n_tokens = n_pairs // TOPK
    if EXPERT:
        pair_row = pid_r - chunks if SHARED else pid_r
    else:
        pair_row = pid_r - n_shared_tokens if SHARED else pid_r
    if EXPERT:
        e, pairs, m_ok, any_ok = _expert_rows(ids_ptr, tl.maximum(pair_row, 0), n_pairs, chunks, P_PAD, BLOCK_M)
        if pair_row >= 0:  # noqa: SIM102 (Triton returns early only from a plain if)
            if not any_ok:
                return
    else:
        e, pairs, m_ok = _pair_rows(ids_ptr, order_ptr, meta_ptr, tl.maximum(pair_row, 0), GROUPED, BLOCK_M)
    h_off = (pairs + n_tokens * shared_parts) * stride_h if SHARED else pairs * stride_h
    w_base = w_ptr + e * stride_we
    s_base = s_ptr + e * stride_se
    gs_base = gs_ptr + e * stride_gse
    k_len = INTER
    wn, sn = stride_wn, stride_sn
    b1, b2, b3 = seg1, seg2, seg3
    t = tl.maximum(pair_row, 0) // TOPK
    slot = tl.maximum(pair_row, 0) % TOPK
    if not GROUPED:
        weight = tl.load(tw_ptr + tl.maximum(pair_row, 0)).to(tl.float32)
    if SLOTS_HERE:  # per column: token, slot and routing weight of the block's pairs
        t_cols = pairs // TOPK
        slot_cols = pairs % TOPK
        w_cols = tl.load(tw_ptr + pairs, mask=m_ok, other=0.0).to(tl.float32)
    if SHARED:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton compiles them apart)
        if pair_row < 0:
            if EXPERT:  # the shared expert for the BLOCK_M tokens of chunk pid_r, arriving as slot TOPK
                toks = (pid_r * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
                m_ok = toks < n_tokens
                h_off = toks * shared_parts * stride_h
                t_cols = toks
                slot_cols = toks * 0 + TOPK
                w_cols = tl.full((BLOCK_M,), 1.0, tl.float32)
            else:
                h_off = tl.zeros((BLOCK_M,), dtype=tl.int64) + (pid_r * shared_parts).to(tl.int64) * stride_h
                t = pid_r
                slot = pid_r * 0 + TOPK
                weight = weight * 0.0 + 1.0
            w_base, s_base, gs_base = sw_ptr, ss_ptr, sgs_ptr
            k_len = shared_inter
            wn, sn = stride_swn, stride_ssn
            b1, b2, b3 = sseg1, sseg2, sseg3
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < H
    acc = tile_matmul(
        w_base, s_base, rows.to(tl.int64), row_ok, h_ptr, h_off, m_ok,
        0, k_len, wn, sn, NVFP4, USE_DOT, PRECISION, EVEN_K, WORDS, BLOCK_N, BLOCK_M, BLOCK_K,
        PDL and not GROUPED,
    )  # fmt: skip
    if GSCALE:
        acc = acc * segment_scale(gs_base, rows, row_ok, b1, b2, b3)[:, None]
    xdt = h_ptr.dtype.element_ty
    y = acc.to(xdt)
    store_ok = row_ok[:, None] & m_ok[None, :]
    if GROUPED and SLOTS_HERE:
        _reduce_slots(
            y, t_cols, slot_cols, w_cols, m_ok, rows, row_ok, ws_ptr, cnt_ptr, out_ptr, stride_out, pid_n, TOPK,
            NSLOTS, SHARED, BLOCK_N,
        )  # fmt: skip
    elif GROUPED:
        tl.store(out_ptr + pairs[None, :] * stride_out + rows[:, None], y, mask=store_ok)
    else:
        # The NSLOTS programs of one (token, H-tile) meet on one counter; the last sums in slot order.
        tile = t * tl.num_programs(0) + pid_n
        tile_base, offs, mask, arrived = split_k_arrive(
            y.to(tl.float32) * weight, ws_ptr, cnt_ptr, tile, slot, m_ok, NSLOTS, BLOCK_N, BLOCK_M
        )
        total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        extra = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if arrived == NSLOTS - 1:
            for s in range(TOPK):
                total += tl.load(tile_base + s * (BLOCK_N * BLOCK_M) + offs, mask=mask, other=0.0, cache_modifier=".cg")
            if SHARED:
                extra = tl.load(
                    tile_base + TOPK * (BLOCK_N * BLOCK_M) + offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
            tl.atomic_xchg(cnt_ptr + tile, 0)
        res = total.to(xdt)
        if SHARED:
            res = (res.to(tl.float32) + extra).to(xdt)
        out_ptrs = out_ptr + t.to(tl.int64) * stride_out + rows[:, None] + tl.zeros((1, BLOCK_M), dtype=tl.int64)
        tl.store(out_ptrs, res, mask=store_ok & is_last(arrived, NSLOTS, BLOCK_N)[:, None])
        if NORM:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton compiles them apart)
            # Token t's row is whole once its dn_tiles final stores have arrived: the last one adds and normalises.
            if arrived == NSLOTS - 1:
                ro = t.to(tl.int64) * stride_out
                _finish_row(
                    out_ptr + ro, res_ptr + ro, nw_ptr, hn_ptr + ro, res_out_ptr + ro, row_cnt_ptr + t, H, eps, N_PAD
                )


@triton.jit
def _reduce_slots(
    y, t, slot, weight, m_ok, rows, row_ok, ws_ptr, cnt_ptr, out_ptr, stride_out, pid_n, TOPK: tl.constexpr,
    NSLOTS: tl.constexpr, SHARED: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[t, rows] = round(sum over s < TOPK in slot order of FP32(y_s) * w_s) for the tokens t of this block's
    columns, in the down launch; with SHARED the shared expert's y arrives as slot TOPK (weight 1) and is added to
    the rounded sum, rounding again (the reference's BF16 add). Each column stores its weighted FP32 product to its
    slot of the (token, H-tile) workspace, then arrives on that tile's counter (CTA barrier, acq_rel increments,
    one a column); where a column's arrival is the token's last (NSLOTS in all), this program adds the products in
    slot order, stores the row tile and resets the counter. A block's columns belong to distinct tokens (a token's
    experts are distinct; the shared block holds each token once), so a counter is incremented at most once per
    program. The sums are `_moe_reduce_kernel`'s (products stored, then added)."""
    tile = t * tl.num_programs(0) + pid_n  # [BLOCK_M] (token, H-tile) counters
    ok = row_ok[:, None] & m_ok[None, :]
    cols = tl.arange(0, BLOCK_N)[:, None]
    slot_ptrs = ws_ptr + (tile * NSLOTS + slot)[None, :].to(tl.int64) * BLOCK_N + cols
    tl.store(slot_ptrs, y.to(tl.float32) * weight[None, :], mask=ok)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + tile, 1, mask=m_ok, sem="acq_rel")
    last = m_ok & (arrived == NSLOTS - 1)
    if tl.sum(last.to(tl.int32), axis=0) > 0:
        xdt = out_ptr.dtype.element_ty
        rows_ok = row_ok[:, None] & last[None, :]
        base = ws_ptr + (tile * NSLOTS)[None, :].to(tl.int64) * BLOCK_N + cols
        total = tl.zeros(y.shape, dtype=tl.float32)
        for s in range(TOPK):
            total += tl.load(base + s * BLOCK_N, mask=rows_ok, other=0.0, cache_modifier=".cg")
        res = total.to(xdt)
        if SHARED:
            extra = tl.load(base + TOPK * BLOCK_N, mask=rows_ok, other=0.0, cache_modifier=".cg")
            res = (res.to(tl.float32) + extra).to(xdt)
        tl.store(out_ptr + t[None, :].to(tl.int64) * stride_out + rows[:, None], res, mask=rows_ok)
        tl.atomic_xchg(cnt_ptr + tile, 0, mask=last)


@triton.jit
def _moe_reduce_kernel(
    y_ptr, tw_ptr, out_ptr, add_ptr, H, stride_y, stride_out, stride_add, TOPK: tl.constexpr, BLOCK_H: tl.constexpr,
    ADD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[t] = round(sum_s FP32(y[t*TOPK + s]) * w[t, s]), slots added in order; with ADD (the shared expert's
    output) round(FP32(that) + FP32(add[t])), the reference's add in out's dtype."""
    pdl_entry(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for s in range(TOPK):
        y = tl.load(y_ptr + (t * TOPK + s) * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
        total += y * tl.load(tw_ptr + t * TOPK + s).to(tl.float32)
    res = total.to(out_ptr.dtype.element_ty)
    if ADD:
        extra = tl.load(add_ptr + t * stride_add + cols, mask=ok, other=0.0).to(tl.float32)
        res = (res.to(tl.float32) + extra).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_out + cols, res, mask=ok)


# ------------------------------------------------------------------------------------------------- host side
def paths_config(nvfp4: bool, device: torch.device | None = None) -> MoEPaths:
    """Token limits of the decode path and of the folded shared expert; table op "moe.paths" (shape nvfp4)."""
    if nvfp4:
        default = MoEPaths(DECODE_MAX_TOKENS_NVFP4, SHARED_FOLD_MAX_TOKENS_NVFP4)
    else:
        default = MoEPaths(DECODE_MAX_TOKENS_BF16, SHARED_FOLD_MAX_TOKENS_BF16)
    return tuning.tuned("moe.paths", default, device, nvfp4=nvfp4)


def copies_min_tokens(limits: MoEPaths) -> int:
    """The fewest tokens of a step for which `fused_moe` makes BF16 copies of NVFP4 experts (the engine keeps memory
    free for them), given NVFP4's `paths_config`: the copies' threshold, past the twins that decode in registers where
    those take the steps from there on."""
    lo, hi, copies = limits.tma_nvfp4_min_tokens, limits.tma_nvfp4_max_tokens, limits.dequant_min_tokens
    if 0 < lo <= copies:
        return sys.maxsize if hi == 0 else max(copies, hi + 1)
    return copies


def decode_config(nvfp4: bool, tokens: int = 1, device: torch.device | None = None) -> MoEConfig:
    """Per-pair tiles: NVFP4 through the FMA GEMV (BLOCK_M = 1); BF16 too up to 2 tokens, then on tensor cores.

    Table op "moe.decode" (shape tokens, nvfp4); the H200 measurements behind these defaults are in its table."""
    if not nvfp4:
        if tokens <= 2:
            default = MoEConfig(1, 8, 1024, 8, 512, False, 4, 1)
        else:
            default = MoEConfig(16, 16, 128, 32, 128, True, 4, 3)
    elif tokens <= 4:
        default = MoEConfig(1, 8, 1024, 8, 512, False, 4, 1)
    else:
        default = MoEConfig(1, 32, 512, 32, 512, False, 4, 1)
    return tuning.tuned("moe.decode", default, device, tokens=tokens, nvfp4=nvfp4)


def grouped_config(pairs_per_expert: float, nvfp4: bool = False, device: torch.device | None = None) -> MoEConfig:
    """Grouped-GEMM tiles: BLOCK_M pairs of one expert per program, sized to the average group.

    Table op "moe.grouped" (shape pairs_per_expert, nvfp4)."""
    if pairs_per_expert <= 16:
        default = MoEConfig(16, 32, 128, 64, 128, True, 4, 3)
    elif pairs_per_expert <= 48:
        default = MoEConfig(32, 64, 64, 128, 64, True, 4, 3)
    else:
        default = MoEConfig(128, 64, 64, 128, 64, True, 8, 3)
    return tuning.tuned("moe.grouped", default, device, pairs_per_expert=float(pairs_per_expert), nvfp4=nvfp4)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every output, intermediate and workspace comes from here (tests replace it with a NaN-filled allocator)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _weight_args(w: Weight | ScaledWeight, like: torch.Tensor) -> tuple:
    """(data, scales, global scales, strides..., segment bounds, is_nvfp4, has global scales) of stacked expert
    weights [E, N, K]."""
    n = w.shape[-2]
    if isinstance(w, ScaledWeight):
        gs, d = w.global_scale, w.data
        return (d, d, gs, d.stride(0), d.stride(1), 0, 0, gs.stride(0), segment_bounds(w.segments, n), False, True)
    if isinstance(w, NVFP4Weight):
        gs = w.global_scale
        return (
            w.qweight, w.scales, gs, w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1),
            gs.stride(0), segment_bounds(w.segments, n), True, True,
        )  # fmt: skip
    return (w, w, like, w.stride(0), w.stride(1), 0, 0, 0, (n, n, n), False, False)


def supported(x: torch.Tensor, w13: Weight, w2: Weight) -> bool:
    """Whether the Triton path covers these inputs (otherwise `moe_ref` runs)."""
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if not (x.is_cuda or _INTERPRET):
        return False
    for w in (w13, w2):
        if isinstance(w, NVFP4Weight):
            if w.qweight.dim() != 3 or len(w.segments) > MAX_SEGMENTS or w.global_scale.dim() != 2:
                return False
            if w.qweight.stride(2) != 1 or w.scales.stride(2) != 1 or w.qweight.device != x.device:
                return False
            if not gemv_triton.groups_aligned(w.qweight):  # the FMA path reads int64 groups
                return False
        elif w.dim() != 3 or w.stride(2) != 1 or w.device != x.device:
            return False
    i = w2.shape[-1]
    if i == 0 or x.shape[1] == 0:  # the kernels read a first K step before their loop: K ranges are never empty
        return False
    return w13.shape[-1] == x.shape[1] and w13.shape[-2] == 2 * i and w2.shape[-2] == x.shape[1]


def _shared_args(w: Weight, like: torch.Tensor) -> tuple:
    """(data, scales, global scales, row strides, segment bounds) of one 2-D shared-expert weight."""
    n = w.shape[-2]
    if isinstance(w, NVFP4Weight):
        gs = w.global_scale.reshape(-1)
        return (w.qweight, w.scales, gs, w.qweight.stride(0), w.scales.stride(0), *segment_bounds(w.segments, n))
    return (w, w, like, w.stride(0), 0, n, n, n)


def _no_shared(like: torch.Tensor) -> tuple:
    return (like, like, like, 0, 0, 0, 0, 0)


def _no_norm(like: torch.Tensor) -> tuple:
    return (like, like, like, like, like, 0.0)


def foldable(shared: SharedExpert, x: torch.Tensor, w13: Weight, w2: Weight) -> bool:
    """Whether the shared expert can run inside the decode kernels: same storage as the experts, I_s a multiple of I."""
    gate_up, down = shared
    inter, hidden = w2.shape[-1], x.shape[1]
    nv = isinstance(w13, NVFP4Weight)
    if not (isinstance(w2, NVFP4Weight) == nv == isinstance(gate_up, NVFP4Weight) == isinstance(down, NVFP4Weight)):
        return False
    i_s = down.shape[-1]
    if i_s == 0 or gate_up.shape != (2 * i_s, hidden) or down.shape != (hidden, i_s) or i_s % inter:
        return False
    for w, like in ((gate_up, w13), (down, w2)):
        if isinstance(w, NVFP4Weight):
            if w.qweight.dim() != 2 or len(w.segments) > MAX_SEGMENTS or w.global_scale.dim() != 1:
                return False
            if w.qweight.stride(1) != 1 or w.scales.stride(1) != 1 or w.qweight.device != x.device:
                return False
            if not gemv_triton.groups_aligned(w.qweight):
                return False
        elif w.dim() != 2 or w.stride(1) != 1 or w.device != x.device or w.dtype != like.dtype:  # type: ignore[union-attr]
            return False
    return True


def shared_expert(x: torch.Tensor, shared: SharedExpert) -> torch.Tensor:
    """The shared expert on its own, through the Triton linear and SiLU-and-mul kernels (`shared_expert_ref`)."""
    gate_up, down = shared
    return gemv_triton.linear(activation_triton.silu_and_mul(gemv_triton.linear(x, gate_up)), down)


def fused_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: Weight,
    w2: Weight,
    decode_max_tokens: int | None = None,
    config: MoEConfig | None = None,
    split_k: int | None = None,
    shared: SharedExpert | None = None,
    fold_max_tokens: int | None = None,
    dequant_min_tokens: int | None = None,
    grouped_gemm_min_tokens: int | None = None,
    tma_min_tokens: int | None = None,
    tma_nvfp4_min_tokens: int | None = None,
    tma_nvfp4_max_tokens: int | None = None,
    shared_beside: bool | None = None,
) -> torch.Tensor:
    """`moe_ref` through the Triton kernels; `decode_max_tokens` picks the path (tests force either).

    A shared expert runs inside the decode launches when `foldable` and the batch has at most `fold_max_tokens`
    tokens (default: `paths_config`); otherwise it runs on its own and is added. On the grouped path, from
    `dequant_min_tokens` tokens NVFP4 experts are dequantised to x's dtype for the call, and from
    `grouped_gemm_min_tokens` (0: never) plain experts run on torch's grouped GEMM (`moe_grouped_gemm`), and
    otherwise from `tma_min_tokens` (0: never) on the TMA-fed launches (`moe_grouped_tma_triton`, unless a `config`
    of the Triton grouped kernels is given). From `tma_nvfp4_min_tokens` (0: never) to `tma_nvfp4_max_tokens` (0: any)
    NVFP4 experts run on those launches' twins that decode NVFP4 in registers, before any copy is made.
    `shared_beside`: a shared expert run apart on the decode path runs on a side stream (CUDA). All default to
    `paths_config`'s.
    """
    t = topk_ids.shape[0]
    decode, fold, copies = _paths(x, t, w13, w2, shared, decode_max_tokens, fold_max_tokens, dequant_min_tokens, config)
    nv = isinstance(w13, NVFP4Weight) or isinstance(w2, NVFP4Weight)
    limits = _limits(
        nv, x.device, grouped_gemm_min_tokens=grouped_gemm_min_tokens, tma_min_tokens=tma_min_tokens,
        tma_nvfp4_min_tokens=tma_nvfp4_min_tokens, tma_nvfp4_max_tokens=tma_nvfp4_max_tokens,
        shared_beside=shared_beside,
    )  # fmt: skip
    pairs_per_expert = t * topk_ids.shape[-1] / w13.shape[0]
    tma_cfg = None
    hi = limits.tma_nvfp4_max_tokens
    twins = 0 < limits.tma_nvfp4_min_tokens <= t and (hi == 0 or t <= hi)
    if nv and not decode and config is None and twins:
        # NVFP4 decoded inside the TMA-fed launches: no BF16 copy.
        tma_cfg = moe_grouped_tma_triton.config(pairs_per_expert, True, x.device)
        tma_cfg = tma_cfg if moe_grouped_tma_triton.fits(x, w13, w2, tma_cfg) else None
        copies = copies and tma_cfg is None
    if copies:
        w13, w2 = (_dequantized(w, x.dtype) for w in (w13, w2))
    # NVFP4 experts fit the next two only as the copies (`ScaledWeight`): their thresholds count from
    # `dequant_min_tokens`.
    gemm = tma_cfg is None and not decode and 0 < limits.grouped_gemm_min_tokens <= t
    gemm = gemm and moe_grouped_gemm.fits(x, w13, w2)
    dense = not isinstance(w13, NVFP4Weight) and not isinstance(w2, NVFP4Weight)  # BF16 experts or NVFP4's copies
    if tma_cfg is None and dense and not decode and not gemm and 0 < limits.tma_min_tokens <= t and config is None:
        # NVFP4's copies are BF16 launches with scaled epilogues: BF16's tiles ("nvfp4" picks the twins').
        tma_cfg = moe_grouped_tma_triton.config(pairs_per_expert, False, x.device)
        tma_cfg = tma_cfg if moe_grouped_tma_triton.fits(x, w13, w2, tma_cfg) else None
    extra, side = None, None
    if shared is not None and not fold:
        # The shared expert first, so the routed path's slot-reduce launch (when it has one) adds it too. On the
        # decode path it may run on a side stream beside the routed launches (MoEPaths.shared_beside), which
        # `_routed` joins before that add.
        side = _side_stream(x.device) if decode and limits.shared_beside and x.is_cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):  # None: the current stream
            extra = shared_expert(x, shared)
        shared = None
    if gemm:
        return moe_grouped_gemm.routed(x, topk_weights, topk_ids, w13, w2, add=extra)  # type: ignore[arg-type]
    if tma_cfg is not None:
        return moe_grouped_tma_triton.routed(x, topk_weights, topk_ids, w13, w2, tma_cfg, add=extra)  # type: ignore[arg-type]
    return _routed(x, topk_weights, topk_ids, w13, w2, decode, config, split_k, shared, add=extra, add_after=side)


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the shared expert runs on beside the routed launches (one a device, made on first use: a step's
    warm-up runs eagerly before any capture)."""
    return torch.cuda.Stream(device)


def _dequantized(w: Weight, dtype: torch.dtype) -> Weight:
    """Stacked NVFP4 experts [E, N, K] as `dtype` values (exact) that keep their global scales: a `ScaledWeight`.
    Other weights as they are."""
    if not isinstance(w, NVFP4Weight):
        return w
    e, n, k = w.shape
    flat = NVFP4Weight(
        w.qweight.reshape(e * n, k // 2), w.scales.reshape(e * n, -1), w.global_scale.new_ones(1), (e * n,)
    )
    return ScaledWeight(gemv_triton.dequantize(flat, dtype).view(e, n, k), w.global_scale, w.segments)


def _paths(
    x: torch.Tensor,
    t: int,
    w13: Weight,
    w2: Weight,
    shared: SharedExpert | None,
    decode_max_tokens: int | None = None,
    fold_max_tokens: int | None = None,
    dequant_min_tokens: int | None = None,
    config: MoEConfig | None = None,
) -> tuple[bool, bool, bool]:
    """(decode path, shared expert folded into its launches, NVFP4 experts run from copies in x's dtype) for T
    tokens; None limits: `paths_config`'s. Decode-sized batches on expert-major tensor-core tiles that sum the slots
    in the down launch (`config`, else `decode_config`) fold a foldable shared expert at any size: it runs there as
    blocks of BLOCK_M tokens, its weights read once a block, not once a token; so do the NVFP4 MMA launches with
    `mma_shared`."""
    nv = isinstance(w13, NVFP4Weight) or isinstance(w2, NVFP4Weight)
    limits = _limits(
        nv, x.device, decode_max_tokens=decode_max_tokens, shared_fold_max_tokens=fold_max_tokens,
        dequant_min_tokens=dequant_min_tokens,
    )  # fmt: skip
    decode = t <= limits.decode_max_tokens
    fold = shared is not None and decode and t > 0 and foldable(shared, x, w13, w2)
    if fold and t > limits.shared_fold_max_tokens:
        cfg = config or decode_config(nv, t, x.device)
        fold = _unsorted_grouped(cfg, shared) or _mma_shared(cfg, x, w13, w2, shared)
    return decode, fold, nv and not decode and t >= limits.dequant_min_tokens


def _limits(nvfp4: bool, device: torch.device, **given: int | None) -> MoEPaths:
    """`paths_config` with the limits a caller gave (None: the table's)."""
    return dataclasses.replace(paths_config(nvfp4, device), **{k: v for k, v in given.items() if v is not None})


def _mma_fits(x: torch.Tensor, w: Weight | ScaledWeight) -> bool:
    """Whether `nvfp4_mma_moe_triton`'s kernels take activations x against experts w (MoEConfig.mma)."""
    from . import nvfp4_mma_moe_triton  # here: that module imports this one

    return nvfp4_mma_moe_triton.moe_supported(x, w)


def _mma_shared(cfg: MoEConfig, x: torch.Tensor, w13: Weight, w2: Weight, shared: SharedExpert | None) -> bool:
    """Whether the decode path's MMA launches take the shared expert in programs of their own (MoEConfig.mma_shared:
    the wide 16-byte gate_up and down, `nvfp4_mma_moe_triton.shared_fits`)."""
    mma = cfg.mma and cfg.mma_down and cfg.mma_vec and cfg.mma_wide and cfg.mma_down_wide and cfg.expert_major
    if not (cfg.mma_shared and mma and not cfg.use_dot and shared is not None and isinstance(w13, NVFP4Weight)):
        return False
    from . import nvfp4_mma_moe_triton  # here: that module imports this one

    return nvfp4_mma_moe_triton.shared_fits(x, w13, w2, *shared)


def _token_slots(
    cfg: MoEConfig, stacked: bool, value_bytes: float, hidden: int, topk: int, inter: int, shared_inter: int
) -> bool:
    """Whether the decode down runs a program a (tile, token) with the slots added in registers
    (MoEConfig.dn_token_slots, `moe_down_slots_triton`): FMA tiles of one row, each expert's rows (codes and scales)
    right after the previous expert's (`stacked`), weights of `value_bytes` each within its register bounds."""
    if not cfg.dn_token_slots or cfg.use_dot or cfg.block_m != 1:
        return False
    n, warps, slots = cfg.dn_block_n, cfg.num_warps, _shared_slots(cfg, topk, inter, shared_inter)
    return moe_down_slots_triton.fits(topk, hidden, inter, shared_inter, n, warps, stacked, value_bytes, slots)


def _shared_slots(cfg: MoEConfig, topk: int, inter: int, shared_inter: int) -> bool:
    """Whether the token-slots down takes the shared expert in its padding slots (MoEConfig.dn_shared_slots, where
    its parts fit them)."""
    return cfg.dn_shared_slots and moe_down_slots_triton.shared_slots_fit(topk, inter, shared_inter)


def _unsorted_grouped(cfg: MoEConfig, shared: SharedExpert | None) -> bool:
    """Whether decode-sized batches take the grouped launches with blocks found in the unsorted ids: tiles on
    tensor cores marked expert-major; a folded shared expert needs the slots summed in the down launch."""
    return cfg.expert_major and cfg.use_dot and (shared is None or cfg.slots_in_down)


def _p_pad(pairs: int, unsorted: bool) -> int:
    """The ids scan's width (a power of two) for the unsorted grouped launches; 1 (unused) otherwise."""
    return triton.next_power_of_2(pairs) if unsorted else 1


def _routed(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: Weight | ScaledWeight,
    w2: Weight | ScaledWeight,
    decode: bool,
    config: MoEConfig | None,
    split_k: int | None,
    shared: SharedExpert | None,
    norm: tuple | None = None,
    add: torch.Tensor | None = None,
    add_after: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """The launches of `fused_moe`; `shared` (decode path only) is already known to be foldable.

    `norm` (decode path only): (residual, norm weight, eps, h out, new residual out), filled by the down launch.
    `add` [T, H] (the shared expert run apart) is added to the result in x's dtype: by the slot-reduce launch where
    the path has one, else as a separate add; `add_after`: the side stream `add` is made on, which the main stream
    joins before that launch (and before returning, whatever the path)."""

    def added() -> torch.Tensor | None:
        if add_after is not None:
            torch.cuda.current_stream(x.device).wait_stream(add_after)
        return add if add is None or add.stride(-1) == 1 else add.contiguous()

    t, topk = topk_ids.shape
    hidden = x.shape[1]
    num_experts = w13.shape[0]
    inter = w2.shape[-1]
    out = _empty((t, hidden), x.dtype, x.device)
    if t == 0:
        added()
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    if isinstance(w13, NVFP4Weight):
        x = gemv_triton.rows_aligned(x)
    ids = topk_ids.contiguous()
    tw = topk_weights.contiguous()
    p = t * topk
    nv = isinstance(w13, NVFP4Weight) or isinstance(w2, NVFP4Weight)
    cfg = config or (decode_config(nv, t, x.device) if decode else grouped_config(p / num_experts, nv, x.device))
    # The shared expert in the MMA launches' own programs (MoEConfig.mma_shared): hs and ys of its own, no FMA rows.
    mma_shared = decode and norm is None and _mma_shared(cfg, x, w13, w2, shared)
    parts = 0 if shared is None or mma_shared else shared[1].shape[-1] // inter
    n_shared_rows = parts * t
    h = _empty((n_shared_rows + p, inter), x.dtype, x.device)
    q13, s13, g13, we13, wn13, se13, sn13, ge13, seg13, nv13, gsc13 = _weight_args(w13, out)
    q2, s2, g2, we2, wn2, se2, sn2, ge2, seg2, nv2, gsc2 = _weight_args(w2, out)
    sh13 = _no_shared(out) if shared is None else _shared_args(shared[0], out)
    sh2 = _no_shared(out) if shared is None else _shared_args(shared[1], out)
    shared_inter = 0 if shared is None else shared[1].shape[-1]
    prec = precision_for(x.dtype)
    cnt = counters(x.device)
    gu_tiles = triton.cdiv(inter, cfg.gu_block_i)
    dn_tiles = triton.cdiv(hidden, cfg.dn_block_n)
    # Expert-major gate_up (`_moe_gate_up_expert_kernel`): no K split, so no workspace.
    expert_major = decode and cfg.expert_major and nv13 and gsc13 and not cfg.use_dot and (shared is None or mma_shared)
    # Expert-major on tensor cores: the grouped launches with blocks found in the unsorted ids (no sort launches).
    unsorted = decode and _unsorted_grouped(cfg, shared)
    decode = decode and not unsorted
    if decode and t * dn_tiles > COUNTER_SLOTS:
        raise ValueError(f"{t} tokens are too many for the decode path's slot counters; use the grouped path")
    chunks = triton.cdiv(t, cfg.block_m)  # a token's k ids are distinct, so an expert has at most t pairs
    if decode:
        order, meta, rows_grid = ids, ids, n_shared_rows + p
        split, per = (
            (1, hidden) if expert_major else choose_split_k(gu_tiles * rows_grid, hidden, cfg.gu_block_k, x.device)
        )
    elif unsorted:  # the shared expert's blocks (parts x chunks) first, then the experts'
        order, meta, rows_grid = ids, ids, num_experts * chunks + parts * chunks
        split, per = 1, triton.cdiv(hidden, cfg.gu_block_k) * cfg.gu_block_k
    else:
        order, meta, rows_grid = align(ids, num_experts, cfg.block_m)
        split, per = 1, triton.cdiv(hidden, cfg.gu_block_k) * cfg.gu_block_k
    if split_k is not None and not expert_major:
        per = triton.cdiv(triton.cdiv(hidden, split_k), cfg.gu_block_k) * cfg.gu_block_k
        split = triton.cdiv(hidden, per)
    ws_elems = gu_tiles * rows_grid * split * 2 * cfg.gu_block_i * cfg.block_m if split > 1 else 1
    ws = _empty((ws_elems,), torch.float32, x.device)
    mode = decode_mode(cfg, x.dtype)
    mma_gate_up = expert_major and cfg.mma and _mma_fits(x, w13)
    if mma_gate_up:
        from . import nvfp4_mma_moe_triton  # here: that module imports this one

        hs = _empty((t, shared_inter), x.dtype, x.device) if mma_shared else None
        nvfp4_mma_moe_triton.launch_moe_gate_up(
            x, ids.reshape(-1), w13, h, topk, cfg.num_warps, cfg.mma_prefetch, cfg.mma_vec, cfg.mma_l2_ahead,
            cfg.mma_warp_k, cfg.mma_wide, cfg.mma_ready, shared=None if hs is None else (shared[0], hs),
            perm=mma_shared and cfg.mma_perm_h, first=mma_shared and cfg.mma_shared_first,
            ready_codes=cfg.mma_ready_codes,
        )  # fmt: skip
    elif expert_major:  # h keeps the per-pair layout the down launch reads
        _moe_gate_up_expert_kernel[(gu_tiles, num_experts)](
            x, ids, q13, s13, g13, h, p, hidden, inter, topk, x.stride(0), we13, wn13, se13, sn13, ge13, h.stride(0),
            *seg13, EVEN_K=hidden % cfg.gu_block_k == 0, P_PAD=triton.next_power_of_2(p), BLOCK_I=cfg.gu_block_i,
            BLOCK_K=cfg.gu_block_k, num_warps=cfg.num_warps, num_stages=1, **launch_options(x.device),
        )  # fmt: skip
    else:
        _moe_gate_up_kernel[(gu_tiles, rows_grid, split)](
            x, ids, order, meta, q13, s13, g13, h, ws, cnt,
            hidden, inter, topk, x.stride(0), we13, wn13, se13, sn13, ge13, h.stride(0), *seg13, per,
            *sh13, n_shared_rows, max(parts, 1), shared_inter, p, chunks,
            NVFP4=nv13, GSCALE=gsc13, GROUPED=not decode, EXPERT=unsorted, SHARED=shared is not None,
            EVEN_K=hidden % cfg.gu_block_k == 0, WORDS=mode, USE_DOT=cfg.use_dot, PRECISION=prec, SPLIT_K=split,
            BLOCK_I=cfg.gu_block_i, BLOCK_M=cfg.block_m, BLOCK_K=cfg.gu_block_k, P_PAD=_p_pad(p, unsorted),
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            **launch_options(x.device),
        )  # fmt: skip
    even_dn = inter % cfg.dn_block_k == 0 and shared_inter % cfg.dn_block_k == 0
    mma_down = decode and (shared is None or mma_shared) and cfg.mma_down and norm is None and _mma_fits(h, w2)
    if mma_shared and not mma_down:  # `shared_fits` checked the down's operands too, so this is a bug, not an input
        raise RuntimeError("the shared expert's gate_up ran in the MMA launch but its down does not fit that path")
    if mma_down:  # h: a row a pair
        from . import nvfp4_mma_moe_triton  # here: that module imports this one

        # Each pair's rounded y, then the slot-reduce launch (routing weights, slot order, the shared expert's add:
        # ys when its programs ran here, else `add`).
        y = _empty((p, hidden), x.dtype, x.device)
        ys = _empty((t, hidden), x.dtype, x.device) if mma_shared else None
        nvfp4_mma_moe_triton.launch_moe_down(
            h, ids.reshape(-1), w2, y, cfg.num_warps, vec=cfg.mma_vec, l2=cfg.mma_down_l2, wide=cfg.mma_down_wide,
            ready=cfg.mma_ready, shared=None if ys is None else (shared[1], hs, ys), perm=mma_shared and cfg.mma_perm_h,
            first=mma_shared and cfg.mma_shared_first, ready_codes=cfg.mma_ready_codes,
        )  # fmt: skip
        more = added()
        return _reduce_slots_launch(y, tw, out, more if ys is None else ys)
    if decode:
        stacked = we2 == hidden * wn2 and (not nv2 or se2 == hidden * sn2)
        value_bytes = moe_down_slots_triton.NVFP4_VALUE_BYTES if nv2 else q2.element_size()
        if norm is None and _token_slots(cfg, stacked, value_bytes, hidden, topk, inter, shared_inter):
            down_args = (q2, s2, g2, we2, wn2, se2, sn2, ge2, seg2, nv2, gsc2)
            # One load picks each row's pointer, so the shared expert's codes must be of the experts' kind.
            slots = _shared_slots(cfg, topk, inter, shared_inter) and sh2[0].dtype == q2.dtype
            moe_down_slots_triton.launch(
                h, ids, tw, down_args, sh2, max(parts, 1), shared_inter, out, cfg.dn_block_n, cfg.num_warps, slots
            )  # fmt: skip
            return _plus(out, added())
        n_shared_tokens = 0 if shared is None else t
        nslots = topk + (shared is not None)
        ws = _empty((t * dn_tiles * nslots * cfg.dn_block_n * cfg.block_m,), torch.float32, x.device)
        if norm is not None:
            residual, norm_w, eps, h_out, res_out = norm
            # Token t's row counter is slot COUNTER_SLOTS - T + t, after the slot tiles (checked by the caller).
            row = (residual, norm_w, h_out, res_out, cnt[COUNTER_SLOTS - t :], float(eps))
        else:
            row = _no_norm(out)
        _moe_down_kernel[(dn_tiles, n_shared_tokens + p)](
            h, ids, order, meta, tw, q2, s2, g2, out, ws, cnt,
            hidden, inter, h.stride(0), we2, wn2, se2, sn2, ge2, out.stride(0), *seg2,
            *sh2, n_shared_tokens, max(parts, 1), shared_inter, *row, p, chunks,
            NVFP4=nv2, GSCALE=gsc2, GROUPED=False, EXPERT=False, SLOTS_HERE=False, SHARED=shared is not None,
            EVEN_K=even_dn, WORDS=mode, USE_DOT=cfg.use_dot, PRECISION=prec, TOPK=topk, NSLOTS=nslots,
            NORM=norm is not None, N_PAD=triton.next_power_of_2(hidden) if norm is not None else 1,
            BLOCK_N=cfg.dn_block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.dn_block_k, P_PAD=1, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            **launch_options(x.device),
        )  # fmt: skip
        return _plus(out, added())
    # Unsorted blocks with `slots_in_down`: the down launch reduces each token's slots (and adds the folded shared
    # expert, one block of rows a chunk of tokens, slot topk) into out itself.
    slots_here = unsorted and cfg.slots_in_down
    if slots_here:
        if t * dn_tiles > COUNTER_SLOTS:
            raise ValueError(f"{t} tokens are too many for the down launch's slot counters")
        nslots = topk + (shared is not None)
        y, ws = out, _empty((t * dn_tiles * nslots * cfg.dn_block_n,), torch.float32, x.device)
        dn_rows, dn_shared = num_experts * chunks + (chunks if shared is not None else 0), sh2
    else:
        nslots, y = topk, _empty((p, hidden), x.dtype, x.device)
        ws, dn_rows, dn_shared = y, rows_grid, _no_shared(out)
    _moe_down_kernel[(dn_tiles, dn_rows)](
        h, ids, order, meta, tw, q2, s2, g2, y, ws, cnt,
        hidden, inter, h.stride(0), we2, wn2, se2, sn2, ge2, y.stride(0), *seg2,
        *dn_shared, t if shared is not None else 0, max(parts, 1), shared_inter, *_no_norm(out), p, chunks,
        NVFP4=nv2, GSCALE=gsc2, GROUPED=True, EXPERT=unsorted, SLOTS_HERE=slots_here, SHARED=shared is not None,
        EVEN_K=even_dn, WORDS=mode, USE_DOT=cfg.use_dot, PRECISION=prec, TOPK=topk, NSLOTS=nslots, NORM=False, N_PAD=1,
        BLOCK_N=cfg.dn_block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.dn_block_k, P_PAD=_p_pad(p, unsorted),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(x.device),
    )  # fmt: skip
    if slots_here:
        return _plus(out, added())
    return _reduce_slots_launch(y, tw, out, added())


def _plus(out: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    return out if add is None else out + add


def _reduce_slots_launch(
    y: torch.Tensor, tw: torch.Tensor, out: torch.Tensor, add: torch.Tensor | None
) -> torch.Tensor:
    """out = each token's slots of y [T * k, H] weighted by tw [T, k] and summed in slot order (`_moe_reduce_kernel`),
    plus `add` in out's dtype."""
    t, topk = tw.shape
    hidden = out.shape[1]
    block_h = min(1024, triton.next_power_of_2(hidden))
    _moe_reduce_kernel[(t, triton.cdiv(hidden, block_h))](
        y, tw, out, out if add is None else add, hidden, y.stride(0), out.stride(0),
        0 if add is None else add.stride(0), TOPK=topk, BLOCK_H=block_h, ADD=add is not None, num_warps=4,
        **launch_options(out.device),
    )  # fmt: skip
    return out


def moe_add_rms_norm(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: Weight,
    w2: Weight,
    shared: SharedExpert | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`moe` then the residual add and RMSNorm: (normed, new residual), as `moe_add_rms_norm_ref`.

    On the decode path (shared expert folded or absent) the down launch's last tile of each token normalises that
    token's row, so the norm costs no launch of its own; otherwise the Triton add+RMSNorm kernel follows.
    """
    if not supported(x, w13, w2):
        return moe_add_rms_norm_ref(x, topk_weights, topk_ids, w13, w2, shared, residual, norm_weight, eps)
    t, hidden = topk_ids.shape[0], x.shape[1]
    nv = isinstance(w13, NVFP4Weight) or isinstance(w2, NVFP4Weight)
    decode, fold, _ = _paths(x, t, w13, w2, shared)
    cfg = decode_config(nv, t, x.device)
    fits = (
        decode
        and t > 0
        and (shared is None or fold)
        and not _unsorted_grouped(cfg, shared if fold else None)
        # the MMA launches' shared programs: the slot reduce adds their ys; the norm is its own launch then
        and not (fold and _mma_shared(cfg, x, w13, w2, shared))
        and hidden <= NORM_MAX_N
        and residual.shape == (t, hidden)
        and residual.dtype == x.dtype
        and residual.is_contiguous()
        and norm_weight.is_contiguous()
        and t * (triton.cdiv(hidden, cfg.dn_block_n) + 1) <= COUNTER_SLOTS
    )
    if not fits:
        return rmsnorm_triton.add_rms_norm(moe(x, topk_weights, topk_ids, w13, w2, shared), residual, norm_weight, eps)
    h = _empty((t, hidden), x.dtype, x.device)
    new_res = _empty((t, hidden), x.dtype, x.device)
    _routed(x, topk_weights, topk_ids, w13, w2, True, None, None, shared, norm=(residual, norm_weight, eps, h, new_res))
    return h, new_res


def moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: Weight,
    w2: Weight,
    shared: SharedExpert | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I] -> routed sum [T, H] (+ shared expert)."""
    if not supported(x, w13, w2):
        return moe_ref(x, topk_weights, topk_ids, w13, w2, shared)
    return fused_moe(x, topk_weights, topk_ids, w13, w2, shared=shared)
