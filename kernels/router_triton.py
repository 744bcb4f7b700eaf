"""Triton router for small batches: FP32 logits x·Wᵀ, sigmoid, top-k, renormalised; same contract as `sigmoid_topk_ref`.

One launch. The experts are spread over many programs (BLOCK_E experts each, all tokens of the batch), so the router
weight (2 MB in FP32 for Flint) is read once by many SMs instead of once per token by one. Each program stores its
FP32 logits [T, BLOCK_E] to a workspace and arrives on an arrival counter (CTA barrier, then an acq_rel increment,
the split-K pattern of `split_k_triton`); the program that arrives last reads all the logits back from L2 and does the
top-k for every token: sigmoid, then k rounds of "largest score, lowest expert id on ties" in registers, which gives
torch.topk's descending order, and the renormalisation. It then resets the counter, so it is zero again for the next
launch or CUDA-graph replay. The counter is slot 0 of `split_k_triton.counters` (created on first use: make the first
call outside graph capture), shared with split-K: such launches must not run concurrently on several streams. A
device's tuning table may end it another way (`RouterSmallConfig.tail_launch`, op "router.small"): the programs
store their logits and end, and `_router_topk_kernel`, one program launched next, runs the top-k after its PDL wait
(a kernel boundary where the barrier, the atomic and the last arrival's wait were; no counter).

That kernel is for decode-sized batches: every program reads all the tokens' activations, which stops paying off
at a few dozen tokens. Above SMALL_BATCH tokens `_router_tiles_kernel` runs instead (large decode batches and
prefill, where the reference's FP32 SIMT GEMM and torch.topk took 15 ms of an 8K prefill on the H200): a grid of
(BLOCK_T tokens, BLOCK_E experts) tiles on tensor cores, the top-k done in the same launch, by the tile itself when
it holds every expert, else by the last tile of the token block to arrive (a counter per token block). One token
block (decode batches of 17-64 tokens) makes only 16 tiles for Flint's 256 experts, so there K is also split over
programs: each stores its partial logits to its own plane and the last arrival adds the planes in split order
(deterministic) before the top-k.

Residual add + RMSNorm prologue (`add_rms_norm_sigmoid_topk`): at decode the router's input is the post-attention
norm of o_proj's output plus the residual. Where one K step of the small-batch program covers every token's whole
row (`fused_norm_fits`: up to 4 tokens at Flint's hidden 2048), `_router_norm_kernel` (the same program with its
PROLOGUE on) does the norm too, so a MoE layer has one launch fewer: each program loads the x and residual rows
after the PDL wait (the previous kernel writes x; the norm weight, never written, loads before it), forms
s = round(residual + x) and normed = round(w * (s * rsqrt(mean(s^2) + eps))) with the operations of
`add_rms_norm_ref` (and of rmsnorm_triton's kernel), and takes its logits from normed; program 0 also stores s and
normed. Every program normalises the same few rows, which costs little against its weight row and needs no
grid-wide barrier before the logits. The residual is bit-identical to the reference; normed too, except where the
FP32 rstd differs in its last bit (the variance is summed in another order than PyTorch's mean) and that moves a
value across a rounding boundary: a few elements in a million in BF16. FMA contraction changes nothing else: the
only product that feeds an addition is the square in that sum (as the sm_90 PTX shows). Larger batches run
rmsnorm_triton's `add_rms_norm`, then `sigmoid_topk`.

FP32 accuracy on BF16 tensor cores: activations are BF16, so each FP32 router weight is split exactly into three
BF16 parts (w = hi + mid + lo, each the rounding of what is left), and x.hi + x.mid + x.lo run as three BF16 MMAs
into one FP32 accumulator. Every BF16 x BF16 product is exact in FP32, so the logits are the FP32 sums of exact
products, as in an FP32 GEMM, only summed in another order (the lo part drops what lies below 24 bits of the
weight, as FP32 storage already has). Other activation dtypes use FP32 dots (`input_precision="ieee"`). The split
is made once per weight when the model is built (`prepare`, the op table's `prepare_router`); a weight without one
is split in the kernel, tile by tile (same result, slower). H200, BF16, `benchmarks/kernels_router.py`: T = 8192
71 us (reference 358 us), T = 512 31 us (49), T = 32 20 us (31).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import replace

import torch
import triton
import triton.language as tl

from . import rmsnorm_triton, split_k_triton, tuning
from .configs import RouterSmallConfig, RouterTilesConfig
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
# Shared memory a program may use on the H200 (Triton's max_shared_mem there).
H200_SHARED_MEMORY = 232448
# Pre-split BF16 parts of FP32 router weights (`prepare`), by id of the weight tensor.
_splits: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


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
def _store_topk(top_w, top_i, r, r_ok, out_w_ptr, out_ids_ptr, TOP_K: tl.constexpr, K_PAD: tl.constexpr):
    """Rows r of the outputs: weights FP32 and expert ids int64 [T, TOP_K] (the K_PAD padding is not stored)."""
    slots = tl.arange(0, K_PAD)
    out = r[:, None] * TOP_K + slots[None, :]
    ok = r_ok[:, None] & (slots < TOP_K)[None, :]
    tl.store(out_w_ptr + out, top_w, mask=ok)
    tl.store(out_ids_ptr + out, top_i.to(tl.int64), mask=ok)


@triton.jit
def _topk_from_logits(
    logits_ptr,
    r0,
    num_tokens,
    num_experts,
    scaling,
    out_w_ptr,
    out_ids_ptr,
    ROWS: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """Top-k of the FP32 logits rows r0..r0+ROWS that other programs stored (read from L2 with .cg, not a stale L1
    line; the caller has acquired their release on its arrival counter). SPLITS > 1: the logits are the sum of that
    many K-split partial planes [T, E], added in split order."""
    r = r0 + tl.arange(0, ROWS)
    r_ok = r < num_tokens
    ee = tl.arange(0, E_PAD)
    ee_ok = ee < num_experts
    ptrs = logits_ptr + r[:, None] * num_experts + ee[None, :]
    ok = r_ok[:, None] & ee_ok[None, :]
    logits = tl.load(ptrs, mask=ok, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLITS):
        logits += tl.load(ptrs + s * num_tokens * num_experts, mask=ok, other=0.0, cache_modifier=".cg")
    top_w, top_i = _topk_rows(logits, ee, ee_ok, scaling, ROWS, TOP_K, K_PAD, E_PAD, RENORMALIZE)
    _store_topk(top_w, top_i, r, r_ok, out_w_ptr, out_ids_ptr, TOP_K, K_PAD)


@triton.jit
def _topk_of_tokens(
    logits_ptr,
    num_tokens,
    num_experts,
    scaling,
    out_w_ptr,
    out_ids_ptr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """Every token's top-k of the logits [T, E] other programs stored, ROWS tokens at a time (all of them for Flint's
    256 experts): the k reductions then run once per chunk, not once per token."""
    for t0 in range(0, num_tokens, ROWS):
        _topk_from_logits(
            logits_ptr, t0, num_tokens, num_experts, scaling, out_w_ptr, out_ids_ptr, ROWS, TOP_K, K_PAD, E_PAD,
            RENORMALIZE, 1,
        )  # fmt: skip


@triton.jit
def _weight_step(w_rows, e_ok, kk, k0, hidden, EVEN_K: tl.constexpr):
    """Router weight rows, columns k0 + kk, for k0 < hidden (the launcher never runs hidden == 0)."""
    w_mask = e_ok[:, None]
    if not EVEN_K:
        w_mask = w_mask & ((k0 + kk) < hidden)[None, :]
    return tl.load(w_rows + (k0 + kk)[None, :], mask=w_mask, other=0.0)


@triton.jit
def _add_rms_norm_rows(
    x_ptr,
    res_ptr,
    norm_w,
    normed_ptr,
    new_res_ptr,
    t,
    t_ok,
    kk,
    hidden,
    stride_x,
    stride_res,
    eps,
    EVEN_K: tl.constexpr,
):
    """`add_rms_norm_ref` of the whole rows t (kk covers `hidden`): s = residual + x and normed [T, BLOCK_K] in x's
    dtype, normed returned; program 0 stores both as [T, hidden] rows, every program uses normed."""
    mask = t_ok[:, None]
    if not EVEN_K:
        mask = mask & (kk < hidden)[None, :]
    rows = t[:, None].to(tl.int64)
    xv = tl.load(x_ptr + rows * stride_x + kk[None, :], mask=mask, other=0.0)
    r = tl.load(res_ptr + rows * stride_res + kk[None, :], mask=mask, other=0.0)
    # As PyTorch adds in the activation dtype: one FP32 add, one rounding; the norm reads the rounded sum. The same
    # operations as rmsnorm_triton's kernel; w * (s * rstd) is products only, nothing to contract into an FMA.
    s = (r.to(tl.float32) + xv.to(tl.float32)).to(xv.dtype)
    s32 = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s32 * s32, axis=1) / hidden + eps)
    normed = (norm_w[None, :] * (s32 * rstd[:, None])).to(xv.dtype)
    if tl.program_id(0) == 0:  # every program computes the rows; one stores them
        out = rows * hidden + kk[None, :]
        tl.store(new_res_ptr + out, s, mask=mask)
        tl.store(normed_ptr + out, normed, mask=mask)
    return normed


@triton.jit
def _router_program(
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
    res_ptr,
    norm_w_ptr,
    normed_ptr,
    new_res_ptr,
    stride_res,
    eps,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PROLOGUE: tl.constexpr,
    PDL: tl.constexpr,
    TAIL: tl.constexpr = True,
):
    """FP32 logits of all tokens for BLOCK_E experts (one pass over their weight rows); with TAIL the last program to
    finish turns all the logits into top-k weights (FP32) and expert ids (int64), without it the logits are the
    result (`_router_topk_kernel`, launched next, runs the top-k) and cnt_ptr, out_w_ptr and out_ids_ptr are unused.

    The first K step's weight rows (all of K for Flint at T = 1) are loaded before waiting for the previous grid
    (PDL; weights are never written by a kernel). With PROLOGUE (one K step covers the row) the router's input is
    add+RMSNorm of x and the residual (`_add_rms_norm_rows`); without it res_ptr .. eps are unused."""
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    t = tl.arange(0, BLOCK_T)
    kk = tl.arange(0, BLOCK_K)
    e_ok = e < num_experts
    t_ok = t < num_tokens
    w_rows = w_ptr + e[:, None].to(tl.int64) * stride_w
    wv = _weight_step(w_rows, e_ok, kk, 0, hidden, EVEN_K)
    if PROLOGUE:  # the norm weight is never written by a kernel either: it loads before the wait too
        norm_w = tl.load(norm_w_ptr + kk, mask=kk < hidden, other=0.0).to(tl.float32)
    pdl_entry(PDL)
    if PROLOGUE:
        xv = _add_rms_norm_rows(
            x_ptr, res_ptr, norm_w, normed_ptr, new_res_ptr, t, t_ok, kk, hidden, stride_x, stride_res, eps, EVEN_K
        )
        acc = tl.sum(xv.to(tl.float32)[:, None, :] * wv.to(tl.float32)[None, :, :], axis=2)
    else:
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
    if TAIL:
        # The barrier orders all of this CTA's stores before the release; the program that sees the last arrival
        # (its acquire pairs with every release) reads the logits from L2 (.cg: not a stale L1 line).
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:
            _topk_of_tokens(
                logits_ptr, num_tokens, num_experts, scaling, out_w_ptr, out_ids_ptr, TOP_K, K_PAD, E_PAD, ROWS,
                RENORMALIZE,
            )  # fmt: skip
            tl.atomic_xchg(cnt_ptr, 0)


# Entry points of one program, so the plain router keeps its signature (and no dummy arguments): with and without
# the norm prologue, each with its top-k tail and without it (`RouterSmallConfig.tail_launch`).
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
    """Router of x [T, H] for BLOCK_E experts a program, top-k in the last program to arrive (`_router_program`)."""
    _router_program(
        x_ptr, w_ptr, logits_ptr, cnt_ptr, out_w_ptr, out_ids_ptr, num_tokens, hidden, num_experts, stride_x,
        stride_w, scaling, x_ptr, x_ptr, x_ptr, x_ptr, 0, 0.0, BLOCK_T, BLOCK_E, BLOCK_K, EVEN_K, TOP_K, K_PAD,
        E_PAD, ROWS, RENORMALIZE, False, PDL,
    )  # fmt: skip


@triton.jit
def _router_norm_kernel(
    x_ptr,
    res_ptr,
    norm_w_ptr,
    normed_ptr,
    new_res_ptr,
    w_ptr,
    logits_ptr,
    cnt_ptr,
    out_w_ptr,
    out_ids_ptr,
    num_tokens,
    hidden,
    num_experts,
    stride_x,
    stride_res,
    stride_w,
    eps,
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
    """`_router_kernel` of add+RMSNorm(x, residual) (the PROLOGUE of `_router_program`); stores normed and the new
    residual [T, H] too. BLOCK_K must cover `hidden`."""
    _router_program(
        x_ptr, w_ptr, logits_ptr, cnt_ptr, out_w_ptr, out_ids_ptr, num_tokens, hidden, num_experts, stride_x,
        stride_w, scaling, res_ptr, norm_w_ptr, normed_ptr, new_res_ptr, stride_res, eps, BLOCK_T, BLOCK_E,
        BLOCK_K, EVEN_K, TOP_K, K_PAD, E_PAD, ROWS, RENORMALIZE, True, PDL,
    )  # fmt: skip


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
    EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """`_router_kernel` without its tail: the FP32 logits only (`RouterSmallConfig.tail_launch`)."""
    _router_program(
        x_ptr, w_ptr, logits_ptr, logits_ptr, logits_ptr, logits_ptr, num_tokens, hidden, num_experts, stride_x,
        stride_w, 1.0, x_ptr, x_ptr, x_ptr, x_ptr, 0, 0.0, BLOCK_T, BLOCK_E, BLOCK_K, EVEN_K, 1, 1, 1, 1, False,
        False, PDL, False,
    )  # fmt: skip


@triton.jit
def _router_norm_logits_kernel(
    x_ptr,
    res_ptr,
    norm_w_ptr,
    normed_ptr,
    new_res_ptr,
    w_ptr,
    logits_ptr,
    num_tokens,
    hidden,
    num_experts,
    stride_x,
    stride_res,
    stride_w,
    eps,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """`_router_norm_kernel` without its tail: normed, the new residual and the FP32 logits
    (`RouterSmallConfig.tail_launch`)."""
    _router_program(
        x_ptr, w_ptr, logits_ptr, logits_ptr, logits_ptr, logits_ptr, num_tokens, hidden, num_experts, stride_x,
        stride_w, 1.0, res_ptr, norm_w_ptr, normed_ptr, new_res_ptr, stride_res, eps, BLOCK_T, BLOCK_E, BLOCK_K,
        EVEN_K, 1, 1, 1, 1, False, True, PDL, False,
    )  # fmt: skip


@triton.jit
def _router_topk_kernel(
    logits_ptr,
    out_w_ptr,
    out_ids_ptr,
    num_tokens,
    num_experts,
    scaling,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program: the top-k of every token's FP32 logits, which the launch before stored (the router's tail as a
    launch of its own), ROWS tokens at a time."""
    pdl_entry(PDL)
    _topk_of_tokens(
        logits_ptr, num_tokens, num_experts, scaling, out_w_ptr, out_ids_ptr, TOP_K, K_PAD, E_PAD, ROWS, RENORMALIZE
    )  # fmt: skip


@triton.jit
def _tiles_step(x_rows, w_rows, s_rows, plane, t_ok, e_ok, k0, kk, hidden, acc, SPLIT: tl.constexpr,
                PRESPLIT: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
    """acc [T, E] += x [T, k0:k0+K] @ W [E, k0:k0+K]^T (see the module docstring for SPLIT / PRESPLIT)."""
    x_mask = t_ok[:, None]
    w_mask = e_ok[:, None]
    if not EVEN_K:
        k_ok = ((k0 + kk) < hidden)[None, :]
        x_mask = x_mask & k_ok
        w_mask = w_mask & k_ok
    xv = tl.load(x_rows + (k0 + kk)[None, :], mask=x_mask, other=0.0)
    if PRESPLIT:  # the three BF16 parts, made once per weight by `split_weight`
        hi = tl.load(s_rows + (k0 + kk)[None, :], mask=w_mask, other=0.0)
        mid = tl.load(s_rows + plane + (k0 + kk)[None, :], mask=w_mask, other=0.0)
        lo = tl.load(s_rows + 2 * plane + (k0 + kk)[None, :], mask=w_mask, other=0.0)
    else:
        wv = tl.load(w_rows + (k0 + kk)[None, :], mask=w_mask, other=0.0).to(tl.float32)
        if SPLIT:
            hi = wv.to(tl.bfloat16)
            rest = wv - hi.to(tl.float32)  # exact: hi is the weight rounded to 8 bits
            mid = rest.to(tl.bfloat16)
            lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    if SPLIT:
        acc = tl.dot(xv, tl.trans(hi), acc)
        acc = tl.dot(xv, tl.trans(mid), acc)
        acc = tl.dot(xv, tl.trans(lo), acc)
    else:
        acc = tl.dot(xv.to(tl.float32), tl.trans(wv), acc, input_precision="ieee")
    return acc


@triton.jit
def _router_tiles_kernel(
    x_ptr,
    w_ptr,
    split_ptr,
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
    k_per_split,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    PRESPLIT: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """FP32 logits of BLOCK_T tokens x BLOCK_E experts on tensor cores, then top-k weights (FP32) and expert ids
    (int64) of the tokens: here when BLOCK_E covers every expert and K is not split, else in the token block's last
    tile to arrive. SPLIT_K > 1: program (t, e, s) sums K from s * k_per_split and stores its partial logits to plane
    s; the last arrival adds the planes in split order, so the result does not depend on scheduling."""
    pid_t = tl.program_id(0)
    pid_e = tl.program_id(1)
    pid_k = tl.program_id(2)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    kk = tl.arange(0, BLOCK_K)
    t_ok = t < num_tokens
    e_ok = e < num_experts
    x_rows = x_ptr + t[:, None].to(tl.int64) * stride_x
    w_rows = w_ptr + e[:, None].to(tl.int64) * stride_w
    s_rows = split_ptr + e[:, None].to(tl.int64) * hidden  # split planes [3, E, H], contiguous
    plane = num_experts.to(tl.int64) * hidden
    pdl_entry(PDL)
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, tl.minimum(hidden, k_start + k_per_split), BLOCK_K):
        acc = _tiles_step(x_rows, w_rows, s_rows, plane, t_ok, e_ok, k0, kk, hidden, acc, SPLIT, PRESPLIT, EVEN_K)
    if BLOCK_E >= E_PAD and SPLIT_K == 1:  # the tile holds every expert of its tokens, all of K
        top_w, top_i = _topk_rows(acc, e, e_ok, scaling, BLOCK_T, TOP_K, K_PAD, E_PAD, RENORMALIZE)
        _store_topk(top_w, top_i, t, t_ok, out_w_ptr, out_ids_ptr, TOP_K, K_PAD)
    else:
        split_plane = pid_k.to(tl.int64) * num_tokens * num_experts
        tl.store(
            logits_ptr + split_plane + t[:, None] * num_experts + e[None, :], acc, mask=t_ok[:, None] & e_ok[None, :]
        )
        # As in `_router_kernel`: barrier, then release/acquire on the token block's counter.
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_t, 1, sem="acq_rel")
        if arrived == tl.num_programs(1) * SPLIT_K - 1:
            for r0 in range(0, BLOCK_T, ROWS):
                _topk_from_logits(
                    logits_ptr, pid_t * BLOCK_T + r0, num_tokens, num_experts, scaling, out_w_ptr, out_ids_ptr,
                    ROWS, TOP_K, K_PAD, E_PAD, RENORMALIZE, SPLIT_K,
                )  # fmt: skip
            tl.atomic_xchg(cnt_ptr + pid_t, 0)


def sigmoid_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] (any dtype), weight [E, H] -> (weights FP32 [T, k], expert ids int64 [T, k]); as `sigmoid_topk_ref`.

    Ties go to the lower expert id. More than MAX_EXPERTS experts or top_k above MAX_TOP_K run the reference;
    batches above SMALL_BATCH tokens the tensor-core tiles (`_router_tiles_kernel`).
    """
    t, hidden = x.shape
    num_experts = weight.shape[0]
    if num_experts > MAX_EXPERTS or hidden == 0 or not 0 < top_k <= min(MAX_TOP_K, num_experts):
        return sigmoid_topk_ref(x, weight, top_k, renormalize, scaling)
    split = _split_of(weight) if t > SMALL_BATCH and x.dtype == torch.bfloat16 else None
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out_w = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    out_ids = torch.empty((t, top_k), dtype=torch.int64, device=x.device)
    if t == 0:
        return out_w, out_ids
    if t > SMALL_BATCH:
        _tiles(x, weight, top_k, renormalize, scaling, out_w, out_ids, split=split)
        return out_w, out_ids
    _small_batch(x, weight, top_k, renormalize, scaling, out_w, out_ids)
    return out_w, out_ids


def _block_k(tokens: int, hidden: int) -> int:
    """K step of `_router_kernel`: as much of K as the product tile allows (all of Flint's 2048 up to 4 tokens), so
    fewer dependent iterations."""
    return max(8, min(triton.next_power_of_2(hidden), _PRODUCT_TILE // (triton.next_power_of_2(tokens) * _BLOCK_E)))


def fused_norm_fits(tokens: int, hidden: int) -> bool:
    """Whether `add_rms_norm_sigmoid_topk` runs as one launch: 1..SMALL_BATCH tokens whose whole rows fit one K step
    of `_router_kernel` (the norm needs the whole row before any logit): hidden <= _PRODUCT_TILE //
    (next_pow2(tokens) * _BLOCK_E) or hidden <= 8. Up to 4 tokens for Flint's hidden 2048, all 16 up to hidden 512."""
    return 0 < tokens <= SMALL_BATCH and 0 < hidden <= _block_k(tokens, hidden)


def _small_batch(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scaling: float,
    out_w: torch.Tensor,
    out_ids: torch.Tensor,
    norm: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Launch `_router_kernel` (1..SMALL_BATCH tokens, unit strides on H), or with `norm` = (residual, norm weight,
    eps, normed out, new residual out) `_router_norm_kernel` (the caller has checked `fused_norm_fits`); where
    `small_config` asks for it, their tailless twins and then `_router_topk_kernel`."""
    t, hidden = x.shape
    num_experts = weight.shape[0]
    logits = torch.empty((t, num_experts), dtype=torch.float32, device=x.device)
    block_t = triton.next_power_of_2(t)
    e_pad = triton.next_power_of_2(num_experts)
    block_k = _block_k(t, hidden)
    grid = (triton.cdiv(num_experts, _BLOCK_E),)
    meta = dict(
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
    if small_config(t, num_experts, x.device).tail_launch:
        logits_meta = {k: meta[k] for k in ("BLOCK_T", "BLOCK_E", "BLOCK_K", "EVEN_K", "num_warps")}
        pdl = launch_options(x.device)
        if norm is None:
            _router_logits_kernel[grid](
                x, weight, logits, t, hidden, num_experts, x.stride(0), weight.stride(0), **logits_meta, **pdl
            )  # fmt: skip
        else:
            residual, norm_weight, eps, normed, new_res = norm
            _router_norm_logits_kernel[grid](
                x, residual, norm_weight, normed, new_res, weight, logits, t, hidden, num_experts, x.stride(0),
                residual.stride(0), weight.stride(0), float(eps), **logits_meta, **pdl,
            )  # fmt: skip
        topk_meta = {k: meta[k] for k in ("TOP_K", "K_PAD", "E_PAD", "ROWS", "RENORMALIZE", "num_warps")}
        _router_topk_kernel[(1,)](logits, out_w, out_ids, t, num_experts, float(scaling), **topk_meta, **pdl)
        return
    counter = split_k_triton.counters(x.device)
    if norm is None:
        _router_kernel[grid](
            x, weight, logits, counter, out_w, out_ids, t, hidden, num_experts, x.stride(0), weight.stride(0),
            float(scaling), **meta,
        )  # fmt: skip
        return
    residual, norm_weight, eps, normed, new_res = norm
    _router_norm_kernel[grid](
        x, residual, norm_weight, normed, new_res, weight, logits, counter, out_w, out_ids, t, hidden, num_experts,
        x.stride(0), residual.stride(0), weight.stride(0), float(eps), float(scaling), **meta,
    )  # fmt: skip


def small_config(tokens: int, num_experts: int, device: torch.device | None = None) -> RouterSmallConfig:
    """How the small-batch router ends on this device: on its counter (the default), unless the device's tuning
    table (op "router.small", shape tokens, experts) asks for the top-k as a launch of its own."""
    return tuning.tuned("router.small", RouterSmallConfig(), device, tokens=tokens, experts=num_experts)


def add_rms_norm_sigmoid_topk(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    router_weight: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normed, new residual, top-k weights FP32, expert ids int64) as `add_rms_norm_sigmoid_topk_ref`; one launch
    where `fused_norm_fits`, else Triton `add_rms_norm` then `sigmoid_topk` (each with its own fallbacks)."""
    num_experts = router_weight.shape[0]
    fused = (
        x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and residual.shape == x.shape
        and residual.dtype == x.dtype
        and norm_weight.shape == (x.shape[1],)
        and router_weight.dim() == 2
        and router_weight.shape[1] == x.shape[1]
        and num_experts <= MAX_EXPERTS
        and 0 < top_k <= min(MAX_TOP_K, num_experts)
        and fused_norm_fits(x.shape[0], x.shape[1])
    )
    if not fused:
        normed, new_res = rmsnorm_triton.add_rms_norm(x, residual, norm_weight, eps)
        return normed, new_res, *sigmoid_topk(normed, router_weight, top_k, renormalize, scaling)
    x, residual, norm_weight, router_weight = (
        a if a.stride(-1) == 1 else a.contiguous() for a in (x, residual, norm_weight, router_weight)
    )
    t, hidden = x.shape
    normed = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    new_res = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    out_w = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    out_ids = torch.empty((t, top_k), dtype=torch.int64, device=x.device)
    _small_batch(
        x, router_weight, top_k, renormalize, scaling, out_w, out_ids, (residual, norm_weight, eps, normed, new_res)
    )
    return normed, new_res, out_w, out_ids


def tiles_config(
    tokens: int, num_experts: int, device: torch.device | None = None, presplit: bool = True
) -> RouterTilesConfig:
    """The fastest candidates of benchmarks/kernels_router.py on the H200 (2026-11-30, pre-split weights): 128 x 128
    tiles from 4096 tokens (T = 8192: 71 us), 64 x 64 from 1024 (T = 2048: 39 us), else token blocks of 16-64
    against 16 experts a tile with long K steps (T = 512: 31 us). Up to 64 tokens (decode batches) the blocks are 16
    tokens and K is split 4 ways over programs (`RouterTilesConfig.split_k`): T = 32 in 10.7 us, against 16.2 in one
    32-token block and 21.0 unsplit. Narrower expert blocks only where the expert count is smaller. A
    device's tuning table may replace any of it (op "router.tiles", shape tokens, experts); on a GPU with less
    shared memory than the H200 the tiles then shrink to fit (`fit_shared_memory`)."""
    e_pad = triton.next_power_of_2(num_experts)
    if tokens >= 4096:
        cfg = RouterTilesConfig(128, min(e_pad, 128), 64, 8, 3, 1)
    elif tokens >= 1024:
        cfg = RouterTilesConfig(64, min(e_pad, 64), 64, 4, 4, 1)
    else:
        # Decode batches: more programs from 16-token blocks and 4 K splits (H200, T = 32: 10.7 us; 4 splits of one
        # 32-token block 16.2, 8 splits 17.9). Longer prefill chunks fill the GPU with token blocks alone.
        if tokens <= 64:
            cfg = RouterTilesConfig(16, 16, 128, 4, 3, 4)
        else:
            cfg = RouterTilesConfig(max(16, min(64, triton.next_power_of_2(tokens))), 16, 128, 4, 3, 1)
    cfg = tuning.tuned("router.tiles", cfg, device, tokens=tokens, experts=num_experts)
    return fit_shared_memory(cfg, presplit, shared_memory_limit(device))


def shared_memory_bytes(cfg: RouterTilesConfig, presplit: bool) -> int:
    """Estimated shared memory of a launch: each pipeline stage holds the x tile and the weight tile(s) (three BF16
    parts, or the FP32 weight plus one BF16 operand at a time when split in the kernel), plus scratch. Within 3% of
    what Triton 3.6 asked for on the H200 for the configurations that overflowed there."""
    x = cfg.block_t * cfg.block_k * 2
    if presplit:
        per_stage, extra = x + 3 * cfg.block_e * cfg.block_k * 2, 0
    else:
        per_stage, extra = x + cfg.block_e * cfg.block_k * 4, cfg.block_e * cfg.block_k * 2
    return cfg.num_stages * per_stage + extra + 8192


def fit_shared_memory(cfg: RouterTilesConfig, presplit: bool, limit: int) -> RouterTilesConfig:
    """`cfg`, or the nearest smaller configuration whose estimate fits `limit` bytes: fewer pipeline stages (down to
    2) first, then narrower token, expert and K blocks (down to 16)."""
    while shared_memory_bytes(cfg, presplit) > limit:
        if cfg.num_stages > 2:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_t > 16 and cfg.block_t >= cfg.block_e:
            cfg = replace(cfg, block_t=cfg.block_t // 2)
        elif cfg.block_e > 16:
            cfg = replace(cfg, block_e=cfg.block_e // 2)
        elif cfg.block_k > 16:
            cfg = replace(cfg, block_k=cfg.block_k // 2)
        else:
            break
    return cfg


@functools.cache
def _cuda_shared_memory(index: int) -> int:
    try:  # what Triton checks a launch against (OutOfResources)
        return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # an older Triton: PyTorch's opt-in limit, else the smallest of current NVIDIA GPUs
        return int(getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 101376))


def shared_memory_limit(device: torch.device | None) -> int:
    """Shared memory a program may use on `device` (the H200's 227 KB where there is no CUDA device: the
    interpreter, whose tests then see the H200's tiles)."""
    if device is None or device.type != "cuda":
        return H200_SHARED_MEMORY
    return _cuda_shared_memory(device.index if device.index is not None else torch.cuda.current_device())


def prepare(weight: torch.Tensor) -> None:
    """Make the three-part BF16 split of an FP32 router weight once and keep it while the weight lives (3 MB
    for Flint's 256 x 2048, 141 MB over its 47 MoE layers), so the many-token kernel loads BF16 parts instead of
    splitting the FP32 weight in every tile (8K prefill, H200: 71 vs 109 us a layer). Without it the kernel
    splits in registers, with the same result."""
    if weight.dtype != torch.float32 or weight.dim() != 2:
        return
    key = id(weight)
    if _split_of(weight) is not None:
        return
    # The entry goes when the weight does (CPython runs the callback at once, before the id can be reused).
    _splits[key] = (weakref.ref(weight, lambda _ref, key=key: _splits.pop(key, None)), split_weight(weight))


def _split_of(weight: torch.Tensor) -> torch.Tensor | None:
    hit = _splits.get(id(weight))
    return hit[1] if hit is not None and hit[0]() is weight else None


def split_nbytes(num_experts: int, hidden: int) -> int:
    """Bytes `prepare` keeps for one router weight [num_experts, hidden]: three BF16 parts."""
    return 3 * 2 * num_experts * hidden


def split_weight(weight: torch.Tensor) -> torch.Tensor:
    """FP32 router weight [E, H] -> its three exact BF16 parts [3, E, H] (hi, mid, lo; see the module docstring)."""
    w = weight.float()
    hi = w.bfloat16()
    rest = w - hi.float()
    mid = rest.bfloat16()
    lo = (rest - mid.float()).bfloat16()
    return torch.stack([hi, mid, lo]).contiguous()


def _tiles(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scaling: float,
    out_w: torch.Tensor,
    out_ids: torch.Tensor,
    config: RouterTilesConfig | None = None,
    split: torch.Tensor | None = None,
) -> None:
    t, hidden = x.shape
    num_experts = weight.shape[0]
    e_pad = triton.next_power_of_2(num_experts)
    split_bf16 = x.dtype == torch.bfloat16
    presplit = split_bf16 and split is not None
    cfg = config or tiles_config(t, num_experts, x.device, presplit)
    token_blocks = triton.cdiv(t, cfg.block_t)
    expert_tiles = triton.cdiv(num_experts, cfg.block_e)
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(hidden)))
    split_k, per = _k_split(cfg.split_k, token_blocks, expert_tiles, hidden, block_k, x.device)
    one_pass = cfg.block_e >= e_pad and split_k == 1
    if not one_pass and token_blocks > split_k_triton.COUNTER_SLOTS:
        raise ValueError(f"router: {t} tokens need more arrival counters than {split_k_triton.COUNTER_SLOTS}")
    # Logits go through memory only when a token block's experts or K are split over several tiles.
    logits = out_w if one_pass else torch.empty((split_k, t, num_experts), dtype=torch.float32, device=x.device)
    _router_tiles_kernel[(token_blocks, expert_tiles, split_k)](
        x,
        weight,
        split if split is not None else weight,
        logits,
        split_k_triton.counters(x.device),
        out_w,
        out_ids,
        t,
        hidden,
        num_experts,
        x.stride(0),
        weight.stride(0),
        float(scaling),
        per,
        BLOCK_T=cfg.block_t,
        BLOCK_E=cfg.block_e,
        BLOCK_K=block_k,
        EVEN_K=hidden % block_k == 0,
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        E_PAD=e_pad,
        ROWS=max(1, min(cfg.block_t, _SCORE_TILE // e_pad)),
        SPLIT=split_bf16,
        PRESPLIT=presplit,
        RENORMALIZE=renormalize,
        SPLIT_K=split_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(x.device),
    )


def _k_split(
    asked: int, token_blocks: int, expert_tiles: int, hidden: int, block_k: int, device: torch.device
) -> tuple[int, int]:
    """(K splits, K per split, a multiple of block_k) of a tiles launch: `asked` if set (0: automatic), else for one
    token block (decode-sized batches, whose 16 tiles leave most of a GPU idle) as `split_k_triton.choose_split_k`."""
    whole = triton.cdiv(hidden, block_k) * block_k
    if asked == 1 or (asked == 0 and token_blocks > 1):
        return 1, whole
    if asked == 0:
        return split_k_triton.choose_split_k(token_blocks * expert_tiles, hidden, block_k, device)
    per = triton.cdiv(triton.cdiv(hidden, block_k), asked) * block_k
    return triton.cdiv(hidden, per), per
