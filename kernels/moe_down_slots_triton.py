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

from .gemv_triton import dense_fma_part, fma_weights, nvfp4_gemv_step
from .nvfp4_decode_triton import code_words, scale_value, segment_scale
from .pdl import launch_options, pdl_entry

# A thread's share of a program's weight tiles (the experts' rows times their padded K, and the shared expert's),
# in bytes a weight value: sm_90 compiles (Triton 3.9, forty-first session) put BF16 at 4 columns a program in 4
# warps (320 bytes a thread) at 168 registers and NVFP4 at 193 (its decode holds x in FP32 planes a group, about
# as many registers as BF16's values), both without spills, and NVFP4 at 8 columns (640) past 255 with spills.
# Larger tiles keep the per-pair launch.
MAX_THREAD_BYTES = 320
NVFP4_VALUE_BYTES = 2


@triton.jit
def _slot_dots(wa, wb, h_ptr, h_off, k_len, NVFP4: tl.constexpr, EVEN_K: tl.constexpr, S_PAD: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """FP32 [S_PAD, BLOCK_N]: each slot's BLOCK_N weight rows (`fma_weights`' tiles of S_PAD * BLOCK_N rows,
    slot-major) against that slot's h row at h_off [S_PAD], K in one step. h is held once a slot (broadcast over its
    rows), not once a row."""
    if NVFP4:
        G: tl.constexpr = BLOCK_K // 16
        groups = tl.reshape(wa, (S_PAD, BLOCK_N, G))
        scale = tl.reshape(wb, (S_PAD, BLOCK_N, G))
        part = nvfp4_gemv_step(groups, scale, h_ptr, h_off[:, None, None], 0, k_len, EVEN_K, BLOCK_N, BLOCK_K)
        return tl.sum(part, axis=2) * 4.611686018427388e18  # 2**62 undoes the decode's offset (exact)
    else:
        kk = tl.arange(0, BLOCK_K)
        xr = tl.load(h_ptr + h_off[:, None, None] + kk[None, None, :], mask=(kk < k_len)[None, None, :], other=0.0)
        return tl.sum(dense_fma_part(tl.reshape(wa, (S_PAD, BLOCK_N, BLOCK_K)), xr), axis=2)


@triton.jit
def _slot_and_shared_weights(
    w_ptr, s_ptr, sw_ptr, ss_ptr, rows, scol, spart, routed, ok, stride_wn, stride_sn, stride_swn, stride_ssn,
    NVFP4: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`fma_weights`' tiles (K whole: BLOCK_K = INTER) of rows that are the stacked experts' `rows` where `routed`,
    else the shared expert's row `scol`, K part `spart` (values spart * INTER onwards): one load a tile, through
    pointers picked per row."""
    if NVFP4:
        G: tl.constexpr = BLOCK_K // 16
        offs_g = tl.arange(0, G)
        w64, sw64 = code_words(w_ptr), code_words(sw_ptr)
        shared_g = spart[:, None] * G + offs_g[None, :]  # [ROWS, G]: a part's groups follow the previous part's
        g_ptrs = tl.where(
            routed[:, None],
            w64 + rows[:, None] * (stride_wn // 8) + offs_g[None, :],
            sw64 + scol[:, None] * (stride_swn // 8) + shared_g,
        )
        s_ptrs = tl.where(
            routed[:, None],
            s_ptr + rows[:, None] * stride_sn + offs_g[None, :],
            ss_ptr + scol[:, None] * stride_ssn + shared_g,
        )
        groups = tl.load(g_ptrs, mask=ok[:, None], other=0)
        sb = tl.load(s_ptrs, mask=ok[:, None], other=0)
        return groups, scale_value(sb, s_ptr)
    else:
        kk = tl.arange(0, BLOCK_K)
        ptrs = tl.where(
            routed[:, None],
            w_ptr + rows[:, None] * stride_wn + kk[None, :],
            sw_ptr + scol[:, None] * stride_swn + spart[:, None] * BLOCK_K + kk[None, :],
        )
        return tl.load(ptrs, mask=ok[:, None], other=0.0), 0


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
    program's rows are (slot, column) pairs, slot-major; the experts' weights are one [E * H, INTER] stack, so a
    row of expert e is row e * H + column (the launcher checks the strides). SHARED_SLOTS: the shared expert's
    parts are slot rows TOPK.. (module docstring; the launcher checks they fit the padding and INTER is BLOCK_K)."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    ROWS: tl.constexpr = S_PAD * BLOCK_N
    r = tl.arange(0, ROWS)
    slot = r // BLOCK_N
    col = pid_n * BLOCK_N + r % BLOCK_N
    routed = slot < TOPK
    spart = slot - TOPK  # a shared slot row's K part (SHARED_SLOTS)
    if SHARED_SLOTS:
        ok = (routed | (spart < shared_parts)) & (col < H)
    else:
        ok = routed & (col < H)
    pair = t * TOPK + tl.minimum(slot, TOPK - 1)
    # The router's ids and weights: written two launches back, so read before the wait (`pdl` module).
    e = tl.load(ids_ptr + pair).to(tl.int64)
    weight = tl.load(tw_ptr + pair).to(tl.float32)
    if SHARED_SLOTS:
        wa, wb = _slot_and_shared_weights(
            w_ptr, s_ptr, sw_ptr, ss_ptr, e * H + col, col.to(tl.int64), tl.maximum(spart, 0), routed, ok, stride_wn,
            stride_sn, stride_swn, stride_ssn, NVFP4, BLOCK_K,
        )  # fmt: skip
    else:
        wa, wb = fma_weights(
            w_ptr, s_ptr, e * H + col, ok, 0, INTER, stride_wn, stride_sn, NVFP4, EVEN_K, ROWS, BLOCK_K
        )  # fmt: skip
    if GSCALE:
        gs = segment_scale(gs_ptr + e * stride_gse, col, routed & (col < H), seg1, seg2, seg3)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_ok = cols < H
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
    s_idx = tl.arange(0, S_PAD)
    h_rows = t * TOPK + tl.minimum(s_idx, TOPK - 1) + first
    if SHARED_SLOTS:  # the shared expert's h: its parts' rows, token t's first
        h_rows = tl.where(
            s_idx < TOPK, h_rows, t * shared_parts + tl.minimum(tl.maximum(s_idx - TOPK, 0), shared_parts - 1)
        )
    h_off = h_rows * stride_h
    acc = _slot_dots(wa, wb, h_ptr, h_off, INTER, NVFP4, EVEN_K, S_PAD, BLOCK_N, BLOCK_K)
    scaled = acc
    if GSCALE:
        scaled = acc * tl.reshape(gs, (S_PAD, BLOCK_N))
    y = scaled.to(xdt).to(tl.float32) * tl.reshape(weight, (S_PAD, BLOCK_N))
    slots = s_idx[:, None]
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(TOPK):  # slot order, as the reduce launch; picking one slot's row adds only zeros
        total += tl.sum(tl.where(slots == s, y, 0.0), axis=0)
    res = total.to(xdt)
    if SHARED:
        if SHARED_SLOTS:  # its parts' FP32 sums added, then scaled and rounded as one K sum would be
            mine = (slots >= TOPK) & (slots < TOPK + shared_parts)
            ys = tl.sum(tl.where(mine, acc, 0.0), axis=0)
        else:
            h_s = t * shared_parts * stride_h + tl.zeros((1,), dtype=tl.int64)
            ys = tl.reshape(
                _slot_dots(sa, sb, h_ptr, h_s, shared_inter, NVFP4, EVEN_KS, 1, BLOCK_N, BLOCK_KS), (BLOCK_N,)
            )  # fmt: skip
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
