"""The MoE's expert-major gate_up and down for NVFP4 (W4A16) on `mma.sync` tensor cores, on `nvfp4_mma_triton`'s
K steps (the weights decoded two a register in PTX, FP32 accumulation in the MMA's order).

`moe_gate_up` computes the h rows of `moe_ref` for every (token, slot) pair (SiLU-and-mul in the epilogue) and
`moe_down` each pair's rounded expert output y, 8 of an expert's pairs an MMA; `MoEConfig.mma` / `mma_down` put
them inside `moe_triton.fused_moe` (the slot sum is its reduce launch), and the H200 table selects them where a
whole-step A/B had them ahead (docs/performance.md, nineteenth session on).

A launch's grid is (column tiles, experts): each program finds its expert's pairs from the ids (`_ranked_pairs`),
so an expert without pairs costs a program that exits. Twins of each kernel (the same body, other constexprs)
choose what a table entry asks for: 16-byte loads (`vec`), L2 requests ahead of the K loop (`l2_ahead`, the down's
`l2`), two 16-row tiles a warp sharing x's loads (`wide`), the gate_up's warps splitting K (`warp_k`), and the
shared expert in programs of its own (`shared`, MoEConfig.mma_shared: first in the grid with `first`, h kept in the
MMA's order with `perm`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .l2_prefetch import prefetch_lines
from .linear import NVFP4Weight
from .moe_triton import _ranked_pairs
from .nvfp4_decode_triton import segment_bounds, segment_scale
from .nvfp4_mma_triton import (
    _INTERPRET,
    BLOCK_K,
    PREFETCH,
    _fits,
    _k_loop,
    _k_loop_wide,
    _vec_fits,
    _vec_weight,
    _weight_bases,
    _weight_fits,
    _with_ready_bytes,
)
from .pdl import launch_options, pdl_entry

# The gate_up whose warps split K: ptxas gives it ~140 registers a thread in 8 warps unless capped (sm_90, Triton
# 3.6), which leaves one 8-warp program an SM; at 128 it needs ~117 with no spills (`kernel_sass.py`-style compile,
# 2026-12-03), so two fit, as for the unsplit kernel (108). The wide gate_up with its loads a step ahead takes 176
# uncapped and fits 128 with no spills too (2026-12-04).
KS_MAXNREG = 128


@triton.jit
def _perm_col(i, PERM: tl.constexpr):
    """Where column i of a row goes when the row is kept in the MMA's order (`nvfp4_mma_triton.perm_columns`;
    PERM), else i."""
    if PERM:
        return i - (i & 7) + 2 * (i & 3) + ((i >> 2) & 1)
    else:
        return i


@triton.jit
def _expert_of_program(n_exp, SHARED: tl.constexpr, FIRST: tl.constexpr):
    """The program's expert index (with SHARED, n_exp onward: the shared expert's programs). FIRST: the launch's grid
    puts the shared expert's programs before the experts', so they start first (the down's take K_S, twice an
    expert's K, and would otherwise be the launch's last); the index is mapped back so the body reads as without."""
    e = tl.program_id(1)
    if SHARED:  # noqa: SIM102 (constexpr tests: Triton compiles them apart)
        if FIRST:
            n_sh = tl.num_programs(1) - n_exp
            e = tl.where(e < n_sh, e + n_exp, e - n_sh)
    return e


@triton.jit
def _shared_or_expert(is_sh, sw_ptr, ss_ptr, sgs_ptr, swn, ssn, sseg1, sseg2, sseg3,
                      w_ptr, s_ptr, gs_ptr, wn, sn, seg1, seg2, seg3):  # fmt: skip
    """(codes, scales, global scales, code and scale row strides, segment bounds) of the shared expert where is_sh
    (a program of the MoE launches' SHARED twins), else the expert's."""
    return (
        tl.where(is_sh, sw_ptr, w_ptr), tl.where(is_sh, ss_ptr, s_ptr), tl.where(is_sh, sgs_ptr, gs_ptr),
        tl.where(is_sh, swn, wn), tl.where(is_sh, ssn, sn),
        tl.where(is_sh, sseg1, seg1), tl.where(is_sh, sseg2, seg2), tl.where(is_sh, sseg3, seg3),
    )  # fmt: skip


@triton.jit
def _silu_mul(gate, up):
    """round(round(silu(gate)) * up) of rounded gate and up, as `silu_and_mul_ref`."""
    g32 = gate.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _gate_up_columns(pid_i, t, NG: tl.constexpr, TILES: tl.constexpr = 1):
    """Lane t's (c, column j) in the gate_up's column tile pid_i of NG warps' 8 columns; with the warps splitting K,
    warp w's columns are those of warp w % NG. TILES 2: 16 columns a warp, j and j + 8 the lane's."""
    lane = t % 32
    CW: tl.constexpr = 8 * TILES  # columns a warp
    return lane % 4, pid_i * (CW * NG) + ((t // 32) % NG) * CW + lane // 4


@triton.jit
def _gate_up_tile(w_ptr, s_ptr, j, INTER, c, stride_wn, stride_sn, col, up):
    """Code and scale bases (`_weight_bases`) of one expert's gate row col + j and up row col + up + j (j past INTER
    reads INTER - 1: a column never stored). Routed experts: col 0, up INTER; the shared expert's part: its first
    column and the shared expert's width (`_moe_gate_up_body`'s SHARED)."""
    jj = tl.minimum(j, INTER - 1).to(tl.int64) + col
    _, _, wa, wb, sa, sb = _weight_bases(w_ptr, s_ptr, jj, jj + up, c, stride_wn, stride_sn)
    return wa, wb, sa, sb


@triton.jit
def _gate_up_scales(gs_ptr, jo, INTER, seg1, seg2, seg3, col, up):
    """(column jo is one of the expert's, gate row col + jo's and up row col + up + jo's global scales times
    2**62)."""
    ok = jo < INTER
    jj = tl.minimum(jo, INTER - 1).to(tl.int64) + col
    post = 4.611686018427388e18  # 2**62
    gs_a = segment_scale(gs_ptr, jj, ok, seg1, seg2, seg3) * post
    return ok, gs_a, segment_scale(gs_ptr, jj + up, ok, seg1, seg2, seg3) * post


@triton.jit
def _gate_up_store(h_ptr, d0, d1, d2, d3, ok, gs_a, gs_b, p_lo, p_hi, lo_ok, hi_ok, col, stride_h):
    """A tile's D fragment (gate in d0 / d1, up in d2 / d3, pairs p_lo / p_hi) as silu(gate) * up into h's column."""
    xdt = h_ptr.dtype.element_ty
    h_lo = _silu_mul((d0 * gs_a).to(xdt), (d2 * gs_b).to(xdt))
    h_hi = _silu_mul((d1 * gs_a).to(xdt), (d3 * gs_b).to(xdt))
    tl.store(h_ptr + p_lo * stride_h + col, h_lo, mask=ok & lo_ok)
    tl.store(h_ptr + p_hi * stride_h + col, h_hi, mask=ok & hi_ok)


@triton.jit
def _moe_gate_up_body(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    K,
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
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    VEC: tl.constexpr,
    L2_AHEAD: tl.constexpr,
    KSPLIT: tl.constexpr = 1,
    TILES: tl.constexpr = 1,
    SHARED: tl.constexpr = False,
    n_exp=0,
    sw_ptr=None,
    ss_ptr=None,
    sgs_ptr=None,
    hs_ptr=None,
    T=0,
    INTER_S=0,
    stride_swn=0,
    stride_ssn=0,
    stride_hs=0,
    sseg1=0,
    sseg2=0,
    sseg3=0,
    PERM: tl.constexpr = False,
    FIRST: tl.constexpr = False,
):
    """Expert-major MoE gate_up (NVFP4): program (column tile, expert e) finds e's pairs in the router's ids and
    computes their h = silu(gate) * up columns, 8 pairs an MMA. A lane's fragment rows are gate row j and up row
    INTER + j, so its D fragment holds gate and up of the same column for pairs 2c, 2c + 1: SiLU-and-mul in
    registers. An expert without pairs does no K loop. KSPLIT > 1: the warps split K as well as the columns (NW /
    KSPLIT groups of 8 columns, each in KSPLIT parts of K, one a warp), so each warp's chain of dependent K steps is
    KSPLIT times shorter; the parts' D fragments are summed across warps in part order (deterministic). TILES 2 (with
    KSPLIT 1): 16 columns a warp, two 16-row weight tiles (columns j and j + 8) whose MMAs share each K step's x
    words. (Four tiles, 32 columns a warp, lost on the H200: b32 +15%, thirty-third session.)

    SHARED (with TILES 2, KSPLIT 1): programs e >= n_exp compute the shared expert as well (`sw_ptr`..., a 2-D NVFP4
    gate_up of 2 * INTER_S rows, INTER_S a multiple of INTER): program n_exp + q takes part q % (INTER_S / INTER), its
    columns INTER * part onward, for tokens 8 * (q // parts) onward of the T, and writes their silu(gate) * up into hs
    [T, INTER_S]. The same K loop and epilogue as an expert's, so a shared launch of its own costs nothing. PERM: h
    and hs are written in the MMA's order (`nvfp4_mma_triton.perm_columns`), for the down's K loop without PRMTs."""
    pid_i = tl.program_id(0)
    e = _expert_of_program(n_exp, SHARED, FIRST)
    NT: tl.constexpr = 32 * NW
    NG: tl.constexpr = NW // KSPLIT  # warps (groups of 8 columns) a K part
    t = tl.arange(0, NT)
    g = (t % 32) // 4
    c, j = _gate_up_columns(pid_i, t, NG, TILES)
    e64 = e.to(tl.int64)
    we_ptr, se_ptr, ge_ptr = w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, gs_ptr + e64 * stride_gse
    col = 0  # the expert's first column (the shared expert's part: INTER * part)
    up = INTER  # rows from a gate row to its up row
    wn, sn, out_ptr, out_stride = stride_wn, stride_sn, h_ptr, stride_h
    s1, s2, s3 = seg1, seg2, seg3
    if SHARED:
        is_sh = e >= n_exp
        q = tl.maximum(e - n_exp, 0)
        parts = INTER_S // INTER
        first = (q // parts) * 8  # the shared program's first token
        col = tl.where(is_sh, (q % parts) * INTER, 0).to(tl.int64)
        up = tl.where(is_sh, INTER_S, INTER)
        we_ptr, se_ptr, ge_ptr, wn, sn, s1, s2, s3 = _shared_or_expert(
            is_sh, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2, sseg3,
            we_ptr, se_ptr, ge_ptr, wn, sn, s1, s2, s3,
        )  # fmt: skip
        out_ptr, out_stride = tl.where(is_sh, hs_ptr, h_ptr), tl.where(is_sh, stride_hs, stride_h)
    ja = tl.minimum(j, INTER - 1).to(tl.int64) + col
    jb = ja + up
    w64, sp, wa_base, wb_base, sa_base, sb_base = _weight_bases(we_ptr, se_ptr, ja, jb, c, wn, sn)
    if TILES == 2:  # tile two: gate and up rows of column j + 8
        wc_base, wd_base, sc_base, sd_base = _gate_up_tile(we_ptr, se_ptr, j + 8, INTER, c, wn, sn, col, up)
    x64 = x_ptr.to(tl.pointer_type(tl.int64))
    k_part = K // KSPLIT  # a multiple of 256 (`launch_moe_gate_up`): the parts keep the 16-byte and line alignment
    if KSPLIT > 1:  # warp w's part of K, (w // NG) * k_part onward, as offsets in int64 code words and scale bytes
        k_off = (t // (32 * NG)) * k_part
        wa_base += k_off // 16
        wb_base += k_off // 16
        sa_base += k_off // 16
        sb_base += k_off // 16
    # The epilogue's lanes: one K part's (after the sum across parts, a warp a column group).
    NO: tl.constexpr = 32 * NG
    if KSPLIT > 1:
        co, jo = _gate_up_columns(pid_i, tl.arange(0, NO), NG)
    else:
        co = c
        jo = j
    ok = jo < INTER
    joa = tl.minimum(jo, INTER - 1).to(tl.int64) + col
    post = 4.611686018427388e18  # 2**62
    gs_a = segment_scale(ge_ptr, joa, ok, s1, s2, s3) * post
    gs_b = segment_scale(ge_ptr, joa + up, ok, s1, s2, s3) * post
    if TILES == 2:
        ok2, gs_c, gs_d = _gate_up_scales(ge_ptr, jo + 8, INTER, s1, s2, s3, col, up)
    xdt = h_ptr.dtype.element_ty
    pdl_entry(PDL)  # the ids are the router's, the previous kernel's
    pairs, count = _ranked_pairs(ids_ptr, e, 0, P, P_PAD, 8)
    if SHARED:  # the shared program's tokens as pairs of slot 0 (x row pair // TOPK; past T: the last token)
        tokens = first + tl.arange(0, 8)
        pairs = tl.where(is_sh, tl.minimum(tokens, T - 1).to(tl.int64) * TOPK, pairs)
        count = tl.where(is_sh, tl.minimum(T - first, 8), count)
    for c0 in range(0, count, 8):
        if c0 > 0:
            pairs, count = _ranked_pairs(ids_ptr, e, c0, P, P_PAD, 8)
        # Lane (g, c) multiplies x of the pair ranked c0 + g (past the last: pair 0, a column never stored).
        xa_base = (tl.gather(pairs, g, 0) // TOPK) * (stride_xt // 4) + c * 8
        if KSPLIT > 1:
            xa_base += k_off // 4
        if TILES == 2:
            d0, d1, d2, d3, f0, f1, f2, f3 = _k_loop_wide(
                w64, wa_base, wb_base, wc_base, wd_base, sp, sa_base, sb_base, sc_base, sd_base, x64, xa_base, 0,
                k_part, NT, PREFETCH, VEC, L2_AHEAD,
            )  # fmt: skip
        else:
            d0, d1, d2, d3 = _k_loop(
                w64, wa_base, wb_base, sp, sa_base, sb_base, x64, xa_base, 0, k_part, NT, PREFETCH, VEC, L2_AHEAD
            )  # fmt: skip
        if KSPLIT > 1:
            d0 = tl.sum(tl.reshape(d0, (KSPLIT, NO)), axis=0)
            d1 = tl.sum(tl.reshape(d1, (KSPLIT, NO)), axis=0)
            d2 = tl.sum(tl.reshape(d2, (KSPLIT, NO)), axis=0)
            d3 = tl.sum(tl.reshape(d3, (KSPLIT, NO)), axis=0)
        p_lo = tl.gather(pairs, 2 * co, 0)
        p_hi = tl.gather(pairs, 2 * co + 1, 0)
        if SHARED:  # the shared expert's rows of hs are tokens
            p_lo = tl.where(is_sh, p_lo // TOPK, p_lo)
            p_hi = tl.where(is_sh, p_hi // TOPK, p_hi)
        h_lo = _silu_mul((d0 * gs_a).to(xdt), (d2 * gs_b).to(xdt))
        h_hi = _silu_mul((d1 * gs_a).to(xdt), (d3 * gs_b).to(xdt))
        at = _perm_col(col + jo, PERM)
        tl.store(out_ptr + p_lo * out_stride + at, h_lo, mask=ok & (c0 + 2 * co < count))
        tl.store(out_ptr + p_hi * out_stride + at, h_hi, mask=ok & (c0 + 2 * co + 1 < count))
        if TILES == 2:
            lo_ok, hi_ok = c0 + 2 * co < count, c0 + 2 * co + 1 < count
            at = _perm_col(col + jo + 8, PERM)
            _gate_up_store(out_ptr, f0, f1, f2, f3, ok2, gs_c, gs_d, p_lo, p_hi, lo_ok, hi_ok, at, out_stride)


@triton.jit(do_not_specialize=["P"])
def _moe_gate_up_mma_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    K,
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
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    """The MoE gate_up (`_moe_gate_up_body`) with 8-byte loads."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, False, 0
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_gate_up_mma_vec_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    K,
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
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    """The MoE gate_up (`_moe_gate_up_body`) with 16-byte loads (VEC)."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, 0
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_gate_up_mma_l2_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    K,
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
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    L2_AHEAD: tl.constexpr,
):
    """The VEC MoE gate_up that also asks L2 for its codes L2_AHEAD K steps ahead (`_l2_ahead`; a twin, so the
    installed kernels' signatures and the shipped manifest stay as they are)."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_AHEAD
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_gate_up_mma_ks_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    K,
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
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    L2_AHEAD: tl.constexpr,
    KSPLIT: tl.constexpr,
):
    """The VEC MoE gate_up with its warps splitting K in KSPLIT parts (MoEConfig.mma_warp_k), L2 requests
    L2_AHEAD K steps ahead (0: none); a twin, so the installed kernels' signatures and the manifest stay as they are."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_AHEAD, KSPLIT
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_gate_up_mma_wide_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    h_ptr,
    P,
    K,
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
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    L2_AHEAD: tl.constexpr,
):
    """The VEC MoE gate_up with 16 columns a warp, two weight tiles sharing each K step's x words (MoEConfig.mma_wide),
    L2 requests L2_AHEAD K steps ahead (0: none); a twin, so the installed kernels' signatures and the manifest stay
    as they are."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_AHEAD, 1, 2
    )  # fmt: skip


@triton.jit(do_not_specialize=["P", "T"])
def _moe_gate_up_mma_wide_shared_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
    stride_sn, stride_gse, stride_h, seg1, seg2, seg3,
    n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, T, INTER_S, stride_swn, stride_ssn, stride_hs, sseg1, sseg2, sseg3,
    P_PAD: tl.constexpr, NW: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, L2_AHEAD: tl.constexpr,
    PERM: tl.constexpr,
):  # fmt: skip
    """The wide MoE gate_up that also computes the shared expert in programs of its own (MoEConfig.mma_shared,
    `_moe_gate_up_body`'s SHARED): its launch no longer runs beside the MoE's. PERM: h and hs in the MMA's order
    (MoEConfig.mma_perm_h). A twin, so the installed kernels' signatures and the manifest stay as they are."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_AHEAD, 1, 2,
        True, n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, T, INTER_S, stride_swn, stride_ssn, stride_hs, sseg1, sseg2,
        sseg3, PERM,
    )  # fmt: skip


@triton.jit(do_not_specialize=["P", "T"])
def _moe_gate_up_mma_wide_shared_first_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
    stride_sn, stride_gse, stride_h, seg1, seg2, seg3,
    n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, T, INTER_S, stride_swn, stride_ssn, stride_hs, sseg1, sseg2, sseg3,
    P_PAD: tl.constexpr, NW: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, L2_AHEAD: tl.constexpr,
    PERM: tl.constexpr,
):  # fmt: skip
    """`_moe_gate_up_mma_wide_shared_kernel` with the shared expert's programs first in the grid
    (MoEConfig.mma_shared_first); a twin, so the installed kernel's signature and the manifest stay as they are."""
    _moe_gate_up_body(
        x_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, P, K, INTER, TOPK, stride_xt, stride_we, stride_wn, stride_se,
        stride_sn, stride_gse, stride_h, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_AHEAD, 1, 2,
        True, n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, T, INTER_S, stride_swn, stride_ssn, stride_hs, sseg1, sseg2,
        sseg3, PERM, True,
    )  # fmt: skip


@triton.jit
def _down_tile(w_ptr, s_ptr, gs_ptr, row, N, c, stride_wn, stride_sn, seg1, seg2, seg3):
    """One expert's 16-row tile at rows row / row + 8: code and scale bases (`_weight_bases`; rows past N read row
    N - 1, never stored), whether the rows are the expert's, their global scales times 2**62."""
    ra = tl.minimum(row, N - 1).to(tl.int64)
    rb = tl.minimum(row + 8, N - 1).to(tl.int64)
    _, _, wa, wb, sa, sb = _weight_bases(w_ptr, s_ptr, ra, rb, c, stride_wn, stride_sn)
    ok_a, ok_b = row < N, row + 8 < N
    post = 4.611686018427388e18  # 2**62
    gs_a = segment_scale(gs_ptr, ra, ok_a, seg1, seg2, seg3) * post
    return wa, wb, sa, sb, ok_a, ok_b, gs_a, segment_scale(gs_ptr, rb, ok_b, seg1, seg2, seg3) * post


@triton.jit
def _down_store(y_ptr, d0, d1, d2, d3, row, ok_a, ok_b, gs_a, gs_b, p_lo, p_hi, lo_ok, hi_ok, stride_y):
    """A tile's D fragment (rows row / row + 8, pairs p_lo / p_hi) times the rows' global scales, rounded once."""
    ydt = y_ptr.dtype.element_ty
    tl.store(y_ptr + p_lo * stride_y + row, (d0 * gs_a).to(ydt), mask=ok_a & lo_ok)
    tl.store(y_ptr + p_hi * stride_y + row, (d1 * gs_a).to(ydt), mask=ok_a & hi_ok)
    tl.store(y_ptr + p_lo * stride_y + row + 8, (d2 * gs_b).to(ydt), mask=ok_b & lo_ok)
    tl.store(y_ptr + p_hi * stride_y + row + 8, (d3 * gs_b).to(ydt), mask=ok_b & hi_ok)


@triton.jit
def _moe_down_body(
    h_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    y_ptr,
    P,
    K,
    N,
    stride_h,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_y,
    seg1,
    seg2,
    seg3,
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    VEC: tl.constexpr,
    L2_MODE: tl.constexpr,
    TILES: tl.constexpr = 1,
    SHARED: tl.constexpr = False,
    n_exp=0,
    sw_ptr=None,
    ss_ptr=None,
    sgs_ptr=None,
    hs_ptr=None,
    ys_ptr=None,
    T=0,
    K_S=0,
    stride_swn=0,
    stride_ssn=0,
    stride_hs=0,
    stride_ys=0,
    sseg1=0,
    sseg2=0,
    sseg3=0,
    PERM: tl.constexpr = False,
    FIRST: tl.constexpr = False,
):
    """Expert-major MoE down (NVFP4): program (row tile, expert e) computes y[p] = round(h[p] @ w2[e]^T * scale) for e's
    pairs p, 8 an MMA, into y [pairs, N]; the routing weights and the sum over slots are `_moe_reduce_kernel`'s. L2_MODE
    (MoEConfig.mma_down_l2): 1 asks L2 for the codes two K steps ahead in the K loop (`_l2_ahead`); 2 asks for all of
    the tile's codes before the PDL wait, for an expert with pairs: the ids are the router's, written two grids back,
    and the gate_up launch before this one lets it start only after each of its programs has waited for its own
    predecessor (`pdl_entry`), so the router has finished by then. TILES 2: 32 rows a warp, two 16-row tiles whose MMAs
    share each K step's h words. (Four tiles, 64 rows a warp, were even to +2.3% on the H200.)

    SHARED (with TILES 2): programs e >= n_exp compute the shared expert's down as well (`sw_ptr`..., a 2-D NVFP4 [N,
    K_S]): program n_exp + q for tokens 8q onward of the T, from hs [T, K_S] into ys [T, N], rounded once as the linear
    rounds it (the slot reduce then adds ys). PERM (with TILES 2): h and hs in the MMA's order
    (`nvfp4_mma_triton.perm_columns`, as the gate_up's PERM writes them): the K loop has no PRMTs."""
    tl.static_assert(not PERM or TILES == 2, "PERM is the wide down's")
    pid_n = tl.program_id(0)
    e = _expert_of_program(n_exp, SHARED, FIRST)
    NT: tl.constexpr = 32 * NW
    t = tl.arange(0, NT)
    lane = t % 32
    g = lane // 4
    c = lane % 4
    RW: tl.constexpr = 16 * TILES  # weight rows a warp
    row0 = pid_n * (RW * NW) + (t // 32) * RW + g
    row1 = row0 + 8
    ok0 = row0 < N
    ok1 = row1 < N
    r0 = tl.minimum(row0, N - 1).to(tl.int64)
    r1 = tl.minimum(row1, N - 1).to(tl.int64)
    e64 = e.to(tl.int64)
    we_ptr, se_ptr, ge_ptr = w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, gs_ptr + e64 * stride_gse
    k_hi, wn, sn, hp, h_stride, out_ptr, out_stride = K, stride_wn, stride_sn, h_ptr, stride_h, y_ptr, stride_y
    s1, s2, s3 = seg1, seg2, seg3
    if SHARED:
        is_sh = e >= n_exp
        first = tl.maximum(e - n_exp, 0) * 8  # the shared program's first token
        we_ptr, se_ptr, ge_ptr, wn, sn, s1, s2, s3 = _shared_or_expert(
            is_sh, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2, sseg3,
            we_ptr, se_ptr, ge_ptr, wn, sn, s1, s2, s3,
        )  # fmt: skip
        k_hi = tl.where(is_sh, K_S, K)
        hp, h_stride = tl.where(is_sh, hs_ptr, h_ptr), tl.where(is_sh, stride_hs, stride_h)
        out_ptr, out_stride = tl.where(is_sh, ys_ptr, y_ptr), tl.where(is_sh, stride_ys, stride_y)
    w64, sp, wa_base, wb_base, sa_base, sb_base = _weight_bases(we_ptr, se_ptr, r0, r1, c, wn, sn)
    h64 = hp.to(tl.pointer_type(tl.int64))
    post = 4.611686018427388e18  # 2**62
    gs0 = segment_scale(ge_ptr, r0, ok0, s1, s2, s3) * post
    gs1 = segment_scale(ge_ptr, r1, ok1, s1, s2, s3) * post
    if TILES == 2:  # tile two: rows g + 16 / g + 24 of the warp's 32
        wc_base, wd_base, sc_base, sd_base, ok2, ok3, gs2, gs3 = _down_tile(
            we_ptr, se_ptr, ge_ptr, row0 + 16, N, c, wn, sn, s1, s2, s3
        )
    ydt = y_ptr.dtype.element_ty
    if L2_MODE != 2:
        pdl_entry(PDL)  # h is the gate_up launch's
    pairs, count = _ranked_pairs(ids_ptr, e, 0, P, P_PAD, 8)
    if SHARED:  # the shared program's tokens (past T: the last one, never stored)
        tokens = first + tl.arange(0, 8)
        pairs = tl.where(is_sh, tl.minimum(tokens, T - 1).to(tl.int64), pairs)
        count = tl.where(is_sh, tl.minimum(T - first, 8), count)
    if L2_MODE == 2:
        if count > 0:
            for kl in range(0, k_hi, 256):  # a row's 128-byte lines (256 codes each)
                prefetch_lines(w64 + wa_base + kl // 16)
                prefetch_lines(w64 + wb_base + kl // 16)
                if TILES == 2:
                    prefetch_lines(w64 + wc_base + kl // 16)
                    prefetch_lines(w64 + wd_base + kl // 16)
        pdl_entry(PDL)
    for c0 in range(0, count, 8):
        if c0 > 0:
            pairs, count = _ranked_pairs(ids_ptr, e, c0, P, P_PAD, 8)
        ha_base = tl.gather(pairs, g, 0) * (h_stride // 4) + c * 8
        if TILES == 2:
            d0, d1, d2, d3, f0, f1, f2, f3 = _k_loop_wide(
                w64, wa_base, wb_base, wc_base, wd_base, sp, sa_base, sb_base, sc_base, sd_base, h64, ha_base, 0,
                k_hi, NT, PREFETCH, VEC, 2 * (L2_MODE == 1), PERM,
            )  # fmt: skip
        else:
            d0, d1, d2, d3 = _k_loop(
                w64, wa_base, wb_base, sp, sa_base, sb_base, h64, ha_base, 0, k_hi, NT, PREFETCH, VEC,
                2 * (L2_MODE == 1),
            )  # fmt: skip
        p_lo = tl.gather(pairs, 2 * c, 0)
        p_hi = tl.gather(pairs, 2 * c + 1, 0)
        lo_ok = c0 + 2 * c < count
        hi_ok = c0 + 2 * c + 1 < count
        tl.store(out_ptr + p_lo * out_stride + row0, (d0 * gs0).to(ydt), mask=ok0 & lo_ok)
        tl.store(out_ptr + p_hi * out_stride + row0, (d1 * gs0).to(ydt), mask=ok0 & hi_ok)
        tl.store(out_ptr + p_lo * out_stride + row1, (d2 * gs1).to(ydt), mask=ok1 & lo_ok)
        tl.store(out_ptr + p_hi * out_stride + row1, (d3 * gs1).to(ydt), mask=ok1 & hi_ok)
        if TILES == 2:
            _down_store(out_ptr, f0, f1, f2, f3, row0 + 16, ok2, ok3, gs2, gs3, p_lo, p_hi, lo_ok, hi_ok, out_stride)


@triton.jit(do_not_specialize=["P"])
def _moe_down_mma_kernel(
    h_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    y_ptr,
    P,
    K,
    N,
    stride_h,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_y,
    seg1,
    seg2,
    seg3,
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    """The MoE down (`_moe_down_body`) with 8-byte loads."""
    _moe_down_body(
        h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
        stride_gse, stride_y, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, False, 0
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_down_mma_vec_kernel(
    h_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    y_ptr,
    P,
    K,
    N,
    stride_h,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_y,
    seg1,
    seg2,
    seg3,
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    """The MoE down (`_moe_down_body`) with 16-byte loads (VEC)."""
    _moe_down_body(
        h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
        stride_gse, stride_y, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, 0
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_down_mma_l2_kernel(
    h_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    y_ptr,
    P,
    K,
    N,
    stride_h,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_y,
    seg1,
    seg2,
    seg3,
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    L2_MODE: tl.constexpr,
):
    """The VEC MoE down that also asks L2 for its codes (L2_MODE, `_moe_down_body`; a twin, so the installed kernels'
    signatures and the shipped manifest stay as they are)."""
    _moe_down_body(
        h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
        stride_gse, stride_y, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_MODE
    )  # fmt: skip


@triton.jit(do_not_specialize=["P"])
def _moe_down_mma_wide_kernel(
    h_ptr,
    ids_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    y_ptr,
    P,
    K,
    N,
    stride_h,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_gse,
    stride_y,
    seg1,
    seg2,
    seg3,
    P_PAD: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    L2_MODE: tl.constexpr,
):
    """The VEC MoE down with 32 rows a warp, two weight tiles sharing each K step's h words (MoEConfig.mma_down_wide),
    L2 requests as L2_MODE says (`_moe_down_body`); a twin, so the installed kernels' signatures and the manifest
    stay as they are."""
    _moe_down_body(
        h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
        stride_gse, stride_y, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_MODE, 2
    )  # fmt: skip


@triton.jit(do_not_specialize=["P", "T"])
def _moe_down_mma_wide_shared_kernel(
    h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
    stride_gse, stride_y, seg1, seg2, seg3,
    n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, ys_ptr, T, K_S, stride_swn, stride_ssn, stride_hs, stride_ys, sseg1,
    sseg2, sseg3,
    P_PAD: tl.constexpr, NW: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, L2_MODE: tl.constexpr,
    PERM: tl.constexpr,
):  # fmt: skip
    """The wide MoE down that also computes the shared expert's down in programs of its own (MoEConfig.mma_shared,
    `_moe_down_body`'s SHARED; PERM: h and hs in the MMA's order, MoEConfig.mma_perm_h); a twin, so the installed
    kernels' signatures and the manifest stay as they are."""
    _moe_down_body(
        h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
        stride_gse, stride_y, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_MODE, 2,
        True, n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, ys_ptr, T, K_S, stride_swn, stride_ssn, stride_hs, stride_ys,
        sseg1, sseg2, sseg3, PERM,
    )  # fmt: skip


@triton.jit(do_not_specialize=["P", "T"])
def _moe_down_mma_wide_shared_first_kernel(
    h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
    stride_gse, stride_y, seg1, seg2, seg3,
    n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, ys_ptr, T, K_S, stride_swn, stride_ssn, stride_hs, stride_ys, sseg1,
    sseg2, sseg3,
    P_PAD: tl.constexpr, NW: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, L2_MODE: tl.constexpr,
    PERM: tl.constexpr,
):  # fmt: skip
    """`_moe_down_mma_wide_shared_kernel` with the shared expert's programs first in the grid
    (MoEConfig.mma_shared_first); a twin, so the installed kernel's signature and the manifest stay as they are."""
    _moe_down_body(
        h_ptr, ids_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, P, K, N, stride_h, stride_we, stride_wn, stride_se, stride_sn,
        stride_gse, stride_y, seg1, seg2, seg3, P_PAD, NW, PREFETCH, PDL, True, L2_MODE, 2,
        True, n_exp, sw_ptr, ss_ptr, sgs_ptr, hs_ptr, ys_ptr, T, K_S, stride_swn, stride_ssn, stride_hs, stride_ys,
        sseg1, sseg2, sseg3, PERM, True,
    )  # fmt: skip


def _ready_pair(
    experts: NVFP4Weight, shared: NVFP4Weight, ready: bool, ready_codes: bool
) -> tuple[NVFP4Weight, NVFP4Weight]:
    """Both weights reading ready scale bytes, or neither, and the same for ready codes (one launch's programs pick
    either through one pointer type): `_with_ready_bytes` where both have them."""
    scales = ready and experts.ready_scales is not None and shared.ready_scales is not None
    codes = ready_codes and experts.ready_codes is not None and shared.ready_codes is not None
    pair = _with_ready_bytes(experts, scales, codes), _with_ready_bytes(shared, scales, codes)
    if pair[0].qweight.dtype != pair[1].qweight.dtype or pair[0].scales.dtype != pair[1].scales.dtype:
        raise ValueError(
            "the experts and the shared expert must both have their ready scales and codes in their own bytes' place "
            f"or neither (FLINT_MMA_READY_*=replace for every weight): codes {pair[0].qweight.dtype} and "
            f"{pair[1].qweight.dtype}, scales {pair[0].scales.dtype} and {pair[1].scales.dtype}"
        )
    return pair


def pairs_fit(k: int, prefetch: bool, l2_ahead: int) -> bool:
    """Whether K = k suits a wide launch reading ready codes: with loads a step ahead and L2 requests ahead its K loop
    takes two steps an iteration (`nvfp4_mma_triton._k_loop_wide_pairs`), so K must be whole pairs of steps (Flint's
    H and I are)."""
    return not (prefetch and l2_ahead > 0) or k % (2 * BLOCK_K) == 0


def _loads_ahead(w: NVFP4Weight, k: int, prefetch: bool, l2_ahead: int) -> bool:
    """A wide launch's `prefetch`: as asked, but off where w's codes are ready codes (int8) and K is not whole pairs
    of steps (`pairs_fit`), so the launch takes the loop that runs one step an iteration (the same sums)."""
    return prefetch and (w.qweight.dtype != torch.int8 or pairs_fit(k, prefetch, l2_ahead))


def shared_fits(x: torch.Tensor, w13: NVFP4Weight, w2: NVFP4Weight, gate_up: object, down: object) -> bool:
    """Whether the wide MoE kernels can run a shared expert (gate_up [2 I_s, H], down [H, I_s]) in programs of their
    own (MoEConfig.mma_shared): x against w13 on the 16-byte kernels, w2 and both shared weights (2-D) NVFP4 for them
    too (h and hs are the launches' own rows), I_s a multiple of the experts' I."""
    if not (isinstance(gate_up, NVFP4Weight) and isinstance(down, NVFP4Weight) and isinstance(w2, NVFP4Weight)):
        return False
    if gate_up.qweight.dim() != 2 or down.qweight.dim() != 2 or w2.qweight.dim() != 3:
        return False
    inter, i_s, hidden = w2.shape[-1], down.shape[-1], x.shape[-1]
    return (
        moe_supported(x, w13)
        and _vec_fits(x, w13)
        and _vec_fits(x, gate_up)
        and _weight_fits(gate_up, hidden)
        and gate_up.shape == (2 * i_s, hidden)
        and w2.shape[-2] == hidden
        and _weight_fits(w2, inter)
        and _vec_weight(w2)
        and down.shape == (hidden, i_s)
        and i_s % inter == 0
        and _weight_fits(down, i_s)
        and _vec_weight(down)
    )


def moe_supported(x: torch.Tensor, w: NVFP4Weight) -> bool:
    """Whether the MoE kernels take activations x [rows, K] (x for the gate_up, h for the down) against experts w
    [E, N, K]: `_fits` with 3-D weights."""
    return _fits(x, w) and w.qweight.dim() == 3


def launch_moe_down(
    h: torch.Tensor,
    ids: torch.Tensor,
    w2: NVFP4Weight,
    y: torch.Tensor,
    num_warps: int,
    prefetch: bool = PREFETCH,
    vec: bool = False,
    l2: int = 0,
    wide: bool = False,
    ready: bool = False,
    shared: tuple[NVFP4Weight, torch.Tensor, torch.Tensor] | None = None,
    perm: bool = False,
    first: bool = False,
    ready_codes: bool = False,
) -> None:
    """Fill y [pairs, H] with each pair's rounded expert output for the flat ids [pairs] and h [pairs, I];
    `moe_supported(h, w2)` must hold. vec: 16-byte loads where the rows are aligned for them; l2 (with vec): also ask L2
    for the codes, 1 two K steps ahead, 2 all of them before the PDL wait (MoEConfig.mma_down_l2); wide (with vec): 32
    rows a warp, two tiles sharing h's loads (MoEConfig.mma_down_wide); ready: the experts' ready scale bytes where they
    have them (MoEConfig.mma_ready). shared (with vec and wide; MoEConfig.mma_shared): (the shared expert's down [H,
    I_s], hs [T, I_s], ys [T, H]), ys filled with its rounded output in programs of the same launch; perm (with shared;
    MoEConfig.mma_perm_h): h and hs in the MMA's order (`nvfp4_mma_triton.perm_columns`), no PRMTs; first (with shared;
    MoEConfig.mma_shared_first): the shared expert's programs before the experts' in the grid; ready_codes: the experts'
    ready codes where they have them (MoEConfig.mma_ready_codes)."""
    if l2 not in (0, 1, 2):
        raise ValueError(f"l2 must be 0 (off), 1 (two K steps ahead) or 2 (before the PDL wait), got {l2}")
    if shared is not None:
        return _launch_down_shared(
            h, ids, w2, y, num_warps, prefetch, l2, (ready, ready_codes), perm, first, *shared
        )  # fmt: skip
    if perm or first:
        raise ValueError("perm and first come with the shared expert's programs (shared)")
    w2 = _with_ready_bytes(w2, ready, ready_codes)
    prefetch = _loads_ahead(w2, h.shape[1], prefetch, 2 * (l2 == 1)) if wide else prefetch
    n_exp, n, _ = w2.qweight.shape
    pairs = ids.numel()
    seg1, seg2, seg3 = segment_bounds(w2.segments, n)
    kernel = _moe_down_mma_vec_kernel if vec and _vec_fits(h, w2) else _moe_down_mma_kernel
    extra = {}
    rows = 16 * num_warps  # weight rows a program
    if wide and kernel is _moe_down_mma_vec_kernel:
        kernel, extra, rows = _moe_down_mma_wide_kernel, {"L2_MODE": l2}, 32 * num_warps
    elif l2 and kernel is _moe_down_mma_vec_kernel:
        kernel, extra = _moe_down_mma_l2_kernel, {"L2_MODE": l2}
    kernel[(triton.cdiv(n, rows), n_exp)](
        h, ids, w2.qweight, w2.scales, w2.global_scale, y, pairs, h.shape[1], n,
        h.stride(0), w2.qweight.stride(0), w2.qweight.stride(1), w2.scales.stride(0), w2.scales.stride(1),
        w2.global_scale.stride(0), y.stride(0), seg1, seg2, seg3,
        P_PAD=triton.next_power_of_2(pairs), NW=num_warps, PREFETCH=prefetch, num_warps=num_warps, num_stages=1,
        **extra, **launch_options(h.device),
    )  # fmt: skip


def _launch_down_shared(
    h: torch.Tensor,
    ids: torch.Tensor,
    w2: NVFP4Weight,
    y: torch.Tensor,
    num_warps: int,
    prefetch: bool,
    l2: int,
    ready: tuple[bool, bool],
    perm: bool,
    first: bool,
    sw: NVFP4Weight,
    hs: torch.Tensor,
    ys: torch.Tensor,
) -> None:
    """`launch_moe_down` with the shared expert (`_moe_down_mma_wide_shared_kernel`; first: its `_first` twin); ready:
    (ready scale bytes, ready codes)."""
    n_exp, n, _ = w2.qweight.shape
    k, (t, k_s) = h.shape[1], hs.shape
    if not (_vec_fits(h, w2) and _vec_fits(hs, sw)) or sw.shape != (n, k_s) or ys.shape != (t, n):
        raise ValueError(
            f"the shared expert in the MoE down needs h, hs and weights for the 16-byte kernels, a down [{n}, I_s] "
            f"and ys [T, {n}]; got {sw.shape}, hs {tuple(hs.shape)}, ys {tuple(ys.shape)}"
        )
    w2, sw = _ready_pair(w2, sw, *ready)
    prefetch = _loads_ahead(w2, k, prefetch, 2 * (l2 == 1)) and _loads_ahead(sw, k_s, prefetch, 2 * (l2 == 1))
    seg1, seg2, seg3 = segment_bounds(w2.segments, n)
    sseg1, sseg2, sseg3 = segment_bounds(sw.segments, n)
    kernel = _moe_down_mma_wide_shared_first_kernel if first else _moe_down_mma_wide_shared_kernel
    kernel[(triton.cdiv(n, 32 * num_warps), n_exp + triton.cdiv(t, 8))](
        h, ids, w2.qweight, w2.scales, w2.global_scale, y, ids.numel(), k, n,
        h.stride(0), w2.qweight.stride(0), w2.qweight.stride(1), w2.scales.stride(0), w2.scales.stride(1),
        w2.global_scale.stride(0), y.stride(0), seg1, seg2, seg3,
        n_exp, sw.qweight, sw.scales, sw.global_scale, hs, ys, t, k_s, sw.qweight.stride(0), sw.scales.stride(0),
        hs.stride(0), ys.stride(0), sseg1, sseg2, sseg3,
        P_PAD=triton.next_power_of_2(ids.numel()), NW=num_warps, PREFETCH=prefetch, L2_MODE=l2, PERM=perm,
        num_warps=num_warps, num_stages=1, **launch_options(h.device),
    )  # fmt: skip


def moe_down(
    h: torch.Tensor,
    topk_ids: torch.Tensor,
    w2: NVFP4Weight,
    num_warps: int = 4,
    prefetch: bool = PREFETCH,
    vec: bool = False,
    l2: int = 0,
    wide: bool = False,
    ready: bool = False,
    ready_codes: bool = False,
) -> torch.Tensor:
    """y [T * k, H]: `linear_ref(h[p], w2[e])` of every pair p routed to expert e, expert-major on the MMA kernel;
    h [T * k, I] BF16 (the gate_up's output), topk_ids [T, k], w2 [E, H, I]."""
    if not (moe_supported(h, w2) and h.shape[0] == topk_ids.numel()):
        raise ValueError(
            f"nvfp4_mma.moe_down takes BF16 h [pairs, I] with aligned rows on a CUDA GPU, I a multiple of {BLOCK_K}, "
            f"and NVFP4 w2 [E, H, I]; got h {tuple(h.shape)} {h.dtype} on {h.device}, ids {tuple(topk_ids.shape)}"
        )
    ids = topk_ids.reshape(-1).contiguous()
    y = torch.empty((ids.numel(), w2.qweight.shape[1]), dtype=h.dtype, device=h.device)
    launch_moe_down(h, ids, w2, y, num_warps, prefetch, vec, l2, wide, ready, ready_codes=ready_codes)
    return y


def launch_moe_gate_up(
    x: torch.Tensor,
    ids: torch.Tensor,
    w13: NVFP4Weight,
    h: torch.Tensor,
    topk: int,
    num_warps: int,
    prefetch: bool = PREFETCH,
    vec: bool = False,
    l2_ahead: int = 0,
    warp_k: int = 1,
    wide: bool = False,
    ready: bool = False,
    shared: tuple[NVFP4Weight, torch.Tensor] | None = None,
    perm: bool = False,
    first: bool = False,
    ready_codes: bool = False,
) -> None:
    """Fill h [pairs, I] (rows in pair order) for the flat ids [pairs]; `moe_supported(x, w13)` must hold. vec: 16-byte
    loads where the rows are aligned for them; l2_ahead (even, with vec): also ask L2 for the codes that many K steps
    ahead; warp_k (with vec; a power of two dividing num_warps): the warps split K in that many parts as well as the
    columns, where K is a multiple of 256 a part (else it is not split); wide (with vec, not with warp_k): 16 columns a
    warp, two tiles sharing x's loads (MoEConfig.mma_wide); ready: the experts' ready scale bytes where they have them
    (MoEConfig.mma_ready). shared (with vec and wide; MoEConfig.mma_shared): (the shared expert's gate_up [2 I_s, H], hs
    [T, I_s]), hs filled with its silu(gate) * up for every token of x in programs of the same launch (I_s a multiple of
    I; `shared_fits`); perm (with shared; MoEConfig.mma_perm_h): h and hs written in the MMA's order
    (`nvfp4_mma_triton.perm_columns`) for the down's `perm`; first (with shared; MoEConfig.mma_shared_first): the shared
    expert's programs before the experts' in the grid; ready_codes: the experts' ready codes where they have them
    (MoEConfig.mma_ready_codes)."""
    if shared is not None:
        return _launch_gate_up_shared(
            x, ids, w13, h, topk, num_warps, prefetch, l2_ahead, (ready, ready_codes), perm, first, *shared
        )  # fmt: skip
    if perm or first:
        raise ValueError("perm and first come with the shared expert's programs (shared)")
    w13 = _with_ready_bytes(w13, ready, ready_codes)
    prefetch = _loads_ahead(w13, x.shape[1], prefetch, l2_ahead) if wide else prefetch
    _check_l2_ahead(l2_ahead)
    if warp_k < 1 or warp_k & (warp_k - 1) or num_warps % warp_k:
        raise ValueError(f"warp_k must be a power of two dividing num_warps ({num_warps}), got {warp_k}")
    if wide and warp_k > 1:
        raise ValueError("wide and warp_k > 1 do not combine: the wide gate_up's warps do not split K")
    n_exp, two_i, _ = w13.qweight.shape
    pairs, inter = ids.numel(), two_i // 2
    seg1, seg2, seg3 = segment_bounds(w13.segments, two_i)
    kernel = _moe_gate_up_mma_vec_kernel if vec and _vec_fits(x, w13) else _moe_gate_up_mma_kernel
    extra = {}
    groups = num_warps  # warps a K part: 8 columns each
    columns = 8  # a warp's
    if wide and kernel is _moe_gate_up_mma_vec_kernel:
        kernel, extra, columns = _moe_gate_up_mma_wide_kernel, {"L2_AHEAD": l2_ahead}, 16
        if not _INTERPRET:
            extra["maxnreg"] = KS_MAXNREG
    elif warp_k > 1 and kernel is _moe_gate_up_mma_vec_kernel and x.shape[1] % (256 * warp_k) == 0:
        # 256 values a part at least: a part starts on a 128-byte code line, as `_l2_ahead`'s pairs of steps assume
        kernel, extra = _moe_gate_up_mma_ks_kernel, {"L2_AHEAD": l2_ahead, "KSPLIT": warp_k}
        if not _INTERPRET:
            extra["maxnreg"] = KS_MAXNREG
        groups = num_warps // warp_k
    elif l2_ahead and kernel is _moe_gate_up_mma_vec_kernel:
        kernel, extra = _moe_gate_up_mma_l2_kernel, {"L2_AHEAD": l2_ahead}
    kernel[(triton.cdiv(inter, columns * groups), n_exp)](
        x, ids, w13.qweight, w13.scales, w13.global_scale, h, pairs, x.shape[1], inter, topk,
        x.stride(0), w13.qweight.stride(0), w13.qweight.stride(1), w13.scales.stride(0), w13.scales.stride(1),
        w13.global_scale.stride(0), h.stride(0), seg1, seg2, seg3,
        P_PAD=triton.next_power_of_2(pairs), NW=num_warps, PREFETCH=prefetch, num_warps=num_warps, num_stages=1,
        **extra, **launch_options(x.device),
    )  # fmt: skip


def _check_l2_ahead(l2_ahead: int) -> None:
    """The gate_up's l2_ahead: an even number of K steps."""
    if l2_ahead < 0 or l2_ahead % 2:
        raise ValueError(f"l2_ahead must be an even number of K steps, got {l2_ahead}")


def _launch_gate_up_shared(
    x: torch.Tensor,
    ids: torch.Tensor,
    w13: NVFP4Weight,
    h: torch.Tensor,
    topk: int,
    num_warps: int,
    prefetch: bool,
    l2_ahead: int,
    ready: tuple[bool, bool],
    perm: bool,
    first: bool,
    sw: NVFP4Weight,
    hs: torch.Tensor,
) -> None:
    """`launch_moe_gate_up` with the shared expert (`_moe_gate_up_mma_wide_shared_kernel`; first: its `_first`
    twin); ready: (ready scale bytes, ready codes)."""
    n_exp, two_i, _ = w13.qweight.shape
    inter, inter_s, (t, k) = two_i // 2, sw.qweight.shape[0] // 2, x.shape
    aligned = _vec_fits(x, w13) and _vec_fits(x, sw)
    if not aligned or sw.shape[1] != k or inter_s % inter or hs.shape != (t, inter_s):
        raise ValueError(
            f"the shared expert in the MoE gate_up needs x and weights for the 16-byte kernels, a gate_up [2 I_s, {k}] "
            f"with I_s a multiple of {inter} and hs [{t}, I_s]; got {sw.shape}, hs {tuple(hs.shape)}"
        )
    _check_l2_ahead(l2_ahead)
    w13, sw = _ready_pair(w13, sw, *ready)
    prefetch = _loads_ahead(w13, k, prefetch, l2_ahead)
    seg1, seg2, seg3 = segment_bounds(w13.segments, two_i)
    sseg1, sseg2, sseg3 = segment_bounds(sw.segments, 2 * inter_s)
    programs = n_exp + (inter_s // inter) * triton.cdiv(t, 8)
    extra = {} if _INTERPRET else {"maxnreg": KS_MAXNREG}
    kernel = _moe_gate_up_mma_wide_shared_first_kernel if first else _moe_gate_up_mma_wide_shared_kernel
    kernel[(triton.cdiv(inter, 16 * num_warps), programs)](
        x, ids, w13.qweight, w13.scales, w13.global_scale, h, ids.numel(), k, inter, topk,
        x.stride(0), w13.qweight.stride(0), w13.qweight.stride(1), w13.scales.stride(0), w13.scales.stride(1),
        w13.global_scale.stride(0), h.stride(0), seg1, seg2, seg3,
        n_exp, sw.qweight, sw.scales, sw.global_scale, hs, t, inter_s, sw.qweight.stride(0), sw.scales.stride(0),
        hs.stride(0), sseg1, sseg2, sseg3,
        P_PAD=triton.next_power_of_2(ids.numel()), NW=num_warps, PREFETCH=prefetch, L2_AHEAD=l2_ahead, PERM=perm,
        num_warps=num_warps, num_stages=1, **extra, **launch_options(x.device),
    )  # fmt: skip


def moe_gate_up(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: NVFP4Weight,
    num_warps: int = 4,
    prefetch: bool = PREFETCH,
    vec: bool = False,
    l2_ahead: int = 0,
    warp_k: int = 1,
    wide: bool = False,
    ready: bool = False,
    ready_codes: bool = False,
) -> torch.Tensor:
    """h [T * k, I]: `silu_and_mul_ref(linear_ref(x[t], w13[e]))` of every (token t, slot) pair routed to expert e,
    expert-major on the MMA kernel (`_moe_gate_up_mma_kernel`); x [T, H] BF16, topk_ids [T, k], w13 [E, 2I, H]."""
    t, topk = topk_ids.shape
    if not (moe_supported(x, w13) and x.shape[0] == t):
        raise ValueError(
            f"nvfp4_mma.moe_gate_up takes BF16 x [T, H] with aligned rows on a CUDA GPU, H a multiple of {BLOCK_K}, "
            f"and NVFP4 w13 [E, 2I, H]; got x {tuple(x.shape)} {x.dtype} on {x.device}, ids {tuple(topk_ids.shape)}, "
            f"w13 {getattr(w13, 'shape', type(w13).__name__)}"
        )
    ids = topk_ids.reshape(-1).contiguous()
    h = torch.empty((ids.numel(), w13.qweight.shape[1] // 2), dtype=x.dtype, device=x.device)
    launch_moe_gate_up(
        x, ids, w13, h, topk, num_warps, prefetch, vec, l2_ahead, warp_k, wide, ready, ready_codes=ready_codes
    )  # fmt: skip
    return h
