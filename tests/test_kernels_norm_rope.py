"""Triton RMSNorm, add+RMSNorm and QK-norm+RoPE+KV-write against the PyTorch references.

On a CPU-only machine these run in Triton's interpreter (float32 with tolerances, float16 for the rounding order);
the `gpu` tests repeat them in bfloat16 on CUDA and require >= 99.9% of elements bit-identical to the reference.
"""

from __future__ import annotations

import pytest
import torch
from flint_kernels.qk_norm_rope import qk_norm_rope_write_ref
from flint_kernels.qk_norm_rope_triton import qk_norm_rope_write
from flint_kernels.rmsnorm import add_rms_norm_ref, rms_norm_ref
from flint_kernels.rmsnorm_triton import add_rms_norm, rms_norm
from flint_kernels.rope import rope_cos_sin
from kernel_checks import poison_torch_empty

EPS = 1e-6
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor the kernels allocate starts as NaN (floats) or -77 (ints), so unwritten elements show."""
    poison_torch_empty(monkeypatch)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def _same_frac(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Fraction of elements with identical bits (NaN == NaN), e.g. untouched poisoned cache slots."""
    same = (out == ref) | (out.isnan() & ref.isnan())
    return same.float().mean().item()


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------------- RMSNorm
def _check_norm(shape: tuple[int, ...], dtype: torch.dtype, w_dtype: torch.dtype, device: str, min_same: float) -> None:
    h = shape[-1]
    x = _rand(shape, dtype, 1, device) * 3
    res = _rand(shape, dtype, 2, device)
    w = (_rand((h,), torch.float32, 3, device) * 0.5 + 1).to(w_dtype)
    out = rms_norm(x, w, EPS)
    ref = rms_norm_ref(x, w, EPS)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert not out.isnan().any()
    normed, new_res = add_rms_norm(x, res, w, EPS)
    normed_ref, new_res_ref = add_rms_norm_ref(x, res, w, EPS)
    assert normed.shape == normed_ref.shape and new_res.dtype == new_res_ref.dtype
    # The residual sum is one add in the activation dtype: always bit-identical.
    assert torch.equal(new_res, new_res_ref)
    assert not normed.isnan().any()
    if dtype == torch.float32:
        assert _rel_err(out, ref) < 1e-5
        assert _rel_err(normed, normed_ref) < 1e-5
    else:
        assert _same_frac(out, ref) >= min_same
        assert _same_frac(normed, normed_ref) >= min_same
        assert _rel_err(out, ref) < 1e-2 and _rel_err(normed, normed_ref) < 1e-2


@pytest.mark.parametrize("hidden", [64, 2048])
@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_interp(poison: None, hidden: int, rows: int, dtype: torch.dtype) -> None:
    _check_norm((rows, hidden), dtype, torch.float32, "cpu", min_same=0.999)


def test_rms_norm_shapes_interp(poison: None) -> None:
    """3-D input, a hidden size that is no power of two, the 8192 limit, a BF16-stored weight and an empty batch."""
    _check_norm((2, 3, 96), torch.float32, torch.float32, "cpu", 1.0)
    _check_norm((3, 1000), torch.float32, torch.bfloat16, "cpu", 1.0)
    _check_norm((2, 8192), torch.float32, torch.float32, "cpu", 1.0)
    empty = torch.zeros((0, 64))
    assert rms_norm(empty, torch.ones(64), EPS).shape == (0, 64)
    a, b = add_rms_norm(empty, empty, torch.ones(64), EPS)
    assert a.shape == b.shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("hidden", [64, 2048, 5120, 8192])
@pytest.mark.parametrize("rows", [1, 8, 257])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_gpu(poison: None, hidden: int, rows: int, dtype: torch.dtype) -> None:
    _check_norm((rows, hidden), dtype, torch.float32, "cuda", min_same=0.999)
    _check_norm((rows, hidden), dtype, torch.bfloat16, "cuda", min_same=0.999)


# ------------------------------------------------------------------------------------------- QK-norm + RoPE
def _check_qk(
    t: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    rope: bool,
    device: str,
    min_same: float,
    block_size: int = 4,
) -> None:
    num_blocks = -(-2 * t // block_size) + 2
    qkv = _rand((t, (hq + 2 * hkv) * d), dtype, 10, device) * 2
    q_norm = _rand((d,), torch.float32, 11, device) * 0.3 + 1
    k_norm = _rand((d,), torch.float32, 12, device) * 0.3 + 1
    g = torch.Generator().manual_seed(13)
    positions = torch.randint(0, 40000, (t,), generator=g).to(device)
    cos_sin = rope_cos_sin(positions, d, 10000.0, dtype) if rope else None
    # Distinct slots in shuffled order; with several tokens every third one is not written (-1).
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t].to(device)
    if t > 1:
        slots[::3] = -1
    shape = (num_blocks, block_size, hkv, d)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q = qk_norm_rope_write(qkv, q_norm, k_norm, EPS, cos_sin, k_cache, v_cache, slots, hq, hkv)
    q_ref = qk_norm_rope_write_ref(qkv, q_norm, k_norm, EPS, cos_sin, k_ref, v_ref, slots, hq, hkv)
    assert q.shape == q_ref.shape == (t, hq, d) and q.dtype == q_ref.dtype
    assert not q.isnan().any()
    # V is a copy; untouched slots must still be NaN in both.
    assert _same_frac(v_cache, v_ref) == 1.0
    assert torch.equal(k_cache.isnan(), k_ref.isnan())
    written = ~k_ref.isnan()
    if dtype == torch.float32:
        assert _rel_err(q, q_ref) < 1e-5
        assert _rel_err(k_cache[written], k_ref[written]) < 1e-5
    else:
        assert _same_frac(q, q_ref) >= min_same
        assert _same_frac(k_cache[written], k_ref[written]) >= min_same
        assert _rel_err(q, q_ref) < 2e-2 and _rel_err(k_cache[written], k_ref[written]) < 2e-2


@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 4, 128), (4, 2, 32), (2, 1, 16)])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_qk_norm_rope_write_interp(poison: None, hq: int, hkv: int, d: int, rope: bool, dtype: torch.dtype) -> None:
    _check_qk(7, hq, hkv, d, dtype, rope, "cpu", min_same=0.999)


def test_qk_norm_rope_write_edge_interp(poison: None) -> None:
    """One token, a head count that does not fill the last head group, block size 1, an empty batch."""
    _check_qk(1, 6, 1, 32, torch.float32, True, "cpu", 1.0, block_size=1)
    k_cache = torch.zeros((2, 4, 1, 16))
    q = qk_norm_rope_write(
        torch.zeros((0, 4 * 16)), torch.ones(16), torch.ones(16), EPS, None, k_cache, k_cache.clone(),
        torch.zeros(0, dtype=torch.int64), 2, 1,
    )  # fmt: skip
    assert q.shape == (0, 2, 16)


@pytest.mark.parametrize("op", [qk_norm_rope_write, qk_norm_rope_write_ref], ids=["triton", "reference"])
def test_qk_norm_rope_write_into_out_interp(poison: None, op) -> None:
    """With `out` (rows of a larger buffer, as the step graphs pass it) the queries land there, equal to those the op
    allocates, and the rows past them stay untouched; an `out` of the wrong shape is refused."""
    t, hq, hkv, d = 5, 4, 2, 32
    qkv = _rand((t, (hq + 2 * hkv) * d), torch.float32, 20)
    q_norm, k_norm = _rand((d,), torch.float32, 21) * 0.3 + 1, _rand((d,), torch.float32, 22) * 0.3 + 1
    cos_sin = rope_cos_sin(torch.arange(3, 3 + t), d, 10000.0, torch.float32)
    caches = [torch.zeros((4, 4, hkv, d)) for _ in range(2)]
    slots = torch.tensor([0, 5, -1, 9, 2])
    args = (qkv, q_norm, k_norm, EPS, cos_sin, *caches, slots, hq, hkv)
    want = op(*args)
    buf = torch.full((t + 3, hq, d), float("nan"))
    got = op(*args, out=buf[:t])
    assert got.data_ptr() == buf.data_ptr() and torch.equal(buf[:t], want) and buf[t:].isnan().all()
    with pytest.raises(ValueError, match="out is"):
        op(*args, out=torch.empty((t, hq, d // 2)))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 4, 128), (4, 2, 32), (8, 1, 16)])
@pytest.mark.parametrize("t", [1, 64, 1000])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qk_norm_rope_write_gpu(
    poison: None, hq: int, hkv: int, d: int, t: int, rope: bool, dtype: torch.dtype
) -> None:
    _check_qk(t, hq, hkv, d, dtype, rope, "cuda", min_same=0.999, block_size=16)
