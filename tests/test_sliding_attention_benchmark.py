"""benchmarks/sliding_attention_cudnn.py: its two ways of giving cuDNN a 513-key window compute the sliding layer's
attention, checked with an FP32 stand-in for cuDNN's call (same contract: [B, H, S, D] views in, the output and the
log-sum-exp of the scaled scores out) against the reference, the sinks and merges running in the interpreter."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from flint_kernels.attention import AttnMeta, paged_attention_ref


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool) -> tuple:
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, 1).float() for x in (k, v))
    scores = q.float() @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), -math.inf)
    return (torch.softmax(scores, -1) @ vv).to(q.dtype), torch.logsumexp(scores, -1)


def test_flipped_blocks_and_band_give_the_sliding_attention(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt of 1,100 tokens: two whole 512-query blocks and a padded one (two reversed calls), the band in 128-
    and 256-query blocks (a padded last block too), with the keys as an overlapping view and copied."""
    t = 1100
    bench = benchmark_script("sliding_attention_cudnn")
    monkeypatch.setattr(bench, "_cudnn", _attend)
    monkeypatch.setattr(bench, "HQ", 8)  # two query heads a KV head, not Flint's eight: a quarter of the work
    g = torch.Generator().manual_seed(t)
    hq, hkv, d = bench.HQ, 4, bench.D
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    sinks = torch.randn(hq, generator=g)
    table = torch.arange(t, dtype=torch.int32)[None]
    meta = AttnMeta.build([0, t], [t], "cpu")
    ref = paged_attention_ref(q, k[:, None], v[:, None], table, meta, sinks, d**-0.5, bench.WINDOW)
    ways = {**bench.flipped(q, k, v, sinks, bench.WINDOW)}
    for bq in (128, 256):
        ways.update(bench.band(q, k, v, sinks, bench.WINDOW, bq))
    whole = {name: fn for name, fn in ways.items() if name.endswith("(whole)")}
    assert len(whole) == 5
    for name, fn in whole.items():
        assert torch.allclose(fn(), ref, atol=1e-5, rtol=1e-5), name
