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

A long prompt's later chunks have a cached prefix, and torch's cuDNN entry has only the top-left causal mask. Such a
chunk is two kinds of call: its own keys, causally, as a fresh prompt's; and the prefix in segments of `SEGMENT` keys
that every query sees whole (no mask). Each call returns its normalised output and log-sum-exp, and partial results
merge exactly by their log-sum-exps (`merge_ref`; `_merge_kernel` in one launch a merge, FP32 in between, the sinks
and the one rounding in the last). Segments of one fixed length keep cuDNN's plans to one a padded chunk length; a
prefix that is not a whole number of segments (a prefix-cache hit, a chunk cut short beside decodes) stays on Triton.
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
# Keys of a cached prefix a cuDNN call takes (the engine's long-prompt chunks on the H200 are 8,192 tokens, so their
# prefixes are whole segments); 0 leaves every chunk with a prefix on the Triton kernel.
SEGMENT = 8192
# What cuDNN's attention raised here, once it has: from then on the Triton kernel takes every prompt.
_failures: list[str] = []
# (q [1, Hq, n, D], k, v [1, Hkv, m, D], scale, causal) -> (output [1, Hq, n, D] in q's dtype, log-sum-exp of the
# scaled scores, FP32, Hq x n); causal is top-left (query i sees keys 0..i).
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]]


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


def cudnn_sequences(meta: AttnMeta, min_tokens: int, segment: int | None = None) -> list[int]:
    """The sequences with at least `min_tokens` queries whose prefix (the context before them) is empty or a whole
    number of `segment` keys (default `SEGMENT`; 0: empty only)."""
    segment = SEGMENT if segment is None else segment
    qs = meta.query_start
    found = []
    for s, ctx in enumerate(meta.seq_lens):
        n = qs[s + 1] - qs[s]
        prefix = ctx - n
        if n >= max(min_tokens, 1) and (prefix == 0 or (segment > 0 and prefix % segment == 0)):
            found.append(s)
    return found


def cudnn_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention without sinks on cuDNN (GQA as is: its kernels read each KV head for its query group)."""
    assert CUDNN_ATTENTION is not None
    out, lse = CUDNN_ATTENTION(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out, lse.reshape(q.shape[1], -1)


def attend_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`cudnn_attend`'s contract in FP32 PyTorch (the CPU tests' stand-in, and its reference on the GPU)."""
    group = q.shape[1] // k.shape[1]
    kh, vh = (x[0].float().repeat_interleave(group, dim=0) for x in (k, v))
    scores = torch.matmul(q[0].float(), kh.transpose(1, 2)) * scale
    if causal:
        n, m = q.shape[2], k.shape[2]
        above = torch.ones(n, m, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), vh)
    return out.to(q.dtype)[None], lse


def add_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """out [n, Hq, D] without sinks and its log-sum-exp [Hq, n] -> the output with each head's sink logit."""
    keep = torch.sigmoid(lse.float() - sinks.float()[:, None]).transpose(0, 1)
    return (out.float() * keep[..., None]).to(out.dtype)


@triton.jit(do_not_specialize=["n"])
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


def merge_ref(
    a: torch.Tensor, a_lse: torch.Tensor, b: torch.Tensor, b_lse: torch.Tensor, sinks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attentions of the same queries over disjoint keys, out [n, Hq, D] and log-sum-exp [Hq, n] each -> the one
    over all their keys (FP32), with each head's sink logit in the denominator when given; the log-sum-exp returned
    leaves the sinks out."""
    la, lb = a_lse.float(), b_lse.float()
    top = torch.maximum(la, lb)
    if sinks is not None:
        top = torch.maximum(top, sinks.float()[:, None])
    wa, wb = torch.exp(la - top), torch.exp(lb - top)
    den = wa + wb
    lse = top + torch.log(den)
    if sinks is not None:
        den = den + torch.exp(sinks.float()[:, None] - top)
    out = (a.float() * wa.t()[..., None] + b.float() * wb.t()[..., None]) / den.t()[..., None]
    return out, lse


@triton.jit(do_not_specialize=["n"])
def _merge_kernel(
    a_ptr, a_lse_ptr, b_ptr, b_lse_ptr, sinks_ptr, dst_ptr, dst_lse_ptr, n,
    stride_at, stride_ah, stride_al, stride_bt, stride_bh, stride_bl, stride_dt, stride_dh, stride_dl,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`merge_ref` for BLOCK_T rows t of head h: dst[t, h] and, without SINKS, dst_lse[h, t] (FP32)."""
    pdl_entry(PDL)
    h = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    rows = t < n
    live = rows[:, None] & (d < HEAD_DIM)[None, :]
    la = tl.load(a_lse_ptr + h * stride_al + t, mask=rows, other=0.0).to(tl.float32)
    lb = tl.load(b_lse_ptr + h * stride_bl + t, mask=rows, other=0.0).to(tl.float32)
    top = tl.maximum(la, lb)
    if SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        top = tl.maximum(top, sink)
    wa = tl.exp(la - top)
    wb = tl.exp(lb - top)
    den = wa + wb
    if SINKS:
        den += tl.exp(sink - top)
    else:
        tl.store(dst_lse_ptr + h * stride_dl + t, top + tl.log(wa + wb), mask=rows)
    a = tl.load(a_ptr + t[:, None] * stride_at + h * stride_ah + d[None, :], mask=live, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + t[:, None] * stride_bt + h * stride_bh + d[None, :], mask=live, other=0.0).to(tl.float32)
    out = (a * wa[:, None] + b * wb[:, None]) / den[:, None]
    tl.store(dst_ptr + t[:, None] * stride_dt + h * stride_dh + d[None, :], out.to(dst_ptr.dtype.element_ty), mask=live)


def merge_into(
    a: torch.Tensor,
    a_lse: torch.Tensor,
    b: torch.Tensor,
    b_lse: torch.Tensor,
    dst: torch.Tensor,
    dst_lse: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """`merge_ref` in one launch, written into dst [n, Hq, D] (any strides, D contiguous) and, without sinks, its
    log-sum-exp into dst_lse [Hq, n] (FP32). Neither may be an input: on the H200 the threads of a program that hold
    copies of a row's log-sum-exp load it at different times, so a store in place can reach one before its load
    (measured: a chunk after three segments merged in place was off by 0.2)."""
    n, hq, d = a.shape
    if n == 0:
        return dst
    assert (sinks is None) == (dst_lse is not None)
    outputs = {x.data_ptr() for x in (dst, dst_lse) if x is not None}
    assert not outputs & {x.data_ptr() for x in (a, a_lse, b, b_lse)}, "merge_into writes in place"
    for x in (a, b, dst, a_lse, b_lse) + (() if dst_lse is None else (dst_lse,)):
        assert x.stride(-1) == 1
    lse_out = dst_lse if dst_lse is not None else a_lse  # not written with sinks
    block_t = 16
    _merge_kernel[(triton.cdiv(n, block_t), hq)](
        a, a_lse, b, b_lse, sinks if sinks is not None else a_lse, dst, lse_out, n,
        a.stride(0), a.stride(1), a_lse.stride(0), b.stride(0), b.stride(1), b_lse.stride(0),
        dst.stride(0), dst.stride(1), lse_out.stride(0),
        HEAD_DIM=d, BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(d), SINKS=sinks is not None, num_warps=4,
        **launch_options(dst.device),
    )  # fmt: skip
    return dst


def compile_merges(heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
    """Launch each variant of the prefix merge once (the warm-up's), as a chunk after two or more segments makes
    them: cuDNN's parts into an FP32 state, an FP32 state and a part into the other state, and either with the
    sinks into the output."""
    part = torch.zeros((3, heads, head_dim), dtype=dtype, device=device)
    # Log-sum-exps with their rows padded, as the engine's are (strides multiples of 16 pick the same variant).
    lse, lse_a, lse_b = (torch.zeros((heads, PAD), dtype=torch.float32, device=device)[:, :3] for _ in "abc")
    state, other = (part.float(), lse_a), (part.float(), lse_b)
    sinks = torch.zeros(heads, dtype=torch.float32, device=device)
    merge_into(part, lse, part, lse, *state)
    merge_into(*state, part, lse, *other)
    for a, a_lse in ((part, lse), state):
        merge_into(a, a_lse, part, lse, torch.empty_like(part), sinks=sinks)


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
    prefix: int = 0,
    segment: int | None = None,
) -> torch.Tensor:
    """q [n, Hq, D]: one sequence's queries at positions [prefix, prefix + n) of its cache (the prefix a whole number
    of `segment` keys, default `SEGMENT`) -> output [n, Hq, D], written into `dst` when given (by Triton launches;
    without it by `add_sinks` / `merge_ref`)."""
    n = q.shape[0]
    rows = math.ceil(n / pad) * pad
    k, v = (gather_kv(c, block_row, prefix, prefix + n, checked=False) for c in (k_cache, v_cache))
    qp = _pad_rows(q, rows).transpose(0, 1).unsqueeze(0)
    out, lse = attend(qp, *(_pad_rows(x, rows).transpose(0, 1).unsqueeze(0) for x in (k, v)), scale, True)
    out, lse = out[0].transpose(0, 1)[:n], lse[:, :n]
    if prefix == 0:
        return add_sinks(out, lse, sinks) if dst is None else add_sinks_into(out, lse, sinks, dst)
    segment = SEGMENT if segment is None else segment
    if segment <= 0 or prefix % segment:
        raise ValueError(f"a prefix of {prefix} keys is not a whole number of {segment}-key segments")
    # The prefix a segment at a time, every query seeing each whole; merged in FP32 from the second segment on, into
    # two states in turn (`merge_into` cannot write in place).
    part: tuple[torch.Tensor, torch.Tensor] | None = None
    states: list[tuple[torch.Tensor, torch.Tensor]] = []
    for start in range(0, prefix, segment):
        ks, vs = (gather_kv(c, block_row, start, start + segment, checked=False) for c in (k_cache, v_cache))
        o, lo = attend(qp, ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0), scale, False)
        o, lo = o[0].transpose(0, 1)[:n], lo[:, :n]
        if part is None:
            part = (o, lo)
        elif dst is None:
            part = merge_ref(*part, o, lo)
        else:
            free = [st for st in states if st is not part]
            if not free:
                # The log-sum-exp's rows padded as cuDNN's are, so its stride stays a multiple of PAD.
                lse_rows = torch.empty((lo.shape[0], rows), dtype=torch.float32, device=o.device)
                states.append((torch.empty(o.shape, dtype=torch.float32, device=o.device), lse_rows[:, :n]))
                free = states[-1:]
            state = free[0]
            merge_into(*part, o, lo, *state)
            part = state
    assert part is not None
    if dst is None:
        return merge_ref(*part, out, lse, sinks)[0].to(q.dtype)
    return merge_into(*part, out, lse, dst, sinks=sinks)
