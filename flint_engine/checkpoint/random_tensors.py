"""Deterministic random checkpoint tensors, generated one at a time (no whole model in memory).

Every tensor depends only on (seed, tensor key, device), so any format written from the same seed (on the same kind of
device: CPU and CUDA generators draw different numbers) holds the same values.
With `nvfp4_values` the linear weights are drawn in the NVFP4 domain (codes, UE4M3 scales, power-of-two global
scale), so BF16 files of them are exact and an NVFP4 file of the same seed is the same model bit for bit.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from flint_kernels import nvfp4
from flint_kernels.linear import NVFP4Weight, Weight

from ..config import FlintConfig
from .tensor_plan import EMBED, EXPERTS, LINEAR, NORM, ROUTER, SINKS, TensorSpec, fan_in

TensorProvider = Callable[[TensorSpec], Weight]


def nvfp4_encodable(spec: TensorSpec) -> bool:
    return spec.role in (LINEAR, EXPERTS) and spec.shape[-1] % nvfp4.QK == 0


def random_provider(
    config: FlintConfig,
    seed: int = 0,
    nvfp4_values: bool = False,
    gain: float = 1.0,
    device: str | torch.device = "cpu",
) -> TensorProvider:
    """Tensors drawn on `device` (a GPU makes the full-size model's 40B values in seconds) and returned on the CPU."""
    device = torch.device(device)

    def make(spec: TensorSpec) -> Weight:
        w = _make(spec)
        if isinstance(w, NVFP4Weight):
            return NVFP4Weight(w.qweight.cpu(), w.scales.cpu(), w.global_scale.cpu(), w.segments)
        return w.cpu()

    def _make(spec: TensorSpec) -> Weight:
        gen = torch.Generator(device).manual_seed((seed * 1_000_003 + zlib.crc32(spec.key.encode())) % 2**63)
        shape = spec.shape

        def randn(scale: float, mean: float = 0.0) -> torch.Tensor:
            return torch.randn(shape, generator=gen, device=device) * scale + mean

        if spec.role in (LINEAR, EXPERTS):
            w = randn(gain / fan_in(spec) ** 0.5)
            if nvfp4_values and nvfp4_encodable(spec):
                lead = shape[:-2]
                amax = w.abs().amax(dim=(-2, -1)) if lead else w.abs().amax()
                g = nvfp4.choose_global_scale(amax, power_of_two=True)
                q, s = nvfp4.quantize(w, g)
                return NVFP4Weight(q, s, g.reshape(*lead, 1) if lead else g.reshape(1), (shape[-2],))
            return w.to(torch.bfloat16).to(torch.float32)
        if spec.role == NORM:
            return randn(0.1, 1.0).to(torch.bfloat16).to(torch.float32)
        if spec.role == SINKS:
            return randn(1.0)
        if spec.role == ROUTER:
            return randn(gain / fan_in(spec) ** 0.5)
        if spec.role == EMBED:
            return randn(1.0).to(torch.bfloat16).to(torch.float32)
        raise ValueError(f"unknown tensor role {spec.role}")

    return make
