"""Prefill warm-up: the batch shapes it runs, and that running them leaves the KV cache untouched."""

from __future__ import annotations

import dataclasses

import torch
from flint_kernels import fast
from flint_kernels.dispatch import REFERENCE
from flint_kernels.sampling_triton import MAX_K, MIN_KC

from flint_engine.config import preset
from flint_engine.kv_cache import KVCache
from flint_engine.model import FlintModel
from flint_engine.prefill_warmup import warm_up_prefill, warmup_batches
from flint_engine.weights import random_weights

CFG = preset("tiny").replace(hidden_size=128, num_attention_heads=8, num_key_value_heads=1, head_dim=32)


def test_shapes_stay_within_the_scheduler_budgets() -> None:
    shapes = warmup_batches(2048, 64)
    assert (2048, 0) in shapes and (1024, 0) in shapes and (1025, 0) in shapes and (17, 0) in shapes
    assert (4097, 0) not in shapes and (4097, 0) in warmup_batches(8192, 256)  # the router's and MoE's 4096 switches
    assert {rows for _, rows in shapes if rows} == {1, 4, 8, 16, 32}
    # The lm_head's rows (one a sequence) meet the 17-32 and 33-64 row tiles off a multiple of 16.
    assert {rows + 1 for _, rows in shapes if rows > 8} == {17, 33}
    assert {rows for _, rows in warmup_batches(2048, 20) if rows} == {1, 4, 8, 16}  # within the sequence budget
    # Mixed steps in each of the prefill attention's row-tile sizes (a last chunk of 2, 3 or >= 5 tokens).
    assert {n for n, rows in shapes if rows} == {2, 3, 64}
    assert (9, 0) in shapes  # the expert-major MoE's narrowest ids scan (54 pairs, padded to 64)
    assert (192, 0) in shapes  # and its widest on the H200's NVFP4 decode path (1,152 pairs, padded to 2,048)
    assert all(n + rows <= 2048 for n, rows in shapes)
    small = warmup_batches(16, 1)
    assert small == [(2, 0), (3, 0), (8, 0), (9, 0), (16, 0)]  # no room for a second sequence, nothing over 16 tokens
    # Prefill-only steps of 8192 tokens beside 2048-token steps: both budgets run as prefills of their own.
    both = warmup_batches(8192, 64, (2048,))
    assert (2048, 0) in both and (8192, 0) in both and (4097, 0) in both
    assert warmup_batches(2048, 64, (8192,)) == shapes  # nothing above the largest step


def _filled_cache(model: FlintModel, blocks: int) -> KVCache:
    cache = KVCache(CFG, blocks, blocks, 16, model.dtype, model.device)
    gen = torch.Generator().manual_seed(0)
    for i in range(CFG.num_hidden_layers):
        for t in cache.layer(i)[:2]:
            t.copy_(torch.randn(t.shape, generator=gen))
    return cache


def _snapshot(cache: KVCache) -> list[torch.Tensor]:
    return [t.clone() for i in range(CFG.num_hidden_layers) for t in cache.layer(i)[:2]]


def test_warm_up_writes_nothing_reference_path() -> None:
    model = FlintModel(random_weights(CFG, torch.float32, seed=1))
    cache = _filled_cache(model, 4)
    before = _snapshot(cache)
    shapes = warm_up_prefill(model, cache, max_tokens=300, max_seqs=16)
    assert shapes == warmup_batches(300, 16) and (300, 0) in shapes
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(cache)))


def test_warm_up_writes_nothing_fused_path() -> None:
    """The fused kernels that touch the cache (QK-norm+RoPE+write, attention; Triton's interpreter on CPU in
    float32) over the scratch block, short lengths only."""
    kernels = fast.fast_kernels(REFERENCE, ("qk_norm_rope_write", "attention"))
    model = FlintModel(random_weights(CFG, torch.float32, seed=2), kernels)
    cache = _filled_cache(model, 2)
    before = _snapshot(cache)
    shapes = warm_up_prefill(model, cache, max_tokens=17, max_seqs=2)
    assert shapes == [(2, 0), (3, 0), (8, 0), (9, 0), (16, 0), (17, 0), (2, 1), (3, 1), (16, 1)]
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(cache)))


def test_warm_up_runs_the_sampling_op_for_each_top_k_variant() -> None:
    """Both top-k variants of the sampling kernels compile at start (each takes seconds to compile)."""
    calls: list[tuple[tuple[int, ...], int]] = []

    def recording(logits: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        calls.append((tuple(logits.shape), args[-1]))
        return REFERENCE.sample_top_k(logits, *args)

    model = FlintModel(
        random_weights(CFG, torch.float32, seed=3), dataclasses.replace(REFERENCE, sample_top_k=recording)
    )
    warm_up_prefill(model, _filled_cache(model, 2), max_tokens=17, max_seqs=2)
    # The last batch's logits (one prefill row, one decode row), at the largest top_k of each variant.
    assert calls == [((2, CFG.vocab_size), MIN_KC), ((2, CFG.vocab_size), min(MAX_K, CFG.vocab_size))]
