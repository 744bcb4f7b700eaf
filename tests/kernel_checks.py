"""What the Triton kernel tests share: the error measure, output buffers poisoned with NaN, a launch counter, a
table turning on the qkv projection's norm prologue, NVFP4 weights with ready bytes in their own bytes' place."""

from __future__ import annotations

import json
import math

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error in float64; inf when `a` holds a NaN or inf (an unwritten, poisoned element)."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    if not torch.isfinite(a64).all():
        return math.inf
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()


def poisoned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Stands in for a kernel module's `_empty`: every allocated tensor starts as NaN, so unwritten elements show."""
    return torch.full(shape, math.nan, dtype=dtype, device=device)


def poison_torch_empty(monkeypatch) -> None:
    """Make `torch.empty` / `torch.empty_like` return NaN (floats) or -77 (ints), so unwritten elements show."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(math.nan)
        elif t.dtype != torch.bool:
            t.fill_(-77)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


def norm_prologue_table(monkeypatch, tmp_path) -> None:
    """A tuning table (for the test's duration) that turns on `add_rms_norm_linear`'s one launch at M == 1 for every
    shape, as the shipped table does for BF16's q|k|v projection; the default table (none on the CPU) leaves it off."""
    from flint_kernels import tuning

    path = tmp_path / "norm_prologue.json"
    entry = {"when": {"m": 1}, "config": {"norm_prologue": True}, "source": "a test's table"}
    path.write_text(json.dumps({"gemv.small_m": [entry]}))
    monkeypatch.setenv(tuning.ENV, str(path))  # read per call; restored after the test


class LaunchSpy:
    """Stands in for a Triton kernel and counts its launches (`kernel[grid](...)`), keeping their grids."""

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel
        self.grids: list[tuple] = []

    @property
    def launches(self) -> int:
        return len(self.grids)

    def __getitem__(self, grid: tuple) -> object:
        self.grids.append(tuple(grid))
        return self.kernel[grid]


def random_nvfp4(n: int, k: int, g: torch.Generator, segments: tuple[int, ...] | None = None):  # -> NVFP4Weight
    """A random NVFP4 weight [n, k] on g's device: every code and scale byte value occurs (0x7F decodes to 0, 0xFF to
    480 / 2 as in `ue4m3_to_float`), plus planted edges (+0 / -0 codes, zero, largest and smallest scales), and a
    global scale per segment in [0.3, 2) (not powers of two)."""
    from flint_kernels.linear import NVFP4Weight

    dev = g.device
    q = torch.randint(0, 256, (n, k // 2), generator=g, device=dev, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(0, 256, (n, k // 16), generator=g, device=dev, dtype=torch.int32).to(torch.uint8)
    q[0, :4] = torch.tensor([0x00, 0x88, 0x80, 0x08], dtype=torch.uint8)  # +0 / -0 codes in both nibbles
    s[0, 0], s[1, 0], s[2, 0], s[3, 0] = 0x7F, 0x00, 0xFF, 0x80
    if n > 4:
        s[4, 0] = 0x01  # the smallest subnormal scale
    segments = segments or (n,)
    gscale = torch.rand(len(segments), generator=g, device=dev) * 1.7 + 0.3
    return NVFP4Weight(q, s, gscale.float(), segments)


def random_nvfp4_experts(lead: int, n: int, k: int, g: torch.Generator, segments: tuple[int, ...]):  # -> NVFP4Weight
    """Stacked NVFP4 experts [lead, n, k] on g's device: random codes (+0/-0 planted), moderate scale bytes with 0x7F
    and 0x00 planted, per-expert global scales."""
    from flint_kernels.linear import NVFP4Weight

    dev = g.device
    q = torch.randint(0, 256, (lead, n, k // 2), generator=g, device=dev, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(0x30, 0x40, (lead, n, k // 16), generator=g, device=dev, dtype=torch.int32).to(torch.uint8)
    q[:, 0, :2] = torch.tensor([0x80, 0x08], dtype=torch.uint8)
    s[:, 1, 0], s[:, 2, 0] = 0x7F, 0x00
    gs = (torch.rand(lead, len(segments), generator=g, device=dev) + 0.3) / (4 * math.sqrt(k))
    return NVFP4Weight(q, s, gs.float(), segments)


def routing(t: int, e: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token and renormalised FP32 weights (the router's output format), on g's device."""
    scores = torch.rand(t, e, generator=g, device=g.device)
    w, ids = torch.topk(scores, k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def replaced(w, kind: str = "scales"):  # NVFP4Weight -> NVFP4Weight
    """A copy of w with ready scale bytes in the UE4M3 bytes' place ("scales"), ready codes in the engine's codes'
    place ("codes"), or both ("both": the scales first, as `fast.prepare_nvfp4` makes them)."""
    from flint_kernels import nvfp4_mma_codes, nvfp4_mma_scales
    from flint_kernels.linear import NVFP4Weight

    out = NVFP4Weight(w.qweight.clone(), w.scales.clone(), w.global_scale.clone(), w.segments)
    if kind in ("scales", "both"):
        nvfp4_mma_scales.make_ready(out, replace=True)
        assert out.scales.dtype == torch.int8 and out.ready_scales is out.scales
    if kind in ("codes", "both"):
        nvfp4_mma_codes.make_ready(out, replace=True)
        assert out.qweight.dtype == torch.int8 and out.ready_codes is out.qweight and out.extra_ready_codes is None
    return out
