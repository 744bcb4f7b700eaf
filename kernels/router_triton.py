"""Triton router for small batches: FP32 logits x·Wᵀ, sigmoid, top-k, renormalised; same contract as `sigmoid_topk_ref`.

One launch. The experts are spread over many programs (BLOCK_E experts each, all tokens of the batch), so the router
weight (2 MB in FP32 for Flint) is read once by many SMs instead of once per token by one. Each program stores its
FP32 logits [T, BLOCK_E] to a workspace and arrives on an arrival counter (CTA barrier, then an acq_rel increment,
the split-K pattern of `gemv_triton`); the program that arrives last reads all the logits back from L2 and does the
top-k for every token: sigmoid, then k rounds of "largest score, lowest expert id on ties" in registers, which gives
torch.topk's descending order, and the renormalisation. It then resets the counter, so it is zero again for the next
launch or CUDA-graph replay. The counter is slot 0 of `gemv_triton.counters` (created on first use: make the first
call outside graph capture), shared with split-K: such launches must not run concurrently on several streams.

Meant for decode-sized batches: every program reads all the tokens' activations, which stops paying off at a few
dozen tokens, so above SMALL_BATCH tokens the reference ops (one GEMM, then torch.topk) run instead. Timings of the
earlier two-launch version (logits kernel, then a top-k kernel with one program per token) on an H200 inside a CUDA
graph: 8 us at T=1, 10.5 us at T=8, 50 us at T=64, with one expert per program (256 programs) fastest. This
one-launch version has not been timed on a GPU yet.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import gemv_triton
from .pdl import launch_options, pdl_entry
from .router import sigmoid_topk_ref

SMALL_BATCH = 16
MAX_EXPERTS = 1024
MAX_TOP_K = 8
_BLOCK_E = 1
# Register budgets (elements): the [T, E, K] product tile of the logits loop and the [tokens, experts] score tile
# of the top-k.
_PRODUCT_TILE = 8192
_SCORE_TILE = 4096


@triton.jit
def _topk_rows(
    logits,
    e,
    e_ok,
    scaling,
    ROWS: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """Sigmoid scores of FP32 logits [ROWS, E_PAD], then each row's top-k: (weights FP32, expert ids int32), both
    [ROWS, K_PAD], descending, ties to the lower expert id. `e` [E_PAD] are the expert ids, `e_ok` the real ones."""
    scores = 1.0 / (1.0 + tl.exp(-logits))
    # Padded experts can never win: sigmoid scores are >= 0.
    scores = tl.where(e_ok[None, :], scores, -1.0)
    slots = tl.arange(0, K_PAD)[None, :]
    top_w = tl.zeros([ROWS, K_PAD], dtype=tl.float32)
    top_i = tl.zeros([ROWS, K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(scores, axis=1)
        idx = tl.min(tl.where(scores == best[:, None], e[None, :], E_PAD), axis=1)
        top_w = tl.where(slots == j, best[:, None], top_w)
        top_i = tl.where(slots == j, idx[:, None], top_i)
        scores = tl.where(e[None, :] == idx[:, None], -2.0, scores)
    if RENORMALIZE:
        top_w = top_w / tl.sum(tl.where(slots < TOP_K, top_w, 0.0), axis=1)[:, None]
    return top_w * scaling, top_i


@triton.jit
def _weight_step(w_rows, e_ok, kk, k0, hidden, EVEN_K: tl.constexpr):
    """Router weight rows, columns k0 + kk, for k0 < hidden (the launcher never runs hidden == 0)."""
    w_mask = e_ok[:, None]
    if not EVEN_K:
        w_mask = w_mask & ((k0 + kk) < hidden)[None, :]
    return tl.load(w_rows + (k0 + kk)[None, :], mask=w_mask, other=0.0)


@triton.jit
def _router_kernel(
    x_ptr,
    w_ptr,
    logits_ptr,
    cnt_ptr,
    out_w_ptr,
    out_ids_ptr,
    num_tokens,
    hidden,
    num_experts,
    stride_x,
    stride_w,
    scaling,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    """FP32 logits of all tokens for BLOCK_E experts (one pass over their weight rows); the last program to finish
    turns all the logits into top-k weights (FP32) and expert ids (int64).

    The first K step's weight rows (all of K for Flint at T = 1) are loaded before waiting for the previous grid
    (PDL; weights are never written by a kernel)."""
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    t = tl.arange(0, BLOCK_T)
    kk = tl.arange(0, BLOCK_K)
    e_ok = e < num_experts
    t_ok = t < num_tokens
    w_rows = w_ptr + e[:, None].to(tl.int64) * stride_w
    wv = _weight_step(w_rows, e_ok, kk, 0, hidden, EVEN_K)
    pdl_entry(PDL)
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        if k0 > 0:
            wv = _weight_step(w_rows, e_ok, kk, k0, hidden, EVEN_K)
        x_mask = t_ok[:, None]
        if not EVEN_K:  # a K mask only where the last step is partial, so whole steps keep vectorised loads
            x_mask = x_mask & ((k0 + kk) < hidden)[None, :]
        xv = tl.load(x_ptr + t[:, None].to(tl.int64) * stride_x + (k0 + kk)[None, :], mask=x_mask, other=0.0)
        acc += tl.sum(xv.to(tl.float32)[:, None, :] * wv.to(tl.float32)[None, :, :], axis=2)
    tl.store(logits_ptr + t[:, None] * num_experts + e[None, :], acc, mask=t_ok[:, None] & e_ok[None, :])
    # The barrier orders all of this CTA's stores before the release; the program that sees the last arrival (its
    # acquire pairs with every release) reads the logits from L2 (.cg: not a stale L1 line).
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        ee = tl.arange(0, E_PAD)
        ee_ok = ee < num_experts
        rows = tl.arange(0, ROWS)
        slots = tl.arange(0, K_PAD)
        # ROWS tokens at a time (all of them for Flint's 256 experts): the k reductions then run once per chunk,
        # not once per token.
        for t0 in range(0, num_tokens, ROWS):
            r = t0 + rows
            r_ok = r < num_tokens
            logits = tl.load(
                logits_ptr + r[:, None] * num_experts + ee[None, :],
                mask=r_ok[:, None] & ee_ok[None, :],
                other=0.0,
                cache_modifier=".cg",
            )
            top_w, top_i = _topk_rows(logits, ee, ee_ok, scaling, ROWS, TOP_K, K_PAD, E_PAD, RENORMALIZE)
            out = r[:, None] * TOP_K + slots[None, :]
            out_ok = r_ok[:, None] & (slots < TOP_K)[None, :]
            tl.store(out_w_ptr + out, top_w, mask=out_ok)
            tl.store(out_ids_ptr + out, top_i.to(tl.int64), mask=out_ok)
        tl.atomic_xchg(cnt_ptr, 0)


def sigmoid_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] (any dtype), weight [E, H] -> (weights FP32 [T, k], expert ids int64 [T, k]); as `sigmoid_topk_ref`.

    Ties go to the lower expert id. Batches above SMALL_BATCH tokens, more than MAX_EXPERTS experts or top_k above
    MAX_TOP_K run the reference.
    """
    t, hidden = x.shape
    num_experts = weight.shape[0]
    if t > SMALL_BATCH or num_experts > MAX_EXPERTS or hidden == 0 or not 0 < top_k <= min(MAX_TOP_K, num_experts):
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
    e_pad = triton.next_power_of_2(num_experts)
    # As much of K per step as the product tile allows (all of Flint's 2048 at T=1): fewer dependent iterations.
    block_k = max(8, min(triton.next_power_of_2(hidden), _PRODUCT_TILE // (block_t * _BLOCK_E)))
    _router_kernel[(triton.cdiv(num_experts, _BLOCK_E),)](
        x,
        weight,
        logits,
        gemv_triton.counters(x.device),
        out_w,
        out_ids,
        t,
        hidden,
        num_experts,
        x.stride(0),
        weight.stride(0),
        float(scaling),
        BLOCK_T=block_t,
        BLOCK_E=_BLOCK_E,
        BLOCK_K=block_k,
        EVEN_K=hidden % block_k == 0,
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        E_PAD=e_pad,
        ROWS=max(1, min(block_t, _SCORE_TILE // e_pad)),
        RENORMALIZE=renormalize,
        num_warps=4,
        **launch_options(x.device),
    )
    return out_w, out_ids
