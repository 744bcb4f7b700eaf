"""Per-head Q/K RMSNorm, NeoX RoPE (RoPE layers only) and the KV-cache write, fused in one step."""

from __future__ import annotations

import torch

from .attention import result_buffer, write_kv_ref
from .rmsnorm import rms_norm_ref
from .rope import apply_rope_ref


def qk_norm_rope_write_ref(
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
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """qkv [T, (Hq + 2 Hkv) * D] -> q [T, Hq, D] (into `out` if given); K (normed, rotated if RoPE) and V are written
    to the cache.

    Norm rounds to the activation dtype before RoPE, as the reference does; `cos_sin` None means no RoPE (NoPE).
    """
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = rms_norm_ref(q.reshape(t, num_heads, d), q_norm, eps)
    k = rms_norm_ref(k.reshape(t, num_kv_heads, d), k_norm, eps)
    if cos_sin is not None:
        cos, sin = cos_sin
        q = apply_rope_ref(q, cos, sin)
        k = apply_rope_ref(k, cos, sin)
    write_kv_ref(k, v.reshape(t, num_kv_heads, d), k_cache, v_cache, slot_mapping)
    if out is None:
        return q
    return result_buffer(out, tuple(q.shape), q.dtype, q.device).copy_(q)
