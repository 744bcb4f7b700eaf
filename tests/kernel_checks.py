"""What the Triton kernel tests share: the error measure, and output buffers poisoned with NaN."""

from __future__ import annotations

import math

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error in float64; inf when `a` holds a NaN or inf (an unwritten, poisoned element)."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    if not torch.isfinite(a64).all():
        return math.inf
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()


def poisoned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Stands in for a kernel module's `_empty`: every allocated tensor starts as NaN, so unwritten elements show."""
    return torch.full(shape, math.nan, dtype=dtype, device=device)
