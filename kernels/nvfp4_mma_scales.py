"""NVFP4 block scales as bytes the MMA kernels decode in one instruction ("ready scales"), made at load.

`nvfp4_mma_triton`'s K loops turn each UE4M3 scale byte into the BF16 pair its PTX step multiplies the decoded codes
by: the byte's E4M3 value times 2**64 in both halves (`_scale2`: a mask, a shift, two FP32 multiplies, a select for
0x7F, a conversion and the pair), 13-14% of the loops' instructions on sm_90 (thirty-third session, from the SASS). A
ready byte u holds the same value with E4M3's subnormals as normals, u = (exponent + 9) << 3 | mantissa for the value
(1 + mantissa / 8) * 2**exponent, exponent -9..8, so the pair is u * 0x100010 + READY_PAIR_ADD, one IMAD (23296 =
182 << 7 puts the exponent at BF16's bias plus 64). Normal bytes become u = (b & 0x7F) + 16. Zero has no such byte:
blocks whose scale decodes to 0 (low bits 0, or 0x7F) get zero codes, each code's sign bit kept, and u = 0. Every
weight keeps its value, so every sum with a nonzero term keeps its bits; only a zero weight's sign can change where a
path decodes the code -0 as +0 (the torch reference's table does), which shows only in an output whose every
product is zero.

The kernels take the ready bytes as an int8 tensor (`NVFP4Weight.ready_scales`): the pointer's type picks the decode, so
no kernel gains a parameter. The tuning table's `mma_ready` (TileConfig, MoEConfig) has the MMA kernels read them, and
the fused path makes them when the model is built (`prepare`) where the device's table reads them: one byte per 16
values, in the UE4M3 bytes' place (kept beside them, 1/9 more NVFP4 weight bytes, ~2.5 GB on the full model).
`FLINT_MMA_READY_SCALES=1` makes them on every CUDA device beside the UE4M3 bytes (A/Bs), `=0` never (then `mma_ready`
entries fall back to the UE4M3 decode), `=replace` makes them on every CUDA device in the UE4M3 bytes' place, and `auto`
(the default) in their place where the table reads them (`replaces`): every kernel then reads them (the FMA and prefill
kernels through `nvfp4_decode_triton.scale_value`), no byte is added. On the H200 (thirty-fourth session) they took the
NVFP4 decode step at batch 32 from 9.87 to 9.35 ms and at 64 from 14.61 to 13.97. In the UE4M3 bytes' place every path's
GPU tests give the same bits (thirty-sixth and forty-eighth sessions); on an H100 (forty-eighth session, with ready
codes in the codes' place, separate processes) the step ran b1 1.974 -> 1.918 ms, b8 4.989 -> 4.803, b32 9.347 -> 9.382,
b64 14.549 -> 14.518, and the 8K prefill 135.56 -> 135.59 ms (the thirty-sixth session's one 157.6 against 134.2 did not
come again), so the 2.47 GB went back to the KV cache.
"""

from __future__ import annotations

import os

import torch

from . import nvfp4, tuning
from .linear import NVFP4Weight

READY_PAIR_ADD = 23296 * 0x10001  # 182 << 7 in both BF16 halves


ENV = "FLINT_MMA_READY_SCALES"
# The ops whose configs carry `mma_ready`.
READING_OPS = ("gemv.small_m", "gemv.large_m", "moe.decode")
SETTINGS = ("auto", "0", "1", "replace")  # what FLINT_MMA_READY_SCALES and FLINT_MMA_READY_CODES take


def env_setting(env: str) -> str:
    """A ready-bytes setting (`FLINT_MMA_READY_SCALES`, `FLINT_MMA_READY_CODES`): "auto" (the default), "0", "1" or
    "replace"; anything else is an error."""
    flag = os.environ.get(env, "auto")
    if flag not in SETTINGS:
        raise ValueError(f"{env} must be auto, 0, 1 or replace, not {flag!r}")
    return flag


def table_has(table: tuning.Table, field: str) -> bool:
    """Whether a tuning table has an entry of `READING_OPS` that sets `field` (its kernels read those ready bytes)."""
    return any(entry.config.get(field) for op in READING_OPS for entry in table.ops.get(op, ()))


def wanted_by(env: str, field: str, device: torch.device) -> bool:
    """Whether weights on `device` get the ready bytes of setting `env`: 1 or replace / 0, else ("auto", the default)
    when the device's tuning table has an entry setting `field`."""
    flag = env_setting(env)
    if flag != "auto":
        return flag != "0"
    return table_has(tuning.table(device), field)


def setting() -> str:
    """`FLINT_MMA_READY_SCALES` (`env_setting`)."""
    return env_setting(ENV)


def wanted(device: torch.device) -> bool:
    """Whether weights on `device` get ready scales (`wanted_by`: `FLINT_MMA_READY_SCALES`, the table's `mma_ready`)."""
    return wanted_by(ENV, "mma_ready", device)


def table_reads(table: tuning.Table) -> bool:
    """Whether a tuning table has an entry whose kernels read ready scale bytes."""
    return table_has(table, "mma_ready")


def extra_bytes(values: int) -> int:
    """Bytes the ready scales add beside the UE4M3 ones for `values` NVFP4 weight values: one a block."""
    return values // nvfp4.QK_SUB


def zero_scale(scales: torch.Tensor) -> torch.Tensor:
    """Where UE4M3 scale bytes decode to 0 by the codec's own rule (low 7 bits 0, or the byte 0x7F)."""
    return nvfp4.ue4m3_to_float(scales) == 0


def ready_bytes(scales: torch.Tensor) -> torch.Tensor:
    """int8 ready bytes (module docstring) of uint8 UE4M3 scale bytes, 0 where the scale decodes to 0."""
    n = scales.to(torch.int32) & 0x7F
    m = n & 7
    # E4M3 subnormals m * 2**-9 as normals: the mantissa's top bit gives the exponent, the bits below it the mantissa.
    top = torch.where(m >= 4, 2, torch.where(m >= 2, 1, 0))
    sub = (top << 3) | ((m << (3 - top)) & 7)
    u = torch.where(n >= 8, n + 16, sub)
    u = torch.where(zero_scale(scales), 0, u)
    return u.to(torch.uint8).view(torch.int8)


def ready_pair(u: torch.Tensor) -> torch.Tensor:
    """The int32 BF16 pair the kernels build from ready bytes (for tests: it must equal `_scale2`'s)."""
    return (u.view(torch.uint8).to(torch.int64) * 0x100010 + READY_PAIR_ADD).to(torch.int32)


def make_ready(w: NVFP4Weight, replace: bool = False) -> None:
    """Give `w` its ready scales, first setting the codes of blocks whose scale decodes to 0 to signed zeros (in
    place: every path's products there are those signed zeros already). `replace`: they take the UE4M3 bytes' place
    (`scales`), so the weight keeps one byte a block: every kernel (`nvfp4_decode_triton.scale_value`, `_scale_pair`)
    and `nvfp4.dequantize` decode either form by its dtype."""
    if w.ready_scales is not None:
        return
    empty = zero_scale(w.scales)
    if bool(empty.any()) and (w.ready_codes is not None or w.qweight.dtype != torch.uint8):
        raise ValueError(
            "ready codes were made before the ready scales: they would keep the codes of zero-scale blocks that the "
            "ready scales zero (make the scales first, as fast.prepare_nvfp4 does)"
        )
    if bool(empty.any()):
        codes = w.qweight.unflatten(-1, (-1, nvfp4.QK_SUB // 2))  # a block's 16 values are 8 bytes
        codes.copy_(torch.where(empty[..., None], codes & 0x88, codes))
    w.ready_scales = ready_bytes(w.scales)
    if replace:
        w.scales = w.ready_scales


def replaces() -> bool:
    """Whether ready scales, where made, take the UE4M3 bytes' place: under `replace`, and under `auto` (the default),
    which makes them only where the table reads them; `1` keeps them beside the UE4M3 bytes (A/Bs)."""
    return setting() in ("auto", "replace")


def prepare(w: object) -> None:
    """The op table's `prepare_nvfp4`: ready scales for an NVFP4 weight on a CUDA device that wants them (`wanted`;
    others are left as they are), in the UE4M3 bytes' place unless `FLINT_MMA_READY_SCALES=1` (`replaces`)."""
    if isinstance(w, NVFP4Weight) and w.qweight.is_cuda and wanted(w.qweight.device):
        make_ready(w, replace=replaces())
