"""Triton RMSNorm and fused residual-add + RMSNorm, matching `rmsnorm.py`'s rounding order.

Each program normalises ROWS rows of the flattened [N, H] input (one row for Flint's hidden 2048; several rows for
tiny hidden sizes so a program still has a useful amount of work). FP32 inside, the weight multiplied in FP32,
one cast at the end, exactly as `rms_norm_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, pdl_entry
from .rmsnorm import add_rms_norm_ref, rms_norm_ref

# Elements one program keeps in registers when it packs several short rows; a long row is one program.
_TILE_ELEMS = 2048
# Above this the whole row no longer fits one program's registers well: the reference op runs instead.
MAX_HIDDEN = 8192


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    new_res_ptr,
    n_rows,
    hidden,
    stride_x,
    stride_res,
    stride_out,
    stride_new_res,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    """RMSNorm of ROWS rows; with HAS_RESIDUAL, normalise the dtype-rounded sum `res + x` and store that sum too."""
    pdl_entry(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < hidden)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows64[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
        # The reference adds in the activation dtype: one FP32 add, one rounding; the norm reads the rounded sum.
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + rows64[:, None] * stride_new_res + cols[None, :], x, mask=mask)
    x32 = x.to(tl.float32)
    var = tl.sum(x32 * x32, axis=1) / hidden
    rstd = tl.rsqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    # Same association as the reference: w * (x * rstd), then one cast.
    y = w[None, :] * (x32 * rstd[:, None])
    tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], y.to(x.dtype), mask=mask)


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [N, H] with unit stride on H (a copy only when the input is not row-major)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple:
    hidden = x.shape[-1]
    x2 = _rows_view(x)
    n = x2.shape[0]
    out = torch.empty((n, hidden), dtype=x.dtype, device=x.device)
    new_res = torch.empty_like(out) if residual is not None else out
    if n == 0:
        return out, new_res
    r2 = _rows_view(residual) if residual is not None else x2
    block_h = triton.next_power_of_2(hidden)
    rows = max(1, min(16, _TILE_ELEMS // block_h))
    num_warps = 4 if block_h <= 2048 else 8
    _rms_norm_kernel[(triton.cdiv(n, rows),)](
        x2,
        r2,
        weight,
        out,
        new_res,
        n,
        hidden,
        x2.stride(0),
        r2.stride(0),
        out.stride(0),
        new_res.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        ROWS=rows,
        BLOCK_H=block_h,
        num_warps=num_warps,
        **launch_options(x.device),
    )
    return out, new_res


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`bf16(w * (x32 * rsqrt(mean(x32^2) + eps)))` over the last dimension; same contract as `rms_norm_ref`."""
    if x.shape[-1] > MAX_HIDDEN:
        return rms_norm_ref(x, weight, eps)
    out, _ = _launch(x, None, weight, eps)
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x), the sum rounded to the dtype first; same contract as `add_rms_norm_ref`."""
    if residual.dtype != x.dtype or residual.shape != x.shape or x.shape[-1] > MAX_HIDDEN:
        # Mixed dtypes or broadcasting follow PyTorch's promotion rules: leave those to the reference.
        return add_rms_norm_ref(x, residual, weight, eps)
    out, new_res = _launch(x, residual, weight, eps)
    return out.view(x.shape), new_res.view(x.shape)
