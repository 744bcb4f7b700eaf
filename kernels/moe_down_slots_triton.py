"""The decode MoE's down launch with each token's slots summed inside one program (`MoEConfig.dn_token_slots`).

`moe_triton`'s decode down runs a program per (output tile, pair): each stores its weighted FP32 product to a
workspace and arrives on the (token, tile) counter, and the last arrival adds the TOPK slots (and the folded shared
expert) in slot order. At a token or two that tail (a store, a barrier, an acq_rel atomic, then TOPK loads by the
last program) sits on the critical path of a launch whose weights take ~1 us to read. Here a program owns one token's
output tile: the weight rows of all its experts (and of the shared expert) are loaded before the PDL wait, then h,
and the slots are added in registers in slot order, as `_moe_reduce_kernel` adds them (only each K sum's order
follows the tile's layout, as between any two tilings). The reference is `moe.moe_ref`.

With `shared_slots` (`MoEConfig.dn_shared_slots`) the shared expert's `shared_parts` INTER-wide K parts take the
slot rows that pad TOPK to a power of two (Flint: 6 routed slots and the shared expert's 1,024 = 2 x 512 fill all 8),
so its rows load and decode in the routed slots' tiles instead of a tile of their own, and the padding rows, which
were decoded for nothing, do its work: its parts are added in FP32, then scaled and rounded as before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv_triton import _INTERPRET, dense_fma_part, fma_weights, nvfp4_gemv_step
from .nvfp4_decode_triton import code_words, scale_value, segment_scale
from .pdl import launch_options, pdl_entry

# A thread's share of a program's weight tiles (the experts' rows times their padded K, and the shared expert's),
# in bytes a weight value: sm_90 compiles (Triton 3.9, forty-first session) put BF16 at 4 columns a program in 4
# warps (320 bytes a thread) at 168 registers and NVFP4 at 193 (its decode holds x in FP32 planes a group, about
# as many registers as BF16's values), both without spills, and NVFP4 at 8 columns (640) past 255 with spills.
# Larger tiles keep the per-pair launch. (With the tiles in h's layout, `_unvectorized`, Triton 3.6 puts the
# installed launches lower: NVFP4 with ready bytes and shared slots 64 registers at 2 columns, 80 at 4; BF16 96 at 4.)
MAX_THREAD_BYTES = 320
NVFP4_VALUE_BYTES = 2
_PTX = tl.constexpr(not _INTERPRET)


@triton.jit
def _unvectorized(offs):
    """`offs` through an opaque move, so Triton cannot tell they are contiguous and gives each thread one element of
    them a load: the weight tiles then take the layout of h's rows (a warp's lanes along K, its threads holding every
    column of their slots), so a thread's h values serve all its columns and no tile is moved between layouts. With
    16-byte loads Triton spread the tiles' warps over the columns and moved each decoded plane to h's layout:
    sm_90 SASS (ready codes, 2 columns a program) 96 -> 64 registers, one wave of 8 programs an SM for the 1,024 a
    token (forty-eighth session). The interpreter runs no PTX and has no layouts: there they stay as they are."""
    if _PTX:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [offs], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return offs


@triton.jit
def _slot_weights(
    w_ptr, s_ptr, sw_ptr, ss_ptr, e, cols, spart, routed, ok, H, INTER, stride_wn, stride_sn, stride_swn, stride_ssn,
    NVFP4: tl.constexpr, EVEN_K: tl.constexpr, SHARED_SLOTS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """[BLOCK_N, S_PAD, ...] weight tiles, the columns outermost (`_unvectorized`), K whole (BLOCK_K >= INTER): the
    stacked experts' rows e * H + column for routed slots, else (SHARED_SLOTS) the shared expert's row `column`,
    K part `spart` (values spart * INTER onwards). NVFP4: (int64 groups of 16 codes, FP32 block scales) [.., G];
    dense: (values [.., BLOCK_K], 0)."""
    c3 = cols[:, None, None]
    rows = e[None, :, None] * H + c3
    ok3 = ok[:, :, None]
    routed3 = routed[None, :, None]
    part3 = spart[None, :, None]
    if NVFP4:
        G: tl.constexpr = BLOCK_K // 16
        g = _unvectorized(tl.arange(0, G))[None, None, :]
        if not EVEN_K:
            ok3 = ok3 & (g < INTER // 16)
        g_ptrs = code_words(w_ptr) + rows * (stride_wn // 8) + g
        s_ptrs = s_ptr + rows * stride_sn + g
        if SHARED_SLOTS:  # a part's groups follow the previous part's
            g_ptrs = tl.where(routed3, g_ptrs, code_words(sw_ptr) + c3 * (stride_swn // 8) + part3 * G + g)
            s_ptrs = tl.where(routed3, s_ptrs, ss_ptr + c3 * stride_ssn + part3 * G + g)
        groups = tl.load(g_ptrs, mask=ok3, other=0)
        sb = tl.load(s_ptrs, mask=ok3, other=0)
        return groups, scale_value(sb, s_ptr)
    else:
        kk = tl.arange(0, BLOCK_K)[None, None, :]
        if not EVEN_K:
            ok3 = ok3 & (kk < INTER)
        ptrs = w_ptr + rows * stride_wn + kk
        if SHARED_SLOTS:
            ptrs = tl.where(routed3, ptrs, sw_ptr + c3 * stride_swn + part3 * BLOCK_K + kk)
        return tl.load(ptrs, mask=ok3, other=0.0), 0


@triton.jit
def _slot_dots(wa, wb, h_ptr, h_off, k_len, NVFP4: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):  # fmt: skip
    """FP32 [BLOCK_N, S_PAD]: `_slot_weights`' tiles against each slot's h row at h_off [S_PAD], K in one step; h
    is held once a slot (broadcast over the columns)."""
    if NVFP4:
        part = nvfp4_gemv_step(wa, wb, h_ptr, h_off[None, :, None], 0, k_len, EVEN_K, BLOCK_N, BLOCK_K)
        return tl.sum(part, axis=2) * 4.611686018427388e18  # 2**62 undoes the decode's offset (exact)
    else:
        kk = tl.arange(0, BLOCK_K)
        xr = tl.load(h_ptr + h_off[None, :, None] + kk[None, None, :], mask=(kk < k_len)[None, None, :], other=0.0)
        return tl.sum(dense_fma_part(wa, xr), axis=2)


@triton.jit
def _shared_dots(sa, sb, h_ptr, h_row, k_len, NVFP4: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):  # fmt: skip
    """FP32 [BLOCK_N]: the shared expert's tile of its own (`fma_weights`' [BLOCK_N, ...]) against h's row at
    h_row."""
    if NVFP4:
        part = nvfp4_gemv_step(sa, sb, h_ptr, h_row, 0, k_len, EVEN_K, BLOCK_N, BLOCK_K)
        return tl.sum(part, axis=1) * 4.611686018427388e18
    else:
        kk = tl.arange(0, BLOCK_K)
        xr = tl.load(h_ptr + h_row + kk, mask=kk < k_len, other=0.0)
        return tl.sum(dense_fma_part(sa, xr[None, :]), axis=1)


@triton.jit
def _down_slots(
    h_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, H, INTER, n_tokens, stride_h, stride_wn, stride_sn,
    stride_gse, stride_out, seg1, seg2, seg3, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2, sseg3,
    shared_parts, shared_inter,
    NVFP4: tl.constexpr, GSCALE: tl.constexpr, SHARED: tl.constexpr, TOPK: tl.constexpr, S_PAD: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_KS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_KS: tl.constexpr, SHARED_SLOTS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[t, tile] = round(sum over slots s in order of FP32(y_s) * w_s) with y_s = round(h[pair] @ w2[e_s]^T);
    SHARED: then round(that + the shared expert's rounded output), as `_moe_down_kernel`'s last arrival. A
    program's tiles are [column, slot]; the experts' weights are one [E * H, INTER] stack, so a row of expert e is
    row e * H + column (the launcher checks the strides). SHARED_SLOTS: the shared expert's parts are slots TOPK..
    (module docstring; the launcher checks they fit the padding and INTER is BLOCK_K)."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    s_idx = tl.arange(0, S_PAD)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_ok = cols < H
    routed = s_idx < TOPK
    spart = tl.maximum(s_idx - TOPK, 0)  # a shared slot's K part (SHARED_SLOTS)
    if SHARED_SLOTS:
        ok = cols_ok[:, None] & (routed | (s_idx - TOPK < shared_parts))[None, :]
    else:
        ok = cols_ok[:, None] & routed[None, :]
    pair = t * TOPK + tl.minimum(s_idx, TOPK - 1)
    # The router's ids and weights: written two launches back, so read before the wait (`pdl` module).
    e = tl.load(ids_ptr + pair).to(tl.int64)
    weight = tl.load(tw_ptr + pair).to(tl.float32)
    wa, wb = _slot_weights(
        w_ptr, s_ptr, sw_ptr, ss_ptr, e, cols.to(tl.int64), spart, routed, ok, H, INTER, stride_wn, stride_sn,
        stride_swn, stride_ssn, NVFP4, EVEN_K, SHARED_SLOTS, BLOCK_K,
    )  # fmt: skip
    if GSCALE:
        gs = segment_scale(
            gs_ptr + e[None, :] * stride_gse, cols[:, None], cols_ok[:, None] & routed[None, :], seg1, seg2, seg3
        )
    if SHARED and SHARED_SLOTS:
        if GSCALE:
            sgs = segment_scale(sgs_ptr, cols, cols_ok, sseg1, sseg2, sseg3)
    elif SHARED:
        sa, sb = fma_weights(
            sw_ptr, ss_ptr, cols.to(tl.int64), cols_ok, 0, shared_inter, stride_swn, stride_ssn, NVFP4, EVEN_KS,
            BLOCK_N, BLOCK_KS,
        )  # fmt: skip
        if GSCALE:
            sgs = segment_scale(sgs_ptr, cols, cols_ok, sseg1, sseg2, sseg3)
    pdl_entry(PDL)  # h is the gate_up's, the previous kernel's
    xdt = h_ptr.dtype.element_ty
    # h: the shared expert's rows (shared_parts a token) first, then a row a pair (`moe_triton._routed`).
    first = n_tokens * shared_parts if SHARED else 0
    h_rows = t * TOPK + tl.minimum(s_idx, TOPK - 1) + first
    if SHARED_SLOTS:  # the shared expert's h: its parts' rows, token t's first
        h_rows = tl.where(routed, h_rows, t * shared_parts + tl.minimum(spart, shared_parts - 1))
    acc = _slot_dots(wa, wb, h_ptr, h_rows * stride_h, INTER, NVFP4, EVEN_K, BLOCK_N, BLOCK_K)
    scaled = acc
    if GSCALE:
        scaled = acc * gs
    y = scaled.to(xdt).to(tl.float32) * weight[None, :]
    slots = s_idx[None, :]
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(TOPK):  # slot order, as the reduce launch; picking one slot's column adds only zeros
        total += tl.sum(tl.where(slots == s, y, 0.0), axis=1)
    res = total.to(xdt)
    if SHARED:
        if SHARED_SLOTS:  # its parts' FP32 sums added, then scaled and rounded as one K sum would be
            mine = (slots >= TOPK) & (slots < TOPK + shared_parts)
            ys = tl.sum(tl.where(mine, acc, 0.0), axis=1)
        else:
            ys = _shared_dots(sa, sb, h_ptr, t * shared_parts * stride_h, shared_inter, NVFP4, EVEN_KS, BLOCK_N,
                              BLOCK_KS)  # fmt: skip
        if GSCALE:
            ys = ys * sgs
        res = (res.to(tl.float32) + ys.to(xdt).to(tl.float32)).to(xdt)
    tl.store(out_ptr + t * stride_out + cols, res, mask=cols_ok)


# Two launches of one body, so that each keeps the parameters a recorded kernel manifest names.
@triton.jit(do_not_specialize=["n_tokens"])
def _moe_down_slots_kernel(
    h_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, H, INTER, n_tokens, stride_h, stride_wn, stride_sn,
    stride_gse, stride_out, seg1, seg2, seg3, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2, sseg3,
    shared_parts, shared_inter,
    NVFP4: tl.constexpr, GSCALE: tl.constexpr, SHARED: tl.constexpr, TOPK: tl.constexpr, S_PAD: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_KS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_KS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`_down_slots` with the shared expert in a tile of its own."""
    _down_slots(
        h_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, H, INTER, n_tokens, stride_h, stride_wn, stride_sn,
        stride_gse, stride_out, seg1, seg2, seg3, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2,
        sseg3, shared_parts, shared_inter, NVFP4, GSCALE, SHARED, TOPK, S_PAD, EVEN_K, EVEN_KS, BLOCK_N, BLOCK_K,
        BLOCK_KS, False, PDL,
    )  # fmt: skip


@triton.jit(do_not_specialize=["n_tokens"])
def _moe_down_shared_slots_kernel(
    h_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, H, INTER, n_tokens, stride_h, stride_wn, stride_sn,
    stride_gse, stride_out, seg1, seg2, seg3, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2, sseg3,
    shared_parts, shared_inter,
    NVFP4: tl.constexpr, GSCALE: tl.constexpr, SHARED: tl.constexpr, TOPK: tl.constexpr, S_PAD: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_KS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_KS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`_down_slots` with the shared expert's parts in the padding slot rows (`MoEConfig.dn_shared_slots`)."""
    _down_slots(
        h_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, H, INTER, n_tokens, stride_h, stride_wn, stride_sn,
        stride_gse, stride_out, seg1, seg2, seg3, sw_ptr, ss_ptr, sgs_ptr, stride_swn, stride_ssn, sseg1, sseg2,
        sseg3, shared_parts, shared_inter, NVFP4, GSCALE, SHARED, TOPK, S_PAD, EVEN_K, EVEN_KS, BLOCK_N, BLOCK_K,
        BLOCK_KS, True, PDL,
    )  # fmt: skip


def shared_slots_fit(topk: int, inter: int, shared_inter: int) -> bool:
    """Whether the shared expert's INTER-wide parts fit the slot rows that pad TOPK to a power of two (and INTER is
    one K step: a power of two)."""
    parts, rem = divmod(shared_inter, inter) if inter else (0, 1)
    pow2 = triton.next_power_of_2(inter) == inter
    return shared_inter > 0 and rem == 0 and pow2 and topk + parts <= triton.next_power_of_2(topk)


def fits(
    topk: int, hidden: int, inter: int, shared_inter: int, block_n: int, num_warps: int, stacked: bool,
    value_bytes: float, shared_slots: bool = False,
) -> bool:  # fmt: skip
    """Whether this launch covers the shapes with BLOCK_N columns a program: `stacked` (each expert's rows follow
    the previous expert's in memory, codes and scales) and a thread's tiles within MAX_THREAD_BYTES (`shared_slots`:
    the shared expert in the padding slots, `shared_slots_fit`)."""
    values = triton.next_power_of_2(topk) * block_n * triton.next_power_of_2(inter)
    if shared_slots and not shared_slots_fit(topk, inter, shared_inter):
        return False
    if shared_inter and not shared_slots:
        values += block_n * triton.next_power_of_2(shared_inter)
    return stacked and hidden > 0 and values * value_bytes <= MAX_THREAD_BYTES * 32 * num_warps


def launch(
    h: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, weight_args: tuple, shared_args: tuple, shared_parts: int,
    shared_inter: int, out: torch.Tensor, block_n: int, num_warps: int, shared_slots: bool = False,
) -> None:  # fmt: skip
    """out [T, H] from h (the shared expert's rows, then a row a pair) and ids / tw [T, TOPK]; `weight_args` and
    `shared_args` as `moe_triton._weight_args` / `_shared_args` (or `_no_shared`) give them; `shared_slots` as `fits`
    was asked with (the caller checked it)."""
    q, s, g, _, wn, _, sn, ge, seg, nv, gsc = weight_args
    t, topk = ids.shape
    hidden, inter = out.shape[1], h.shape[1]
    block_ks = triton.next_power_of_2(max(shared_inter, 1))
    kernel = _moe_down_shared_slots_kernel if shared_slots and shared_inter > 0 else _moe_down_slots_kernel
    kernel[(triton.cdiv(hidden, block_n), t)](
        h, ids, tw, q, s, g, out, hidden, inter, t, h.stride(0), wn, sn, ge, out.stride(0), *seg, *shared_args,
        shared_parts, shared_inter,
        NVFP4=nv, GSCALE=gsc, SHARED=shared_inter > 0, TOPK=topk, S_PAD=triton.next_power_of_2(topk),
        EVEN_K=triton.next_power_of_2(inter) == inter, EVEN_KS=block_ks == shared_inter, BLOCK_N=block_n,
        BLOCK_K=triton.next_power_of_2(inter), BLOCK_KS=block_ks, num_warps=num_warps, num_stages=1,
        **launch_options(out.device),
    )  # fmt: skip
