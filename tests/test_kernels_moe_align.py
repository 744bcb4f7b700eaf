"""Grouping MoE pairs by expert in Triton (`flint_kernels.moe_align_triton`) against `align_ref`.

Integer kernels: the interpreter runs them exactly on CPU. The block table must equal the reference's; within an
expert the pairs may come in another order (atomics), so the order is checked per expert as a set, and on the GPU
the grouped MoE must give the same output bit for bit as with the reference's stable order, run after run.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from flint_kernels import moe_triton as mt
from flint_kernels.moe import moe_ref
from flint_kernels.moe_align import align_ref, max_blocks
from flint_kernels.moe_align_triton import align
from kernel_checks import rel_err

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
pytestmark = pytest.mark.skipif(
    not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)


def random_ids(t: int, e: int, k: int, seed: int, skew: bool = False) -> torch.Tensor:
    """[t, k] distinct experts per token; with `skew` most tokens pick from the first few experts."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    scores = torch.rand(t, e, generator=g, device=DEVICE)
    if skew:
        scores[:, : max(k, 3)] += 1.0
    return torch.topk(scores, k, dim=-1).indices


def check_against_reference(ids: torch.Tensor, e: int, block_m: int) -> None:
    order, meta, n_blocks = align(ids, e, block_m)
    ref_order, ref_meta, ref_blocks = align_ref(ids, e, block_m)
    assert n_blocks == ref_blocks == meta.shape[0] == max_blocks(ids.numel(), e, block_m)
    assert meta.dtype == torch.int32 and order.dtype == torch.int64
    assert torch.equal(meta, ref_meta)
    # Each expert's rows hold the same pairs as the stable order, maybe permuted.
    flat = ids.reshape(-1).cpu()
    counts = torch.bincount(flat, minlength=e).tolist()
    start = 0
    for ex, n in enumerate(counts):
        got, want = order[start : start + n].cpu(), ref_order[start : start + n].cpu()
        assert sorted(got.tolist()) == sorted(want.tolist()), ex
        assert bool((flat[got] == ex).all())
        start += n
    assert start == flat.numel()


@pytest.mark.parametrize(
    ("t", "e", "k", "block_m"),
    [(1, 16, 4, 16), (37, 16, 4, 16), (300, 256, 6, 64), (700, 256, 6, 32), (64, 10, 3, 16), (5, 1, 1, 16)],
)
def test_align_matches_the_reference(t: int, e: int, k: int, block_m: int) -> None:
    """Ragged tails, more pairs than one program's 1024, experts without pairs, a non-power-of-two and a single
    expert."""
    check_against_reference(random_ids(t, e, k, seed=t + e), e, block_m)


def test_align_with_experts_holding_many_blocks() -> None:
    """Most pairs on three experts: those experts span many blocks each, the rest few or none."""
    ids = random_ids(500, 64, 4, seed=3, skew=True)
    check_against_reference(ids, 64, 16)
    assert int(torch.bincount(ids.reshape(-1)).max()) > 10 * 16


def test_align_of_int32_ids_and_no_pairs() -> None:
    ids = random_ids(33, 16, 2, seed=4)
    check_against_reference(ids.to(torch.int32), 16, 16)
    order, meta, n_blocks = align(ids[:0], 16, 16)
    assert order.numel() == 0 and n_blocks == 0 and meta.shape == (0, 3)


def test_blocks_cover_every_pair_once() -> None:
    ids = random_ids(37, 16, 4, seed=50)
    order, meta, n_blocks = align(ids, 16, 16)
    rows = []
    for ex, row0, n in meta.cpu().tolist():
        rows += [(ex, int(order[r])) for r in range(row0, row0 + n)]
    flat = ids.reshape(-1).cpu()
    assert sorted(p for _, p in rows) == list(range(flat.numel()))
    assert all(flat[p] == ex for ex, p in rows)
    assert n_blocks == meta.shape[0] and int((meta[:, 2] > 0).sum()) <= n_blocks


def test_grouped_moe_equals_the_stable_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped MoE's output does not depend on the order within an expert: the same bits with `align_ref`."""
    g = torch.Generator(device=DEVICE).manual_seed(7)
    t, e, h, i, k = 40, 8, 64, 32, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    w13 = torch.randn(e, 2 * i, h, generator=g, device=DEVICE) / math.sqrt(h)
    w2 = torch.randn(e, h, i, generator=g, device=DEVICE) / math.sqrt(i)
    scores = torch.rand(t, e, generator=g, device=DEVICE)
    tw, ids = torch.topk(scores, k, dim=-1)
    tw = tw / tw.sum(-1, keepdim=True)
    config = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=config)
    monkeypatch.setattr(mt, "align", align_ref)
    stable = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=config)
    assert torch.equal(out, stable)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [65, 512, 8192])
def test_gpu_align_and_grouped_moe_at_flint_shapes(monkeypatch: pytest.MonkeyPatch, t: int) -> None:
    """256 experts, top-6, BF16 at Flint's expert shapes: the block table equals the reference's, and the grouped
    MoE is bit-equal to the stable order's and to itself on a second run."""
    ids = random_ids(t, 256, 6, seed=t)
    for block_m in (16, 64, 128):
        check_against_reference(ids, 256, block_m)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(t, 2048, generator=g, device=DEVICE).bfloat16()
    w13 = (torch.randn(256, 1024, 2048, generator=g, device=DEVICE) / math.sqrt(2048)).bfloat16()
    w2 = (torch.randn(256, 2048, 512, generator=g, device=DEVICE) / math.sqrt(512)).bfloat16()
    tw = torch.rand(t, 6, generator=g, device=DEVICE)
    tw = tw / tw.sum(-1, keepdim=True)
    first = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0)
    again = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0)
    monkeypatch.setattr(mt, "align", align_ref)
    stable = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0)
    assert torch.equal(first, again) and torch.equal(first, stable)
