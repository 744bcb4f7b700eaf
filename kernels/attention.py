"""Attention with learned sinks over a paged KV cache: the PyTorch reference (prefill, decode and mixed batches).

Cache layout (both pools, one tensor per layer):
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot s = block * block_size + offset; a token's K/V live at slot `slot_mapping[t]` (-1: not written).
Block tables: int32 [num_seqs, max_blocks]; entry b maps the sequence's positions [b*bs, (b+1)*bs) to a block.
Sliding-window layers use their own pool whose table entries outside the window may be -1 (freed blocks).

Scores and softmax are FP32; each query head's sink is one extra logit in the softmax denominator only; the
probabilities are rounded to the value dtype before P @ V, as the reference does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass
class AttnMeta:
    """Where each sequence's queries are and how long its context is, on the host and on the device.

    Sequence s owns q rows [query_start[s], query_start[s+1]); its context after this step is seq_lens[s]
    tokens, the new ones last. Device copies are int32 for kernels (and CUDA graphs, which replay without
    reading the host lists).
    """

    query_start: list[int]
    seq_lens: list[int]
    query_start_t: torch.Tensor
    seq_lens_t: torch.Tensor
    max_query_len: int
    max_seq_len: int
    # The sequence count decode attention plans its launch for (table entry, split count), if not the batch's own:
    # a decode graph's batch bucket, so an eager step takes the splits its graph would (`ModelRunner`).
    plan_seqs: int = 0

    @classmethod
    def build(cls, query_start: list[int], seq_lens: list[int], device: torch.device | str) -> AttnMeta:
        q = torch.tensor(query_start, dtype=torch.int32, device=device)
        s = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        max_q = max((b - a for a, b in itertools.pairwise(query_start)), default=0)
        return cls(query_start, seq_lens, q, s, max_q, max(seq_lens, default=0))


def result_buffer(
    out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """`out` checked against the result's shape, dtype and device (and a unit last stride), or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device or out.stride(-1) != 1:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device} (last stride {out.stride(-1)}), the result is"
            f" {tuple(shape)} {dtype} on {device}"
        )
    return out


def write_kv_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter k, v [T, Hkv, D] into the paged cache at `slot_mapping` [T] (entries < 0 are skipped)."""
    nb, bs = k_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(nb * bs, *k_cache.shape[2:])[slots] = k[valid].to(k_cache.dtype)
    v_cache.view(nb * bs, *v_cache.shape[2:])[slots] = v[valid].to(v_cache.dtype)


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int, checked: bool = True
) -> torch.Tensor:
    """Positions [start, end) of one sequence from a paged cache -> [end - start, Hkv, D]. `checked` raises on a
    freed block, which reads the table on the host (a sync; the fast path's callers know their blocks are live)."""
    bs = cache.shape[1]
    b0, b1 = start // bs, (end - 1) // bs
    blocks = block_table[b0 : b1 + 1].long()
    if checked and bool((blocks < 0).any()):
        raise RuntimeError(f"KV positions [{start}, {end}) touch a freed block")
    kv = cache[blocks].reshape(-1, *cache.shape[2:])
    return kv[start - b0 * bs : end - b0 * bs]


def paged_attention_ref(
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
    """q [T, Hq, D] for the new tokens of each sequence -> output [T, Hq, D] in q's dtype (into `out` if given).

    `window` counts keys including the current one (Flint: 513); None is full causal attention.
    """
    query_start, seq_lens = meta.query_start, meta.seq_lens
    hq = q.shape[1]
    hkv = k_cache.shape[2]
    group = hq // hkv
    out = result_buffer(out, tuple(q.shape), q.dtype, q.device)
    sink_logit = sinks.to(torch.float32).view(hq, 1, 1)
    for s in range(len(seq_lens)):
        q0, q1 = query_start[s], query_start[s + 1]
        n = q1 - q0
        if n == 0:
            continue
        ctx = seq_lens[s]
        first_q = ctx - n
        kv_start = 0 if window is None else max(0, first_q - (window - 1))
        k = gather_kv(k_cache, block_tables[s], kv_start, ctx)
        v = gather_kv(v_cache, block_tables[s], kv_start, ctx)
        qh = q[q0:q1].transpose(0, 1)  # [Hq, n, D]
        kh = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, m, D]
        vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
        scores = torch.matmul(qh.to(torch.float32), kh.to(torch.float32).transpose(1, 2)) * scale
        q_pos = torch.arange(first_q, ctx, device=q.device)[:, None]
        k_pos = torch.arange(kv_start, ctx, device=q.device)[None, :]
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        logits = torch.cat((scores, sink_logit.expand(hq, n, 1)), dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :-1].to(vh.dtype)
        out[q0:q1] = torch.matmul(probs, vh).transpose(0, 1)
    return out
