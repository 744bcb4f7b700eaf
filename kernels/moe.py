"""Routed experts (SwiGLU, routing weight after the down projection) in the reference's order and rounding.

As transformers' default (grouped) experts path: each expert output is rounded to the activation dtype, multiplied
by its FP32 routing weight, the k products are summed in FP32 in top-k slot order, and the sum is rounded once.
The shared expert (ungated SwiGLU, every token) is then added to that rounded sum in the activation dtype.
"""

from __future__ import annotations

import torch

from .activation import silu_and_mul_ref
from .linear import NVFP4Weight, Weight, linear_ref
from .rmsnorm import add_rms_norm_ref


def _expert(w: Weight, e: int) -> Weight:
    return w.select(e) if isinstance(w, NVFP4Weight) else w[e]


# The shared expert's (gate|up [2I_s, H], down [H, I_s]) weights.
SharedExpert = tuple[Weight, Weight]


def shared_expert_ref(x: torch.Tensor, shared: SharedExpert) -> torch.Tensor:
    """The ungated shared expert: down(silu(gate) * up), each linear rounded to x's dtype."""
    gate_up, down = shared
    return linear_ref(silu_and_mul_ref(linear_ref(x, gate_up)), down)


def moe_ref(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: Weight,
    w2: Weight,
    shared: SharedExpert | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I] -> routed sum [T, H] in x's dtype.

    With `shared`, the result is the rounded routed sum plus the shared expert, added in x's dtype.
    """
    t, k = topk_ids.shape
    weighted = torch.zeros((t, k, x.shape[-1]), dtype=torch.float32, device=x.device)
    # The (token, slot) pairs grouped by expert with one sort and one read of the counts (a search per expert would
    # read back from the device once per expert); stable, so each expert's rows keep token order.
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    experts, counts = torch.unique_consecutive(topk_ids.reshape(-1)[order], return_counts=True)
    start = 0
    for e, n in zip(experts.tolist(), counts.tolist(), strict=True):
        pairs = order[start : start + n]
        start += n
        token_idx, slot = pairs // k, pairs % k
        h = silu_and_mul_ref(linear_ref(x[token_idx], _expert(w13, e)))
        y = linear_ref(h, _expert(w2, e))
        weighted[token_idx, slot] = y.to(torch.float32) * topk_weights[token_idx, slot, None]
    out = weighted.sum(dim=1).to(x.dtype)
    if shared is not None:
        out = out + shared_expert_ref(x, shared)
    return out


def moe_add_rms_norm_ref(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: Weight,
    w2: Weight,
    shared: SharedExpert | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE block, then the residual add and the next RMSNorm: (normed, new residual), as the ops in a row."""
    return add_rms_norm_ref(moe_ref(x, topk_weights, topk_ids, w13, w2, shared), residual, norm_weight, eps)
