"""Triton per-head Q/K RMSNorm + NeoX RoPE + paged KV-cache write in one pass over the packed qkv rows.

The packed row is [q heads | k heads | v heads], each head `head_dim` wide, so the Hq + 2 Hkv heads of a token form
one list. Program (t, g) takes BLOCK_H consecutive heads of token t: q heads are normed, rotated and stored to the
output, k heads are normed, rotated and scattered to the cache, v heads are copied to the cache unchanged. A head
is handled as its two halves, which makes NeoX's rotate_half a swap of registers rather than a shuffle.

Rounding follows `qk_norm_rope_write_ref`: the norm rounds to the activation dtype, then `x*cos`, `rotate_half(x)*sin`
and their sum are each rounded to that dtype. The launch turns FP contraction off: with it, Triton/LLVM fused the
BF16 `x*cos + rot*sin` into one FMA and about a quarter of the outputs lost their bit-exactness on the H200.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import result_buffer
from .pdl import launch_options, pdl_entry
from .qk_norm_rope import qk_norm_rope_write_ref

# Heads per program: one GQA group of Flint (8 q heads) or its 4 k + 4 v heads.
_BLOCK_H = 8


@triton.jit
def _qk_norm_rope_write_kernel(
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_qkv,
    stride_cos,
    stride_sin,
    stride_qo_t,
    stride_qo_h,
    stride_kc_blk,
    stride_kc_off,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_off,
    stride_vc_h,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Norm (+ RoPE) BLOCK_H heads of one token; q to the output, k and v to the cache slot of that token."""
    pdl_entry(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    HALF: tl.constexpr = HEAD_DIM // 2
    c = tl.arange(0, HALF_PAD)
    c_ok = c < HALF
    is_q = heads < NUM_HEADS
    is_k = (heads >= NUM_HEADS) & (heads < NUM_HEADS + NUM_KV_HEADS)
    is_v = (heads >= NUM_HEADS + NUM_KV_HEADS) & (heads < NUM_HEADS + 2 * NUM_KV_HEADS)
    h_ok = heads < NUM_HEADS + 2 * NUM_KV_HEADS
    m = h_ok[:, None] & c_ok[None, :]

    row = qkv_ptr + t * stride_qkv + heads[:, None] * HEAD_DIM
    x1 = tl.load(row + c[None, :], mask=m, other=0.0)
    x2 = tl.load(row + HALF + c[None, :], mask=m, other=0.0)
    dt = x1.dtype
    a1 = x1.to(tl.float32)
    a2 = x2.to(tl.float32)
    var = (tl.sum(a1 * a1, axis=1) + tl.sum(a2 * a2, axis=1)) / HEAD_DIM
    rstd = tl.rsqrt(var + eps)[:, None]
    wq1 = tl.load(q_norm_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    wq2 = tl.load(q_norm_ptr + HALF + c, mask=c_ok, other=0.0).to(tl.float32)
    wk1 = tl.load(k_norm_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    wk2 = tl.load(k_norm_ptr + HALF + c, mask=c_ok, other=0.0).to(tl.float32)
    w1 = tl.where(is_q[:, None], wq1[None, :], wk1[None, :])
    w2 = tl.where(is_q[:, None], wq2[None, :], wk2[None, :])
    # rms_norm_ref's association: w * (x * rstd), one rounding to the activation dtype.
    n1 = (w1 * (a1 * rstd)).to(dt).to(tl.float32)
    n2 = (w2 * (a2 * rstd)).to(dt).to(tl.float32)
    if HAS_ROPE:
        cos1 = tl.load(cos_ptr + t * stride_cos + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        cos2 = tl.load(cos_ptr + t * stride_cos + HALF + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        sin1 = tl.load(sin_ptr + t * stride_sin + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        sin2 = tl.load(sin_ptr + t * stride_sin + HALF + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        # rotate_half(x) = [-x2, x1]; each product and the sum round to the activation dtype as in PyTorch.
        o1 = ((n1 * cos1).to(dt).to(tl.float32) + (-n2 * sin1).to(dt).to(tl.float32)).to(dt)
        o2 = ((n2 * cos2).to(dt).to(tl.float32) + (n1 * sin2).to(dt).to(tl.float32)).to(dt)
    else:
        o1 = n1.to(dt)
        o2 = n2.to(dt)
    # v heads are written as they come.
    o1 = tl.where(is_v[:, None], x1, o1)
    o2 = tl.where(is_v[:, None], x2, o2)

    q_dst = q_out_ptr + t * stride_qo_t + heads[:, None] * stride_qo_h + c[None, :]
    mq = is_q[:, None] & c_ok[None, :]
    tl.store(q_dst, o1, mask=mq)
    tl.store(q_dst + HALF, o2, mask=mq)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    # Compared as a vector: the CPU interpreter mis-types `vector & scalar-bool` masks.
    has_slot = (heads.to(tl.int64) * 0 + slot) >= 0
    blk = slot // CACHE_BLOCK
    off = slot % CACHE_BLOCK
    k_dst = k_cache_ptr + blk * stride_kc_blk + off * stride_kc_off + (heads - NUM_HEADS)[:, None] * stride_kc_h
    mk = (is_k & has_slot)[:, None] & c_ok[None, :]
    kt = k_cache_ptr.dtype.element_ty
    tl.store(k_dst + c[None, :], o1.to(kt), mask=mk)
    tl.store(k_dst + HALF + c[None, :], o2.to(kt), mask=mk)
    v_head = heads - NUM_HEADS - NUM_KV_HEADS
    v_dst = v_cache_ptr + blk * stride_vc_blk + off * stride_vc_off + v_head[:, None] * stride_vc_h
    mv = (is_v & has_slot)[:, None] & c_ok[None, :]
    vt = v_cache_ptr.dtype.element_ty
    tl.store(v_dst + c[None, :], o1.to(vt), mask=mv)
    tl.store(v_dst + HALF + c[None, :], o2.to(vt), mask=mv)


def qk_norm_rope_write(
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

    Same contract as `qk_norm_rope_write_ref`. Shapes the kernel does not cover (odd head_dim, cos/sin in another
    dtype than qkv, a cache whose last dimension is strided) run the reference instead.
    """
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    dt = qkv.dtype
    supported = (
        d % 2 == 0
        and qkv.shape[-1] == (num_heads + 2 * num_kv_heads) * d
        and qkv.stride(-1) == 1
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
        and k_cache.shape[1] == v_cache.shape[1]
        and (cos_sin is None or (cos_sin[0].dtype == dt and cos_sin[1].dtype == dt))
        and (cos_sin is None or (cos_sin[0].stride(-1) == 1 and cos_sin[1].stride(-1) == 1))
    )
    if not supported:
        return qk_norm_rope_write_ref(
            qkv, q_norm, k_norm, eps, cos_sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads, out
        )
    q = result_buffer(out, (t, num_heads, d), dt, qkv.device)
    if t == 0:
        return q
    cos, sin = cos_sin if cos_sin is not None else (qkv, qkv)  # dummies, never read without RoPE
    total = num_heads + 2 * num_kv_heads
    _qk_norm_rope_write_kernel[(t, triton.cdiv(total, _BLOCK_H))](
        qkv,
        q_norm,
        k_norm,
        cos,
        sin,
        q,
        k_cache,
        v_cache,
        slot_mapping,
        qkv.stride(0),
        cos.stride(0),
        sin.stride(0),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        eps,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=d,
        HALF_PAD=triton.next_power_of_2(d // 2),
        BLOCK_H=_BLOCK_H,
        CACHE_BLOCK=k_cache.shape[1],
        HAS_ROPE=cos_sin is not None,
        num_warps=4,
        **launch_options(qkv.device),
        # No FMA contraction: `x*cos + rot*sin` must round each product before the add, as PyTorch does.
        enable_fp_fusion=False,
    )
    return q
