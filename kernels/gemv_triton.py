"""Triton linear layers over dense or NVFP4 (W4A16) weights: `linear` and `lm_head` with the references' semantics.

One kernel family computes ``out^T[n, m] = sum_k W[n, k] x[m, k]`` for BLOCK_N weight rows and BLOCK_M activation
rows ("swap AB": the weight is the MMA's A operand and the token count only sets the MMA's narrow side).

Paths (chosen by M inside `linear` / `lm_head`; the numbers are from an H200, see benchmarks/kernels_moe_gemv.py):
- M == 1: an FMA GEMV, no tensor cores: FP32 products summed in registers, one reduction at the end. Dense BF16
  runs at 2-4.3 TB/s, a little ahead of cuBLAS; NVFP4 moves 3.6x fewer bytes and beats BF16 cuBLAS in time.
- NVFP4, 2 <= M <= 64: tl.dot with BLOCK_M >= 16 rows (padding the few real ones), weights decoded to BF16 tiles.
- NVFP4, M > 64: `dequant_matmul`: one exact dequantisation to x.dtype by a Triton kernel, cuBLAS with each
  segment's global scale as alpha on its FP32 accumulator and one rounding (430-590 TFLOP/s at M >= 1024). A fused
  dequantise-and-dot kernel with prefill tiles exists (`large_m_config`) but was 3-4x slower: its decode competes
  with the MMAs for issue slots.
- Dense, M > 1: the reference (cuBLAS); Triton did not beat it there.

Split-K (small M): when N / BLOCK_N tiles cannot give ~4 programs per SM, K is split over programs and reduced
deterministically in the same launch (`split_k_triton`).

The NVFP4 decode (exact and table-free) and the per-segment global scales: `nvfp4_decode_triton`.

The per-segment FP32 global scale multiplies the FP32 accumulator before the single rounding to x.dtype (`linear`)
or the FP32 store (`lm_head`). Limits of the decode's power-of-two offsets
(`nvfp4_decode_triton`): |x| must stay below 2**64 (activations are far smaller).
Grids come from shapes only and nothing syncs with the host (but `dequant_matmul`'s first call on a weight, which
reads its global scales, and not while a graph is captured), so every path is CUDA-graph capturable. Workspaces
come from the caching allocator; the split-K arrival counters are `split_k_triton.counters`.
"""

from __future__ import annotations

import itertools
import os

import torch
import triton
import triton.language as tl

from . import nvfp4_mma_triton, rmsnorm_triton, tuning
from .configs import MoEConfig, TileConfig
from .linear import NVFP4Weight, Weight, linear_fp32_out_ref, linear_ref, matmul_fp32_out
from .nvfp4_decode_triton import (
    MAX_SEGMENTS,
    bf16x2_scaled,
    code_words,
    e2m1_pair_bits,
    e2m1_pair_packed,
    nvfp4_planes,
    scale_value,
    segment_bounds,
    segment_scale,
)
from .pdl import launch_options, pdl_entry
from .split_k_triton import COUNTER_SLOTS, choose_split_k, counters, is_last, split_k_reduce

# Above this many activation rows a dense weight goes to cuBLAS (torch), which neither the Triton kernel's tensor-core
# tiles nor its 2-row FMA programs beat (H200, BF16 b2-b4, seventeenth session: +4% to +24% a step).
DENSE_MAX_M = 1
# From this many rows an NVFP4 weight is dequantised once per call and multiplied by cuBLAS (see dequant_matmul).
DEQUANT_MIN_M = 65
# Up to this many rows the kernel runs the small-M (GEMV, split-K) configuration.
SMALL_M = 64
# Tiles of `dequantize` (BLOCK_N, BLOCK_K, warps) for weights of at least / below DEQUANT_LARGE values. H200,
# benchmarks/kernels_dequant.py (2026-11-30): a layer's experts (512M values) 3.7-4.0 TB/s with 16 x 512 (2.9-3.3
# with 32 x 128), a 5120 x 2048 projection 8.4 us with 32 x 128 (9.6 with 16 x 512).
DEQUANT_TILE_LARGE = (16, 512, 4)
DEQUANT_TILE = (32, 128, 4)
DEQUANT_LARGE = 1 << 24
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# The word-plane tensor-core variant (TileConfig.words) crashes Triton 3.6's compiler; 3.9 and the interpreter run it.
WORDS_SUPPORTED = _INTERPRET or tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 9)


def groups_aligned(qweight: torch.Tensor) -> bool:
    """Whether the NVFP4 FMA path can read `qweight` (codes, two a byte) as int64 groups of 16 values: its start and
    every row (and expert) stride on 8 bytes."""
    return qweight.data_ptr() % 8 == 0 and all(st % 8 == 0 for st in qweight.stride()[:-1])


def rows_aligned(x: torch.Tensor) -> torch.Tensor:
    """x (rows of unit stride), or a contiguous copy when a BF16 row would not start on an 8-byte boundary: the
    NVFP4 FMA path reads BF16 activations four at a time (`nvfp4_x8`)."""
    if x.dtype == torch.bfloat16 and (x.data_ptr() % 8 or (x.dim() > 1 and x.stride(0) % 4)):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
    return x


# ----------------------------------------------------------------------------------------------- device helpers


@triton.jit
def packed_k(k0, BLOCK_K: tl.constexpr):
    """The K index of each column of an `nvfp4_packed_weights` tile: position (g, w, h, p) holds value 16g + 8w + 4h +
    p, its pairs (p, p + 4 nibbles) kept together."""
    G: tl.constexpr = BLOCK_K // 16
    return tl.reshape(
        k0
        + tl.arange(0, G)[:, None, None, None, None] * 16
        + tl.arange(0, 2)[None, :, None, None, None] * 8
        + tl.arange(0, 2)[None, None, :, None, None] * 4
        + tl.arange(0, 2)[None, None, None, :, None]
        + tl.arange(0, 2)[None, None, None, None, :] * 2,
        (BLOCK_K,),
    )


@triton.jit
def nvfp4_packed_weights(
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    k0,
    k_end,
    stride_wn,
    stride_sn,
    EVEN_K: tl.constexpr,
    EMULATE: tl.constexpr,
    WDT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IN_ORDER: tl.constexpr = False,
):
    """NVFP4 weight rows, columns k0..k0+BLOCK_K, decoded two at a time as the true values times 2**-62: [BLOCK_N,
    BLOCK_K] of WDT (BF16; FP32 when EMULATE) with K permuted within every 16 values as `packed_k` says, or in K
    order with IN_ORDER.

    Each int32 word (values 8w..8w+7) gives four packed BF16 pairs (nibbles p, p + 4), each scaled by one
    FMA.BF16X2 and split into two BF16 registers: about two instructions a value against five for the byte planes.
    IN_ORDER first re-pairs them as neighbours (p, p + 1: one byte permute a pair), so the tile is in K order and
    its operand loads stay whole rows. EMULATE (the CPU interpreter, which runs no PTX) builds the same values with
    FP32 operations.
    """
    G: tl.constexpr = BLOCK_K // 16
    groups, scale = fma_weights(
        w_ptr, s_ptr, rows, row_ok, k0, k_end, stride_wn, stride_sn, True, EVEN_K, BLOCK_N, BLOCK_K
    )  # [BLOCK_N, G] int64 groups, [BLOCK_N, G] FP32 block scales
    lo, hi = group_words(groups)
    words = tl.join(lo, hi)  # [BLOCK_N, G, 2]: values 8w .. 8w + 7
    sc = scale * 1.8446744073709552e19  # 2**64: weights times 2**-62 (exact)
    if IN_ORDER:
        return _nvfp4_pairs_in_order(words, sc, EMULATE, WDT, BLOCK_N, BLOCK_K)
    if EMULATE:
        sc3 = sc[:, :, None]
        l0, h0 = e2m1_pair_bits(words, 0)
        l1, h1 = e2m1_pair_bits(words, 1)
        l2, h2 = e2m1_pair_bits(words, 2)
        l3, h3 = e2m1_pair_bits(words, 3)
        w0 = tl.join(l0 * sc3, h0 * sc3).to(WDT)
        w1 = tl.join(l1 * sc3, h1 * sc3).to(WDT)
        w2 = tl.join(l2 * sc3, h2 * sc3).to(WDT)
        w3 = tl.join(l3 * sc3, h3 * sc3).to(WDT)
    else:
        s16 = sc.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        s2 = tl.broadcast_to((s16 | (s16 << 16))[:, :, None], (BLOCK_N, G, 2))
        l0, h0 = bf16x2_scaled(e2m1_pair_packed(words, 0), s2)
        l1, h1 = bf16x2_scaled(e2m1_pair_packed(words, 1), s2)
        l2, h2 = bf16x2_scaled(e2m1_pair_packed(words, 2), s2)
        l3, h3 = bf16x2_scaled(e2m1_pair_packed(words, 3), s2)
        w0 = tl.join(l0, h0)
        w1 = tl.join(l1, h1)
        w2 = tl.join(l2, h2)
        w3 = tl.join(l3, h3)
    # [BLOCK_N, G, w, h, p & 1, p >> 1] -> [BLOCK_N, BLOCK_K]
    return tl.reshape(tl.join(tl.join(w0, w1), tl.join(w2, w3)), (BLOCK_N, BLOCK_K))


@triton.jit
def _nvfp4_pairs_in_order(words, sc, EMULATE: tl.constexpr, WDT: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):  # fmt: skip
    """`nvfp4_packed_weights` in K order: words [BLOCK_N, G, 2] (values 8w..8w+7), sc [BLOCK_N, G] (the scales times
    2**64). The pairs (p, p + 4) become (2q, 2q + 1) by byte permutes of their bit patterns before the scaling FMA."""
    G: tl.constexpr = BLOCK_K // 16
    if EMULATE:
        sc3 = sc[:, :, None]
        v0, v4 = e2m1_pair_bits(words, 0)
        v1, v5 = e2m1_pair_bits(words, 1)
        v2, v6 = e2m1_pair_bits(words, 2)
        v3, v7 = e2m1_pair_bits(words, 3)
        # lo = (v0, v2, v4, v6), hi = (v1, v3, v5, v7): join(join(a, b), join(c, d)) flattens to a, c, b, d.
        lo = tl.join(tl.join(v0 * sc3, v4 * sc3), tl.join(v2 * sc3, v6 * sc3)).to(WDT)
        hi = tl.join(tl.join(v1 * sc3, v5 * sc3), tl.join(v3 * sc3, v7 * sc3)).to(WDT)
    else:
        s16 = sc.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        s2 = tl.broadcast_to((s16 | (s16 << 16))[:, :, None], (BLOCK_N, G, 2))
        p0 = e2m1_pair_packed(words, 0)  # (v0, v4)
        p1 = e2m1_pair_packed(words, 1)  # (v1, v5)
        p2 = e2m1_pair_packed(words, 2)
        p3 = e2m1_pair_packed(words, 3)
        a0, a1 = bf16x2_scaled((p0 & 0xFFFF) | (p1 << 16), s2)  # (v0, v1)
        b0, b1 = bf16x2_scaled(((p0 >> 16) & 0xFFFF) | (p1 & -65536), s2)  # (v4, v5)
        c0, c1 = bf16x2_scaled((p2 & 0xFFFF) | (p3 << 16), s2)  # (v2, v3)
        d0, d1 = bf16x2_scaled(((p2 >> 16) & 0xFFFF) | (p3 & -65536), s2)  # (v6, v7)
        lo = tl.join(tl.join(a0, b0), tl.join(c0, d0))  # v0, v2, v4, v6
        hi = tl.join(tl.join(a1, b1), tl.join(c1, d1))  # v1, v3, v5, v7
    # [BLOCK_N, G, w, 2, 2, pair] -> values 16g + 8w + 0..7 in order
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))


@triton.jit
def nvfp4_packed_dot_step(
    acc,
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    x_ptr,
    x_off,
    x_ok,
    k0,
    k_end,
    stride_wn,
    stride_sn,
    PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """acc [BLOCK_N, BLOCK_M] += one BLOCK_K step of W @ x^T on tensor cores, the weights decoded two at a time
    (`nvfp4_packed_weights`) and x loaded in the same permuted K order, so one dot covers the step (a permutation of
    K changes only the order of the FP32 sums)."""
    w = nvfp4_packed_weights(
        w_ptr, s_ptr, rows, row_ok, k0, k_end, stride_wn, stride_sn, EVEN_K, EMULATE, x_ptr.dtype.element_ty, BLOCK_N,
        BLOCK_K,
    )  # fmt: skip
    kk = packed_k(k0, BLOCK_K)
    x_mask = x_ok[None, :]
    if not EVEN_K:
        x_mask = x_mask & (kk < k_end)[:, None]
    xt = tl.load(x_ptr + x_off[None, :] + kk[:, None], mask=x_mask, other=0.0)
    return tl.dot(w, xt, acc, input_precision=PRECISION)


@triton.jit
def fma_weights(
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    k0,
    k_end,
    stride_wn,
    stride_sn,
    NVFP4: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The weight tiles of one M == 1 (FMA) step at k0 < k_end (callers never launch an empty K range): NVFP4
    (int64 groups [BLOCK_N, G] of 16 codes, FP32 block scales [BLOCK_N, G]); dense (W [BLOCK_N, BLOCK_K], 0)."""
    if NVFP4:
        G: tl.constexpr = BLOCK_K // 16
        offs_g = k0 // 16 + tl.arange(0, G)
        # One int64 a group of 16 values, so a thread holds whole groups: the sum over a group needs no lane
        # shuffle and the scale byte meets its group in the same thread.
        w64 = code_words(w_ptr)  # ready codes: unsigned groups tell the decode (`e2m1_pair_packed`)
        group_ptrs = w64 + rows[:, None] * (stride_wn // 8) + offs_g[None, :]
        s_ptrs = s_ptr + rows[:, None] * stride_sn + offs_g[None, :]
        if EVEN_K:
            groups = tl.load(group_ptrs, mask=row_ok[:, None], other=0)
            sb = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
        else:
            g_ok = offs_g < k_end // 16
            groups = tl.load(group_ptrs, mask=row_ok[:, None] & g_ok[None, :], other=0)
            sb = tl.load(s_ptrs, mask=row_ok[:, None] & g_ok[None, :], other=0)
        return groups, scale_value(sb, s_ptr)
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        w_mask = row_ok[:, None]
        if not EVEN_K:
            w_mask = w_mask & (kk < k_end)[None, :]
        w = tl.load(w_ptr + rows[:, None] * stride_wn + kk[None, :], mask=w_mask, other=0.0)
        return w, 0


@triton.jit
def fma_step(
    wa,
    wb,
    x_ptr,
    x_off,
    k0,
    k_end,
    NVFP4: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One M == 1 step on the weight tiles `fma_weights` loaded: NVFP4 [BLOCK_N, G] partial sums (times 2**-62),
    dense [BLOCK_N, BLOCK_K] FP32 products (W rounded to x's dtype first, as the reference materialises it)."""
    if NVFP4:
        part = nvfp4_gemv_step(wa, wb, x_ptr, x_off, k0, k_end, EVEN_K, BLOCK_N, BLOCK_K)
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            xr = tl.load(x_ptr + x_off[:, None] + kk[None, :])
        else:
            xr = tl.load(x_ptr + x_off[:, None] + kk[None, :], mask=(kk < k_end)[None, :], other=0.0)
        part = dense_fma_part(wa, xr)
    return part


@triton.jit
def fma_rows_step(
    wa,
    wb,
    x_ptr,
    x_off,
    x_ok,
    k0,
    k_end,
    NVFP4: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """`fma_step` for BLOCK_M rows of x on the same weight tiles: FP32 [BLOCK_N, BLOCK_M] sums of one K step
    (NVFP4 times 2**-62). The rows' decodes are the same operations on the same tiles, which the compiler merges,
    so each weight value is decoded once; padding rows (not x_ok) read row 0 and are never stored. BLOCK_M == 1:
    `fma_step`'s unreduced partials (the caller reduces over K once, after its last step)."""
    if BLOCK_M == 1:
        out = fma_step(wa, wb, x_ptr, x_off, k0, k_end, NVFP4, EVEN_K, BLOCK_N, BLOCK_K)
    else:
        cols = tl.arange(0, BLOCK_M)
        first = tl.sum(tl.where(cols == 0, x_off, 0), axis=0)
        offs = tl.where(x_ok, x_off, first)
        out = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for m in tl.static_range(BLOCK_M):
            xo = tl.sum(tl.where(cols == m, offs, 0), axis=0, keep_dims=True)
            row = tl.sum(fma_step(wa, wb, x_ptr, xo, k0, k_end, NVFP4, EVEN_K, BLOCK_N, BLOCK_K), axis=1)
            out = tl.where(cols[None, :] == m, row[:, None], out)
    return out


@triton.jit
def dense_fma_part(w, xr):
    """[BLOCK_N, BLOCK_K] FP32 products of a dense weight tile (rounded to x's dtype first, as the reference
    materialises it) and the x row [1, BLOCK_K]."""
    return w.to(xr.dtype).to(tl.float32) * xr.to(tl.float32)


@triton.jit
def _load_groups(ptrs, ok, EVEN_K: tl.constexpr):
    """One value a group at `ptrs`; groups not `ok` (past K) read 0 unless every step is whole."""
    if EVEN_K:
        v = tl.load(ptrs)
    else:
        v = tl.load(ptrs, mask=ok, other=0)
    return v


@triton.jit
def _bf16_quad(q):
    """The four BF16 values of int64 `q` (lowest address first) as FP32, by bit moves."""
    lo = q.to(tl.int32)
    hi = (q >> 32).to(tl.int32)
    f = tl.float32
    return (
        (lo << 16).to(f, bitcast=True),
        (lo & -65536).to(f, bitcast=True),
        (hi << 16).to(f, bitcast=True),
        (hi & -65536).to(f, bitcast=True),
    )


@triton.jit
def nvfp4_x8(x_ptr, x_off, offs_g, BASE: tl.constexpr, k_end, EVEN_K: tl.constexpr):
    """x values 16g + BASE + i (i = 0..7) of each group g in offs_g as eight FP32 planes, times 2**64 (so code * x
    products are exact FP32 normals), in the layout the weights' groups use.

    BF16 x is read four values an int64 (two loads a plane set; `rows_aligned` makes rows start on 8 bytes) and
    widened by bit moves; other dtypes one value a load. A thread reads its own groups' x: reading them contiguously
    and redistributing through shared memory would add a barrier after the PDL wait."""
    ok = offs_g < k_end // 16
    if x_ptr.dtype.element_ty == tl.bfloat16:
        x64 = x_ptr.to(tl.pointer_type(tl.int64)) + x_off // 4 + offs_g * 4 + BASE // 4
        x0, x1, x2, x3 = _bf16_quad(_load_groups(x64, ok, EVEN_K))
        x4, x5, x6, x7 = _bf16_quad(_load_groups(x64 + 1, ok, EVEN_K))
    else:
        xs = x_ptr + x_off + offs_g * 16 + BASE
        x0 = _load_groups(xs + 0, ok, EVEN_K).to(tl.float32)
        x1 = _load_groups(xs + 1, ok, EVEN_K).to(tl.float32)
        x2 = _load_groups(xs + 2, ok, EVEN_K).to(tl.float32)
        x3 = _load_groups(xs + 3, ok, EVEN_K).to(tl.float32)
        x4 = _load_groups(xs + 4, ok, EVEN_K).to(tl.float32)
        x5 = _load_groups(xs + 5, ok, EVEN_K).to(tl.float32)
        x6 = _load_groups(xs + 6, ok, EVEN_K).to(tl.float32)
        x7 = _load_groups(xs + 7, ok, EVEN_K).to(tl.float32)
    c = 1.8446744073709552e19  # 2**64
    return x0 * c, x1 * c, x2 * c, x3 * c, x4 * c, x5 * c, x6 * c, x7 * c


@triton.jit
def nvfp4_gemv_step(
    groups,
    scale,
    x_ptr,
    x_off,
    k0,
    k_end,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[BLOCK_N, G] partial sums (times 2**-62) of one BLOCK_K step of an NVFP4 GEMV for the single row x_off.

    `groups` / `scale` are the step's weight tiles from `fma_weights` (16 values per int64 group)."""
    offs_g = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    a0, a1, a2, a3, a4, a5, a6, a7 = nvfp4_x8(x_ptr, x_off, offs_g, 0, k_end, EVEN_K)
    b0, b1, b2, b3, b4, b5, b6, b7 = nvfp4_x8(x_ptr, x_off, offs_g, 8, k_end, EVEN_K)
    return nvfp4_group_dot(groups, scale, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7)


@triton.jit
def group_words(groups):
    """The two 32-bit words (values 16g .. 16g + 7, 16g + 8 .. 16g + 15) of int64 groups of codes; of uint64 groups
    (ready codes, `fma_weights`) as uint32, which the decode reads as ready codes (`e2m1_pair_packed`)."""
    if groups.dtype == tl.uint64:
        return groups.to(tl.uint32), (groups >> 32).to(tl.uint32)
    else:
        return groups.to(tl.int32), (groups >> 32).to(tl.int32)


@triton.jit
def nvfp4_group_dot(groups, scale, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """[BLOCK_N, G] block-scaled sums (times 2**-62) of int64 groups [BLOCK_N, G] against x planes [G] (values
    16g + i in a_i, 16g + 8 + i in b_i, times 2**64): one FFMA chain a word, the two words added, the scale."""
    lo, hi = group_words(groups)
    part = nvfp4_word_dot(lo, a0, a1, a2, a3, a4, a5, a6, a7)
    part = part + nvfp4_word_dot(hi, b0, b1, b2, b3, b4, b5, b6, b7)
    return part * scale


@triton.jit
def nvfp4_word_dot(word, x0, x1, x2, x3, x4, x5, x6, x7):
    """Sum over a word's eight values of code * x (times 2**-63, before the block scale), word [BLOCK_N, G] int32
    and x planes [G] (one x row for every weight row) or [BLOCK_N, G] (a row each): one FFMA chain, the products
    exact, only the running sum rounds."""
    v0, v4 = e2m1_pair_bits(word, 0)
    v1, v5 = e2m1_pair_bits(word, 1)
    v2, v6 = e2m1_pair_bits(word, 2)
    v3, v7 = e2m1_pair_bits(word, 3)
    part = v0 * x0
    part = part + v4 * x4
    part = part + v1 * x1
    part = part + v5 * x5
    part = part + v2 * x2
    part = part + v6 * x6
    part = part + v3 * x3
    part = part + v7 * x7
    return part


@triton.jit
def nvfp4_dot_step(
    acc,
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    x_ptr,
    x_off,
    x_ok,
    k0,
    k_end,
    stride_wn,
    stride_sn,
    PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """acc [BLOCK_N, BLOCK_M] += one BLOCK_K step of W @ x^T on tensor cores, weights decoded from int32 words.

    The eight nibble planes (value 16g + 8w + i for plane i) are eight K-slices of 2G values: each is scaled,
    rounded to x's dtype (exactly) and multiplied by the matching plane of x in its own tl.dot.
    """
    G: tl.constexpr = BLOCK_K // 16
    xdt = x_ptr.dtype.element_ty
    offs_g = k0 // 16 + tl.arange(0, G)
    wd = tl.arange(0, 2)
    if w_ptr.dtype.element_ty == tl.int8:  # ready codes: unsigned words tell the decode (`e2m1_pair_packed`)
        w32 = w_ptr.to(tl.pointer_type(tl.uint32))
    else:
        w32 = w_ptr.to(tl.pointer_type(tl.int32))
    word_ptrs = w32 + rows[:, None, None] * (stride_wn // 4) + (offs_g * 2)[None, :, None] + wd[None, None, :]
    s_ptrs = s_ptr + rows[:, None] * stride_sn + offs_g[None, :]
    kk = k0 + tl.arange(0, G)[:, None, None] * 16 + wd[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    x_ptrs = x_ptr + x_off[:, None, None, None] + kk[None, :, :, :]
    if EVEN_K:
        words = tl.load(word_ptrs, mask=row_ok[:, None, None], other=0)
        sb = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
        xv = tl.load(x_ptrs, mask=x_ok[:, None, None, None], other=0.0)
    else:
        g_ok = offs_g < k_end // 16
        words = tl.load(word_ptrs, mask=row_ok[:, None, None] & g_ok[None, :, None], other=0)
        sb = tl.load(s_ptrs, mask=row_ok[:, None] & g_ok[None, :], other=0)
        xv = tl.load(x_ptrs, mask=x_ok[:, None, None, None] & (kk < k_end)[None, :, :, :], other=0.0)
    if xdt == tl.float16:  # FP16's narrow range needs the true weights (code * scale is an exact FP32 subnormal)
        sc = scale_value(sb, s_ptr)[:, :, None]
        post = 8.507059173023462e37  # 2**126
    else:  # weights times 2**-62, exact in BF16 and FP32; one multiply per value
        sc = (scale_value(sb, s_ptr) * 1.8446744073709552e19)[:, :, None]  # 2**64
        post = 1.0
    x_even, x_odd = tl.split(tl.reshape(xv, (BLOCK_M, G, 2, 4, 2)))
    x_e04, x_e26 = tl.split(tl.reshape(x_even, (BLOCK_M, G, 2, 2, 2)))
    x_o15, x_o37 = tl.split(tl.reshape(x_odd, (BLOCK_M, G, 2, 2, 2)))
    for p in tl.static_range(4):
        if p == 0:
            xl, xh = tl.split(x_e04)
        elif p == 1:
            xl, xh = tl.split(x_o15)
        elif p == 2:
            xl, xh = tl.split(x_e26)
        else:
            xl, xh = tl.split(x_o37)
        vl, vh = e2m1_pair_bits(words, p)
        wl = tl.reshape(vl * sc * post, (BLOCK_N, 2 * G)).to(xdt)
        wh = tl.reshape(vh * sc * post, (BLOCK_N, 2 * G)).to(xdt)
        acc = tl.dot(wl, tl.trans(tl.reshape(xl, (BLOCK_M, 2 * G))), acc, input_precision=PRECISION)
        acc = tl.dot(wh, tl.trans(tl.reshape(xh, (BLOCK_M, 2 * G))), acc, input_precision=PRECISION)
    return acc


@triton.jit
def tile_matmul(
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    x_ptr,
    x_off,
    x_ok,
    k_start,
    k_end,
    stride_wn,
    stride_sn,
    NVFP4: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """FP32 [BLOCK_N, BLOCK_M] = W[rows, k_start:k_end] @ x[x_off, k_start:k_end]^T (NVFP4 without global scale).

    PDL: the caller has not waited for the previous grid yet (see `pdl.pdl_entry`); this waits after issuing the
    first step's weight loads on the FMA path, so those weights (never written by a kernel) stream while the
    previous kernel finishes. (Also loading each next step's weights a step ahead was slower: H200, 2026-11-29.)

    USE_DOT: tensor cores. Otherwise FMA: with BLOCK_M == 1 FP32 products summed elementwise in registers and
    reduced over K once at the end, so the loop has no cross-lane work; with a few rows (`fma_rows_step`) each
    weight tile is decoded once and multiplied into every row, each row reduced per K step. A dense weight is
    rounded to x's dtype first, as the reference materialises it; decoded NVFP4 values are exact in any of the
    activation dtypes.
    EVEN_K: every K step is whole (K and the split are multiples of BLOCK_K), so loads need no K mask and stay
    vectorised (a K mask of unknown alignment turns them into scalar loads).
    WORDS, the tensor-core NVFP4 decode (`decode_mode`): 0 byte planes joined back into K order; 1 (BLOCK_K >= 128)
    int32 words into eight nibble planes and eight dots, ~20% fewer instructions, but Triton 3.6 fails to compile it
    (TritonGPUOptimizeDotOperands; 3.9 compiles it), so the configs leave it off; 2 packed BF16 pairs scaled by
    FMA.BF16X2 (BF16 x), `nvfp4_packed_dot_step`; 3 the same, emulated with FP32 operations (interpreter).
    """
    xdt = x_ptr.dtype.element_ty
    if not USE_DOT:
        wa, wb = fma_weights(
            w_ptr, s_ptr, rows, row_ok, k_start, k_end, stride_wn, stride_sn, NVFP4, EVEN_K, BLOCK_N, BLOCK_K
        )
        pdl_entry(PDL)
        acc = fma_rows_step(wa, wb, x_ptr, x_off, x_ok, k_start, k_end, NVFP4, EVEN_K, BLOCK_N, BLOCK_M, BLOCK_K)
        for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
            wa, wb = fma_weights(
                w_ptr, s_ptr, rows, row_ok, k0, k_end, stride_wn, stride_sn, NVFP4, EVEN_K, BLOCK_N, BLOCK_K
            )
            acc += fma_rows_step(wa, wb, x_ptr, x_off, x_ok, k0, k_end, NVFP4, EVEN_K, BLOCK_N, BLOCK_M, BLOCK_K)
        if BLOCK_M == 1:  # one reduction over K at the end
            acc = tl.sum(acc, axis=1, keep_dims=True)
        if NVFP4:
            acc = acc * 4.611686018427388e18  # 2**62 undoes the offset (exact)
        return acc
    pdl_entry(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        if NVFP4 and USE_DOT and WORDS >= 2:  # packed BF16 pairs (3: emulated in the interpreter)
            acc = nvfp4_packed_dot_step(
                acc, w_ptr, s_ptr, rows, row_ok, x_ptr, x_off, x_ok, k0, k_end, stride_wn, stride_sn, PRECISION,
                EVEN_K, WORDS == 3, BLOCK_N, BLOCK_M, BLOCK_K,
            )  # fmt: skip
        elif NVFP4 and USE_DOT and WORDS == 1 and BLOCK_K >= 128:  # eight planes of K = BLOCK_K / 8 >= 16
            acc = nvfp4_dot_step(
                acc, w_ptr, s_ptr, rows, row_ok, x_ptr, x_off, x_ok, k0, k_end, stride_wn, stride_sn, PRECISION,
                EVEN_K, BLOCK_N, BLOCK_M, BLOCK_K,
            )  # fmt: skip
        elif NVFP4 and USE_DOT:
            lo, hi, scale = nvfp4_planes(
                w_ptr, s_ptr, rows, row_ok, k0, k_end, stride_wn, stride_sn, EVEN_K, BLOCK_N, BLOCK_K
            )
            if xdt == tl.float16:  # FP16's narrow range needs the true weights: 2**126 (lo*scale is exact)
                sc = scale[:, :, None]
                lo = lo * sc * 8.507059173023462e37
                hi = hi * sc * 8.507059173023462e37
            else:  # one multiply: the weights times 2**-62, exact in BF16 and FP32
                sc = (scale * 1.8446744073709552e19)[:, :, None]  # 2**64
                lo = lo * sc
                hi = hi * sc
            # Interleave the nibble planes back into K order: one dot against a plain (pipelined) x tile.
            w = tl.reshape(tl.join(lo.to(xdt), hi.to(xdt)), (BLOCK_N, BLOCK_K))
            kk = k0 + tl.arange(0, BLOCK_K)
            x_mask = x_ok[None, :]
            if not EVEN_K:
                x_mask = x_mask & (kk < k_end)[:, None]
            xt = tl.load(x_ptr + x_off[None, :] + kk[:, None], mask=x_mask, other=0.0)
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            w_mask = row_ok[:, None]
            if not EVEN_K:
                w_mask = w_mask & (kk < k_end)[None, :]
            w = tl.load(w_ptr + rows[:, None] * stride_wn + kk[None, :], mask=w_mask, other=0.0).to(xdt)
            x_mask = x_ok[None, :]
            if not EVEN_K:
                x_mask = x_mask & (kk < k_end)[:, None]
            xt = tl.load(x_ptr + x_off[None, :] + kk[:, None], mask=x_mask, other=0.0)
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
    if NVFP4 and xdt != tl.float16:
        acc = acc * 4.611686018427388e18  # 2**62 undoes the offset (exact)
    return acc


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    seg1,
    seg2,
    seg3,
    k_per_split,
    res_ptr,
    nw_ptr,
    h_ptr,
    res_out_ptr,
    row_cnt_ptr,
    eps,
    NVFP4: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    WORDS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    N_PAD: tl.constexpr,
    NORM_IN: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[m, n] = (sum_k x[m, k] W[n, k]) * global_scale[segment(n)], rounded once to out's dtype.

    NORM (M == 1): then also the residual add and RMSNorm of the whole row (see `_finish_row`).
    NORM_IN (M == 1, FMA tiles): x is add+RMSNorm of x_ptr's row and res_ptr's row first (`_normed_row_matmul`;
    program 0 stores the new residual to res_out_ptr).
    Nothing before `tile_matmul` reads memory: it waits for the previous grid (PDL) after its first weight loads."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    x_off = ms.to(tl.int64) * stride_xm
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    if NORM_IN:
        acc = _normed_row_matmul(
            w_ptr, s_ptr, rows64, row_ok, x_ptr, res_ptr, nw_ptr, res_out_ptr, k_start, k_end, K, eps, stride_wn,
            stride_sn, NVFP4, EVEN_K, BLOCK_N, BLOCK_K, PDL,
        )  # fmt: skip
    else:
        acc = tile_matmul(
            w_ptr, s_ptr, rows64, row_ok, x_ptr, x_off, m_ok, k_start, k_end, stride_wn, stride_sn,
            NVFP4, USE_DOT, PRECISION, EVEN_K, WORDS, BLOCK_N, BLOCK_M, BLOCK_K, PDL,
        )  # fmt: skip
    store_ok = row_ok[:, None] & m_ok[None, :]
    if SPLIT_K > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        acc, arrived = split_k_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, m_ok, SPLIT_K, BLOCK_N, BLOCK_M)
        store_ok = store_ok & is_last(arrived, SPLIT_K, BLOCK_N)[:, None]
    if NVFP4:
        acc = acc * segment_scale(gs_ptr, rows, row_ok, seg1, seg2, seg3)[:, None]
    out_ptrs = out_ptr + ms.to(tl.int64)[None, :] * stride_om + rows64[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=store_ok)
    if NORM:
        # Only programs that stored rows arrive: every one when K is not split, the last split of a tile else.
        if SPLIT_K > 1:
            if arrived == SPLIT_K - 1:
                _finish_row(out_ptr, res_ptr, nw_ptr, h_ptr, res_out_ptr, row_cnt_ptr, N, eps, N_PAD)
        else:
            _finish_row(out_ptr, res_ptr, nw_ptr, h_ptr, res_out_ptr, row_cnt_ptr, N, eps, N_PAD)


@triton.jit
def _row_rstd(x_ptr, res_ptr, res_out_ptr, K, eps, STORE: tl.constexpr, BLOCK: tl.constexpr):
    """1 / RMS of s = round(residual + x) over the row of K values, in FP32 (`add_rms_norm_ref`'s order up to the
    summation order); with STORE this program also writes s, the new residual, to res_out_ptr."""
    tot = tl.zeros([BLOCK], dtype=tl.float32)
    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0)
    for k0 in range(0, K, BLOCK):
        kk = k0 + tl.arange(0, BLOCK)
        ok = kk < K
        d = tl.load(x_ptr + kk, mask=ok, other=0.0)
        s = (tl.load(res_ptr + kk, mask=ok, other=0.0).to(tl.float32) + d.to(tl.float32)).to(d.dtype)
        if STORE:
            # A vector compare: the CPU interpreter mis-types `vector & scalar-bool` masks.
            tl.store(res_out_ptr + kk, s, mask=ok & ((kk * 0 + first.to(tl.int32)) != 0))
        s32 = s.to(tl.float32)
        tot += s32 * s32
    return tl.rsqrt(tl.sum(tot, axis=0) / K + eps)


@triton.jit
def _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk, ok):
    """x values at offsets kk (any shape) of round(w * (s * rstd)), s = round(residual + x): the normed row."""
    d = tl.load(x_ptr + kk, mask=ok, other=0.0)
    s = (tl.load(res_ptr + kk, mask=ok, other=0.0).to(tl.float32) + d.to(tl.float32)).to(d.dtype)
    w = tl.load(nw_ptr + kk, mask=ok, other=0.0).to(tl.float32)
    return (w * (s.to(tl.float32) * rstd)).to(d.dtype)


@triton.jit
def _normed_x8(x_ptr, res_ptr, nw_ptr, rstd, offs_g, BASE: tl.constexpr, k_end):
    """`nvfp4_x8` of the normed row: values 16g + BASE + i as eight FP32 planes times 2**64."""
    kk = offs_g * 16 + BASE
    ok = offs_g < k_end // 16
    c = 1.8446744073709552e19  # 2**64
    return (
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 0, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 1, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 2, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 3, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 4, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 5, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 6, ok).to(tl.float32) * c,
        _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk + 7, ok).to(tl.float32) * c,
    )


@triton.jit
def _normed_step(wa, wb, x_ptr, res_ptr, nw_ptr, rstd, k0, k_end, NVFP4: tl.constexpr, BLOCK_K: tl.constexpr):
    """`fma_step` with x the normed row (`_normed_x`) instead of a row read as it is."""
    if NVFP4:
        offs_g = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        a0, a1, a2, a3, a4, a5, a6, a7 = _normed_x8(x_ptr, res_ptr, nw_ptr, rstd, offs_g, 0, k_end)
        b0, b1, b2, b3, b4, b5, b6, b7 = _normed_x8(x_ptr, res_ptr, nw_ptr, rstd, offs_g, 8, k_end)
        return nvfp4_group_dot(wa, wb, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7)
    else:
        kk = (k0 + tl.arange(0, BLOCK_K))[None, :]
        return dense_fma_part(wa, _normed_x(x_ptr, res_ptr, nw_ptr, rstd, kk, kk < k_end))


@triton.jit
def _normed_row_matmul(
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    x_ptr,
    res_ptr,
    nw_ptr,
    res_out_ptr,
    k_start,
    k_end,
    K,
    eps,
    stride_wn,
    stride_sn,
    NVFP4: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """`tile_matmul`'s FMA path (M == 1) of the add+RMSNorm of one row: every program normalises the whole row
    itself (its RMS needs all of K before any product), then multiplies its K range as `fma_step` does, reading the
    row's pieces again (L1/L2). The first step's weights load before the PDL wait, as in `tile_matmul`."""
    wa, wb = fma_weights(
        w_ptr, s_ptr, rows, row_ok, k_start, k_end, stride_wn, stride_sn, NVFP4, EVEN_K, BLOCK_N, BLOCK_K
    )
    pdl_entry(PDL)
    rstd = _row_rstd(x_ptr, res_ptr, res_out_ptr, K, eps, True, 1024)
    acc = _normed_step(wa, wb, x_ptr, res_ptr, nw_ptr, rstd, k_start, k_end, NVFP4, BLOCK_K)
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        wa, wb = fma_weights(
            w_ptr, s_ptr, rows, row_ok, k0, k_end, stride_wn, stride_sn, NVFP4, EVEN_K, BLOCK_N, BLOCK_K
        )
        acc += _normed_step(wa, wb, x_ptr, res_ptr, nw_ptr, rstd, k0, k_end, NVFP4, BLOCK_K)
    acc = tl.sum(acc, axis=1, keep_dims=True)
    if NVFP4:
        acc = acc * 4.611686018427388e18  # 2**62 undoes the offset (exact)
    return acc


@triton.jit
def _finish_row(out_ptr, res_ptr, nw_ptr, h_ptr, res_out_ptr, row_cnt_ptr, N, eps, N_PAD: tl.constexpr):
    """After this program's output rows are stored: arrive on the row's counter; the last tile to arrive reads the
    whole output row back (L2) and computes `add_rms_norm_ref` of it: s = round(residual + out), stored as the new
    residual, and h = round(w * (s * rsqrt(mean(s^2) + eps))), the same order and rounding as the norm kernel."""
    tl.debug_barrier()
    done = tl.atomic_add(row_cnt_ptr, 1, sem="acq_rel")
    if done == tl.num_programs(0) - 1:
        cols = tl.arange(0, N_PAD)
        ok = cols < N
        y = tl.load(out_ptr + cols, mask=ok, other=0.0, cache_modifier=".cg")
        r = tl.load(res_ptr + cols, mask=ok, other=0.0)
        s = (r.to(tl.float32) + y.to(tl.float32)).to(y.dtype)
        tl.store(res_out_ptr + cols, s, mask=ok)
        s32 = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(s32 * s32, axis=0) / N + eps)
        w = tl.load(nw_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(h_ptr + cols, (w * (s32 * rstd)).to(y.dtype), mask=ok)
        tl.atomic_xchg(row_cnt_ptr, 0)


@triton.jit
def _dequant_kernel(
    w_ptr,
    s_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    stride_sn,
    stride_on,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[n, k] = E2M1X2 * ue4m3 (no global scale), exact in out's dtype (BF16 / FP16 / FP32)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    k0 = tl.program_id(1) * BLOCK_K
    lo, hi, scale = nvfp4_planes(
        w_ptr, s_ptr, rows.to(tl.int64), row_ok, k0, K, stride_wn, stride_sn, EVEN_K, BLOCK_N, BLOCK_K
    )
    # lo * scale is an exact FP32 (possibly subnormal) product; 2**126 brings it to the true value exactly.
    sc = scale[:, :, None]
    w = tl.reshape(tl.join(lo * sc * 8.507059173023462e37, hi * sc * 8.507059173023462e37), (BLOCK_N, BLOCK_K))
    kk = k0 + tl.arange(0, BLOCK_K)
    ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_on + kk[None, :]
    mask = row_ok[:, None]
    if not EVEN_K:
        mask = mask & (kk < K)[None, :]
    tl.store(ptrs, w.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale_rows_kernel(acc_ptr, gs_ptr, out_ptr, M, N, stride_a, stride_o, seg1, seg2, seg3, BLOCK_N: tl.constexpr):
    """out[m, n] = acc[m, n] * global_scale[segment(n)], rounded once to out's dtype."""
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    acc = tl.load(acc_ptr + m * stride_a + cols, mask=ok, other=0.0)
    acc = acc * segment_scale(gs_ptr, cols, ok, seg1, seg2, seg3)
    tl.store(out_ptr + m * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


# ------------------------------------------------------------------------------------------------- host helpers
def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every output and workspace comes from here (tests replace it with a NaN-filled allocator)."""
    return torch.empty(shape, dtype=dtype, device=device)


def decode_mode(cfg: TileConfig | MoEConfig, x_dtype: torch.dtype) -> int:
    """The kernels' WORDS constexpr for a config: 2 for `packed` tiles with BF16 x (3 under the interpreter, which
    emulates the PTX), else 1 for `words`, else 0 (byte planes)."""
    if cfg.packed and cfg.use_dot:
        if _INTERPRET:
            return 3
        if x_dtype == torch.bfloat16:
            return 2
    return int(cfg.words)


def precision_for(dtype: torch.dtype) -> str:
    """tl.dot input precision: true FP32 products for FP32 activations (not TF32)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def small_m_config(m: int, nvfp4: bool, k: int = 0, n: int = 0, device: torch.device | None = None) -> TileConfig:
    """Decode-sized tiles: weight bytes streamed once; FMA for M == 1, tensor cores above.

    The device's tuning table (op "gemv.small_m", shape m, n, k, nvfp4) may replace these portable defaults;
    the H200's measured choices are in kernels/tuning/nvidia-h200.json (NVFP4 at M == 1 takes K in steps of 2048
    where K divides, 1024 elsewhere)."""
    if m == 1:
        if nvfp4:
            block_k = 2048 if k > 0 and k % 2048 == 0 else 1024
            default = TileConfig(block_n=8, block_m=1, block_k=block_k, use_dot=False, num_warps=4, num_stages=1)
        else:
            default = TileConfig(block_n=8, block_m=1, block_k=512, use_dot=False, num_warps=4, num_stages=1)
    else:
        block_m = max(16, triton.next_power_of_2(m))
        default = TileConfig(block_n=64, block_m=block_m, block_k=128, use_dot=True, num_warps=4, num_stages=3)
    return tuning.tuned("gemv.small_m", default, device, m=m, n=n, k=k, nvfp4=nvfp4)


def large_m_config(nvfp4: bool, device: torch.device | None = None, m: int = 0, n: int = 0, k: int = 0) -> TileConfig:
    """Mid-M tiles for the NVFP4 dequantising GEMM (dense large M goes to cuBLAS); table op "gemv.large_m"."""
    default = TileConfig(block_n=128, block_m=128, block_k=64, use_dot=True, num_warps=8, num_stages=3)
    return tuning.tuned("gemv.large_m", default, device, m=m, n=n, k=k, nvfp4=nvfp4)


def _matmul(
    x: torch.Tensor,
    w: Weight,
    fp32_out: bool,
    config: TileConfig | None = None,
    split_k: int | None = None,
    norm: tuple | None = None,
    norm_in: tuple | None = None,
) -> torch.Tensor:
    """x [M, K] @ W^T through the Triton kernel; FP32 output or rounded once to x.dtype.

    `norm` (M == 1 only): (residual, norm weight, eps, h out, new residual out), filled in the same launch.
    `norm_in` (M == 1, FMA tiles): (residual, norm weight, eps, new residual out): the product is of the add+RMSNorm
    of x and the residual, and the new residual is written in the same launch."""
    m, k = x.shape
    nv = isinstance(w, NVFP4Weight)
    n = w.shape[-2]
    x = x if x.stride(-1) == 1 else x.contiguous()
    if nv:
        x = rows_aligned(x)
    if nv and config is None and m >= DEQUANT_MIN_M and n > 0 and k > 0:
        return dequant_matmul(x, w, fp32_out)
    out = _empty((m, n), torch.float32 if fp32_out else x.dtype, x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if config is None:
        dev = x.device
        config = small_m_config(m, nv, k, n, dev) if m <= SMALL_M else large_m_config(nv, dev, m, n, k)
    cfg = config
    # FP32 out too (the lm_head): no rounding then
    if cfg.mma and nv and norm is None and norm_in is None and nvfp4_mma_triton.supported(x, w):
        splits = split_k if split_k is not None else cfg.mma_split_k or None
        nvfp4_mma_triton.launch_linear(
            x, w, out, num_warps=cfg.num_warps, split_k=splits, vec=cfg.mma_vec, wide=cfg.mma_wide,
            ready=cfg.mma_ready, ready_codes=cfg.mma_ready_codes,
        )  # fmt: skip
        return out
    if nv:
        qw, sc, gs = w.qweight, w.scales, w.global_scale.reshape(-1)
        seg = segment_bounds(w.segments, n)
        stride_wn, stride_sn = qw.stride(0), sc.stride(0)
    else:
        qw, sc, gs = w, w, out
        seg = (n, n, n)
        stride_wn, stride_sn = w.stride(0), 0
    n_tiles = triton.cdiv(n, cfg.block_n)
    m_tiles = triton.cdiv(m, cfg.block_m)
    if split_k is None:
        split, per = choose_split_k(n_tiles * m_tiles, k, cfg.block_k, x.device) if m <= SMALL_M else (1, k)
    else:
        per = triton.cdiv(triton.cdiv(k, split_k), cfg.block_k) * cfg.block_k
        split = triton.cdiv(k, per)
    if split > 1:
        ws = _empty((n_tiles * m_tiles * split * cfg.block_n * cfg.block_m,), torch.float32, x.device)
        cnt = counters(x.device)
    else:
        ws, cnt = out, out
    if norm is not None:
        if m != 1 or n_tiles * m_tiles * split >= COUNTER_SLOTS:
            raise ValueError("the fused add+RMSNorm epilogue needs M == 1 and fewer tiles than counter slots")
        residual, norm_w, eps, h, new_res = norm
        # The row counter is the last slot: split-K tiles use slots from 0 (fewer than COUNTER_SLOTS, checked).
        row = (residual, norm_w, h, new_res, counters(x.device)[COUNTER_SLOTS - 1 :], float(eps))
    elif norm_in is not None:
        if m != 1 or cfg.use_dot:
            raise ValueError("the add+RMSNorm prologue needs M == 1 and FMA tiles")
        residual, norm_w, eps, new_res = norm_in
        row = (residual, norm_w, out, new_res, out, float(eps))
    else:
        row = (out, out, out, out, out, 0.0)
    _linear_kernel[(n_tiles, m_tiles, split)](
        x, qw, sc, gs, out, ws, cnt,
        m, n, k, x.stride(0), stride_wn, stride_sn, out.stride(0), *seg, per, *row,
        NVFP4=nv, USE_DOT=cfg.use_dot, PRECISION=precision_for(x.dtype), EVEN_K=k % cfg.block_k == 0,
        WORDS=decode_mode(cfg, x.dtype), SPLIT_K=split, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        NORM=norm is not None, N_PAD=triton.next_power_of_2(n) if norm is not None else 1, NORM_IN=norm_in is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(x.device),
    )  # fmt: skip
    return out


def dequantize(w: NVFP4Weight, dtype: torch.dtype, tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """The NVFP4 weight [N, K] without its global scale, in `dtype` (exact), by one Triton launch; `tile` is
    (BLOCK_N, BLOCK_K, warps), default by size (DEQUANT_TILE / DEQUANT_TILE_LARGE)."""
    n, k = w.shape
    out = _empty((n, k), dtype, w.device)
    block_n, block_k, warps = tile or (DEQUANT_TILE_LARGE if n * k >= DEQUANT_LARGE else DEQUANT_TILE)
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    _dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        w.qweight, w.scales, out, n, k, w.qweight.stride(0), w.scales.stride(0), out.stride(0),
        EVEN_K=k % block_k == 0, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )  # fmt: skip
    return out


def dequant_matmul(x: torch.Tensor, w: NVFP4Weight, fp32_out: bool, alpha: bool = True) -> torch.Tensor:
    """Prefill-sized M: dequantise once (exact) and let cuBLAS multiply, the global scale on the FP32 accumulator
    and one rounding, as the reference: for x.dtype output with `alpha`, one GEMM a segment with the segment's scale
    as alpha (applied in cuBLAS's FP32 epilogue) into its columns of the output; for FP32 output, without `alpha`
    or with scales not yet read to the host while a graph is captured: FP32 output, then the scale pass."""
    dense = dequantize(w, x.dtype)
    m, n = x.shape[0], dense.shape[0]
    alphas = w.host_global_scales() if alpha and not fp32_out else None
    if alphas is not None:
        # The output pass over FP32 was 6.9 ms of an 8K NVFP4 prefill (H200, ninth session); cuBLAS writes each
        # segment's columns in place (a column slice is a matrix with leading dimension n), reading nothing (beta 0).
        out = _empty((m, n), x.dtype, x.device)
        for (lo, hi), alpha in zip(_segment_ranges(w.segments), alphas, strict=True):
            part = out[:, lo:hi]
            torch.addmm(part, x, dense[lo:hi].t(), beta=0, alpha=alpha, out=part)
        return out
    acc = matmul_fp32_out(x, dense)
    out = acc if fp32_out else _empty((m, n), x.dtype, x.device)
    block = 1024
    _scale_rows_kernel[(m, triton.cdiv(n, block))](
        acc, w.global_scale.reshape(-1), out, m, n, acc.stride(0), out.stride(0), *segment_bounds(w.segments, n),
        BLOCK_N=block, num_warps=4,
    )  # fmt: skip
    return out


def _segment_ranges(segments: tuple[int, ...]) -> list[tuple[int, int]]:
    """[lo, hi) output columns of each segment."""
    ends = list(itertools.accumulate(segments))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def supported(x: torch.Tensor, w: Weight, fp32_out: bool) -> bool:
    """Whether the Triton kernel covers this call (otherwise the reference runs)."""
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if not (x.is_cuda or _INTERPRET):
        return False
    if isinstance(w, NVFP4Weight):
        return (
            w.qweight.dim() == 2
            and w.qweight.shape[1] * 2 == x.shape[1]
            and len(w.segments) <= MAX_SEGMENTS
            and w.qweight.stride(1) == 1
            and w.scales.stride(1) == 1
            and w.qweight.device == x.device
            and groups_aligned(w.qweight)
        )
    if w.dim() != 2 or w.shape[1] != x.shape[1] or w.stride(1) != 1 or w.device != x.device:
        return False
    # The dense FP32-output reference multiplies unrounded FP32 copies when dtypes differ: leave that to it.
    if fp32_out and w.dtype != x.dtype:
        return False
    if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return x.shape[0] <= DENSE_MAX_M


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """y = x @ W^T in x's dtype; an NVFP4 global scale multiplies the FP32 accumulator before the one rounding."""
    if not supported(x, w, fp32_out=False):
        return linear_ref(x, w)
    return _matmul(x, w, fp32_out=False)


# Widest row the fused add+RMSNorm epilogue normalises in one program (rmsnorm_triton's limit).
NORM_MAX_N = 8192


def linear_add_rms_norm(
    x: torch.Tensor, w: Weight, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_rms_norm(linear(x, w), residual, norm_weight, eps)` -> (normed, new residual); one launch at M == 1.

    At M == 1 the GEMV's last tile to finish normalises the row (`_finish_row`), so the norm costs no launch of
    its own; other shapes run the Triton linear and add+RMSNorm kernels one after the other.
    """
    n = w.shape[-2]
    fused = (
        x.shape[0] == 1
        and supported(x, w, fp32_out=False)
        and n <= NORM_MAX_N
        and residual.shape == (1, n)
        and residual.dtype == x.dtype
        and residual.is_contiguous()
        and norm_weight.is_contiguous()
    )
    if not fused:
        return rmsnorm_triton.add_rms_norm(linear(x, w), residual, norm_weight, eps)
    h = _empty((1, n), x.dtype, x.device)
    new_res = _empty((1, n), x.dtype, x.device)
    _matmul(x, w, fp32_out=False, norm=(residual, norm_weight, eps, h, new_res))
    return h, new_res


def add_rms_norm_linear(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, w: Weight
) -> tuple[torch.Tensor, torch.Tensor]:
    """`linear(add_rms_norm(x, residual, ...)[0], w)` -> (y, new residual); one launch at M == 1 where the device's
    table sets `norm_prologue` for the shape.

    There every program of the GEMV normalises the row itself before its products (`_normed_row_matmul`), so the
    norm costs no launch of its own and no program waits for another; elsewhere the Triton add+RMSNorm and linear
    kernels run one after the other (the same launches and bits as without this op).
    """
    if not norm_in_one_launch(x, residual, norm_weight, w):
        normed, new_res = rmsnorm_triton.add_rms_norm(x, residual, norm_weight, eps)
        return linear(normed, w), new_res
    new_res = _empty(tuple(x.shape), x.dtype, x.device)
    return _matmul(x, w, fp32_out=False, norm_in=(residual, norm_weight, eps, new_res)), new_res


def norm_in_one_launch(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, w: Weight) -> bool:
    """Whether `add_rms_norm_linear` runs these inputs as one launch (the table's `norm_prologue` for the shape)."""
    if x.shape[0] != 1:
        return False
    cfg = small_m_config(1, isinstance(w, NVFP4Weight), x.shape[1], w.shape[-2], x.device)
    return (
        cfg.norm_prologue
        and not cfg.use_dot
        and supported(x, w, fp32_out=False)
        and residual.shape == x.shape
        and residual.dtype == x.dtype
        and residual.is_contiguous()
        and x.is_contiguous()
        and norm_weight.shape == (x.shape[1],)
        and norm_weight.is_contiguous()
    )


def lm_head(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """FP32 output (the lm_head): FP32 accumulation, NVFP4 global scale applied to the FP32 result."""
    if not supported(x, w, fp32_out=True):
        return linear_fp32_out_ref(x, w)
    return _matmul(x, w, fp32_out=True)
