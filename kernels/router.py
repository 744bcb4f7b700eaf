"""Flint's router: FP32 logits, sigmoid scores, top-k, renormalised over the chosen k; no bias, no groups."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .rmsnorm import add_rms_norm_ref


def sigmoid_topk_ref(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] (any dtype), weight [E, H] -> (weights FP32 [T, k], expert ids int64 [T, k])."""
    logits = F.linear(x.to(torch.float32), weight.to(torch.float32))
    scores, ids = torch.topk(logits.sigmoid(), top_k, dim=-1)
    if renormalize:
        scores = scores / scores.sum(dim=-1, keepdim=True)
    if scaling != 1.0:
        scores = scores * scaling
    return scores, ids


def add_rms_norm_sigmoid_topk_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    router_weight: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`add_rms_norm_ref` then `sigmoid_topk_ref` of the normed rows -> (normed, new residual, weights, ids)."""
    normed, new_residual = add_rms_norm_ref(x, residual, norm_weight, eps)
    weights, ids = sigmoid_topk_ref(normed, router_weight, top_k, renormalize, scaling)
    return normed, new_residual, weights, ids
