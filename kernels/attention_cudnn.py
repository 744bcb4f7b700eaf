"""Full-attention prefill of fresh prompts on torch's cuDNN attention, each head's sink added from its log-sum-exp.

A prompt with no cached prefix attends to its own keys only, causally: the shape cuDNN's fused attention is built
for. On the H200 it beats our Triton prefill kernel from ~4K tokens (a full layer at 8K: 1.16 against 1.56 ms,
`benchmarks/prefill_attention_sdpa.py`); the tuning table's `attention.prefill` field `cudnn_min_tokens` says from
which prompt length it runs (0, the default: never).

cuDNN has no sinks but returns each row's log-sum-exp L of the scaled scores. A sink s is one more logit in the
softmax's denominator only, so the output with it is out * e^L / (e^L + e^s) = out * sigmoid(L - s): one pass after
the kernel, in FP32, then one more rounding of the output (within a BF16 ulp of the Triton kernel's single one).

Prompts are padded at the end with zero rows to a multiple of `PAD`: under the causal mask no real query sees a
padding key, so the result is unchanged, and cuDNN, which builds an execution plan per shape, meets fewer shapes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from .attention import AttnMeta

CUDNN_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
PAD = 256
# (q, k, v [1, H, n, D], scale) -> (output [1, Hq, n, D] in q's dtype, log-sum-exp of the scaled scores, FP32, Hq x n)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def covers(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether cuDNN's attention takes these inputs here (measured on sm_90; head dims cuDNN's kernels have)."""
    if CUDNN_ATTENTION is None or not q.is_cuda or not torch.backends.cudnn.is_available():
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


def _prompt_kv(cache: torch.Tensor, block_row: torch.Tensor, n: int, rows: int) -> torch.Tensor:
    """The first n positions of one sequence's paged keys or values, as [rows >= n, Hkv, D] with zero rows after."""
    bs = cache.shape[1]
    blocks = block_row[: math.ceil(n / bs)].long()
    kv = cache[blocks].reshape(-1, *cache.shape[2:])
    if rows == n:
        return kv[:n]
    padded = kv.new_zeros((rows, *cache.shape[2:]))
    padded[:n] = kv[:n]
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
) -> torch.Tensor:
    """q [n, Hq, D]: one fresh prompt's queries, its keys the cache's first n positions -> output [n, Hq, D]."""
    n = q.shape[0]
    rows = math.ceil(n / pad) * pad
    if rows != n:
        padded = q.new_zeros((rows, *q.shape[1:]))
        padded[:n] = q
        q = padded
    k, v = (_prompt_kv(c, block_row, n, rows) for c in (k_cache, v_cache))
    out, lse = attend(*(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)), scale)
    return add_sinks(out[0].transpose(0, 1)[:n], lse[:, :n], sinks)
