"""Triton router for small batches: FP32 logits x·Wᵀ, sigmoid, top-k, renormalised; same contract as `sigmoid_topk_ref`.

Two launches. The logits kernel spreads the experts over many programs (BLOCK_E experts each, all tokens of the
batch), so the router weight (2 MB in FP32 for Flint) is read once by many SMs instead of once per token by one;
one expert per program (256 programs) was fastest on an H200: 8 us at T=1, 10.5 us at T=8 inside a CUDA graph.
The top-k kernel takes one token per program: sigmoid, then k rounds of "largest score, lowest expert id on ties"
in registers, which gives torch.topk's descending order, and the renormalisation. Meant for decode-sized batches:
every program reads all the tokens' activations, which stops paying off at a few dozen tokens (50 us at T=64), so
above SMALL_BATCH tokens the reference ops (one GEMM, then torch.topk) run instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .router import sigmoid_topk_ref

SMALL_BATCH = 16
MAX_EXPERTS = 1024
MAX_TOP_K = 8
_BLOCK_E = 1
_BLOCK_K = 256


@triton.jit
def _router_logits_kernel(
    x_ptr,
    w_ptr,
    logits_ptr,
    num_tokens,
    hidden,
    num_experts,
    stride_x,
    stride_w,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """FP32 logits of all tokens for BLOCK_E experts: one pass over those experts' weight rows."""
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    t = tl.arange(0, BLOCK_T)
    kk = tl.arange(0, BLOCK_K)
    e_ok = e < num_experts
    t_ok = t < num_tokens
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = (k0 + kk) < hidden
        xv = tl.load(
            x_ptr + t[:, None].to(tl.int64) * stride_x + (k0 + kk)[None, :],
            mask=t_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        wv = tl.load(
            w_ptr + e[:, None].to(tl.int64) * stride_w + (k0 + kk)[None, :],
            mask=e_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(xv[:, None, :] * wv[None, :, :], axis=2)
    out = logits_ptr + t[:, None] * num_experts + e[None, :]
    tl.store(out, acc, mask=t_ok[:, None] & e_ok[None, :])


@triton.jit
def _topk_kernel(
    logits_ptr,
    out_w_ptr,
    out_ids_ptr,
    num_experts,
    scaling,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """Sigmoid scores of one token, then its top-k weights (FP32, descending) and expert ids (int64)."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    e_ok = e < num_experts
    logits = tl.load(logits_ptr + t * num_experts + e, mask=e_ok, other=0.0)
    scores = 1.0 / (1.0 + tl.exp(-logits))
    # Padded experts can never win: sigmoid scores are >= 0.
    scores = tl.where(e_ok, scores, -1.0)
    slots = tl.arange(0, K_PAD)
    top_w = tl.zeros([K_PAD], dtype=tl.float32)
    top_i = tl.zeros([K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(scores, axis=0)
        idx = tl.min(tl.where(scores == best, e, E_PAD), axis=0)
        top_w = tl.where(slots == j, best, top_w)
        top_i = tl.where(slots == j, idx, top_i)
        scores = tl.where(e == idx, -2.0, scores)
    k_ok = slots < TOP_K
    if RENORMALIZE:
        top_w = top_w / tl.sum(tl.where(k_ok, top_w, 0.0), axis=0)
    top_w = top_w * scaling
    tl.store(out_w_ptr + t * TOP_K + slots, top_w, mask=k_ok)
    tl.store(out_ids_ptr + t * TOP_K + slots, top_i.to(tl.int64), mask=k_ok)


def sigmoid_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] (any dtype), weight [E, H] -> (weights FP32 [T, k], expert ids int64 [T, k]); as `sigmoid_topk_ref`.

    Ties go to the lower expert id. Batches above SMALL_BATCH tokens, more than MAX_EXPERTS experts or top_k above
    MAX_TOP_K run the reference.
    """
    t, hidden = x.shape
    num_experts = weight.shape[0]
    if t > SMALL_BATCH or num_experts > MAX_EXPERTS or not 0 < top_k <= min(MAX_TOP_K, num_experts):
        return sigmoid_topk_ref(x, weight, top_k, renormalize, scaling)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out_w = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    out_ids = torch.empty((t, top_k), dtype=torch.int64, device=x.device)
    if t == 0:
        return out_w, out_ids
    logits = torch.empty((t, num_experts), dtype=torch.float32, device=x.device)
    block_t = triton.next_power_of_2(t)
    # Keep the [T, E, K] product tile near 8K elements so it stays in registers.
    block_k = max(8, min(_BLOCK_K, 8192 // (block_t * _BLOCK_E)))
    _router_logits_kernel[(triton.cdiv(num_experts, _BLOCK_E),)](
        x,
        weight,
        logits,
        t,
        hidden,
        num_experts,
        x.stride(0),
        weight.stride(0),
        BLOCK_T=block_t,
        BLOCK_E=_BLOCK_E,
        BLOCK_K=block_k,
        num_warps=4,
    )
    _topk_kernel[(t,)](
        logits,
        out_w,
        out_ids,
        num_experts,
        float(scaling),
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        E_PAD=triton.next_power_of_2(num_experts),
        RENORMALIZE=renormalize,
        num_warps=4,
    )
    return out_w, out_ids
