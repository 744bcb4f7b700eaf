"""`rope_cos_sin` in three launches against the reference's expression (FP32 cos/sin of the concatenated
frequencies, each cast): the same bits, on the CPU here and on CUDA in the `gpu` test."""

from __future__ import annotations

import pytest
import torch
from flint_kernels.rope import inv_freq, rope_cos_sin

HAS_CUDA = torch.cuda.is_available()


def _reference(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The expression the reference's rotary embedding uses."""
    freqs = positions[:, None].to(torch.float32) * inv_freq(head_dim, theta, str(positions.device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _check(device: str, dtype: torch.dtype, head_dim: int, theta: float) -> None:
    g = torch.Generator().manual_seed(head_dim)
    # Random positions over the whole 262K context, its edges, and a decode batch's few.
    positions = torch.cat((torch.randint(0, 262144, (3000,), generator=g), torch.tensor([0, 1, 512, 2**18 - 1]))).to(
        device
    )
    for pos in (positions, positions[:5]):
        cos, sin = rope_cos_sin(pos, head_dim, theta, dtype)
        want_cos, want_sin = _reference(pos, head_dim, theta, dtype)
        assert cos.dtype == sin.dtype == dtype and cos.shape == (pos.numel(), head_dim)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    # Positions as int32 (the engine's are int64) convert the same way.
    cos32, _ = rope_cos_sin(positions.to(torch.int32), head_dim, theta, dtype)
    assert torch.equal(cos32, _reference(positions, head_dim, theta, dtype)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("head_dim", "theta"), [(128, 10000.0), (64, 1e6)])
def test_rope_cos_sin_equals_the_reference_expression(dtype: torch.dtype, head_dim: int, theta: float) -> None:
    _check("cpu", dtype, head_dim, theta)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_cos_sin_equals_the_reference_expression_gpu(dtype: torch.dtype) -> None:
    _check("cuda", dtype, 128, 10000.0)
    # Three launches: the product, cos and sin (the reference's expression takes seven).
    positions = torch.arange(7, 15, device="cuda")
    rope_cos_sin(positions, 128, 10000.0, dtype)  # the frequencies' one-time copies happen here
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        rope_cos_sin(positions, 128, 10000.0, dtype)
        torch.cuda.synchronize()
    launches = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(launches) == 3, [e.name for e in launches]
