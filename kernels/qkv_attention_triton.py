"""Triton `qkv_attention`: decode batches in one launch, everything else as the two fused kernels it composes.

In a decode batch every program of the split-KV decode kernel (`attention_triton`) normalises and rotates its own
GROUP query heads from the packed qkv row, and the split that holds the newest position writes the token's K and V
to the cache before reading its keys: the separate Q/K norm + RoPE + cache-write launch (one per layer) goes away.
Prefill and mixed batches, and inputs the decode kernel does not cover, run `qk_norm_rope_write` then
`paged_attention` (each falling back to its reference where it must).
"""

from __future__ import annotations

import torch

from .attention import AttnMeta
from .attention_triton import PackedQKV, paged_attention, paged_attention_decode
from .qk_norm_rope_triton import qk_norm_rope_write


def _decode_covers(
    qkv: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    meta: AttnMeta,
) -> bool:
    d = k_cache.shape[-1]
    dt = qkv.dtype
    return (
        meta.max_query_len == 1
        and qkv.shape[0] == len(meta.seq_lens)
        and dt == k_cache.dtype == v_cache.dtype
        and dt in (torch.float16, torch.bfloat16, torch.float32)
        and d >= 16
        and d % 2 == 0
        and num_heads % num_kv_heads == 0
        and k_cache.shape[2] == num_kv_heads
        and qkv.shape[-1] == (num_heads + 2 * num_kv_heads) * d
        and qkv.stride(-1) == 1
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
        and (cos_sin is None or all(c.dtype == dt and c.stride(-1) == 1 for c in cos_sin))
    )


def qkv_attention(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    eps: float,
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    block_tables: torch.Tensor,
    meta: AttnMeta,
    sinks: torch.Tensor,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """qkv [T, (Hq + 2 Hkv) * D] -> attention output [T, Hq, D]; same contract as `qkv_attention_ref`."""
    if _decode_covers(qkv, cos_sin, k_cache, v_cache, num_heads, num_kv_heads, meta):
        packed = PackedQKV(q_norm, k_norm, eps, cos_sin, slot_mapping, num_heads)
        return paged_attention_decode(qkv, k_cache, v_cache, block_tables, meta, sinks, scale, window, packed=packed)
    q = qk_norm_rope_write(qkv, q_norm, k_norm, eps, cos_sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads)
    return paged_attention(q, k_cache, v_cache, block_tables, meta, sinks, scale, window)
