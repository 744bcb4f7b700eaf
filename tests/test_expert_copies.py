"""`expert_copies`: a long NVFP4 prefill's expert copies begun ahead of the MoE (the experimental `experts_ahead` op).

On CPU the interpreter makes the copies at once, so these tests check the bookkeeping and the results: the MoE takes
exactly the copies begun for its experts, gives the same output as copies made in the call, and never uses copies of
other experts. The side stream runs only on CUDA (the `gpu` test)."""

from __future__ import annotations

import pytest
import torch
from flint_kernels import expert_copies, fast
from flint_kernels import moe_triton as mt
from flint_kernels.configs import MoEPaths
from flint_kernels.dispatch import REFERENCE
from flint_kernels.linear import NVFP4Weight
from flint_kernels.moe import moe_ref
from kernel_checks import rel_err
from test_fast_path import CFG

from flint_engine.model import FlintModel
from flint_engine.weights import random_weights

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
GROUPED = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)


def _experts(e: int, h: int, i: int, seed: int) -> tuple[NVFP4Weight, NVFP4Weight]:
    g = torch.Generator().manual_seed(seed)

    def one(n: int, k: int, segments: tuple[int, ...]) -> NVFP4Weight:
        q = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
        s = torch.randint(0x30, 0x40, (e, n, k // 16), generator=g, dtype=torch.uint8)
        gs = (torch.rand(e, len(segments), generator=g) + 0.5) / (4 * k**0.5)  # outputs of order 1
        return NVFP4Weight(q.to(DEVICE), s.to(DEVICE), gs.to(DEVICE), segments)

    return one(2 * i, h, (i, i)), one(h, i, (h,))


def _routing(t: int, e: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    return torch.rand(t, k, generator=g).to(DEVICE), ids.to(DEVICE)


@pytest.fixture(autouse=True)
def nothing_in_flight() -> None:
    """Each test starts and ends with no copies in flight (they are per device, module-wide)."""
    expert_copies._ahead.clear()
    yield
    expert_copies._ahead.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_moe_takes_the_copies_begun_for_its_experts(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    e, h, i, k, t = 8, 128, 64, 2, 12
    w13, w2 = _experts(e, h, i, seed=1)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    tw, ids = _routing(t, e - 2, k, seed=3)
    made = []
    dequantized = mt._dequantized
    monkeypatch.setattr(mt, "_dequantized", lambda w, d, out=None: made.append(w) or dequantized(w, d, out))
    args = (x, tw, ids, w13, w2)
    limits = {"decode_max_tokens": 0, "dequant_min_tokens": t}
    in_call = mt.fused_moe(*args, config=GROUPED, **limits)
    assert made == [w13, w2]
    assert expert_copies.start(t, w13, w2, dtype, **limits)
    assert expert_copies.in_flight(DEVICE) and made[2:] == [w13, w2]
    ahead = mt.fused_moe(*args, config=GROUPED, **limits)
    assert len(made) == 4 and not expert_copies.in_flight(DEVICE)  # taken, not made again
    assert torch.equal(ahead, in_call)
    tol = 1e-5 if dtype == torch.float32 else 1e-3
    assert rel_err(ahead, moe_ref(*args)) < tol


def test_copies_begin_only_where_the_moe_runs_from_copies() -> None:
    e, h, i, t = 8, 128, 64, 12
    w13, w2 = _experts(e, h, i, seed=4)
    assert not expert_copies.start(t, w13, w2, torch.float32, decode_max_tokens=0, dequant_min_tokens=t + 1)
    assert not expert_copies.start(t, w13, w2, torch.float32, decode_max_tokens=t, dequant_min_tokens=1)
    dense13 = torch.randn(e, 2 * i, h, device=DEVICE)
    assert not expert_copies.start(t, dense13, w2, torch.float32, decode_max_tokens=0, dequant_min_tokens=1)
    assert not expert_copies.in_flight(DEVICE)
    assert expert_copies.start(t, w13, w2, torch.float32, decode_max_tokens=0, dequant_min_tokens=t)


def test_copies_of_other_experts_are_never_taken() -> None:
    e, h, i, t = 8, 128, 64, 12
    w13, w2 = _experts(e, h, i, seed=5)
    o13, o2 = _experts(e, h, i, seed=6)
    assert expert_copies.start(t, w13, w2, torch.float32, decode_max_tokens=0, dequant_min_tokens=t)
    assert expert_copies.take(o13, o2, torch.float32, DEVICE) is None
    assert not expert_copies.in_flight(DEVICE)  # dropped, so they cannot be taken later either
    assert expert_copies.start(t, w13, w2, torch.float32, decode_max_tokens=0, dequant_min_tokens=t)
    assert expert_copies.take(w13, w2, torch.float16, DEVICE) is None  # another dtype
    assert expert_copies.start(t, w13, w2, torch.float32, decode_max_tokens=0, dequant_min_tokens=t)
    got = expert_copies.take(w13, w2, torch.float32, DEVICE)
    assert got is not None and torch.equal(got[0].data, w13.dequantize(torch.float32))
    assert torch.equal(got[1].global_scale, w2.global_scale)


def test_experts_ahead_in_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op at each MoE layer's start with the MoE on copies from 8 tokens: every MoE layer takes the copies begun
    for it, and the logits equal those of the same table without the op."""
    monkeypatch.setattr(mt, "paths_config", lambda nvfp4, device=None: MoEPaths(2, 2, dequant_min_tokens=8))
    taken = []
    take = expert_copies.take
    monkeypatch.setattr(expert_copies, "take", lambda *a: taken.append(take(*a)) or taken[-1])
    w = random_weights(CFG, torch.float32, seed=9, nvfp4_linears=True)
    seqs = [list(range(5, 14))]
    without = FlintModel(w, fast.fast_kernels(REFERENCE, fast.OPS)).forward_sequences(seqs)
    assert taken and all(t is None for t in taken)
    taken.clear()
    ahead = FlintModel(w, fast.fast_kernels(REFERENCE, (*fast.OPS, "experts_ahead"))).forward_sequences(seqs)
    moe_layers = sum(1 for layer in w.layers if hasattr(layer.mlp, "router"))
    assert len(taken) == moe_layers and all(t is not None for t in taken)
    assert all(torch.equal(a, b) for a, b in zip(ahead, without, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_copies_on_the_side_stream_gpu() -> None:
    """On CUDA the copies are written on the side stream and the MoE waits for them: the same output as copies made
    in the call, with the compute stream busy before the start (a large matmul queued ahead)."""
    e, h, i, t = 64, 1024, 512, 256
    w13, w2 = _experts(e, h, i, seed=7)
    x = torch.randn(t, h, device=DEVICE).bfloat16()
    tw, ids = _routing(t, e, 6, seed=8)
    limits = {"decode_max_tokens": 0, "dequant_min_tokens": t}
    in_call = mt.fused_moe(x, tw, ids, w13, w2, **limits)
    busy = torch.randn(8192, 8192, device=DEVICE)
    for _ in range(3):
        busy = busy @ busy / 8192
        assert expert_copies.start(t, w13, w2, torch.bfloat16, **limits)
        assert torch.equal(mt.fused_moe(x, tw, ids, w13, w2, **limits), in_call)
    torch.cuda.synchronize()
