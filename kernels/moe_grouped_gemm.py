"""The routed MoE of long prefills on torch's grouped GEMM (`grouped_mm`: CUTLASS on sm_90), beside `moe_ref`.

The token-expert pairs are sorted by expert (`moe_align_triton.sort`: counts, first rows, atomic ranks), x's rows
gathered in that order, one grouped GEMM computes every expert's gate_up, SiLU-and-mul follows, one grouped GEMM
computes every down projection, and `_moe_reduce_sorted_kernel` sums each token's slots in slot order, reading
each pair's row where the sort put it (no scatter back). The numerics are `moe_ref`'s: gate_up rounded to x's
dtype, h = round(silu(gate) * up), each pair's y rounded, the weighted slots summed in FP32 and rounded once. The
order of an expert's rows varies with scheduling; the result does not (a GEMM's rows are independent, and the
reduce reads each pair's own row).

Why: at 8,192 tokens (192 pairs an expert) CUTLASS's grouped GEMMs beat the Triton grouped kernels of
`moe_triton` by 0.26 ms a layer on the H200 (gate_up 494 against ~620 us, down 288 against ~420; docs/performance.md,
twenty-fourth session); at 2,048 they do not. Which batches take this path is the tuning table's
(`MoEPaths.grouped_gemm_min_tokens`, 0: none). NVFP4 experts reach it as the BF16 copies `moe_triton` makes for long
prefills (`ScaledWeight`): their global scales multiply the FP32 accumulators, so both GEMMs give FP32 results
(`out_dtype`) and the scales are applied, before the one rounding, in the SiLU-and-mul launch (gate_up) and in the
slot reduce (down). Where torch's grouped GEMM cannot give FP32 results (torch 2.11), those copies take
`moe_grouped_tma_triton`'s launches instead, which scale in their own epilogues.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import activation_triton, moe_align_triton
from .linear import ScaledWeight
from .pdl import launch_options, pdl_entry

# torch >= 2.10 names it in torch.nn.functional; 2.8-2.9 only as the private op.
GROUPED_MM: Callable[..., torch.Tensor] | None = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


@functools.cache
def _fp32_out(device: torch.device) -> bool:
    """Whether this torch's grouped GEMM gives FP32 results of x's dtype on `device` (`out_dtype`; the CPU kernel
    does not), tried once on a tiny problem."""
    assert GROUPED_MM is not None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    a = torch.ones(16, 16, dtype=dtype, device=device)
    b = torch.ones(1, 16, 16, dtype=dtype, device=device)
    try:
        out = GROUPED_MM(a, b.transpose(1, 2), offs=torch.tensor([16], dtype=torch.int32, device=device),
                         out_dtype=torch.float32)  # fmt: skip
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return out.dtype == torch.float32


def plain_fits(x: torch.Tensor, w: object) -> bool:
    return (
        isinstance(w, torch.Tensor)
        and w.dim() == 3
        and w.dtype == x.dtype
        and w.device == x.device
        and (w.is_contiguous())
    )


def scaled_fits(x: torch.Tensor, w: object, segments: tuple[tuple[int, ...], ...]) -> bool:
    """A `ScaledWeight` whose data fits as a plain stack and whose segments are one of `segments`."""
    if not isinstance(w, ScaledWeight) or not plain_fits(x, w.data) or w.segments not in segments:
        return False
    gs = w.global_scale
    return (
        gs.dim() == 2
        and gs.shape == (w.shape[0], len(w.segments))
        and gs.dtype == torch.float32
        and (gs.device == x.device)
    )


def fits(x: torch.Tensor, w13: object, w2: object) -> bool:
    """Whether this path takes activations x [T, H] against stacked experts w13 [E, 2I, H] and w2 [E, H, I]: plain
    contiguous tensors of x's dtype, or NVFP4's `ScaledWeight` copies (gate|up with one global scale or one each,
    down with one; where the grouped GEMM gives FP32 results); on CUDA BF16 on sm_90 or later (where the grouped
    GEMM is CUTLASS's), on the CPU any float dtype torch's grouped GEMM takes (the tests)."""
    if GROUPED_MM is None or x.dim() != 2 or w13.shape[0] != w2.shape[0]:  # type: ignore[attr-defined]
        return False
    inter, hidden = w2.shape[-1], x.shape[1]  # type: ignore[attr-defined]
    if not (plain_fits(x, w13) and plain_fits(x, w2)):
        scaled = scaled_fits(x, w13, ((2 * inter,), (inter, inter))) and scaled_fits(x, w2, ((hidden,),))
        if not scaled or not (x.dtype == torch.float32 or _fp32_out(x.device)):
            return False
    if x.is_cuda:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if x.dtype != torch.bfloat16 or torch.cuda.get_device_capability(index) < (9, 0):
            return False
    # The grouped GEMM wants 16-byte aligned rows in every operand.
    align = 16 // x.element_size()
    return hidden % align == 0 and inter % align == 0


def routed(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor | ScaledWeight,
    w2: torch.Tensor | ScaledWeight,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """`moe_ref`'s routed sum [T, H] of x [T, H] (plus `add` [T, H] in x's dtype) through two grouped GEMMs; the
    caller checks `fits`. `ScaledWeight` experts: FP32 GEMM results, each expert's global scales applied before the
    one rounding (in the SiLU-and-mul launch for gate_up, in the slot reduce for down)."""
    assert GROUPED_MM is not None
    t = topk_ids.shape[0]
    out = torch.empty_like(x)
    if t == 0:
        return out
    scaled = isinstance(w13, ScaledWeight)
    src, pos, offs = moe_align_triton.sort(topk_ids, w13.shape[0])
    acc = {"out_dtype": torch.float32} if scaled and x.dtype != torch.float32 else {}
    d13 = w13.data if isinstance(w13, ScaledWeight) else w13
    d2 = w2.data if isinstance(w2, ScaledWeight) else w2
    # Each intermediate goes as soon as the next is made: the peak is x's gathered rows and gate_up together.
    xs = x.index_select(0, src)
    gate_up = GROUPED_MM(xs, d13.transpose(1, 2), offs=offs, **acc)
    del xs
    if isinstance(w13, ScaledWeight):
        h = scaled_silu_and_mul(gate_up, offs, w13.global_scale, x.dtype)
    else:
        h = activation_triton.silu_and_mul(gate_up)
    del gate_up
    y = GROUPED_MM(h, d2.transpose(1, 2), offs=offs, **acc)
    del h
    if isinstance(w2, ScaledWeight):
        return reduce_sorted_scaled(y, pos, topk_ids, w2.global_scale, topk_weights, out, add)
    return reduce_sorted(y, pos, topk_weights, out, add)


@triton.jit
def _row_expert(offs_ptr, r, E, E_PAD: tl.constexpr):
    """The expert whose rows hold sorted row r: how many experts end at or before it."""
    ex = tl.arange(0, E_PAD)
    ends = tl.load(offs_ptr + ex, mask=ex < E, other=2**31 - 1)
    return tl.sum((ends <= r).to(tl.int32), axis=0)


@triton.jit
def _scaled_silu_and_mul_kernel(
    gu_ptr, offs_ptr, gs_ptr, out_ptr, inter, stride_in, stride_out, stride_gs, E, UP_SCALE: tl.constexpr,
    E_PAD: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[r, c] = `_silu_and_mul_kernel`'s result for gate = round(acc_gate[r, c] * gs[e, 0]) and up =
    round(acc_up[r, c] * gs[e, UP_SCALE]), e the expert of sorted row r: each segment's global scale on the FP32
    accumulator before the one rounding, as `linear_ref` applies it."""
    pdl_entry(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < inter
    e = _row_expert(offs_ptr, r, E, E_PAD).to(tl.int64)
    xdt = out_ptr.dtype.element_ty
    row = gu_ptr + r * stride_in
    g = (tl.load(row + c, mask=ok, other=0.0) * tl.load(gs_ptr + e * stride_gs)).to(xdt)
    u = (tl.load(row + inter + c, mask=ok, other=0.0) * tl.load(gs_ptr + e * stride_gs + UP_SCALE)).to(xdt)
    g32 = g.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(xdt)
    tl.store(out_ptr + r * stride_out + c, (act.to(tl.float32) * u.to(tl.float32)).to(xdt), mask=ok)


def scaled_silu_and_mul(
    gate_up: torch.Tensor, offs: torch.Tensor, global_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """h [P, I] in `dtype` from the FP32 gate_up accumulators [P, 2I] of rows sorted by expert (`offs`: each
    expert's end row), the gate scaled by global_scale[e, 0], the up by its last column (one scale or one each)."""
    rows, two_i = gate_up.shape
    inter = two_i // 2
    out = torch.empty((rows, inter), dtype=dtype, device=gate_up.device)
    if rows:
        block = min(1024, triton.next_power_of_2(inter))
        e = offs.numel()
        _scaled_silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
            gate_up, offs, global_scale, out, inter, gate_up.stride(0), out.stride(0), global_scale.stride(0), e,
            UP_SCALE=global_scale.shape[1] - 1, E_PAD=triton.next_power_of_2(e), BLOCK=block, num_warps=4,
            **launch_options(gate_up.device),
        )  # fmt: skip
    return out


@triton.jit
def _slot_sum(
    y_ptr, pos_ptr, tw_ptr, ids_ptr, gs_ptr, stride_gs, out_ptr, t, cols, ok, stride_y, TOPK: tl.constexpr,
    SCALED: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """sum_s FP32(y_s) * w[t, s] in slot order, y_s the row pos[t*TOPK + s] of y; with SCALED y holds FP32
    accumulators, each first scaled by its expert's global scale gs[ids[t, s]] and rounded to out's dtype."""
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for s in range(TOPK):
        row = tl.load(pos_ptr + t * TOPK + s).to(tl.int64)
        y = tl.load(y_ptr + row * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
        if SCALED:
            e = tl.load(ids_ptr + t * TOPK + s).to(tl.int64)
            y = (y * tl.load(gs_ptr + e * stride_gs)).to(out_ptr.dtype.element_ty).to(tl.float32)
        total += y * tl.load(tw_ptr + t * TOPK + s).to(tl.float32)
    return total


@triton.jit
def _store_sum(total, out_ptr, add_ptr, t, cols, ok, stride_out, stride_add, ADD: tl.constexpr):
    """out[t] = round(total); with ADD, round(FP32(that) + FP32(add[t])): the reference's add in out's dtype."""
    res = total.to(out_ptr.dtype.element_ty)
    if ADD:
        extra = tl.load(add_ptr + t * stride_add + cols, mask=ok, other=0.0).to(tl.float32)
        res = (res.to(tl.float32) + extra).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_out + cols, res, mask=ok)


@triton.jit
def _moe_reduce_sorted_kernel(
    y_ptr, pos_ptr, tw_ptr, out_ptr, add_ptr, H, stride_y, stride_out, stride_add, TOPK: tl.constexpr,
    BLOCK_H: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[t] = round(sum_s FP32(y[pos[t*TOPK + s]]) * w[t, s]), slots added in order (`moe_triton`'s
    `_moe_reduce_kernel` with each pair's row found through pos); with ADD, round(FP32(that) + FP32(add[t]))."""
    pdl_entry(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    total = _slot_sum(y_ptr, pos_ptr, tw_ptr, pos_ptr, tw_ptr, 0, out_ptr, t, cols, ok, stride_y, TOPK, False, BLOCK_H)
    _store_sum(total, out_ptr, add_ptr, t, cols, ok, stride_out, stride_add, ADD)


@triton.jit
def _moe_reduce_sorted_scaled_kernel(
    y_ptr, pos_ptr, ids_ptr, gs_ptr, tw_ptr, out_ptr, add_ptr, H, stride_y, stride_gs, stride_out, stride_add,
    TOPK: tl.constexpr, BLOCK_H: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`_moe_reduce_sorted_kernel` over FP32 down accumulators: pair (t, s)'s row times gs[ids[t, s]], rounded to
    out's dtype (the down projection's one rounding), then weighted and summed as there."""
    pdl_entry(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    total = _slot_sum(
        y_ptr, pos_ptr, tw_ptr, ids_ptr, gs_ptr, stride_gs, out_ptr, t, cols, ok, stride_y, TOPK, True, BLOCK_H
    )
    _store_sum(total, out_ptr, add_ptr, t, cols, ok, stride_out, stride_add, ADD)


def reduce_sorted(
    y: torch.Tensor, pos: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, add: torch.Tensor | None
) -> torch.Tensor:
    """out [T, H] = each token's slots, pair (t, s) at row pos[t * k + s] of y [T * k, H], weighted by topk_weights
    [T, k] and summed in slot order, plus `add` in out's dtype."""
    t, topk = topk_weights.shape
    hidden = out.shape[1]
    tw = topk_weights.contiguous()
    add = add if add is None or add.stride(-1) == 1 else add.contiguous()
    block_h = min(1024, triton.next_power_of_2(hidden))
    _moe_reduce_sorted_kernel[(t, triton.cdiv(hidden, block_h))](
        y, pos, tw, out, out if add is None else add, hidden, y.stride(0), out.stride(0),
        0 if add is None else add.stride(0), TOPK=topk, BLOCK_H=block_h, ADD=add is not None, num_warps=4,
        **launch_options(out.device),
    )  # fmt: skip
    return out


def reduce_sorted_scaled(
    y: torch.Tensor,
    pos: torch.Tensor,
    topk_ids: torch.Tensor,
    global_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor,
    add: torch.Tensor | None,
) -> torch.Tensor:
    """`reduce_sorted` of FP32 down accumulators y [T * k, H]: pair (t, s)'s row times global_scale[ids[t, s], 0],
    rounded to out's dtype, before its weight."""
    t, topk = topk_weights.shape
    hidden = out.shape[1]
    tw = topk_weights.contiguous()
    ids = topk_ids.contiguous()
    add = add if add is None or add.stride(-1) == 1 else add.contiguous()
    block_h = min(1024, triton.next_power_of_2(hidden))
    _moe_reduce_sorted_scaled_kernel[(t, triton.cdiv(hidden, block_h))](
        y, pos, ids, global_scale, tw, out, out if add is None else add, hidden, y.stride(0), global_scale.stride(0),
        out.stride(0), 0 if add is None else add.stride(0), TOPK=topk, BLOCK_H=block_h, ADD=add is not None,
        num_warps=4, **launch_options(out.device),
    )  # fmt: skip
    return out
