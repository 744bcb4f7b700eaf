"""Triton top-k sampling: `sample_top_k_ref`'s draw in two launches, without sorting the vocabulary.

The PyTorch path spends ~1 ms a step at any batch size on ~40 small kernels (a `topk` over 150144 logits, the
noise hash, softmax, cumsum, masks). Here:

1. `_chunk_top_kernel` (rows x vocabulary chunks): each program scales its chunk by the row's temperature, packs
   every logit with its token id into one int64 key (order-preserving float bits above, the inverted id below, so
   the larger key is the larger value, then the smaller id, torch.argmax's tie rule), and keeps its best KC keys:
   sorted rows of 4 KC keys cut to their best KC (twice for Flint's 4096-key chunks), then one sort.
   `_chunk_filter_kernel` finds the same keys with far less sorting (`FILTER`, on by default): the
   smallest of KC column maxima is a lower bound of the chunk's KC-th largest key, so only the keys at or above it
   (typically ~120 of 4096) are gathered and sorted, the rest of the chunk never; a chunk with more of them than
   FILTER_CAP (for independent logits about once in 20,000 rows) takes `_chunk_top_kernel`'s sorted rows.
2. `_draw_kernel` (one program per row): sorts the chunks' candidates, keeps the row's top_k, applies top-p and
   min-p on their softmax, adds the same counter-hash Gumbel noise as the reference and takes the argmax
   (temperature 0: the best key, i.e. the first argmax of the logits). With FILTER, `_draw_filter_kernel` cuts
   only the candidates at or above the KC-th largest chunk maximum (~70 of Flint's 1184), the same way.

The division by temperature is IEEE-rounded (`div_rn`) as in PyTorch; exp/log are Triton's, so softmax masses and
noise may differ from the reference in the last bit: a token differs only where two perturbed scores, or a
cumulative mass and top_p, tie to ~1e-6.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .sampling import sample_top_k_ref

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Largest top_k drawn here (candidates per chunk, a power of two); larger ones take the reference's `topk`.
MAX_K = 128
# Candidates kept per chunk: MIN_KC for top_k up to it (Flint's default 20), else MAX_K. Two variants only: sorting
# networks compile slowly (each kernel 5-13 s on the H200's host), and the engine's start-up warm-up compiles both.
MIN_KC = 32
# The largest top_k of each compiled variant (what a warm-up calls the op with).
TOP_K_VARIANTS = (MIN_KC, MAX_K)
# Vocabulary entries per chunk program (H200, benchmarks/sampler.py; a power of two >= MAX_K).
CHUNK = 4096
# `_chunk_filter_kernel` / `_draw_filter_kernel` instead of the sorted rows for KC = MIN_KC: the op's GPU time on an
# H200 fell 0.087 -> 0.019 ms at batch 1 and 0.467 -> 0.094 at 64 (benchmarks/sampler.py --filter, 2026-12-02); the
# tokens are the same either way. FLINT_SAMPLER_FILTER=0 runs the sorted rows.
FILTER = os.environ.get("FLINT_SAMPLER_FILTER", "1") != "0"
# Keys a filtered chunk gathers at most. With n independent logits in KC columns of 4096 / KC, more than CAP keys
# reach the bound only if some column's maximum lies below the (1 - CAP / 4096) quantile: for CAP = 512 about
# KC * 0.875**128 = 1e-6 a chunk.
FILTER_CAP = 512
# Radix selects instead of sorted rows (`_radix_best`): the unfiltered kernels (KC = MAX_K, or FILTER off) on
# `_chunk_radix_kernel` and `_draw_radix_kernel`, and the filtered kernels' fallbacks on their radix twins. They cut
# the start-up's longest compiles (on the H200's host the sorted rows' `_draw_kernel` 22-30 s, `_chunk_top_kernel`
# 12 s, `_chunk_filter_kernel` 11 s; the radix kernels 5 s) and run faster: at top_k 50 on the H200 the op's GPU time
# 0.211 -> 0.108 ms at batch 1, 0.316 -> 0.150 at 8, 1.058 -> 0.479 at 64, same tokens (benchmarks/sampler.py
# --radix, 2026-12-02). FLINT_SAMPLER_RADIX=0 runs the sorted rows.
RADIX = os.environ.get("FLINT_SAMPLER_RADIX", "1") != "0"
# Candidates `_draw_filter_kernel` gathers at most: for Flint's 37 chunks and independent logits 47-106 reached its
# bound in 200 trials.
DRAW_CAP = 256
_INT64_MIN = tl.constexpr(-(2**63))
_M32 = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _chunk_top_kernel(
    logits_ptr,
    temp_ptr,
    cand_ptr,
    vocab,
    stride_row,
    n_chunks,
    BLOCK: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
):
    """cand[row, chunk, :KC] = the KC largest packed (logit / temperature, id) keys of one vocabulary chunk.

    With LEVELS > 0 the chunk is cut into rows of SUB keys, each row sorted and cut to its best KC (any of the
    chunk's best KC is among its row's), once or twice, before the last sort of FINAL keys: a bitonic sort of 4096
    keys costs ~160K compare-exchanges, the three steps ~76K, with the same result (the keys are all distinct)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    key = _chunk_keys(logits_ptr, temp_ptr, row, chunk, vocab, stride_row, BLOCK)
    _store_best(key, cand_ptr + (row * n_chunks + chunk) * KC, BLOCK, KC, SUB, LEVELS, FINAL)


@triton.jit
def _chunk_keys(logits_ptr, temp_ptr, row, chunk, vocab, stride_row, BLOCK: tl.constexpr):
    """The chunk's packed (logit / temperature, id) keys, [BLOCK] int64; past the vocabulary the smallest key."""
    offs = tl.arange(0, BLOCK)
    ids = chunk * BLOCK + offs
    ok = ids < vocab
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ok, other=0.0)
    t = tl.load(temp_ptr + row)
    q = tl.math.div_rn(x, tl.where(t == 0.0, 1.0, t))
    bits = q.to(tl.int32, bitcast=True)
    # Negative floats order backwards as integers: flipping their magnitude bits makes int order = float order.
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)
    return tl.where(ok, key, _INT64_MIN)


@triton.jit
def _store_best(
    key, out_ptr, N: tl.constexpr, KC: tl.constexpr, SUB: tl.constexpr, LEVELS: tl.constexpr, FINAL: tl.constexpr
):
    """out[:KC] = the KC largest of the N keys `key`, in descending order (`chunk_levels(N, KC)` gives the cut)."""
    top = _sorted_best(key, N, KC, SUB, LEVELS)
    fo = tl.arange(0, FINAL)
    tl.store(out_ptr + fo, top, mask=fo < KC)


@triton.jit
def _chunk_radix_kernel(
    logits_ptr,
    temp_ptr,
    cand_ptr,
    gather_ptr,
    vocab,
    stride_row,
    n_chunks,
    BLOCK: tl.constexpr,
    KC: tl.constexpr,
):
    """`_chunk_top_kernel`'s cand[row, chunk, :KC] through a radix select (`_radix_best`, this program's KC slots of
    `gather`) instead of sorted rows (`RADIX`)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    key = _chunk_keys(logits_ptr, temp_ptr, row, chunk, vocab, stride_row, BLOCK)
    at = (row * n_chunks + chunk) * KC
    tl.store(cand_ptr + at + tl.arange(0, KC), _radix_best(key, gather_ptr + at, BLOCK, KC))


@triton.jit
def _chunk_filter_body(
    logits_ptr,
    temp_ptr,
    cand_ptr,
    gather_ptr,
    vocab,
    stride_row,
    n_chunks,
    BLOCK: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
    CAP: tl.constexpr,
    CAP_SUB: tl.constexpr,
    CAP_LEVELS: tl.constexpr,
    CAP_FINAL: tl.constexpr,
    RADIX: tl.constexpr,
):
    """`_chunk_top_kernel`'s cand[row, chunk, :KC], sorting only the keys at or above a bound of the KC-th largest.

    Column j of the chunk (ids j, j + KC, ...) has a largest key; those KC maxima are distinct keys, so the chunk's
    KC-th largest is at least their minimum, tau. The keys >= tau (at least KC, all of the best KC among them) are
    written in order to this program's CAP slots of `gather` (their positions a prefix sum of the test), read back
    after a CTA barrier, and cut to the best KC (`chunk_levels(CAP, KC)`). Columns rather than contiguous rows keep
    the bound tight in the last chunk, whose tail is past the vocabulary. More than CAP keys >= tau: the sorted rows
    of the whole chunk, as `_chunk_top_kernel` does (SUB, LEVELS, FINAL), or with RADIX its radix select (in the
    program's slots)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    key = _chunk_keys(logits_ptr, temp_ptr, row, chunk, vocab, stride_row, BLOCK)
    out = cand_ptr + (row * n_chunks + chunk) * KC
    tau = tl.min(tl.max(tl.reshape(key, (BLOCK // KC, KC)), axis=0), axis=0)
    hit = (key >= tau).to(tl.int32)
    n = tl.sum(hit, axis=0)
    if n <= CAP:
        few = _gather(key, hit, n, gather_ptr + (row * n_chunks + chunk) * CAP, CAP)
        _store_best(few, out, CAP, KC, CAP_SUB, CAP_LEVELS, CAP_FINAL)
    elif RADIX:
        tl.store(out + tl.arange(0, KC), _radix_best(key, gather_ptr + (row * n_chunks + chunk) * CAP, BLOCK, KC))
    else:
        _store_best(key, out, BLOCK, KC, SUB, LEVELS, FINAL)


@triton.jit
def _chunk_filter_kernel(
    logits_ptr,
    temp_ptr,
    cand_ptr,
    gather_ptr,
    vocab,
    stride_row,
    n_chunks,
    BLOCK: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
    CAP: tl.constexpr,
    CAP_SUB: tl.constexpr,
    CAP_LEVELS: tl.constexpr,
    CAP_FINAL: tl.constexpr,
):
    """`_chunk_filter_body` with the sorted rows for chunks past CAP."""
    _chunk_filter_body(
        logits_ptr, temp_ptr, cand_ptr, gather_ptr, vocab, stride_row, n_chunks, BLOCK, KC, SUB, LEVELS, FINAL, CAP,
        CAP_SUB, CAP_LEVELS, CAP_FINAL, False
    )  # fmt: skip


@triton.jit
def _chunk_filter_radix_kernel(
    logits_ptr,
    temp_ptr,
    cand_ptr,
    gather_ptr,
    vocab,
    stride_row,
    n_chunks,
    BLOCK: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
    CAP: tl.constexpr,
    CAP_SUB: tl.constexpr,
    CAP_LEVELS: tl.constexpr,
    CAP_FINAL: tl.constexpr,
):
    """`_chunk_filter_body` with the radix select for chunks past CAP (`RADIX`)."""
    _chunk_filter_body(
        logits_ptr, temp_ptr, cand_ptr, gather_ptr, vocab, stride_row, n_chunks, BLOCK, KC, SUB, LEVELS, FINAL, CAP,
        CAP_SUB, CAP_LEVELS, CAP_FINAL, True
    )  # fmt: skip


@triton.jit
def _gather(keys, hit, n, slots, CAP: tl.constexpr):
    """[CAP] the n `keys` where `hit` is 1, in their order (a prefix sum of `hit` places them in `slots`), then the
    smallest key."""
    tl.store(slots + tl.cumsum(hit, axis=0) - 1, keys, mask=hit != 0)
    tl.debug_barrier()  # the other threads' stores, before every thread reads all slots
    c = tl.arange(0, CAP)
    return tl.load(slots + c, mask=c < n, other=_INT64_MIN)


@triton.jit
def _best_of_rows(keys, ROWS: tl.constexpr, SUB: tl.constexpr, KC: tl.constexpr):
    """The KC largest of each row of SUB keys (`keys` flat [ROWS * SUB]), flat [ROWS * KC]."""
    rows = tl.sort(tl.reshape(keys, (ROWS, SUB)), dim=1, descending=True)
    parts = tl.reshape(rows, (ROWS, SUB // KC, KC))
    first = tl.arange(0, SUB // KC)[None, :, None] == 0
    return tl.reshape(tl.max(tl.where(first, parts, _INT64_MIN), axis=1), (ROWS * KC,))


def chunk_levels(block: int, kc: int) -> tuple[int, int, int]:
    """(SUB, LEVELS, FINAL) of `_chunk_top_kernel`: rows of 4 KC keys cut to KC, at most twice, while the keys left
    are more than one row."""
    sub, levels, size = 4 * kc, 0, block
    while levels < 2 and size > sub:
        size, levels = size // sub * kc, levels + 1
    return sub, levels, size


@triton.jit
def _mix32(x):
    """The reference's 32-bit finaliser on int64 values in [0, 2^32) (products wrap mod 2^64; the mask keeps 32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


@triton.jit
def _draw_kernel(
    cand_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    step_ptr,
    out_ptr,
    n_cand,
    P: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
):
    """out[row] = the Gumbel-max draw among the row's top-k / top-p / min-p candidates (or the best one if greedy).

    top_k <= KC, so only the best KC candidates matter: cut in rows as in `_chunk_top_kernel` (SUB, LEVELS) before
    the sort of the FINAL keys left. One bitonic sort of all P candidates (8192 for KC = 128 at Flint's vocabulary)
    took 35-42 s to compile on the H200's host, the start-up's longest compile; the cut keeps the same keys."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, P)
    keys = tl.load(cand_ptr + row * n_cand + offs, mask=offs < n_cand, other=_INT64_MIN)
    _draw_row(_sorted_best(keys, P, KC, SUB, LEVELS), row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr,
              step_ptr, out_ptr, FINAL)  # fmt: skip


@triton.jit
def _sorted_best(keys, N: tl.constexpr, KC: tl.constexpr, SUB: tl.constexpr, LEVELS: tl.constexpr):
    """The N keys cut in sorted rows (`chunk_levels(N, KC)`) and sorted, descending: the best KC come first."""
    if LEVELS >= 1:
        keys = _best_of_rows(keys, N // SUB, SUB, KC)
    if LEVELS >= 2:
        keys = _best_of_rows(keys, N // SUB * KC // SUB, SUB, KC)
    return tl.sort(keys, descending=True)


@triton.jit
def _draw_row(keys, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, FINAL: tl.constexpr):
    """out[row] = the draw among the row's best keys, `keys` [FINAL] sorted descending (top_k <= KC <= FINAL)."""
    rank = tl.arange(0, FINAL)
    hi = (keys >> 32).to(tl.int32)
    vals = tl.where(hi >= 0, hi, hi ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    ids = 0x7FFFFFFF - (keys & 0x7FFFFFFF)
    first = tl.sum(tl.where(rank == 0, ids, 0))

    keep = rank < tl.load(top_k_ptr + row)
    p = tl.where(keep, tl.exp(vals - tl.max(tl.where(keep, vals, float("-inf")))), 0.0)
    probs = p / tl.sum(p)
    before = tl.cumsum(probs) - probs
    keep &= (before < tl.load(top_p_ptr + row)) | (rank == 0)
    keep &= probs >= tl.load(min_p_ptr + row) * tl.max(probs)

    s = tl.load(seed_ptr + row)
    lo, hi32 = s & _M32, (s >> 32) & _M32
    key = _mix32(lo ^ _mix32(hi32 ^ _mix32(tl.load(step_ptr + row) & _M32)))
    h = _mix32(key ^ ((ids * 0x9E3779B9) & _M32))
    h = _mix32(h ^ key)
    u = ((h.to(tl.float64) + 0.5) / 4294967296.0).to(tl.float32)
    perturbed = tl.where(keep, vals - tl.log(-tl.log(u)), float("-inf"))
    best = tl.argmax(perturbed, axis=0)
    drawn = tl.sum(tl.where(rank == best, ids, 0))
    token = tl.where(tl.load(temp_ptr + row) == 0.0, first, drawn)
    tl.store(out_ptr + row, token)


@triton.jit
def _radix_best(keys, slots, P: tl.constexpr, KC: tl.constexpr):
    """The KC largest of `keys` [P] sorted descending, through `slots` [KC] (global scratch): a radix select of the
    KC-th largest key, 8 bits a pass from the top (a 256-bin histogram of the keys that match the bits chosen so
    far), then the keys at or above it gathered and sorted. Real keys are distinct; only the padding (the smallest
    key) repeats, and fewer than KC real keys leave the rest of the KC as padding."""
    b = keys.to(tl.uint64, bitcast=True) ^ 0x8000000000000000  # the same order, unsigned; the padding is 0
    bins = tl.arange(0, 256)
    need = tl.full((), KC, tl.int32)  # keys still to find at or below the bits chosen so far
    prefix = tl.full((), 0, tl.uint64)
    known = tl.full((), 0, tl.uint64)
    # A loop, not 8 unrolled passes: one pass's code compiles in well under a second, where the sorting networks
    # of `_draw_kernel` at KC = 128 took 22 s on the H200's host (the start-up's longest compile).
    for shift in range(56, -8, -8):
        match = (b & known) == prefix
        digit = ((b >> shift) & 0xFF).to(tl.int32)
        hist = tl.histogram(digit, 256, mask=match)
        at_least = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # matching keys with a digit >= bin
        d = tl.max(tl.where(at_least >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > d, hist, 0), axis=0)
        prefix |= d.to(tl.uint64) << shift
        known |= tl.full((), 0xFF, tl.uint64) << shift
    # prefix is now the KC-th largest key; when it is the padding, fewer than KC real keys exist: take them all.
    hit = ((b > prefix) | ((b == prefix) & (prefix != 0))).to(tl.int32)
    few = _gather(keys, hit, tl.sum(hit, axis=0), slots, KC)
    return tl.sort(few, descending=True)


@triton.jit
def _draw_radix_kernel(
    cand_ptr,
    gather_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    step_ptr,
    out_ptr,
    n_cand,
    P: tl.constexpr,
    KC: tl.constexpr,
):
    """`_draw_kernel`'s token with the best KC candidates found by a radix select (`_radix_best`) instead of sorted
    rows (`RADIX`)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, P)
    keys = tl.load(cand_ptr + row * n_cand + offs, mask=offs < n_cand, other=_INT64_MIN)
    best = _radix_best(keys, gather_ptr + row * KC, P, KC)
    _draw_row(best, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, KC)


@triton.jit
def _draw_filter_body(
    cand_ptr,
    gather_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    step_ptr,
    out_ptr,
    n_cand,
    P: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
    CAP: tl.constexpr,
    CAP_SUB: tl.constexpr,
    CAP_LEVELS: tl.constexpr,
    CAP_FINAL: tl.constexpr,
    RADIX: tl.constexpr,
):
    """`_draw_kernel`'s token, cutting only the candidates at or above a bound of the row's KC-th largest key.

    Each chunk's KC candidates are stored sorted, so the first of each is its chunk's largest key; with at least KC
    chunks the KC-th largest of those maxima bounds the row's KC-th largest from below (for Flint's 37 chunks and
    independent logits ~70 of 1184 candidates reach it). Those are gathered into this row's CAP slots of `gather`
    as in `_chunk_filter_kernel`; more than CAP (or fewer than KC chunks): the sorted rows of all P candidates, or
    with RADIX their radix select."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, P)
    keys = tl.load(cand_ptr + row * n_cand + offs, mask=offs < n_cand, other=_INT64_MIN)
    CH: tl.constexpr = P // KC
    if CH >= KC:
        lead = tl.arange(0, KC)[None, :] == 0
        heads = tl.sort(tl.max(tl.where(lead, tl.reshape(keys, (CH, KC)), _INT64_MIN), axis=1), descending=True)
        tau = tl.max(tl.where(tl.arange(0, CH) == KC - 1, heads, _INT64_MIN), axis=0)
    else:
        tau = _INT64_MIN
    hit = (keys >= tau).to(tl.int32)
    n = tl.sum(hit, axis=0)
    if n <= CAP:
        few = _gather(keys, hit, n, gather_ptr + row * CAP, CAP)
        # (Each branch's names are its own: the compiler merges a name set in both, which needs one shape.)
        few_best = _sorted_best(few, CAP, KC, CAP_SUB, CAP_LEVELS)
        _draw_row(few_best, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, CAP_FINAL)
    elif RADIX:
        radix_best = _radix_best(keys, gather_ptr + row * CAP, P, KC)
        _draw_row(radix_best, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, KC)
    else:
        all_best = _sorted_best(keys, P, KC, SUB, LEVELS)
        _draw_row(all_best, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, FINAL)


@triton.jit
def _draw_filter_kernel(
    cand_ptr,
    gather_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    step_ptr,
    out_ptr,
    n_cand,
    P: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
    CAP: tl.constexpr,
    CAP_SUB: tl.constexpr,
    CAP_LEVELS: tl.constexpr,
    CAP_FINAL: tl.constexpr,
):
    """`_draw_filter_body` with the sorted rows past CAP."""
    _draw_filter_body(
        cand_ptr, gather_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, n_cand, P, KC,
        SUB, LEVELS, FINAL, CAP, CAP_SUB, CAP_LEVELS, CAP_FINAL, False
    )  # fmt: skip


@triton.jit
def _draw_filter_radix_kernel(
    cand_ptr,
    gather_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    step_ptr,
    out_ptr,
    n_cand,
    P: tl.constexpr,
    KC: tl.constexpr,
    SUB: tl.constexpr,
    LEVELS: tl.constexpr,
    FINAL: tl.constexpr,
    CAP: tl.constexpr,
    CAP_SUB: tl.constexpr,
    CAP_LEVELS: tl.constexpr,
    CAP_FINAL: tl.constexpr,
):
    """`_draw_filter_body` with the radix select past CAP (`RADIX`)."""
    _draw_filter_body(
        cand_ptr, gather_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr, out_ptr, n_cand, P, KC,
        SUB, LEVELS, FINAL, CAP, CAP_SUB, CAP_LEVELS, CAP_FINAL, True
    )  # fmt: skip


def supported(logits: torch.Tensor, k_max: int) -> bool:
    """Whether the kernels cover this call (otherwise the reference runs)."""
    return (
        (logits.is_cuda or _INTERPRET)
        and logits.dim() == 2
        and logits.dtype == torch.float32
        and logits.stride(-1) == 1
        and 1 <= k_max <= MAX_K
        and k_max <= logits.shape[1] < 2**31
    )


def sample_top_k(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    k_max: int,
) -> torch.Tensor:
    """Same contract as `sample_top_k_ref`: one int64 token per row."""
    if not supported(logits, k_max):
        return sample_top_k_ref(logits, temperature, top_k, top_p, min_p, seeds, steps, k_max)
    n, vocab = logits.shape
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    kc = MIN_KC if k_max <= MIN_KC else MAX_K
    block = min(max(CHUNK, kc), triton.next_power_of_2(vocab))
    n_chunks = triton.cdiv(vocab, block)
    # A chunk smaller than KC (a tiny vocabulary) pads its candidates with the smallest key, which sorts last.
    kc = min(kc, block)
    cand = torch.empty((n, n_chunks, kc), dtype=torch.int64, device=logits.device)
    # Per-row parameters often arrive as strided columns of one staging tensor: the kernels index them densely.
    temperature = temperature.to(torch.float32).contiguous()
    top_k, seeds, steps = (t.to(torch.int64).contiguous() for t in (top_k, seeds, steps))
    top_p, min_p = (t.to(torch.float32).contiguous() for t in (top_p, min_p))
    sub, levels, final = chunk_levels(block, kc)
    p = triton.next_power_of_2(n_chunks * kc)
    filter_chunks = FILTER and kc == MIN_KC and block > FILTER_CAP
    filter_draw = FILTER and kc == MIN_KC and p > DRAW_CAP
    radix_chunks = RADIX and not filter_chunks
    radix_draw = RADIX and not filter_draw
    # One scratch buffer for the chunk and draw kernels that gather (filtered or radix; the draw launch starts after
    # the chunk launch is done): the chunk kernel's program (row, chunk) uses slots (row * n_chunks + chunk) * CAP
    # on (CAP: FILTER_CAP, or KC for the radix select), the draw's row row * CAP on (DRAW_CAP, or KC).
    gather = None
    if filter_chunks or filter_draw or radix_chunks or radix_draw:
        chunk_slots = n_chunks * (FILTER_CAP if filter_chunks else kc if radix_chunks else 0)
        slots = max(chunk_slots, DRAW_CAP if filter_draw else kc if radix_draw else 0)
        gather = torch.empty((n * slots,), dtype=torch.int64, device=logits.device)
    if filter_chunks:
        cap_sub, cap_levels, cap_final = chunk_levels(FILTER_CAP, kc)
        chunk_kernel = _chunk_filter_radix_kernel if RADIX else _chunk_filter_kernel
        chunk_kernel[(n, n_chunks)](
            logits, temperature, cand, gather, vocab, logits.stride(0), n_chunks, BLOCK=block, KC=kc, SUB=sub,
            LEVELS=levels, FINAL=final, CAP=FILTER_CAP, CAP_SUB=cap_sub, CAP_LEVELS=cap_levels, CAP_FINAL=cap_final,
        )  # fmt: skip
    elif radix_chunks:
        _chunk_radix_kernel[(n, n_chunks)](
            logits, temperature, cand, gather, vocab, logits.stride(0), n_chunks, BLOCK=block, KC=kc,
        )  # fmt: skip
    else:
        _chunk_top_kernel[(n, n_chunks)](
            logits, temperature, cand, vocab, logits.stride(0), n_chunks, BLOCK=block, KC=kc, SUB=sub, LEVELS=levels,
            FINAL=final,
        )  # fmt: skip
    sub, levels, final = chunk_levels(p, kc)
    if filter_draw:
        cap_sub, cap_levels, cap_final = chunk_levels(DRAW_CAP, kc)
        draw_kernel = _draw_filter_radix_kernel if RADIX else _draw_filter_kernel
        draw_kernel[(n,)](
            cand, gather, temperature, top_k, top_p, min_p, seeds, steps, out, n_chunks * kc,
            P=p, KC=kc, SUB=sub, LEVELS=levels, FINAL=final, CAP=DRAW_CAP, CAP_SUB=cap_sub, CAP_LEVELS=cap_levels,
            CAP_FINAL=cap_final,
        )  # fmt: skip
    elif radix_draw:
        _draw_radix_kernel[(n,)](
            cand, gather, temperature, top_k, top_p, min_p, seeds, steps, out, n_chunks * kc, P=p, KC=kc,
        )  # fmt: skip
    else:
        _draw_kernel[(n,)](
            cand, temperature, top_k, top_p, min_p, seeds, steps, out, n_chunks * kc,
            P=p, KC=kc, SUB=sub, LEVELS=levels, FINAL=final,
        )  # fmt: skip
    return out
