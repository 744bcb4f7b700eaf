"""Triton paged attention with learned sinks and optional sliding window: decode (split-KV) and varlen prefill.

Same contract as `attention.paged_attention_ref` (see its module docstring for the cache layout and `AttnMeta`).

Both kernels fold the GROUP query heads that share a KV head into the rows of one tile, so every K/V tile read
from the paged cache serves all of them (GQA 8: one read instead of eight):

* decode (every sequence has at most one query): one launch, grid (num_seqs, num_kv_heads, NUM_SPLITS); the query
  tile is the [GROUP padded to 16, D] block of one token. Long contexts are split along the keys; each split
  stores an unnormalised FP32 partial (acc, running max, running sum) per query head, then arrives on the
  (sequence, KV head)'s counter in `split_k_triton.counters` (CTA barrier, acq_rel increment, as `split_k_arrive`).
  The split that arrives last merges the NUM_SPLITS partials in split order (a few splits' [GROUP, D] tiles at a
  time), adds the sink (so it enters exactly once), stores the rows and resets the counter to zero for the next
  launch or graph replay: results do not depend on scheduling. A sequence without a query returns before
  arriving, in every split. With one split the kernel starts its running max at the sink and finishes the rows
  itself. `AttentionDecodeConfig.combine_launch` asks for the merge as a launch of its own (`_decode_merge_kernel`,
  one program a sequence and KV head running the same `_merge_splits`, so the same bits) without a counter, as do
  batches with more (sequence, KV head) pairs than counter slots.
  With QKV (`qkv_attention_triton`) the kernel reads the packed qkv rows before the Q/K norm: each program
  normalises and rotates its GROUP query heads in registers, and the split holding the newest position writes that
  token's normed, rotated key and its value to the cache (then a CTA barrier, so its own key loads see them; no
  other split reads that position), which removes the separate Q/K-norm + RoPE + cache-write launch.
* prefill / mixed: grid (query tiles over all sequences, num_kv_heads); a tile is BLOCK_Q consecutive queries of
  one sequence times GROUP heads (row r = query r // G_PAD, head r % G_PAD). Key tiles outside the union of the
  rows' causal/sliding ranges are never visited, and whole tiles every row sees entirely run without masks. A
  program finds its sequence by binary search over the device `query_start_t`, so the grid only depends on the
  token and sequence counts. Folding the heads (rather than a grid over query heads) cuts K/V traffic by GROUP and
  still fills a 128-row MMA tile with 16 queries, which suits chunked prefill and mixed batches with short chunks.

Numerics: scores and softmax in FP32 with exp2 (log2(e) folded into the scale), the sink as the initial running
max with running sum 1 (= exp(sink - sink)), probabilities rounded to the value dtype before P @ V, FP32
accumulation, one rounding of the output. As in every flash-style kernel the rounded probabilities are the
unnormalised exp(s - running max) and the division comes last, where the reference rounds the normalised ones:
identical in FP32, within a BF16 ulp per probability in BF16. Masked loads use other=0 and block-table entries
are only read for positions inside the live range, so -1 entries and garbage in unused slots never reach the math.

CUDA graphs: no host synchronisation, no data-dependent grid. NUM_SPLITS is a function of host ints only
(`meta.max_seq_len` bucketed to a power of two, the sequence count and the KV-head count); each split derives its
key range from the device `seq_lens_t`, so results are right for any context length whatever the split count.
The arrival counters are created zeroed on first use (make the first call outside capture) and left zero by every
launch; split decode launches must not run concurrently on several streams (they share the counters, as split-K).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import attention_cudnn, tuning
from .attention import AttnMeta, paged_attention_ref, result_buffer
from .configs import AttentionDecodeConfig, AttentionPrefillConfig
from .l2_prefetch import prefetch_lines
from .pdl import launch_options, pdl_entry
from .split_k_triton import COUNTER_SLOTS, counters

LOG2E = math.log2(math.e)
_LOG2E = tl.constexpr(LOG2E)
# Finite "minus infinity" for a split's running max before it has seen a key: exp2(NEG - NEG) stays 1, not NaN.
_NEG_BIG = tl.constexpr(-1.0e30)
# Launch parameters come from `decode_config` / `prefill_config` per call: the portable defaults of configs.py, or
# the device's tuning table (benchmarks/kernels_attention.py --sweep passes candidates as `config`).


def _stages(n: int | None) -> dict:
    return {} if n is None else {"num_stages": n}


# Key tiles' masks (`_attend_keys`' MASKED): none, every condition, or only the one an edge tile needs.
_NO_MASK = tl.constexpr(0)
_FULL_MASK = tl.constexpr(1)
_WINDOW_EDGE = tl.constexpr(2)
_CAUSAL_EDGE = tl.constexpr(3)


@triton.jit
def _tile_rows(bt_row_ptr, pos, kv_lo, kv_hi, CACHE_BLOCK: tl.constexpr, MASKED: tl.constexpr):
    """(cache block int64, offset in it int64, live) of key positions `pos`; without MASKED every position is live.
    _CAUSAL_EDGE: the tile is inside every row's window, so only positions past the sequence's end are dead."""
    if MASKED == _CAUSAL_EDGE:
        live = pos < kv_hi
        blk = tl.load(bt_row_ptr + pos // CACHE_BLOCK, mask=live, other=0)
    elif MASKED:
        live = (pos >= kv_lo) & (pos < kv_hi)
        # Only live positions read the block table: entries behind a sliding window may be -1.
        blk = tl.load(bt_row_ptr + pos // CACHE_BLOCK, mask=live, other=-1)
        live = live & (blk >= 0)
    else:
        blk = tl.load(bt_row_ptr + pos // CACHE_BLOCK)
        live = pos >= 0
    return blk.to(tl.int64), (pos % CACHE_BLOCK).to(tl.int64), live


@triton.jit
def _scores_step(m_i, l_i, q, k, pos, live, q_pos, qk_scale, WINDOW: tl.constexpr, DOT_PREC: tl.constexpr,
                 MASKED: tl.constexpr):  # fmt: skip
    """One key tile's online-softmax step before P @ V: (p, alpha, new running max, new running sum)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    if MASKED == _CAUSAL_EDGE:  # every key inside every row's window: only the causal bound (it excludes dead keys)
        s = tl.where(pos[None, :] <= q_pos[:, None], s, float("-inf"))
    elif MASKED == _WINDOW_EDGE:  # every key at or before every row's position: only the window and dead keys
        allowed = live[None, :]
        if WINDOW > 0:
            allowed = allowed & (pos[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(allowed, s, float("-inf"))
    elif MASKED:
        allowed = live[None, :] & (pos[None, :] <= q_pos[:, None])
        if WINDOW > 0:
            allowed = allowed & (pos[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _attend_keys(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_ptr,
    v_ptr,
    bt_row_ptr,
    k_head_off,
    v_head_off,
    stride_kb,
    stride_ko,
    stride_vb,
    stride_vo,
    kv_lo,
    kv_hi,
    tile_begin,
    tile_end,
    qk_scale,
    WINDOW: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online-softmax update of (acc, m_i, l_i) over keys [tile_begin, tile_end) ∩ [kv_lo, kv_hi), causal per row.

    MASKED (_NO_MASK, _FULL_MASK, _WINDOW_EDGE, _CAUSAL_EDGE): _NO_MASK is for whole tiles every row may see entirely
    (live keys, inside every row's causal and window range), _WINDOW_EDGE for tiles at or before every row's position
    (the window and dead keys decide), _CAUSAL_EDGE for tiles inside every row's window (the causal bound decides);
    _FULL_MASK checks everything.
    """
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = (d < HEAD_DIM)[None, :]
    for start in range(tile_begin, tile_end, BLOCK_N):
        pos = start + offs_n
        blk64, within, live = _tile_rows(bt_row_ptr, pos, kv_lo, kv_hi, CACHE_BLOCK, MASKED)
        kv_mask = live[:, None] & d_ok if MASKED else d_ok
        k_rows = blk64 * stride_kb + within * stride_ko + k_head_off
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        p, alpha, m_i, l_i = _scores_step(m_i, l_i, q, k, pos, live, q_pos, qk_scale, WINDOW, DOT_PREC, MASKED)
        v_rows = blk64 * stride_vb + within * stride_vo + v_head_off
        v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        # The reference rounds the probabilities to the value dtype before P @ V.
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_i, l_i


@triton.jit
def _prefetch_tiles(k_ptr, v_ptr, bt_row_ptr, k_head_off, v_head_off, stride_kb, stride_ko, stride_vb, stride_vo, kv_lo,
                    kv_hi, begin, end, CACHE_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                    LINES: tl.constexpr, LINE_ELEMS: tl.constexpr, TILES: tl.constexpr):  # fmt: skip
    """L2 prefetch of the keys and values of the first TILES key tiles of [begin, end): one request per 128-byte
    line (LINE_ELEMS elements; LINES a row, padded to a power of two) of each live row, which is contiguous."""
    line = tl.arange(0, LINES) * LINE_ELEMS
    line = tl.where(line < HEAD_DIM, line, 0)
    for t in tl.static_range(TILES):
        pos = begin + t * BLOCK_N + tl.arange(0, BLOCK_N)
        blk64, within, live = _tile_rows(bt_row_ptr, pos, kv_lo, kv_hi, CACHE_BLOCK, _FULL_MASK)
        live = live & (pos < end)
        k_rows = tl.where(live, blk64 * stride_kb + within * stride_ko + k_head_off, 0)
        v_rows = tl.where(live, blk64 * stride_vb + within * stride_vo + v_head_off, 0)
        # Dead rows point at the cache's first line: harmless, and no branch per row.
        prefetch_lines(k_ptr + k_rows[:, None] + line[None, :])
        prefetch_lines(v_ptr + v_rows[:, None] + line[None, :])


@triton.jit
def _mul_rn(a, b, PTX: tl.constexpr):
    """a * b in FP32 that the compiler may not contract into an FMA with a following add (PTX mul.rn; the CPU
    interpreter, which never contracts, multiplies plainly). The separate Q/K-norm kernel turns contraction off for
    its whole launch instead, which the attention loop here should keep."""
    if PTX:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True,
                                         pack=1)  # fmt: skip
    else:
        return a * b


@triton.jit
def _norm_rope_heads(
    row_ptr,
    heads,
    row_ok,
    w_ptr,
    cos_row,
    sin_row,
    eps,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    PTX_MUL: tl.constexpr,
):
    """Heads [R] of one packed qkv row: per-head RMSNorm (+ NeoX RoPE), in `qk_norm_rope_write_ref`'s roundings.

    rotate_half pairs element d with d ± HEAD_DIM/2, so each head is also loaded at the partner offsets (the same
    L1 lines) instead of shuffling registers: the partner's norm uses the same rstd and its own weight.
    """
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    m = row_ok[:, None] & d_ok[None, :]
    base = row_ptr + heads[:, None] * HEAD_DIM
    x = tl.load(base + d[None, :], mask=m, other=0.0)
    dt = x.dtype
    a = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(a * a, axis=1) / HEAD_DIM + eps)[:, None]
    w = tl.load(w_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    # rms_norm_ref's association: w * (x * rstd), one rounding to the activation dtype.
    n = (w * (a * rstd)).to(dt).to(tl.float32)
    if HAS_ROPE:
        pd = (d + HALF) % HEAD_DIM
        ap = tl.load(base + pd[None, :], mask=m, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + pd, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        npart = (wp * (ap * rstd)).to(dt).to(tl.float32)
        rot = tl.where((d < HALF)[None, :], -npart, npart)
        cos = tl.load(cos_row + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        sin = tl.load(sin_row + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        # Each product and the sum round to the activation dtype, as PyTorch's x*cos + rotate_half(x)*sin does; the
        # products are mul.rn so that no FMA contraction merges one into the sum (see `_mul_rn`).
        c = _mul_rn(n, cos, PTX_MUL).to(dt).to(tl.float32)
        return (c + _mul_rn(rot, sin, PTX_MUL).to(dt).to(tl.float32)).to(dt)
    return n.to(dt)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    qs_ptr,
    sl_ptr,
    sink_ptr,
    out_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    cnt_ptr,
    qn_ptr,
    kn_ptr,
    cos_ptr,
    sin_ptr,
    slot_ptr,
    stride_cos,
    stride_sin,
    eps,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_vb,
    stride_vo,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    G_PAD: tl.constexpr,
    G_P2: tl.constexpr,
    WINDOW: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FUSED_COMBINE: tl.constexpr,
    SPLIT_STEP: tl.constexpr,
    DOT_PREC: tl.constexpr,
    QKV: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    PTX_MUL: tl.constexpr,
    PREFETCH: tl.constexpr,
    LINES: tl.constexpr,
    LINE_ELEMS: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (sequence, KV head, key split): all GROUP query heads of the sequence's single query against its keys.

    With several splits and FUSED_COMBINE the last split to arrive also merges them (see the module docstring);
    without FUSED_COMBINE the partials are left for `_decode_merge_kernel`. With QKV, q_ptr is the packed qkv
    rows before the Q/K norm and RoPE: each program normalises (and rotates) its query heads itself, and the split
    that holds the newest position writes the token's K and V to the cache before it reads its keys.

    With PREFETCH > 0 the split's first PREFETCH key tiles (keys and values) are requested into L2 before waiting
    for the previous grid (PDL), so their DRAM latency overlaps that kernel's tail; the loads proper come after the
    wait, as without. (A hint only: L2 is where the GPU's writes meet, so the newest position, written this step,
    is read as written.)
    """
    s_idx = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    # The batch metadata is written before the step's first kernel, so it is read before waiting for the previous
    # grid (PDL); the query and the current token's key/value (the previous kernel's) only after.
    q0 = tl.load(qs_ptr + s_idx)
    n_q = tl.load(qs_ptr + s_idx + 1) - q0
    ctx = tl.load(sl_ptr + s_idx)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    kv_hi = ctx
    if WINDOW > 0:
        kv_lo = tl.maximum(ctx - WINDOW, 0)
    else:
        kv_lo = ctx * 0
    first_tile = (kv_lo // BLOCK_N) * BLOCK_N
    n_tiles = tl.cdiv(kv_hi - first_tile, BLOCK_N)
    per_split = tl.cdiv(n_tiles, NUM_SPLITS)
    begin = first_tile + split * per_split * BLOCK_N
    end = tl.minimum(begin + per_split * BLOCK_N, kv_hi)
    bt_row = bt_ptr + s_idx.to(tl.int64) * stride_bt
    if PREFETCH > 0:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton compiles them apart)
        if n_q > 0:
            _prefetch_tiles(k_ptr, v_ptr, bt_row, kvh * stride_kh, kvh * stride_vh, stride_kb, stride_ko, stride_vb,
                            stride_vo, kv_lo, kv_hi, begin, end, CACHE_BLOCK, HEAD_DIM, BLOCK_N, LINES, LINE_ELEMS,
                            PREFETCH)  # fmt: skip
    pdl_entry(PDL)
    if n_q == 0:
        return
    rows = tl.arange(0, G_PAD)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    q_row = q_ptr + q0.to(tl.int64) * stride_qt
    q_pos = tl.zeros([G_PAD], dtype=tl.int32) + (ctx - 1)
    if QKV:
        NUM_KV_HEADS: tl.constexpr = NUM_HEADS // GROUP
        cos_row = cos_ptr + q0.to(tl.int64) * stride_cos
        sin_row = sin_ptr + q0.to(tl.int64) * stride_sin
        q = _norm_rope_heads(q_row, heads, row_ok, qn_ptr, cos_row, sin_row, eps, HEAD_DIM, BLOCK_D, HAS_ROPE, PTX_MUL)
        # The newest key and value: written by the split whose range holds position ctx - 1, before its reads.
        one = tl.arange(0, 1)
        kv_row = tl.zeros([1], dtype=tl.int32) + kvh
        k_new = _norm_rope_heads(
            q_row, NUM_HEADS + kv_row, one < 1, kn_ptr, cos_row, sin_row, eps, HEAD_DIM, BLOCK_D, HAS_ROPE, PTX_MUL
        )
        v_new = tl.load(q_row + (NUM_HEADS + NUM_KV_HEADS + kv_row)[:, None] * HEAD_DIM + d[None, :],
                        mask=d_ok[None, :], other=0.0)  # fmt: skip
        slot = tl.load(slot_ptr + q0).to(tl.int64)
        # A vector compare: the CPU interpreter mis-types `vector & scalar-bool` masks.
        newest = tl.zeros([1], dtype=tl.int32) + (ctx - 1)
        owns = (newest.to(tl.int64) * 0 + slot >= 0) & (newest >= begin) & (newest < end)
        blk = slot // CACHE_BLOCK
        off = slot % CACHE_BLOCK
        w_mask = owns[:, None] & d_ok[None, :]
        k_dst = k_ptr + blk * stride_kb + off * stride_ko + kvh * stride_kh
        tl.store(k_dst + d[None, :], k_new.to(k_ptr.dtype.element_ty), mask=w_mask)
        v_dst = v_ptr + blk * stride_vb + off * stride_vo + kvh * stride_vh
        tl.store(v_dst + d[None, :], v_new.to(v_ptr.dtype.element_ty), mask=w_mask)
        # Makes the stores visible to this CTA's threads before they load the newest key's tile.
        tl.debug_barrier()
    else:
        q = tl.load(q_row + heads[:, None] * stride_qh + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    acc = tl.zeros([G_PAD, BLOCK_D], dtype=tl.float32)
    if NUM_SPLITS == 1:
        # The sink is the initial running max with running sum exp(sink - sink) = 1.
        m_i = tl.load(sink_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * _LOG2E
        l_i = tl.full([G_PAD], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([G_PAD], _NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc, m_i, l_i = _attend_keys(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        k_ptr,
        v_ptr,
        bt_row,
        kvh * stride_kh,
        kvh * stride_vh,
        stride_kb,
        stride_ko,
        stride_vb,
        stride_vo,
        kv_lo,
        kv_hi,
        begin,
        end,
        qk_scale,
        WINDOW,
        CACHE_BLOCK,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        DOT_PREC,
        _FULL_MASK,
    )
    if NUM_SPLITS == 1:
        o = acc / l_i[:, None]
        o_ptr = out_ptr + q0.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        # Every split writes its partial, also an empty one (m = NEG, l = 0, acc = 0), so the combine reads no garbage.
        part = (s_idx * NUM_HEADS + heads).to(tl.int64) * NUM_SPLITS + split
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=row_ok[:, None])
        if FUSED_COMBINE:
            # As split_k_triton.split_k_arrive: all of this CTA's stores are issued before the release increment.
            slot = s_idx * (NUM_HEADS // GROUP) + kvh
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                _merge_splits(
                    part_acc_ptr, part_m_ptr, part_l_ptr, sink_ptr, out_ptr, s_idx, kvh, q0, stride_ot, stride_oh,
                    NUM_HEADS, GROUP, G_P2, HEAD_DIM, BLOCK_D, NUM_SPLITS, SPLIT_STEP,
                )  # fmt: skip
                tl.atomic_xchg(cnt_ptr + slot, 0)


@triton.jit
def _merge_splits(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    sink_ptr,
    out_ptr,
    s_idx,
    kvh,
    q0,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    G_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_STEP: tl.constexpr,
):
    """Merge the NUM_SPLITS partials of the GROUP heads of one (sequence, KV head), add the sink once, store.

    Maxima and sums of all splits at once ([G_P2, NUM_SPLITS] is small), the accumulators SPLIT_STEP splits at a
    time in split order (never [G_P2, NUM_SPLITS, BLOCK_D] in registers; the order does not depend on which split
    or launch merges). A step's loads are independent, so they are in flight
    together (a loop over single splits, maxima first, left the merge bound by L2 latency). Other splits'
    partials must be read past L1 (".cg"): only L2 is coherent with their stores. Rows are GROUP padded to a power
    of two, not to the 16 the decode tile needs for tl.dot; padding rows come out as 0 (sink 0, l 0), unstored.
    """
    rows = tl.arange(0, G_P2)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    part0 = (s_idx * NUM_HEADS + heads).to(tl.int64)[:, None] * NUM_SPLITS
    sp = tl.arange(0, NUM_SPLITS)[None, :]
    ml_mask = row_ok[:, None]
    m = tl.load(part_m_ptr + part0 + sp, mask=ml_mask, other=0.0, cache_modifier=".cg")
    ls = tl.load(part_l_ptr + part0 + sp, mask=ml_mask, other=0.0, cache_modifier=".cg")
    sink = tl.load(sink_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * _LOG2E
    m_all = tl.maximum(tl.max(m, axis=1), sink)
    denom = tl.sum(ls * tl.exp2(m - m_all[:, None]), axis=1) + tl.exp2(sink - m_all)

    step = tl.arange(0, SPLIT_STEP)[None, :]
    d = tl.arange(0, BLOCK_D)
    num = tl.zeros([G_P2, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, SPLIT_STEP):
        part = part0 + s0 + step
        # The same weights as above (same inputs), reloaded rather than picked out of w by a reduction.
        w = tl.exp2(tl.load(part_m_ptr + part, mask=ml_mask, other=0.0, cache_modifier=".cg") - m_all[:, None])
        acc_ptrs = part_acc_ptr + part[:, :, None] * BLOCK_D + d[None, None, :]
        acc = tl.load(acc_ptrs, mask=ml_mask[:, :, None], other=0.0, cache_modifier=".cg")
        num += tl.sum(acc * w[:, :, None], axis=1)
    o = num / denom[:, None]
    o_ptr = out_ptr + q0.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (d < HEAD_DIM)[None, :])


@triton.jit
def _decode_merge_kernel(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    qs_ptr,
    sink_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    G_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_STEP: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (sequence, KV head): `_merge_splits` of the partials the decode launch before left, where the splits end
    on their stores instead of a counter (`AttentionDecodeConfig.combine_launch`, or a batch with more (sequence, KV
    head) pairs than counters): the same bits as the last split's merge."""
    s_idx = tl.program_id(0)
    kvh = tl.program_id(1)
    # The batch metadata is written before the step's first kernel: read before waiting for the decode grid.
    q0 = tl.load(qs_ptr + s_idx)
    n_q = tl.load(qs_ptr + s_idx + 1) - q0
    pdl_entry(PDL)
    if n_q == 0:
        return
    _merge_splits(
        part_acc_ptr, part_m_ptr, part_l_ptr, sink_ptr, out_ptr, s_idx, kvh, q0, stride_ot, stride_oh, NUM_HEADS,
        GROUP, G_P2, HEAD_DIM, BLOCK_D, NUM_SPLITS, SPLIT_STEP,
    )  # fmt: skip


# The sequence count and the block-table width change with every mixed batch: specialising on them (== 1, multiple
# of 16) would compile new variants while serving, for index arithmetic that gains nothing from it.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    qs_ptr,
    sl_ptr,
    sink_ptr,
    out_ptr,
    num_seqs,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_vb,
    stride_vo,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    WINDOW: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
    LONGEST_FIRST: tl.constexpr,
):
    """One tile of BLOCK_Q queries x GROUP heads of one sequence against its causal (and windowed) keys."""
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    if LONGEST_FIRST:
        pid = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid = tl.program_id(0)
    kvh = tl.program_id(1)
    # Sequence s owns programs [qs[s] // BLOCK_Q + s, qs[s+1] // BLOCK_Q + s + 1): enough for its query tiles,
    # and the bound is monotonic, so the owner is the last s whose first program is <= pid.
    lo = pid * 0
    hi = pid * 0 + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        go_right = tl.load(qs_ptr + mid) // BLOCK_Q + mid <= pid
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
    s_idx = lo - 1
    q0 = tl.load(qs_ptr + s_idx)
    n_q = tl.load(qs_ptr + s_idx + 1) - q0
    tile = pid - (q0 // BLOCK_Q + s_idx)
    if tile * BLOCK_Q >= n_q:
        return
    ctx = tl.load(sl_ptr + s_idx)
    first_q = ctx - n_q

    rows = tl.arange(0, BLOCK_M)
    qi = tile * BLOCK_Q + rows // G_PAD
    hh = rows % G_PAD
    row_ok = (qi < n_q) & (hh < GROUP)
    heads = kvh * GROUP + hh
    q_pos = first_q + qi
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    tok = (q0 + qi).to(tl.int64)
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=io_mask, other=0.0)

    kv_hi = tl.minimum(first_q + tile * BLOCK_Q + BLOCK_Q, ctx)
    if WINDOW > 0:
        kv_lo = tl.maximum(first_q + tile * BLOCK_Q - WINDOW + 1, 0)
    else:
        kv_lo = ctx * 0
    first_tile = (kv_lo // BLOCK_N) * BLOCK_N

    # Whole tiles in [full_lo, full_hi) are visible to every row of the tile: inside the last row's window and at
    # or before the first row's position. Only the tiles on either side need masks.
    first_pos = first_q + tile * BLOCK_Q
    full_hi = tl.maximum(first_tile, ((first_pos + 1) // BLOCK_N) * BLOCK_N)
    if WINDOW > 0:
        full_lo = tl.cdiv(tl.maximum(kv_hi - WINDOW, kv_lo), BLOCK_N) * BLOCK_N
    else:
        full_lo = first_tile
    full_lo = tl.minimum(tl.maximum(first_tile, full_lo), full_hi)

    m_i = tl.load(sink_ptr + heads, mask=hh < GROUP, other=0.0).to(tl.float32) * _LOG2E
    l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + s_idx.to(tl.int64) * stride_bt
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, q_pos, k_ptr, v_ptr, bt_row, kvh * stride_kh, kvh * stride_vh,
        stride_kb, stride_ko, stride_vb, stride_vo, kv_lo, kv_hi, full_lo, full_hi, qk_scale,
        WINDOW, CACHE_BLOCK, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PREC, _NO_MASK,
    )  # fmt: skip
    # Tiles below full_lo end at or before every row's position (full_lo <= full_hi <= first_pos + 1).
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, q_pos, k_ptr, v_ptr, bt_row, kvh * stride_kh, kvh * stride_vh,
        stride_kb, stride_ko, stride_vb, stride_vo, kv_lo, kv_hi, first_tile, full_lo, qk_scale,
        WINDOW, CACHE_BLOCK, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PREC, _WINDOW_EDGE,
    )  # fmt: skip
    # Tiles from full_hi start past first_pos + 1 - BLOCK_N, so a window of BLOCK_N + BLOCK_Q keys or more holds all
    # of them for every row; a narrower one needs every mask.
    HIGH: tl.constexpr = _CAUSAL_EDGE if WINDOW == 0 or WINDOW >= BLOCK_N + BLOCK_Q else _FULL_MASK
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, q_pos, k_ptr, v_ptr, bt_row, kvh * stride_kh, kvh * stride_vh,
        stride_kb, stride_ko, stride_vb, stride_vo, kv_lo, kv_hi, full_hi, kv_hi, qk_scale,
        WINDOW, CACHE_BLOCK, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PREC, HIGH,
    )  # fmt: skip
    o = acc / l_i[:, None]
    o_ptr = out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=io_mask)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # an H200, so the interpreter picks the same split counts the GPU would
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def decode_config(
    max_seq_len: int, window: int | None, num_seqs: int, device: torch.device | None = None, elem_bytes: int = 2
) -> AttentionDecodeConfig:
    """Decode launch parameters: the portable defaults (AttentionDecodeConfig's), or the device's table entry
    (op "attention.decode", shape seqs, context = max_seq_len, sliding, elem_bytes of the cache: a tile tuned
    for BF16 may not fit shared memory in FP32)."""
    return tuning.tuned(
        "attention.decode",
        AttentionDecodeConfig(),
        device,
        seqs=num_seqs,
        context=max_seq_len,
        sliding=bool(window),
        elem_bytes=elem_bytes,
    )


def prefill_config(
    tokens: int, window: int | None, device: torch.device | None = None, elem_bytes: int = 2
) -> AttentionPrefillConfig:
    """Prefill launch parameters: the defaults, or the table entry (op "attention.prefill", shape tokens, sliding,
    elem_bytes)."""
    return tuning.tuned(
        "attention.prefill",
        AttentionPrefillConfig(),
        device,
        tokens=tokens,
        sliding=bool(window),
        elem_bytes=elem_bytes,
    )


def decode_num_splits(
    max_seq_len: int,
    window: int | None,
    num_seqs: int,
    num_kv_heads: int,
    device: torch.device,
    config: AttentionDecodeConfig | None = None,
    elem_bytes: int = 2,
) -> int:
    """Key splits for a decode launch, from host ints only: enough CTAs for two waves, >= min_keys_per_split each."""
    cfg = config or decode_config(max_seq_len, window, num_seqs, device, elem_bytes)
    keys = max_seq_len if window is None else min(max_seq_len, window)
    by_len = triton.next_power_of_2(max(1, triton.cdiv(keys, cfg.min_keys_per_split)))
    by_occupancy = triton.next_power_of_2(max(1, triton.cdiv(2 * _num_sms(device), max(1, num_seqs * num_kv_heads))))
    return max(1, min(by_len, by_occupancy, cfg.max_splits))


def _dot_precision(dtype: torch.dtype) -> str:
    # FP32 inputs must not silently drop to TF32 on tensor cores: the reference scores are full FP32.
    return "ieee" if dtype == torch.float32 else "tf32"


def _supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    d = q.shape[-1]
    return (
        q.dtype == k_cache.dtype == v_cache.dtype
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and d >= 16
        and k_cache.shape[-1] == d
        and q.shape[1] % k_cache.shape[2] == 0
        and q.stride(-1) == 1
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
    )


@dataclass(frozen=True)
class PackedQKV:
    """What the decode kernel needs to take the packed qkv rows (`qk_norm_rope_write`'s inputs) instead of q."""

    q_norm: torch.Tensor
    k_norm: torch.Tensor
    eps: float
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None
    slot_mapping: torch.Tensor
    num_heads: int


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    meta: AttnMeta,
    sinks: torch.Tensor,
    scale: float,
    window: int | None,
    num_splits: int | None = None,
    config: AttentionDecodeConfig | None = None,
    packed: PackedQKV | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode path of `paged_attention` (each sequence has at most one query); `num_splits` overrides the heuristic,
    `config` the launch parameters (`decode_config`). With `packed`, q is the packed qkv rows [T, (Hq + 2 Hkv) D]
    and the launch also does `qk_norm_rope_write` (the caller checks `packed_supported`). The result goes into `out`
    if given."""
    hkv = k_cache.shape[2]
    d = k_cache.shape[3]
    t = q.shape[0]
    hq = packed.num_heads if packed is not None else q.shape[1]
    group = hq // hkv
    num_seqs = len(meta.seq_lens)
    plan = meta.plan_seqs or num_seqs  # what the launch is planned for (a graph's batch bucket)
    cfg = config or decode_config(meta.max_seq_len, window, plan, q.device, k_cache.element_size())
    if num_splits is None:
        num_splits = decode_num_splits(meta.max_seq_len, window, plan, hkv, q.device, cfg)
    if num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")
    out = result_buffer(out, (t, hq, d), q.dtype, q.device)
    if t == 0 or num_seqs == 0:
        return out
    block_d = triton.next_power_of_2(d)
    if packed is not None:
        cos, sin = packed.cos_sin if packed.cos_sin is not None else (q, q)  # dummies, never read without RoPE
        qkv_args = (packed.q_norm, packed.k_norm, cos, sin, packed.slot_mapping, cos.stride(0), sin.stride(0))
        eps, stride_qh = packed.eps, d
    else:
        qkv_args, eps, stride_qh = (q, q, q, q, q, 0, 0), 0.0, q.stride(1)
    # The last-arriving split merges unless the config asks for a merge launch or the batch needs more counters than
    # there are (then a second launch).
    fused = num_splits > 1 and num_seqs * hkv <= COUNTER_SLOTS and not cfg.combine_launch
    split_step = max(1, min(num_splits, cfg.merge_elems // (triton.next_power_of_2(group) * block_d)))
    cnt = counters(q.device) if fused else out
    if num_splits > 1:
        part_acc = torch.empty((num_seqs, hq, num_splits, block_d), dtype=torch.float32, device=q.device)
        part_m = torch.empty((num_seqs, hq, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # never touched with one split
    _decode_kernel[(num_seqs, hkv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        meta.query_start_t,
        meta.seq_lens_t,
        sinks,
        out,
        part_acc,
        part_m,
        part_l,
        cnt,
        *qkv_args,
        eps,
        scale * LOG2E,
        q.stride(0),
        stride_qh,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=hq,
        GROUP=group,
        G_PAD=max(16, triton.next_power_of_2(group)),
        G_P2=triton.next_power_of_2(group),
        WINDOW=window or 0,
        CACHE_BLOCK=k_cache.shape[1],
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_N=cfg.block_n,
        NUM_SPLITS=num_splits,
        FUSED_COMBINE=fused,
        SPLIT_STEP=split_step,
        DOT_PREC=_dot_precision(q.dtype),
        QKV=packed is not None,
        HAS_ROPE=packed is not None and packed.cos_sin is not None,
        PTX_MUL=q.is_cuda,
        # The interpreter has no PTX: the prefetch (a hint, no effect on results) runs on GPUs only.
        PREFETCH=cfg.prefetch if q.is_cuda else 0,
        LINES=triton.next_power_of_2(triton.cdiv(d * k_cache.element_size(), 128)),
        LINE_ELEMS=max(1, 128 // k_cache.element_size()),
        num_warps=cfg.num_warps,
        **_stages(cfg.num_stages),
        **launch_options(q.device),
    )
    if num_splits > 1 and not fused:
        _decode_merge_kernel[(num_seqs, hkv)](
            part_acc, part_m, part_l, meta.query_start_t, sinks, out, out.stride(0), out.stride(1), NUM_HEADS=hq,
            GROUP=group, G_P2=triton.next_power_of_2(group), HEAD_DIM=d, BLOCK_D=block_d, NUM_SPLITS=num_splits,
            SPLIT_STEP=split_step, num_warps=4, **launch_options(q.device),
        )  # fmt: skip
    return out


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    meta: AttnMeta,
    sinks: torch.Tensor,
    scale: float,
    window: int | None,
    block_m: int | None = None,
    config: AttentionPrefillConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill / mixed path of `paged_attention` (any query counts); `block_m` overrides the row-tile size, `config`
    the launch parameters (`prefill_config`); the result goes into `out` if given."""
    t, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    num_seqs = len(meta.seq_lens)
    out = result_buffer(out, (t, hq, d), q.dtype, q.device)
    if t == 0 or num_seqs == 0:
        return out
    cfg = config or prefill_config(t, window, q.device, k_cache.element_size())
    if window is None and cfg.cudnn_min_tokens > 0 and attention_cudnn.covers(q, k_cache, v_cache):
        long_rows = attention_cudnn.cudnn_sequences(meta, cfg.cudnn_min_tokens)
        if long_rows:
            try:
                return _prefill_with_cudnn(q, k_cache, v_cache, block_tables, meta, sinks, scale, long_rows, out)
            except RuntimeError as err:  # then every row below, on the Triton kernel
                attention_cudnn.give_up(err)
    g_pad = triton.next_power_of_2(group)
    if block_m is None:
        block_m = min(cfg.max_block_m, triton.next_power_of_2(max(1, meta.max_query_len) * g_pad))
    block_m = max(block_m, 16, g_pad)
    block_q = block_m // g_pad
    # Programs [qs[s] // BLOCK_Q + s, ...) belong to sequence s; the last sequence's bound is T // BLOCK_Q + S.
    grid = (t // block_q + num_seqs, hkv)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        meta.query_start_t,
        meta.seq_lens_t,
        sinks,
        out,
        num_seqs,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        G_PAD=g_pad,
        BLOCK_Q=block_q,
        WINDOW=window or 0,
        CACHE_BLOCK=k_cache.shape[1],
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_N=cfg.block_n,
        DOT_PREC=_dot_precision(q.dtype),
        LONGEST_FIRST=cfg.longest_first,
        num_warps=cfg.num_warps if block_m >= 128 else 4,
        **_stages(cfg.num_stages),
    )
    return out


def _prefill_with_cudnn(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    meta: AttnMeta,
    sinks: torch.Tensor,
    scale: float,
    on_cudnn: list[int],
    out: torch.Tensor,
    attend: attention_cudnn.Attend = attention_cudnn.cudnn_attend,
) -> torch.Tensor:
    """A full layer's prefill with the sequences `on_cudnn` (`attention_cudnn.cudnn_sequences`) on cuDNN and the
    other sequences' rows, gathered, on the Triton kernel."""
    qs = meta.query_start
    for s in on_cudnn:
        span = slice(qs[s], qs[s + 1])
        prefix = meta.seq_lens[s] - (qs[s + 1] - qs[s])
        attention_cudnn.prompt_attention(
            q[span], k_cache, v_cache, block_tables[s], sinks, scale, attend, dst=out[span], prefix=prefix
        )
    done = set(on_cudnn)
    rest = [s for s in range(len(meta.seq_lens)) if s not in done and qs[s + 1] > qs[s]]
    if not rest:
        return out
    starts = [0]
    for s in rest:
        starts.append(starts[-1] + qs[s + 1] - qs[s])
    rows = torch.cat([torch.arange(qs[s], qs[s + 1]) for s in rest]).to(q.device, non_blocking=True)
    sub = AttnMeta.build(starts, [meta.seq_lens[s] for s in rest], q.device)
    cfg = dataclasses.replace(prefill_config(starts[-1], None, q.device, k_cache.element_size()), cudnn_min_tokens=0)
    rest_tables = block_tables[torch.tensor(rest, device=q.device)]
    out[rows] = paged_attention_prefill(q[rows], k_cache, v_cache, rest_tables, sub, sinks, scale, None, config=cfg)
    return out


def cudnn_prompt_lengths(max_tokens: int, device: torch.device, elem_bytes: int = 2) -> list[int]:
    """The padded lengths of the fresh prompts of up to `max_tokens` tokens that full layers give cuDNN here."""
    pad = attention_cudnn.PAD
    top = math.ceil(max_tokens / pad) * pad
    # The step's token count picks the table entry: a prompt of n tokens rides in steps of n to max_tokens.
    least = [prefill_config(t, None, device, elem_bytes).cudnn_min_tokens for t in range(pad, top + 1, pad)]
    least = [m for m in least if m > 0]
    if not least or min(least) > max_tokens:
        return []
    return list(range(math.ceil(min(least) / pad) * pad, top + 1, pad))


def prepare_cudnn_plans(
    max_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> list[int]:
    """Run cuDNN's attention once at each padded chunk length full layers may give it (`cudnn_prompt_lengths`):
    causally over its own keys and over a prefix segment (`attention_cudnn.SEGMENT`). Its first call at a new shape
    builds a plan, ~50-60 ms on the H200. Also compiles the merge of a prefix's parts. Returns the lengths run."""
    probe = torch.empty((1, heads, head_dim), dtype=dtype, device=device)
    cache = torch.empty((1, 1, kv_heads, head_dim), dtype=dtype, device=device)
    if not attention_cudnn.covers(probe, cache, cache):
        return []
    lengths = cudnn_prompt_lengths(max_tokens, device, cache.element_size())
    segment = attention_cudnn.SEGMENT
    segment_kv = torch.zeros((1, kv_heads, segment, head_dim), dtype=dtype, device=device) if segment > 0 else None
    try:
        for n in lengths:
            q = torch.zeros((1, heads, n, head_dim), dtype=dtype, device=device)
            kv = torch.zeros((1, kv_heads, n, head_dim), dtype=dtype, device=device)
            attention_cudnn.cudnn_attend(q, kv, kv, head_dim**-0.5)
            if segment_kv is not None:
                attention_cudnn.cudnn_attend(q, segment_kv, segment_kv, head_dim**-0.5, False)
    except RuntimeError as err:
        attention_cudnn.give_up(err)
        return []
    if lengths and segment_kv is not None:
        attention_cudnn.compile_merges(heads, head_dim, dtype, device)
    return lengths


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    meta: AttnMeta,
    sinks: torch.Tensor,
    scale: float,
    window: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] for the new tokens of each sequence -> output [T, Hq, D] in q's dtype (into `out` if given); as
    `paged_attention_ref`.

    Decode batches (one query per sequence) take the split-KV decode kernel, anything else the varlen prefill
    kernel. Mixed dtypes, head_dim < 16 or a strided last dimension run the reference.
    """
    if not _supported(q, k_cache, v_cache):
        return paged_attention_ref(q, k_cache, v_cache, block_tables, meta, sinks, scale, window, out)
    if meta.max_query_len == 1 and q.shape[0] == len(meta.seq_lens):
        return paged_attention_decode(q, k_cache, v_cache, block_tables, meta, sinks, scale, window, out=out)
    return paged_attention_prefill(q, k_cache, v_cache, block_tables, meta, sinks, scale, window, out=out)
