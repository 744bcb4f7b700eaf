"""SiLU-and-mul (SwiGLU) in the reference's rounding: silu rounded, then the product rounded."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate columns first) -> [..., I]: `silu(gate) * up` with the activation dtype's rounding."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
