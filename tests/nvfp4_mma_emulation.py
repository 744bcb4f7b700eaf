"""What the CPU tests of the NVFP4 mma.sync kernels (`test_nvfp4_mma.py`, `test_nvfp4_mma_moe.py`) share: an emulator
of the K step's PTX for Triton's interpreter, and the checks against float64.

Triton's interpreter cannot run PTX, so the tests run the kernels themselves in the interpreter with their K step's
PTX text (`step_asm`) handed to a small emulator of the instructions it uses (bit operations, PRMT, FMA.BF16X2 and
the m16n8k16 MMA with PTX's fragment layouts).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np
import pytest
import torch
from flint_kernels import nvfp4_mma_moe_triton as mm
from flint_kernels import nvfp4_mma_triton as nm
from flint_kernels.linear import NVFP4Weight
from kernel_checks import LaunchSpy


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------- a PTX emulator (one warp)


def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _f64_to_bf16(v: np.ndarray) -> np.ndarray:
    """To FP32, then to BF16 bits rounded to nearest even; NaN as PTX's canonical BF16 NaN (0x7FFF)."""
    u = v.astype(np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(v), np.uint16(0x7FFF), rounded)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    both = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint64)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        assert nib < 8, "sign-replicating PRMT selectors are not emulated"
        out |= ((both >> np.uint64(8 * nib)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.uint32)


_LANE = np.arange(32)
_G, _T = _LANE // 4, _LANE % 4


def _mma_m16n8k16(a: list[np.ndarray], b: list[np.ndarray], c: list[np.ndarray]) -> list[np.ndarray]:
    """PTX's mma.m16n8k16.row.col.f32.bf16.bf16.f32 for whole warps: fragments [reg][warp * 32 + lane] in, D
    fragments out; each warp's product its own, as one warp's MMA."""
    w = a[0].shape[0] // 32
    g, t = _G, _T
    A, B, C = np.zeros((w, 16, 16)), np.zeros((w, 16, 8)), np.zeros((w, 16, 8))
    for reg, (row_off, col_off) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        frag = a[reg].reshape(w, 32)
        A[:, g + row_off, 2 * t + col_off] = _bf16_to_f64(frag & 0xFFFF)
        A[:, g + row_off, 2 * t + col_off + 1] = _bf16_to_f64(frag >> 16)
    for reg, k_off in enumerate((0, 8)):
        frag = b[reg].reshape(w, 32)
        B[:, 2 * t + k_off, g] = _bf16_to_f64(frag & 0xFFFF)
        B[:, 2 * t + k_off + 1, g] = _bf16_to_f64(frag >> 16)
    for reg, (row_off, col_off) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
        C[:, g + row_off, 2 * t + col_off] = c[reg].reshape(w, 32)
    D = A @ B + C
    return [D[:, g + ro, 2 * t + co].reshape(-1) for ro, co in ((0, 0), (0, 1), (8, 0), (8, 1))]


@functools.cache
def _statements(asm: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`asm`'s instructions as (opcode, operands), parsed once a text (a test runs one K step thousands of times)."""
    out = []
    for stmt in asm.replace("{", " ").replace("}", " ").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, _, rest = stmt.partition(" ")
        rest = rest.strip()
        if op == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32":
            args = tuple(re.findall(r"\$?\w+", rest))
        elif op == "mov.b64":
            m = re.match(r"(\w+)\s*,\s*(\w+)\s*,\s*(\$\d+)", rest)
            assert m, stmt
            args = m.groups()
        else:
            args = tuple(a.strip() for a in rest.split(","))
        out.append((op, args))
    return tuple(out)


def run_ptx(asm: str, operands: dict[int, np.ndarray], n_out: int) -> list[np.ndarray]:
    """Run `asm` (the instructions `step_asm` emits) on whole warps: operands $i are [32 x warps] arrays (b32 as
    uint32, b64 as uint64, f32 as float64); returns the outputs $0 .. $n_out - 1."""
    regs: dict[str, np.ndarray] = {f"${i}": v for i, v in operands.items()}
    lanes = next(iter(operands.values())).shape[0]
    assert lanes % 32 == 0, "the emulator runs whole warps"

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return np.full(lanes, int(tok, 0), dtype=np.uint32)

    for op, args in _statements(asm):
        if op == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32":
            d, a, b, c = args[:4], args[4:8], args[8:10], args[10:14]
            out = _mma_m16n8k16([val(x) for x in a], [val(x) for x in b], [val(x) for x in c])
            for name, v in zip(d, out):
                regs[name] = v
            continue
        if op == "mov.b64":
            wide = val(args[2]).astype(np.uint64)
            regs[args[0]] = (wide & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            regs[args[1]] = (wide >> np.uint64(32)).astype(np.uint32)
            continue
        dst, srcs = args[0], args[1:]
        if op == "mov.b32":
            regs[dst] = val(srcs[0]).astype(np.uint32)
        elif op == "mov.f32":
            regs[dst] = val(srcs[0]).astype(np.float64)
        elif op == "shr.u32":
            regs[dst] = val(srcs[0]) >> np.uint32(int(srcs[1]))
        elif op == "shf.r.wrap.b32":  # a funnel shift of (srcs[1]:srcs[0]); both the same word: a rotation
            lo, hi, n = val(srcs[0]).astype(np.uint64), val(srcs[1]).astype(np.uint64), int(srcs[2]) % 32
            regs[dst] = (((hi << np.uint64(32)) | lo) >> np.uint64(n)).astype(np.uint32)
        elif op == "shl.b32":
            regs[dst] = (val(srcs[0]).astype(np.uint64) << np.uint64(int(srcs[1]))).astype(np.uint32)
        elif op == "and.b32":
            regs[dst] = val(srcs[0]) & val(srcs[1])
        elif op == "or.b32":
            regs[dst] = val(srcs[0]) | val(srcs[1])
        elif op == "mul.lo.u32":
            regs[dst] = (val(srcs[0]).astype(np.uint64) * val(srcs[1]).astype(np.uint64)).astype(np.uint32)
        elif op == "prmt.b32":
            regs[dst] = _prmt(val(srcs[0]), val(srcs[1]), int(srcs[2], 0))
        elif op == "fma.rn.bf16x2":
            a, b, c = (val(x) for x in srcs)
            halves = []
            for shift in (0, 16):
                prod = _bf16_to_f64((a >> shift) & 0xFFFF) * _bf16_to_f64((b >> shift) & 0xFFFF)
                halves.append(_f64_to_bf16(prod + _bf16_to_f64((c >> shift) & 0xFFFF)).astype(np.uint32))
            regs[dst] = halves[0] | (halves[1] << np.uint32(16))
        else:
            raise AssertionError(f"the emulator does not know {op!r}")
    return [regs[f"${i}"] for i in range(n_out)]


# ------------------------------------------------------------------ the real kernels, the PTX step emulated


def _emulated(groups: int, perm: bool = False) -> Callable[..., tuple]:
    """`_mma_step` (groups 1; with perm `_mma_step_perm`) or `_mma_step4` (4) under Triton's interpreter: the
    [threads] operands warp by warp through `run_ptx` on `step_asm(groups, perm, ready_codes)`, ready_codes as the
    kernel's step picks it (the code pointer's type)."""

    def step(w64: object, *args: object) -> tuple:
        from triton.language import core
        from triton.runtime.interpreter import TensorHandle

        ready_codes = w64.dtype.element_ty == core.uint64  # type: ignore[attr-defined]
        arrs = [a.handle.data for a in args]  # type: ignore[attr-defined]
        nt, n_out = arrs[0].shape[0], 4 * groups
        ops: dict[int, np.ndarray] = {}
        for i, v in enumerate(arrs):  # every warp of the program at once
            if i < 4 or 8 <= i < 8 + 8 * groups:  # b64 words: codes, x
                ops[n_out + i] = v.astype(np.int64).view(np.uint64)
            elif i < 8:  # b32 scales
                ops[n_out + i] = v.astype(np.int64).astype(np.uint32)
            else:  # f32 accumulators
                ops[n_out + i] = v.astype(np.float64)
        outs = [d.astype(np.float32) for d in run_ptx(nm.step_asm(groups, perm, ready_codes), ops, n_out)]
        block = core.block_type(core.float32, [nt])
        return tuple(core.tensor(TensorHandle(o, core.float32), block) for o in outs)

    return step


def _emulated_ld16(p: object) -> tuple:
    """`_ld16` under Triton's interpreter, whose pointers are host addresses: the two int64 words at each, which
    must be 16-byte aligned as the PTX's v2.b64 load needs."""
    from triton.language import core
    from triton.runtime.interpreter import TensorHandle

    addrs = [int(a) for a in p.handle.data.astype(np.uint64)]  # type: ignore[attr-defined]
    assert all(a % 16 == 0 for a in addrs), "a 16-byte load from an address not on 16 bytes"
    words = np.array([np.frombuffer(ctypes.string_at(a, 16), dtype=np.int64) for a in addrs]).reshape(-1, 2)
    block = core.block_type(core.int64, [len(addrs)])
    return tuple(core.tensor(TensorHandle(words[:, i].copy(), core.int64), block) for i in range(2))


def _emulated_prefetch(requested: list[int]) -> Callable:
    """`prefetch_lines` under the interpreter: records each lane's address (a hint has no result to emulate)."""

    def prefetch(p: object) -> None:
        requested.extend(int(a) for a in p.handle.data.astype(np.uint64))  # type: ignore[attr-defined]

    return prefetch


def emulate_ptx(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the kernels in Triton's interpreter (which runs no PTX) with their K step's PTX emulated: everything else
    (loads, index math, pair ranking, split-K, epilogues) is the kernels' own code. Outputs are FP32 (the
    interpreter's BF16 arithmetic is not faithful); x and h stay BF16, read as raw words. The PTX lives in
    `nvfp4_mma_triton`'s K steps, which the MoE kernels call too."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest on a machine without CUDA)")
    monkeypatch.setattr(nm, "_mma_step", _emulated(1))
    monkeypatch.setattr(nm, "_mma_step_perm", _emulated(1, perm=True))
    monkeypatch.setattr(nm, "_mma_step4", _emulated(nm.ROW_GROUPS))
    monkeypatch.setattr(nm, "_ld16", _emulated_ld16)


def record_l2_requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The addresses the kernels (the linear's and the MoE's) ask L2 for from now on, under `emulate_ptx`."""
    requested: list[int] = []
    for module in (nm, mm):
        monkeypatch.setattr(module, "prefetch_lines", _emulated_prefetch(requested))
    return requested


@contextlib.contextmanager
def spied(module: ModuleType, kernel: str, vec: bool) -> Iterator[LaunchSpy]:
    """Count the launches of the module's `kernel` (its VEC twin when vec) while the block runs."""
    name = kernel.replace("_kernel", "_vec_kernel") if vec else kernel
    spy = LaunchSpy(getattr(module, name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, name, spy)
        yield spy


def exact(x: torch.Tensor, w: NVFP4Weight) -> torch.Tensor:
    """x @ W^T (global scale included) in float64."""
    return x.double() @ w.dequantize(torch.float64, with_global=True).T


def close_to_exact(got: torch.Tensor, want: torch.Tensor, l1: torch.Tensor) -> None:
    """FP32 accumulation against float64: within 2**-14 of the sum of |products| (and 1e-6 relative)."""
    assert not torch.isnan(got).any(), "an output was never written"
    bad = (got.double() - want).abs() > 2.0**-14 * l1 + 1e-6 * want.abs()
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} differ, e.g. {got[bad][:4]} vs {want[bad][:4]}"


def close_in_bf16(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: NVFP4Weight) -> None:
    """Equal up to FP32 summation order and the one rounding to BF16: within 2 BF16 ulps of the larger value plus
    2**-16 of the sum of |products| (what reordered FP32 sums can move a result that cancels)."""
    g, r = got.float().cpu(), want.float().cpu()
    assert not torch.isnan(g).any(), "an output was never written"
    l1 = (x.float().abs().cpu() @ w.dequantize(torch.float32).abs().cpu().T) * w.column_scale().cpu()
    tol = 2.0**-7 * torch.maximum(g.abs(), r.abs()) + 2.0**-16 * l1
    bad = (g - r).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} differ, e.g. {g[bad][:4]} vs {r[bad][:4]}"
