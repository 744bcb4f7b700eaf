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
(`MoEPaths.grouped_gemm_min_tokens`, 0: none). Plain (BF16) expert stacks only: NVFP4 experts keep global scales
that multiply the FP32 accumulator, which a grouped GEMM of scaled copies cannot apply.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import activation_triton, moe_align_triton
from .pdl import launch_options, pdl_entry

# torch >= 2.10 names it in torch.nn.functional; 2.8-2.9 only as the private op.
GROUPED_MM: Callable[..., torch.Tensor] | None = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def fits(x: torch.Tensor, w13: object, w2: object) -> bool:
    """Whether this path takes activations x [T, H] against stacked experts w13 [E, 2I, H] and w2 [E, H, I]: plain
    contiguous tensors of x's dtype; on CUDA BF16 on sm_90 or later (where the grouped GEMM is CUTLASS's), on the
    CPU any float dtype torch's grouped GEMM takes (the tests)."""
    if GROUPED_MM is None or x.dim() != 2:
        return False
    for w in (w13, w2):
        if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype != x.dtype or w.device != x.device:
            return False
        if not w.is_contiguous():
            return False
    if x.is_cuda:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if x.dtype != torch.bfloat16 or torch.cuda.get_device_capability(index) < (9, 0):
            return False
    # The grouped GEMM wants 16-byte aligned rows in every operand.
    align = 16 // x.element_size()
    return x.shape[1] % align == 0 and w2.shape[-1] % align == 0  # type: ignore[union-attr]


def routed(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """`moe_ref`'s routed sum [T, H] of x [T, H] (plus `add` [T, H] in x's dtype) through two grouped GEMMs; the
    caller checks `fits`."""
    assert GROUPED_MM is not None
    t = topk_ids.shape[0]
    out = torch.empty_like(x)
    if t == 0:
        return out
    src, pos, offs = moe_align_triton.sort(topk_ids, w13.shape[0])
    # Each intermediate goes as soon as the next is made: the peak is x's gathered rows and gate_up together.
    xs = x.index_select(0, src)
    gate_up = GROUPED_MM(xs, w13.transpose(1, 2), offs=offs)
    del xs
    h = activation_triton.silu_and_mul(gate_up)
    del gate_up
    y = GROUPED_MM(h, w2.transpose(1, 2), offs=offs)
    del h
    return reduce_sorted(y, pos, topk_weights, out, add)


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
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for s in range(TOPK):
        row = tl.load(pos_ptr + t * TOPK + s).to(tl.int64)
        y = tl.load(y_ptr + row * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
        total += y * tl.load(tw_ptr + t * TOPK + s).to(tl.float32)
    res = total.to(out_ptr.dtype.element_ty)
    if ADD:
        extra = tl.load(add_ptr + t * stride_add + cols, mask=ok, other=0.0).to(tl.float32)
        res = (res.to(tl.float32) + extra).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_out + cols, res, mask=ok)


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
