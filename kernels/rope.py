"""NeoX rotary embedding over the whole head, with the reference's rounding (cos/sin cast to the activation dtype)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=16)
def inv_freq(head_dim: int, theta: float, device: str = "cpu") -> torch.Tensor:
    # Same expression as the reference so the FP32 frequencies agree bit for bit; computed on the CPU once, then
    # kept on the device so a forward pass copies nothing from the host (CUDA graphs forbid that).
    return (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))).to(device)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [T, head_dim] (both halves repeated), computed in FP32 and cast to `dtype`."""
    freqs = positions[:, None].to(torch.float32) * inv_freq(head_dim, theta, str(positions.device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D]. `x*cos + rotate_half(x)*sin`, each op in x's dtype as the reference does."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return (x * cos) + (_rotate_half(x) * sin)
