"""Attention from the packed qkv rows: Q/K RMSNorm, RoPE and the KV-cache write, then attention with sinks.

The composition of `qk_norm_rope_write_ref` and `paged_attention_ref`, as one op so that a decode kernel can do
both in one launch (`qkv_attention_triton`).
"""

from __future__ import annotations

import torch

from .attention import AttnMeta, paged_attention_ref
from .qk_norm_rope import qk_norm_rope_write_ref


def qkv_attention_ref(
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
    """qkv [T, (Hq + 2 Hkv) * D] -> attention output [T, Hq, D]; the tokens' K and V land in the cache."""
    q = qk_norm_rope_write_ref(
        qkv, q_norm, k_norm, eps, cos_sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads
    )
    return paged_attention_ref(q, k_cache, v_cache, block_tables, meta, sinks, scale, window)
