"""Triton SiLU-and-mul and sigmoid top-k router against the PyTorch references (interpreter on CPU, `gpu` on CUDA)."""

from __future__ import annotations

import pytest
import torch
from flint_kernels import gemv_triton, router_triton
from flint_kernels.activation import silu_and_mul_ref
from flint_kernels.activation_triton import silu_and_mul
from flint_kernels.router import sigmoid_topk_ref
from flint_kernels.router_triton import SMALL_BATCH, sigmoid_topk

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor the kernels allocate starts as NaN (floats) or -77 (ints), so unwritten elements show."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-77)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------ SiLU-and-mul
def _check_silu(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    x = _rand(shape, dtype, 1, device) * 3
    out = silu_and_mul(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert not out.isnan().any()
    if dtype == torch.float32:
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-6
    else:
        # silu rounded, then the product rounded: the reference's order, so (almost) every element is identical.
        assert (out == ref).float().mean().item() >= 0.999
        assert ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item() < 1e-2


@pytest.mark.parametrize("shape", [(1, 2 * 96), (7, 2 * 768), (3, 4, 2 * 1536), (2, 2 * 3000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_interp(poison: None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _check_silu(shape, dtype, "cpu")


def test_silu_and_mul_empty_interp() -> None:
    assert silu_and_mul(torch.zeros((0, 8))).shape == (0, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", [(1, 2 * 768), (64, 2 * 768), (8192, 2 * 768), (37, 2 * 5000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_and_mul_gpu(poison: None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _check_silu(shape, dtype, "cuda")


# ------------------------------------------------------------------------------------------------------ router
def _check_router(
    t: int, hidden: int, experts: int, k: int, renorm: bool, scaling: float, x_dtype: torch.dtype, device: str
) -> None:
    x = _rand((t, hidden), x_dtype, 2, device)
    w = (_rand((experts, hidden), torch.float32, 3, device) * hidden**-0.5).to(x_dtype)
    weights, ids = sigmoid_topk(x, w, k, renorm, scaling)
    ref_w, ref_ids = sigmoid_topk_ref(x, w, k, renorm, scaling)
    assert weights.shape == ref_w.shape == (t, k) and ids.shape == (t, k)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    # The logits sum in another order than the GEMM, so near-ties may swap: where ids differ, the true scores must
    # be (almost) equal.
    exact = torch.sigmoid(x.double() @ w.double().T)
    mismatch = ids != ref_ids
    if mismatch.any():
        ours = exact.gather(1, ids)[mismatch]
        theirs = exact.gather(1, ref_ids)[mismatch]
        assert (ours - theirs).abs().max().item() < 1e-5, "different experts chosen where scores are not tied"
    assert mismatch.float().mean().item() <= 0.01
    # Descending order, no duplicates.
    assert (weights[:, :-1] >= weights[:, 1:]).all()
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()
    assert (weights - ref_w).abs().max().item() < 1e-5 * max(1.0, scaling)
    if renorm:
        assert torch.allclose(weights.sum(1), torch.full((t,), scaling, device=device), rtol=1e-5)


@pytest.mark.parametrize(
    ("t", "hidden", "experts", "k", "renorm", "scaling"),
    [
        (1, 2048, 256, 6, True, 1.0),
        (5, 64, 256, 8, True, 2.5),
        (3, 96, 40, 1, False, 1.0),
        (SMALL_BATCH, 64, 256, 6, False, 1.0),
    ],
)
def test_sigmoid_topk_interp(
    poison: None,
    monkeypatch: pytest.MonkeyPatch,
    t: int,
    hidden: int,
    experts: int,
    k: int,
    renorm: bool,
    scaling: float,
) -> None:
    if hidden > 1000:
        # Flint's 256 x 2048 router with 16 experts a program: the interpreter pays per program.
        monkeypatch.setattr(router_triton, "_BLOCK_E", 16)
    _check_router(t, hidden, experts, k, renorm, scaling, torch.float32, "cpu")


def test_sigmoid_topk_ties_interp(poison: None) -> None:
    """Identical expert rows give exactly tied scores: the lower expert id comes first."""
    x = _rand((3, 64), torch.float32, 5)
    w = _rand((16, 64), torch.float32, 6) * 0.1
    w[9] = w[2]
    w[12] = w[2]
    w[5] = w[7]
    weights, ids = sigmoid_topk(x, w, 8)
    # Duplicated rows give bit-identical scores in FP64 too; expected order: score descending, then id ascending.
    scores = torch.sigmoid(x.double() @ w.double().T)
    for row in range(3):
        expect = sorted(range(16), key=lambda e, r=row: (-scores[r, e].item(), e))[:8]
        assert ids[row].tolist() == expect
    assert (weights[:, :-1] >= weights[:, 1:]).all()


@pytest.mark.parametrize("experts", [256, 1000])
@pytest.mark.parametrize("t", [1, 5, SMALL_BATCH])
def test_sigmoid_topk_one_launch_interp(poison: None, monkeypatch: pytest.MonkeyPatch, t: int, experts: int) -> None:
    """The last program's top-k covers every token (in chunks of tokens when experts are many), repeats
    bit-for-bit, and leaves the shared arrival counters zero for the next launch or graph replay."""
    if experts > 256:
        monkeypatch.setattr(router_triton, "_BLOCK_E", 8)  # the interpreter pays per program
    x = _rand((t, 256), torch.float32, 11)
    w = _rand((experts, 256), torch.float32, 12) * 256**-0.5
    first = sigmoid_topk(x, w, 6, True, 2.5)
    second = sigmoid_topk(x, w, 6, True, 2.5)
    assert not gemv_triton.counters(x.device).any()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    ref_w, ref_ids = sigmoid_topk_ref(x, w, 6, True, 2.5)
    assert torch.equal(first[1], ref_ids)
    assert (first[0] - ref_w).abs().max().item() < 1e-6


def test_sigmoid_topk_large_batch_uses_reference() -> None:
    x = _rand((SMALL_BATCH + 1, 64), torch.float32, 7)
    w = _rand((32, 64), torch.float32, 8)
    a = sigmoid_topk(x, w, 4)
    b = sigmoid_topk_ref(x, w, 4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 5, 8, 16])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("renorm", "scaling"), [(True, 1.0), (False, 2.5)])
def test_sigmoid_topk_gpu(poison: None, t: int, x_dtype: torch.dtype, renorm: bool, scaling: float) -> None:
    _check_router(t, 2048, 256, 6, renorm, scaling, x_dtype, "cuda")
