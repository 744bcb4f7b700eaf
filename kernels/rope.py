"""NeoX rotary embedding over the whole head, with the reference's rounding (cos/sin cast to the activation dtype)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=16)
def inv_freq(head_dim: int, theta: float, device: str = "cpu") -> torch.Tensor:
    # Same expression as the reference so the FP32 frequencies agree bit for bit; computed on the CPU once, then
    # kept on the device so a forward pass copies nothing from the host (CUDA graphs forbid that).
    return (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))).to(device)


@functools.lru_cache(maxsize=16)
def _inv_freq_twice(head_dim: int, theta: float, device: str) -> torch.Tensor:
    """`inv_freq` with both halves of the head repeated, as the reference's `cat((freqs, freqs))` lays them out."""
    f = inv_freq(head_dim, theta, device)
    return torch.cat((f, f))


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [T, head_dim] (both halves repeated), computed in FP32 and cast to `dtype`.

    The reference's expression (positions to FP32, times the frequencies, the two halves concatenated, cos and sin,
    each cast) in three launches instead of seven, which a decode step runs before its first layer: the product of
    the integer positions and the repeated frequencies (the positions convert to FP32 exactly below 2**24), then cos
    and sin each computed in FP32 and rounded as they are stored. The same bits (tests/test_rope.py)."""
    emb = positions[:, None] * _inv_freq_twice(head_dim, theta, str(positions.device))
    cos = torch.cos(emb, out=torch.empty(emb.shape, dtype=dtype, device=emb.device))
    sin = torch.sin(emb, out=torch.empty(emb.shape, dtype=dtype, device=emb.device))
    return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D]. `x*cos + rotate_half(x)*sin`, each op in x's dtype as the reference does."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return (x * cos) + (_rotate_half(x) * sin)
