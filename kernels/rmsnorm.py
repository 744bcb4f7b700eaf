"""RMSNorm as Flint's reference computes it: FP32 inside, weight multiplied in FP32, one cast at the end."""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`bf16(w * (x32 * rsqrt(mean(x32^2) + eps)))` over the last dimension (GptOss-style, not Llama-style)."""
    x32 = x.to(torch.float32)
    var = x32.pow(2).mean(-1, keepdim=True)
    return (weight.to(torch.float32) * (x32 * torch.rsqrt(var + eps))).to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then norm, in the reference's order: the sum is rounded to the activation dtype first.

    Returns (normed, new_residual).
    """
    s = residual + x
    return rms_norm_ref(s, weight, eps), s
