"""What the Triton kernel tests share: the error measure, output buffers poisoned with NaN, a launch counter."""

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


def poison_torch_empty(monkeypatch) -> None:
    """Make `torch.empty` / `torch.empty_like` return NaN (floats) or -77 (ints), so unwritten elements show."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(math.nan)
        elif t.dtype != torch.bool:
            t.fill_(-77)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


class LaunchSpy:
    """Stands in for a Triton kernel and counts its launches (`kernel[grid](...)`)."""

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel
        self.launches = 0

    def __getitem__(self, grid: tuple) -> object:
        self.launches += 1
        return self.kernel[grid]
