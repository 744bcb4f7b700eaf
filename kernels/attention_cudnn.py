"""Full-attention prefill of fresh prompts on torch's cuDNN attention, each head's sink added from its log-sum-exp.

A prompt with no cached prefix attends to its own keys only, causally: the shape cuDNN's fused attention is built
for. On the H200 it beats our Triton prefill kernel from ~4K tokens (a full layer at 8K: 1.16 against 1.56 ms,
`benchmarks/prefill_attention_sdpa.py`); the tuning table's `attention.prefill` field `cudnn_min_tokens` says from
which prompt length it runs (0, the default: never).

cuDNN has no sinks but returns each row's log-sum-exp L of the scaled scores. A sink s is one more logit in the
softmax's denominator only, so the output with it is out * e^L / (e^L + e^s) = out * sigmoid(L - s): one Triton
launch after cuDNN's (`_add_sinks_kernel`, `add_sinks` its reference) reads cuDNN's output, scales it in FP32 and
writes the rows straight into the batch's output, rounded once more (within a BF16 ulp of the Triton kernel's one).

`FLINT_CUDNN_ATTENTION=0` keeps every prompt on the Triton kernel.

Prompts are padded at the end with zero rows to a multiple of `PAD`: under the causal mask no real query sees a
padding key, so the result is unchanged, and cuDNN, which builds an execution plan per shape, meets fewer shapes.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .attention import AttnMeta, gather_kv
from .pdl import launch_options, pdl_entry

log = logging.getLogger(__name__)

CUDNN_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
PAD = 256
# What cuDNN's attention raised here, once it has: from then on the Triton kernel takes every prompt.
_failures: list[str] = []
# (q, k, v [1, H, n, D], scale) -> (output [1, Hq, n, D] in q's dtype, log-sum-exp of the scaled scores, FP32, Hq x n)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def covers(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether cuDNN's attention takes these inputs here (measured on sm_90; head dims cuDNN's kernels have)."""
    if _failures or CUDNN_ATTENTION is None or not q.is_cuda or not torch.backends.cudnn.is_available():
        return False
    if os.environ.get("FLINT_CUDNN_ATTENTION", "1") == "0":  # read per call, so one process can compare both
        return False
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    d = q.shape[-1]
    return (
        torch.backends.cudnn.enabled
        and _capability(index) >= (9, 0)
        and q.dtype == k_cache.dtype == v_cache.dtype
        and q.dtype in (torch.float16, torch.bfloat16)
        and d % 8 == 0
        and d <= 128
        and q.shape[1] % k_cache.shape[2] == 0
    )


def give_up(err: Exception) -> None:
    """cuDNN's attention failed here (a GPU, shape or cuDNN version it does not take): use it no more."""
    log.warning("cuDNN attention failed (%s); full-layer prompts run on the Triton kernel from now on", err)
    _failures.append(str(err))


def fresh_prompts(meta: AttnMeta, min_tokens: int) -> list[int]:
    """The sequences whose queries are their whole context (no cached prefix), at least `min_tokens` of them."""
    qs = meta.query_start
    return [s for s, ctx in enumerate(meta.seq_lens) if ctx >= max(min_tokens, 1) and qs[s + 1] - qs[s] == ctx]


def cudnn_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention without sinks on cuDNN (GQA as is: its kernels read each KV head for its query group)."""
    assert CUDNN_ATTENTION is not None
    out, lse = CUDNN_ATTENTION(q, k, v, None, True, 0.0, True, False, scale=scale)[:2]
    return out, lse.reshape(q.shape[1], -1)


def attend_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`cudnn_attend`'s contract in FP32 PyTorch (the CPU tests' stand-in, and its reference on the GPU)."""
    group = q.shape[1] // k.shape[1]
    kh, vh = (x[0].float().repeat_interleave(group, dim=0) for x in (k, v))
    scores = torch.matmul(q[0].float(), kh.transpose(1, 2)) * scale
    n = q.shape[2]
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), vh)
    return out.to(q.dtype)[None], lse


def add_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """out [n, Hq, D] without sinks and its log-sum-exp [Hq, n] -> the output with each head's sink logit."""
    keep = torch.sigmoid(lse.float() - sinks.float()[:, None]).transpose(0, 1)
    return (out.float() * keep[..., None]).to(out.dtype)


@triton.jit
def _add_sinks_kernel(
    o_ptr, lse_ptr, sinks_ptr, dst_ptr, n, stride_oh, stride_ot, stride_lh, stride_dt, stride_dh,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """dst[t, h] = round(FP32(o[h, t]) * sigmoid(lse[h, t] - sinks[h])) for BLOCK_T rows t of head h."""
    pdl_entry(PDL)
    h = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    live = (t < n)[:, None] & (d < HEAD_DIM)[None, :]
    lse = tl.load(lse_ptr + h * stride_lh + t, mask=t < n, other=0.0).to(tl.float32)
    keep = tl.sigmoid(lse - tl.load(sinks_ptr + h).to(tl.float32))
    o = tl.load(o_ptr + h * stride_oh + t[:, None] * stride_ot + d[None, :], mask=live, other=0.0).to(tl.float32)
    dst = dst_ptr + t[:, None] * stride_dt + h * stride_dh + d[None, :]
    tl.store(dst, (o * keep[:, None]).to(dst_ptr.dtype.element_ty), mask=live)


def add_sinks_into(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """`add_sinks` of out [n, Hq, D] (any strides, D contiguous) written into dst [n, Hq, D] in one launch."""
    n, hq, d = out.shape
    if n == 0:
        return dst
    assert out.stride(-1) == 1 and dst.stride(-1) == 1 and lse.stride(-1) == 1
    block_t = 16
    _add_sinks_kernel[(triton.cdiv(n, block_t), hq)](
        out, lse, sinks, dst, n, out.stride(1), out.stride(0), lse.stride(0), dst.stride(0), dst.stride(1),
        HEAD_DIM=d, BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(d), num_warps=4, **launch_options(dst.device),
    )  # fmt: skip
    return dst


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [n, ...] with zero rows after it up to `rows` (x itself when n == rows)."""
    if x.shape[0] == rows:
        return x
    padded = x.new_zeros((rows, *x.shape[1:]))
    padded[: x.shape[0]] = x
    return padded


def prompt_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_row: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    attend: Attend = cudnn_attend,
    pad: int = PAD,
    dst: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [n, Hq, D]: one fresh prompt's queries, its keys the cache's first n positions -> output [n, Hq, D], written
    into `dst` when given (by the Triton launch; without it by `add_sinks`)."""
    n = q.shape[0]
    rows = math.ceil(n / pad) * pad
    k, v = (gather_kv(c, block_row, 0, n, checked=False) for c in (k_cache, v_cache))
    out, lse = attend(*(_pad_rows(x, rows).transpose(0, 1).unsqueeze(0) for x in (q, k, v)), scale)
    out, lse = out[0].transpose(0, 1)[:n], lse[:, :n]
    return add_sinks(out, lse, sinks) if dst is None else add_sinks_into(out, lse, sinks, dst)
