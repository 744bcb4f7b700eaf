"""Linear layers over BF16/FP32 or NVFP4 (W4A16) weights: the weight types and the PyTorch reference matmuls."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import nvfp4
from .rmsnorm import add_rms_norm_ref


@dataclass
class NVFP4Weight:
    """A weight [..., N, K] in the engine's W4A16 layout (see `flint_kernels.nvfp4`).

    `global_scale` [..., G] multiplies the FP32 accumulator of each of G output segments (`segments` gives their
    sizes, summing to N): one segment for a plain tensor, several for fused projections (q|k|v, gate|up) whose
    parts came from separately scaled checkpoint tensors.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    segments: tuple[int, ...]
    _host_scales: tuple[float, ...] | None = field(default=None, init=False, repr=False, compare=False)
    # Whether the global scales are powers of two: overall, and per leading index (`scales_are_powers_of_two`).
    _powers_of_two: bool | None = field(default=None, init=False, repr=False, compare=False)
    _powers_of_two_each: tuple[bool, ...] | None = field(default=None, init=False, repr=False, compare=False)
    # int8 [..., N, K/16]: the scales as `nvfp4_mma_scales` ready bytes, made at load when asked for (else None);
    # `scales` itself where they replaced the UE4M3 bytes (every kernel and `nvfp4.dequantize` read either form).
    ready_scales: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    # int8 [..., N, K/2]: the codes as `nvfp4_mma_codes` ready codes (each word's bits permuted), made at load when
    # asked for (else None); `qweight` itself where they replaced the engine's codes (every kernel and
    # `nvfp4.dequantize` read either form).
    ready_codes: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n, half_k = self.qweight.shape[-2:]
        if sum(self.segments) != n:
            raise ValueError(f"NVFP4 segments {self.segments} do not sum to {n} rows")
        if self.scales.shape[-1] * nvfp4.QK_SUB != half_k * 2:
            raise ValueError(
                f"NVFP4 scales {tuple(self.scales.shape)} do not match qweight {tuple(self.qweight.shape)}"
            )
        if self.global_scale.shape[-1] != len(self.segments):
            raise ValueError(
                f"NVFP4 global scale {tuple(self.global_scale.shape)} does not match {len(self.segments)} segments"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.qweight.shape[:-1], self.qweight.shape[-1] * 2)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def extra_ready_scales(self) -> torch.Tensor | None:
        """The ready scale bytes where they are kept beside the UE4M3 ones (memory of their own), else None."""
        return None if self.ready_scales is self.scales else self.ready_scales

    @property
    def extra_ready_codes(self) -> torch.Tensor | None:
        """The ready codes where they are kept beside the engine's codes (memory of their own), else None."""
        return None if self.ready_codes is self.qweight else self.ready_codes

    @property
    def extra_nbytes(self) -> int:
        """Bytes of the MMA kernels' ready forms kept beside the weight's own (ready scales, ready codes)."""
        extra = (self.extra_ready_scales, self.extra_ready_codes)
        return sum(t.nbytes for t in extra if t is not None)

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes + self.global_scale.nbytes + self.extra_nbytes

    def column_scale(self) -> torch.Tensor:
        """FP32 [..., N]: the global scale of each output row."""
        # Expanded segment by segment: a repeat_interleave by a tensor of sizes would read them back to the host.
        g = self.global_scale
        lead = g.shape[:-1]
        return torch.cat([g[..., i : i + 1].expand(*lead, n) for i, n in enumerate(self.segments)], dim=-1)

    def host_global_scales(self) -> tuple[float, ...] | None:
        """A 2-D weight's G global scales as Python floats (a GEMM's alpha), read from the device at the first call;
        None for stacked (expert) weights, or while a CUDA graph is being captured and they were not read yet."""
        if self._host_scales is None and self.global_scale.dim() == 1:
            if self.global_scale.is_cuda and torch.cuda.is_current_stream_capturing():
                return None
            self._host_scales = tuple(float(v) for v in self.global_scale.tolist())
        return self._host_scales

    def scales_are_powers_of_two(self) -> bool:
        """Whether every global scale is a power of two (or zero); read from the device once per weight."""
        if self._powers_of_two is None:
            self._powers_of_two = all(self._powers_of_two_per_index())
        return self._powers_of_two

    def _powers_of_two_per_index(self) -> tuple[bool, ...]:
        """Per leading index (expert) of a stacked weight, or one flag: read from the device once per weight, so
        that the experts `select` hands out (new objects at each use) need no device read of their own."""
        if self._powers_of_two_each is None:
            mant, _ = torch.frexp(self.global_scale)
            ok = ((mant == 0.5) | (self.global_scale == 0)).all(dim=-1)
            self._powers_of_two_each = tuple(bool(v) for v in ok.reshape(-1).tolist())
        return self._powers_of_two_each

    def dequantize(self, dtype: torch.dtype = torch.float32, with_global: bool = False) -> torch.Tensor:
        w = nvfp4.dequantize(self.qweight, self.scales, torch.float32)
        if with_global:
            w = w * self.column_scale()[..., None]
        return w.to(dtype)

    def select(self, index: int) -> NVFP4Weight:
        """One slice along the leading (expert) dimension."""
        part = NVFP4Weight(self.qweight[index], self.scales[index], self.global_scale[index], self.segments)
        if self.global_scale.dim() == 2:
            part._powers_of_two = self._powers_of_two_per_index()[index]
        return part


@dataclass(frozen=True)
class ScaledWeight:
    """Dequantised NVFP4 experts (`moe_triton` makes them for long prefills): `data` [E, N, K] holds each value times
    its block scale, exactly; the global scales [E, G] still multiply the FP32 accumulator of each output segment,
    as for NVFP4."""

    data: torch.Tensor
    global_scale: torch.Tensor
    segments: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


Weight = torch.Tensor | NVFP4Weight


def weight_nbytes(w: Weight) -> int:
    return w.nbytes if isinstance(w, NVFP4Weight) else w.numel() * w.element_size()


def materialize(w: Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A dense weight to multiply with, and an FP32 column scale still to apply to the accumulator (or None).

    Power-of-two global scales fold into the dequantised weight exactly, so the NVFP4 path then computes the
    same function as the dense model built from the dequantised weights.
    """
    if not isinstance(w, NVFP4Weight):
        return (w if w.dtype == dtype else w.to(dtype)), None
    if w.scales_are_powers_of_two():
        return w.dequantize(dtype, with_global=True), None
    return w.dequantize(dtype), w.column_scale()


def linear_ref(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """y = x @ W^T in x's dtype; an NVFP4 global scale multiplies the FP32 accumulator before the one rounding."""
    dense, col_scale = materialize(w, x.dtype)
    if col_scale is None:
        return F.linear(x, dense)
    return (matmul_fp32_out(x, dense) * col_scale).to(x.dtype)


def matmul_fp32_out(x: torch.Tensor, w: torch.Tensor, chunk_rows: int = 32768) -> torch.Tensor:
    """FP32 result of x [M, K] @ w[N, K]^T with FP32 accumulation, without an FP32 copy of a huge w."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        return F.linear(x, w)
    if x.is_cuda and x.dtype == w.dtype:
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            pass
    x32 = x.to(torch.float32)
    parts = [F.linear(x32, w[i : i + chunk_rows].to(torch.float32)) for i in range(0, w.shape[0], chunk_rows)]
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def linear_fp32_out_ref(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """FP32 output (the lm_head): FP32 accumulation, NVFP4 global scale applied to the FP32 result."""
    if isinstance(w, NVFP4Weight):
        out = matmul_fp32_out(x, w.dequantize(x.dtype if x.dtype != torch.float32 else torch.float32))
        return out * w.column_scale()
    return matmul_fp32_out(x, w)


def linear_add_rms_norm_ref(
    x: torch.Tensor, w: Weight, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A projection followed by the residual add and RMSNorm: (normed, new residual), as the two ops in a row."""
    return add_rms_norm_ref(linear_ref(x, w), residual, norm_weight, eps)


def add_rms_norm_linear_ref(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, w: Weight
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and RMSNorm followed by a projection: (projection of the normed rows, new residual)."""
    normed, new_res = add_rms_norm_ref(x, residual, norm_weight, eps)
    return linear_ref(normed, w), new_res
