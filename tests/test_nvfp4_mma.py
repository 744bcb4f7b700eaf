"""`flint_kernels.nvfp4_mma_triton`: NVFP4 on mma.sync with the weights decoded in PTX (the linear, the MoE's
expert-major gate_up and down, and the engine switches that launch them).

Triton's interpreter cannot run PTX, so the CPU tests run the kernels themselves in the interpreter with their K
step's PTX text (`step_asm`) handed to a small emulator of the instructions it uses (bit operations, PRMT,
FMA.BF16X2 and the m16n8k16 MMA with PTX's fragment layouts), and compare with float64 and with `moe_ref`.
The sm_90 compile test checks what the lane mapping relies on: the asm's operands are one element a thread, and
the K step issues its 8 MMAs. The `gpu` tests run the compiled kernels, alone and inside the engine's ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from flint_kernels import nvfp4_mma_scales
from flint_kernels import nvfp4_mma_triton as nm
from flint_kernels.activation import silu_and_mul_ref
from flint_kernels.linear import NVFP4Weight, linear_fp32_out_ref, linear_ref
from flint_kernels.moe import moe_ref
from kernel_checks import LaunchSpy, random_nvfp4

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
HAS_CUDA = torch.cuda.is_available()


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------- a PTX emulator (one warp)


def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _f64_to_bf16(v: np.ndarray) -> np.ndarray:
    return torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    both = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint64)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        assert nib < 8, "sign-replicating PRMT selectors are not emulated"
        out |= ((both >> np.uint64(8 * nib)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.uint32)


def _mma_m16n8k16(a: list[np.ndarray], b: list[np.ndarray], c: list[np.ndarray]) -> list[np.ndarray]:
    """PTX's mma.m16n8k16.row.col.f32.bf16.bf16.f32 for one warp: fragments [reg][lane] in, D fragments out."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for reg, (row_off, col_off) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        lo, hi = _bf16_to_f64(a[reg] & 0xFFFF), _bf16_to_f64(a[reg] >> 16)
        A[g + row_off, 2 * t + col_off] = lo
        A[g + row_off, 2 * t + col_off + 1] = hi
    for reg, k_off in enumerate((0, 8)):
        B[2 * t + k_off, g] = _bf16_to_f64(b[reg] & 0xFFFF)
        B[2 * t + k_off + 1, g] = _bf16_to_f64(b[reg] >> 16)
    for reg, (row_off, col_off) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
        C[g + row_off, 2 * t + col_off] = c[reg]
    D = A @ B + C
    return [D[g + ro, 2 * t + co] for ro, co in ((0, 0), (0, 1), (8, 0), (8, 1))]


def run_ptx(asm: str, operands: dict[int, np.ndarray], n_out: int) -> list[np.ndarray]:
    """Run `asm` (the instructions `step_asm` emits) on one warp: operands $i are [32] arrays (b32 as uint32, b64
    as uint64, f32 as float64); returns the outputs $0 .. $n_out - 1."""
    regs: dict[str, np.ndarray] = {f"${i}": v for i, v in operands.items()}

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return np.full(32, int(tok, 0), dtype=np.uint32)

    for stmt in asm.replace("{", " ").replace("}", " ").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, _, rest = stmt.partition(" ")
        rest = rest.strip()
        if op == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32":
            names = re.findall(r"\$?\w+", rest)
            d, a, b, c = names[:4], names[4:8], names[8:10], names[10:14]
            out = _mma_m16n8k16([val(x) for x in a], [val(x) for x in b], [val(x) for x in c])
            for name, v in zip(d, out):
                regs[name] = v
            continue
        if op == "mov.b64":
            m = re.match(r"(\w+)\s*,\s*(\w+)\s*,\s*(\$\d+)", rest)
            assert m, stmt
            wide = val(m.group(3)).astype(np.uint64)
            regs[m.group(1)] = (wide & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            regs[m.group(2)] = (wide >> np.uint64(32)).astype(np.uint32)
            continue
        args = [a.strip() for a in rest.split(",")]
        dst, srcs = args[0], args[1:]
        if op == "mov.b32":
            regs[dst] = val(srcs[0]).astype(np.uint32)
        elif op == "mov.f32":
            regs[dst] = val(srcs[0]).astype(np.float64)
        elif op == "shr.u32":
            regs[dst] = val(srcs[0]) >> np.uint32(int(srcs[1]))
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
    [threads] operands warp by warp through `run_ptx` on `step_asm(groups, perm)`."""

    def step(*args: object) -> tuple:
        from triton.language import core
        from triton.runtime.interpreter import TensorHandle

        arrs = [a.handle.data for a in args]  # type: ignore[attr-defined]
        nt, n_out = arrs[0].shape[0], 4 * groups
        outs = [np.zeros(nt, dtype=np.float32) for _ in range(n_out)]
        for w0 in range(0, nt, 32):
            ops: dict[int, np.ndarray] = {}
            for i, a in enumerate(arrs):
                v = a[w0 : w0 + 32]
                if i < 4 or 8 <= i < 8 + 8 * groups:  # b64 words: codes, x
                    ops[n_out + i] = v.astype(np.int64).view(np.uint64)
                elif i < 8:  # b32 scales
                    ops[n_out + i] = v.astype(np.int64).astype(np.uint32)
                else:  # f32 accumulators
                    ops[n_out + i] = v.astype(np.float64)
            for q, d in enumerate(run_ptx(nm.step_asm(groups, perm), ops, n_out)):
                outs[q][w0 : w0 + 32] = d
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


@pytest.fixture
def l2_requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The addresses the kernels ask L2 for while the test runs (with `emulated_ptx`)."""
    requested: list[int] = []
    monkeypatch.setattr(nm, "prefetch_lines", _emulated_prefetch(requested))
    return requested


@pytest.fixture
def emulated_ptx(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the kernels in Triton's interpreter (which runs no PTX) with their K step's PTX emulated: everything else
    (loads, index math, pair ranking, split-K, epilogues) is the kernels' own code. Outputs are FP32 (the
    interpreter's BF16 arithmetic is not faithful); x and h stay BF16, read as raw words."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest on a machine without CUDA)")
    monkeypatch.setattr(nm, "_mma_step", _emulated(1))
    monkeypatch.setattr(nm, "_mma_step_perm", _emulated(1, perm=True))
    monkeypatch.setattr(nm, "_mma_step4", _emulated(nm.ROW_GROUPS))
    monkeypatch.setattr(nm, "_ld16", _emulated_ld16)


@contextlib.contextmanager
def _spied(kernel: str, vec: bool) -> Iterator[LaunchSpy]:
    """Count the launches of `nvfp4_mma_triton`'s `kernel` (its VEC twin when vec) while the block runs."""
    name = kernel.replace("_kernel", "_vec_kernel") if vec else kernel
    spy = LaunchSpy(getattr(nm, name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, name, spy)
        yield spy


def _exact(x: torch.Tensor, w: NVFP4Weight) -> torch.Tensor:
    """x @ W^T (global scale included) in float64."""
    return x.double() @ w.dequantize(torch.float64, with_global=True).T


def _close_to_exact(got: torch.Tensor, want: torch.Tensor, l1: torch.Tensor) -> None:
    """FP32 accumulation against float64: within 2**-14 of the sum of |products| (and 1e-6 relative)."""
    assert not torch.isnan(got).any(), "an output was never written"
    bad = (got.double() - want).abs() > 2.0**-14 * l1 + 1e-6 * want.abs()
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} differ, e.g. {got[bad][:4]} vs {want[bad][:4]}"


@pytest.mark.parametrize("vec,prefetch", [(False, False), (False, True), (True, False)], ids=["8B", "prefetch", "16B"])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_linear_kernel(emulated_ptx: None, m: int, split_k: int, prefetch: bool, vec: bool) -> None:
    """`_nvfp4_mma_kernel`: ragged N (rows past N on both fragment halves), two segments with their own global
    scales, every code and scale byte, 1/3/8 rows of x, K of three steps in one split or two uneven ones (the
    semaphore sum), with and without the loads a step ahead, with 8- and 16-byte loads (VEC)."""
    w = random_nvfp4(80, 384, seeded(m), (48, 32))
    x = (torch.randn(m, 384, generator=torch.Generator().manual_seed(10 + m)) * 0.5).to(torch.bfloat16)
    out = torch.full((m, 80), float("nan"))
    with _spied("_nvfp4_mma_kernel", vec) as spy:
        nm.launch_linear(x, w, out, num_warps=2, split_k=split_k, prefetch=prefetch, vec=vec)
    assert spy.launches == 1
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    _close_to_exact(out, _exact(x, w), l1)


@pytest.mark.parametrize("vec", [False, True], ids=["8B", "16B"])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("m", [9, 30, 40, 64])
def test_linear_rows_kernel(emulated_ptx: None, m: int, split_k: int, vec: bool) -> None:
    """`_nvfp4_mma_rows_kernel`: 9 rows (three groups past M), 30 (the last group ragged) in one quad of groups, 40
    and 64 in two (the second quad partly or wholly real); ragged N, two segments, K in one split or two (the
    semaphore sum over 16 or 32 accumulators a thread)."""
    w = random_nvfp4(80, 384, seeded(m), (48, 32))
    x = (torch.randn(m, 384, generator=torch.Generator().manual_seed(20 + m)) * 0.5).to(torch.bfloat16)
    out = torch.full((m, 80), float("nan"))
    with _spied("_nvfp4_mma_rows_kernel", False) as rows, _spied("_nvfp4_mma_kernel", vec) as small:
        nm.launch_linear(x, w, out, num_warps=2, split_k=split_k, vec=vec)
    assert (rows.launches, small.launches) == (1, 0)
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    _close_to_exact(out, _exact(x, w), l1)


@pytest.mark.parametrize("vec", [False, True], ids=["8B", "16B"])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("m", [9, 30])
def test_linear_wide_kernel(emulated_ptx: None, m: int, split_k: int, vec: bool) -> None:
    """`_nvfp4_mma_wide_kernel` (`wide`: 32 weight rows a warp, two tiles sharing x): 9 and 30 rows of x; N = 80 in
    programs of 64 rows, so the second program's second warp has both tiles' rows past N and its first warp the
    second tile's; two segments; K in one split or two (the semaphore sum over 32 accumulators a thread)."""
    w = random_nvfp4(80, 384, seeded(m), (48, 32))
    x = (torch.randn(m, 384, generator=torch.Generator().manual_seed(30 + m)) * 0.5).to(torch.bfloat16)
    out = torch.full((m, 80), float("nan"))
    with _spied("_nvfp4_mma_wide_kernel", False) as wide, _spied("_nvfp4_mma_rows_kernel", False) as rows:
        nm.launch_linear(x, w, out, num_warps=2, split_k=split_k, vec=vec, wide=True)
    assert (wide.launches, rows.launches) == (1, 0)
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    _close_to_exact(out, _exact(x, w), l1)


def test_wide_only_for_one_quad_of_rows(emulated_ptx: None) -> None:
    """`wide` applies to 9-32 rows only: 40 rows still take the rows kernel's two quads."""
    w = random_nvfp4(48, 256, seeded(3), (48,))
    x = (torch.randn(40, 256, generator=torch.Generator().manual_seed(3)) * 0.5).to(torch.bfloat16)
    out = torch.full((40, 48), float("nan"))
    with _spied("_nvfp4_mma_wide_kernel", False) as wide, _spied("_nvfp4_mma_rows_kernel", False) as rows:
        nm.launch_linear(x, w, out, num_warps=2, split_k=1, wide=True)
    assert (wide.launches, rows.launches) == (0, 1)
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    _close_to_exact(out, _exact(x, w), l1)


@pytest.mark.parametrize(
    "m,vec,wide,kernel",
    [
        (3, False, False, "_nvfp4_mma_kernel"),
        (8, True, False, "_nvfp4_mma_vec_kernel"),
        (30, True, False, "_nvfp4_mma_rows_kernel"),
        (40, False, False, "_nvfp4_mma_rows_kernel"),
        (30, True, True, "_nvfp4_mma_wide_kernel"),
    ],
)
def test_linear_with_ready_scales(emulated_ptx: None, m: int, vec: bool, wide: bool, kernel: str) -> None:
    """`ready` (TileConfig.mma_ready): after `nvfp4_mma_scales.make_ready` (every code and scale byte, the zero-scale
    blocks' codes zeroed) each linear kernel reading the int8 ready bytes gives the same outputs as before from the
    UE4M3 bytes: the pointer's type picked the one-instruction decode, and it is the same pair. Without ready bytes
    `ready` falls back to the UE4M3 ones."""
    w = random_nvfp4(80, 384, seeded(40 + m), (48, 32))
    x = (torch.randn(m, 384, generator=torch.Generator().manual_seed(40 + m)) * 0.5).to(torch.bfloat16)
    want = torch.full((m, 80), float("nan"))
    nm.launch_linear(x, w, want, num_warps=2, split_k=2, vec=vec, wide=wide, ready=True)  # none made yet
    nvfp4_mma_scales.make_ready(w)
    got = torch.full((m, 80), float("nan"))
    spy = LaunchSpy(getattr(nm, kernel))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, kernel, spy)
        nm.launch_linear(x, w, got, num_warps=2, split_k=2, vec=vec, wide=wide, ready=True)
    assert spy.launches == 1 and torch.equal(got, want)


# silu(gate) of a very negative gate: exp(-gate) overflows to inf in the interpreter, which gives the right -0.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("vec,wide,l2", [(False, False, 0), (True, False, 2), (True, True, 2)])
def test_moe_with_ready_scales(emulated_ptx: None, l2_requests: list[int], vec: bool, wide: bool, l2: int) -> None:
    """`ready` (MoEConfig.mma_ready) in the MoE's gate_up and down, 8- and 16-byte, with L2 requests and the wide
    tiles: the same h and y as from the UE4M3 bytes, with zero scales planted in every expert."""
    w13 = random_experts(5, 40, 768, seed=51)
    w2 = random_experts(5, 68, 768, seed=52)  # [E, 136, 768]
    for w in (w13, w2):
        w.scales[:, 1, 0], w.scales[:, 2, 3] = 0x7F, 0x00
    ids = _routing().reshape(-1).contiguous()
    x = (torch.randn(10, 768, generator=torch.Generator().manual_seed(53)) * 0.5).to(torch.bfloat16)
    hh = (torch.randn(30, 768, generator=torch.Generator().manual_seed(54)) * 0.5).to(torch.bfloat16)
    outs = []
    for step in range(2):
        if step:
            nvfp4_mma_scales.make_ready(w13)
            nvfp4_mma_scales.make_ready(w2)
        h = torch.full((30, 40), float("nan"))
        nm.launch_moe_gate_up(x, ids, w13, h, 3, 2, vec=vec, l2_ahead=l2, wide=wide, ready=True)
        y = torch.full((30, 136), float("nan"))
        nm.launch_moe_down(hh, ids, w2, y, num_warps=2, vec=vec, l2=l2, wide=wide, ready=True)
        outs.append((h, y))
    assert not torch.isnan(outs[0][0]).any() and not torch.isnan(outs[0][1]).any()
    assert torch.equal(outs[1][0], outs[0][0]) and torch.equal(outs[1][1], outs[0][1])


def _stacked(w: NVFP4Weight) -> NVFP4Weight:
    """A 2-D NVFP4 weight as a stack of one expert."""
    return NVFP4Weight(w.qweight[None], w.scales[None], w.global_scale[None], w.segments)


@pytest.mark.parametrize(
    "ready,perm,first,l2",
    [(False, False, False, 2), (True, False, False, 2), (True, True, True, 2), (True, True, True, -1)],
)
def test_moe_with_the_shared_expert_in_its_programs(
    emulated_ptx: None, l2_requests: list[int], ready: bool, perm: bool, first: bool, l2: int
) -> None:
    """MoEConfig.mma_shared: the wide gate_up and down launches with the shared expert (I_s twice the experts' I)
    in programs of their own give the routed h and y bit for bit as without it, and the shared expert's hs and ys bit
    for bit as the same kernels give it run as a stack of one expert that every token routes to (10 tokens: a full
    group of 8 and a part); with ready scale bytes too (both weights need them, or neither reads them). With perm
    (MoEConfig.mma_perm_h) the gate_up writes h and hs in the MMA's order (`perm_columns` of the same values) and the
    down, reading them so, gives the same bits without its PRMTs. With first (MoEConfig.mma_shared_first) the shared
    expert's programs come first in the grids: the same bits again; so with the gate_up asking L2 for all its lines
    at once (l2 -1, `L2_ALL`), which then asks for the shared expert's too."""
    w13 = random_experts(5, 40, 768, seed=61)  # [5, 80, 768]
    w2 = random_experts(5, 68, 256, seed=62)  # [5, 136, 256]
    gate_up = random_nvfp4(160, 768, seeded(63), (80, 80))  # I_s 80
    down = random_nvfp4(136, 512, seeded(64), (136,))  # K_s 512: two of the experts' K
    ids = _routing().reshape(-1).contiguous()  # 10 tokens, 3 slots, 5 experts
    x = (torch.randn(10, 768, generator=seeded(65)) * 0.5).to(torch.bfloat16)
    hh = (torch.randn(30, 256, generator=seeded(66)) * 0.5).to(torch.bfloat16)
    hs_in = (torch.randn(10, 512, generator=seeded(67)) * 0.5).to(torch.bfloat16)
    if ready:
        for w in (w13, w2, gate_up, down):
            nvfp4_mma_scales.make_ready(w)
    every = torch.zeros(10, dtype=torch.int64)  # each token to the one shared "expert"

    h_want = torch.full((30, 40), float("nan"))
    nm.launch_moe_gate_up(x, ids, w13, h_want, 3, 2, vec=True, l2_ahead=2, wide=True, ready=ready)
    hs_want = torch.full((10, 80), float("nan"))
    nm.launch_moe_gate_up(x, every, _stacked(gate_up), hs_want, 1, 2, vec=True, l2_ahead=2, wide=True, ready=ready)
    h, hs = torch.full((30, 40), float("nan")), torch.full((10, 80), float("nan"))
    name = "_moe_gate_up_mma_wide_shared_first_kernel" if first else "_moe_gate_up_mma_wide_shared_kernel"
    spy = LaunchSpy(getattr(nm, name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, name, spy)
        nm.launch_moe_gate_up(
            x, ids, w13, h, 3, 2, vec=True, l2_ahead=l2, wide=True, ready=ready, shared=(gate_up, hs), perm=perm,
            first=first,
        )  # fmt: skip
    assert spy.launches == 1
    if l2 == nm.L2_ALL:  # every line of the shared gate_up's codes too
        q = gate_up.qweight
        off = np.array(l2_requests, dtype=np.int64) - q.data_ptr()
        off = off[(off >= 0) & (off < q.numel())]
        assert {(int(o) // q.stride(0), int(o) % q.stride(0) // 128) for o in off} == {
            (r, ln) for r in range(160) for ln in range(3)
        }
    if perm:
        h_want, hs_want = nm.perm_columns(h_want), nm.perm_columns(hs_want)
    assert not torch.isnan(h_want).any() and torch.equal(h, h_want)
    assert not torch.isnan(hs_want).any() and torch.equal(hs, hs_want)

    y_want = torch.full((30, 136), float("nan"))
    nm.launch_moe_down(hh, ids, w2, y_want, num_warps=2, vec=True, l2=2, wide=True, ready=ready)
    ys_want = torch.full((10, 136), float("nan"))
    nm.launch_moe_down(hs_in, every, _stacked(down), ys_want, num_warps=2, vec=True, l2=2, wide=True, ready=ready)
    y, ys = torch.full((30, 136), float("nan")), torch.full((10, 136), float("nan"))
    name = "_moe_down_mma_wide_shared_first_kernel" if first else "_moe_down_mma_wide_shared_kernel"
    spy = LaunchSpy(getattr(nm, name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, name, spy)
        hh_in, hs_down = (nm.perm_columns(hh), nm.perm_columns(hs_in)) if perm else (hh, hs_in)
        nm.launch_moe_down(
            hh_in,
            ids,
            w2,
            y,
            num_warps=2,
            vec=True,
            l2=2,
            wide=True,
            ready=ready,
            shared=(down, hs_down, ys),
            perm=perm,
            first=first,
        )
    assert spy.launches == 1
    assert not torch.isnan(y_want).any() and torch.equal(y, y_want)
    assert not torch.isnan(ys_want).any() and torch.equal(ys, ys_want)
    # and against float64: the shared expert's y as FP32 accumulation gives it
    l1 = hs_in.double().abs() @ down.dequantize(torch.float64, with_global=True).abs().T
    _close_to_exact(ys, _exact(hs_in, down), l1)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("l2", [2, -1])
def test_moe_launches_with_programs_for_the_experts_in_use(emulated_ptx: None, l2_requests: list[int], l2: int) -> None:
    """`used` (MoEConfig.mma_used_experts) on the shared-expert launches: grids of the shared expert's programs and
    min(E, pairs) expert slots instead of E (12 experts, 3 tokens top-2: 6 slots for the 4 experts in use, two of
    them idle), the same h, hs, y and ys bit for bit as the shared-first launches with a program an expert; with the
    gate_up's L2 requests in the loop or all at once (`L2_ALL`). Without the shared expert it is refused."""
    w13 = random_experts(12, 40, 768, seed=91)  # [12, 80, 768]
    w2 = random_experts(12, 68, 256, seed=92)  # [12, 136, 256]
    gate_up = random_nvfp4(160, 768, seeded(93), (80, 80))  # I_s 80: two parts
    down = random_nvfp4(136, 512, seeded(94), (136,))
    ids = torch.tensor([[0, 5], [5, 9], [11, 0]]).reshape(-1).contiguous()
    x = (torch.randn(3, 768, generator=seeded(95)) * 0.5).to(torch.bfloat16)
    hh = (torch.randn(6, 256, generator=seeded(96)) * 0.5).to(torch.bfloat16)
    hs_in = (torch.randn(3, 512, generator=seeded(97)) * 0.5).to(torch.bfloat16)
    outs = {}
    for used in (False, True):
        h, hs = torch.full((6, 40), float("nan")), torch.full((3, 80), float("nan"))
        y, ys = torch.full((6, 136), float("nan")), torch.full((3, 136), float("nan"))
        suffix = "_used_kernel" if used else "_first_kernel"
        spies = [LaunchSpy(getattr(nm, f"_moe_{part}_mma_wide_shared{suffix}")) for part in ("gate_up", "down")]
        with pytest.MonkeyPatch.context() as mp:
            for part, spy in zip(("gate_up", "down"), spies, strict=True):
                mp.setattr(nm, f"_moe_{part}_mma_wide_shared{suffix}", spy)
            nm.launch_moe_gate_up(
                x, ids, w13, h, 2, 2, vec=True, l2_ahead=l2, wide=True, shared=(gate_up, hs), perm=True, first=True,
                used=used,
            )  # fmt: skip
            nm.launch_moe_down(
                nm.perm_columns(hh), ids, w2, y, num_warps=2, vec=True, l2=2, wide=True,
                shared=(down, nm.perm_columns(hs_in), ys), perm=True, first=True, used=used,
            )  # fmt: skip
        # programs a tile: the shared expert's (2 parts x 1 group of 8 tokens; 1 for the down), then the experts'
        assert [g[1] for spy in spies for g in spy.grids] == ([2 + 6, 1 + 6] if used else [2 + 12, 1 + 12])
        outs[used] = (h, hs, y, ys)
    for want, got in zip(outs[False], outs[True], strict=True):
        assert not torch.isnan(want).any() and torch.equal(got, want)
    with pytest.raises(ValueError, match="used come with the shared"):
        nm.launch_moe_gate_up(x, ids, w13, h, 2, 2, vec=True, wide=True, used=True)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_fused_moe_passes_l2_all_to_the_wide_gate_up(
    emulated_ptx: None, l2_requests: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MoEConfig.mma_l2_all through `fused_moe`, in the H200's config for 9+ tokens (the wide MMA launches with the
    shared expert's programs first, h in the MMA's order): the gate_up gets `L2_ALL`, asks L2 for lines of the
    experts' and the shared expert's codes, and the output has the same bits as with mma_l2_ahead 2, also with
    programs only for the experts in use (mma_used_experts) (the interpreter's
    BF16 epilogues are not faithful, so closeness to `moe_ref` is the GPU test's). H 256, I 256, a shared expert of
    512, 10 tokens top-3 of 5 experts."""
    import dataclasses

    from flint_kernels import moe_triton as mt

    w13, w2 = random_experts(5, 256, 256, seed=81), random_experts(5, 128, 256, seed=82)  # [5, 512, 256], [5, 256, 256]
    shared = (random_nvfp4(1024, 256, seeded(83), (512, 512)), random_nvfp4(256, 512, seeded(84), (256,)))
    ids = _routing()
    tw = torch.rand(10, 3, generator=seeded(85))
    tw = tw / tw.sum(-1, keepdim=True)
    x = (torch.randn(10, 256, generator=seeded(86)) * 0.5).to(torch.bfloat16)
    cfg = mt.MoEConfig(
        1, 16, 256, 32, 256, False, 2, 1, expert_major=True, mma=True, mma_prefetch=True, mma_down=True,
        mma_vec=True, mma_l2_ahead=2, mma_down_l2=2, mma_wide=True, mma_down_wide=True, mma_shared=True,
        mma_perm_h=True, mma_shared_first=True,
    )  # fmt: skip
    # `_fits` declines the interpreter (it runs no PTX); `emulated_ptx` stands in for it here
    monkeypatch.setattr(nm, "_fits", lambda a, w: a.dim() == 2 and nm._weight_fits(w, a.shape[1]))
    assert mt._mma_shared(cfg, x, w13, w2, shared)
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg, shared=shared)
    l2_requests.clear()
    calls = []
    real = nm.launch_moe_gate_up
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, "launch_moe_gate_up", lambda *a, **k: calls.append(a[8]) or real(*a, **k))
        got = mt.fused_moe(
            x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(cfg, mma_l2_all=True), shared=shared
        )
    assert calls == [nm.L2_ALL]
    assert not torch.isnan(want).any() and torch.equal(got, want)
    # and with programs only for the experts in use (mma_used_experts): the same bits again
    in_use = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=64, shared=shared,
        config=dataclasses.replace(cfg, mma_l2_all=True, mma_used_experts=True),
    )  # fmt: skip
    assert torch.equal(in_use, want)
    addr = np.array(l2_requests, dtype=np.int64)
    for q in (w13.qweight, shared[0].qweight):  # every expert with pairs, and the shared expert, asked for
        assert ((addr >= q.data_ptr()) & (addr < q.data_ptr() + q.numel())).any()


def test_perm_columns_is_the_mma_order() -> None:
    """Each 8 values v0..v7 as v0 v4 v1 v5 v2 v6 v3 v7, and the PTX step for it has no PRMT while the plain one has two
    an MMA (16 a K step)."""
    x = torch.arange(24).reshape(1, 24)
    assert nm.perm_columns(x).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 16, 20, 17, 21, 18,
                                            22, 19, 23]]  # fmt: skip
    assert nm.step_asm().count("prmt") == 16 and "prmt" not in nm.step_asm(perm=True)
    assert nm.step_asm(perm=True).count("mma.sync") == nm.step_asm().count("mma.sync") == 8


def test_the_shared_expert_launches_refuse_wrong_shapes() -> None:
    """The shared expert's weights and outputs are checked before any launch, with the shapes named."""
    w13 = random_experts(5, 40, 768, seed=61)
    ids = _routing().reshape(-1).contiguous()
    x = torch.zeros(10, 768, dtype=torch.bfloat16)
    gate_up = random_nvfp4(120, 768, seeded(63), (60, 60))  # I_s 60: not a multiple of 40
    with pytest.raises(ValueError, match="I_s a multiple of 40"):
        nm.launch_moe_gate_up(x, ids, w13, torch.empty(30, 40), 3, 2, vec=True, wide=True,
                              shared=(gate_up, torch.empty(10, 60)))  # fmt: skip
    w2 = random_experts(5, 68, 256, seed=62)
    down = random_nvfp4(136, 512, seeded(64), (136,))
    hh, hs = torch.zeros(30, 256, dtype=torch.bfloat16), torch.zeros(10, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ys \\[T, 136\\]"):
        nm.launch_moe_down(
            hh, ids, w2, torch.empty(30, 136), 2, vec=True, wide=True, shared=(down, hs, torch.empty(10, 100))
        )
    for flag in ("perm", "first"):
        with pytest.raises(ValueError, match="come with the shared expert's programs"):
            nm.launch_moe_down(hh, ids, w2, torch.empty(30, 136), 2, vec=True, wide=True, **{flag: True})
        with pytest.raises(ValueError, match="come with the shared expert's programs"):
            nm.launch_moe_gate_up(x, ids, w13, torch.empty(30, 40), 3, 2, vec=True, wide=True, **{flag: True})


def test_decode_is_exact_for_each_code(emulated_ptx: None) -> None:
    """One-hot x: every E2M1 code (both nibbles of a byte, every pair position) comes out as its dequantised value
    exactly, so the decode itself is exact, not just close."""
    n, k = 16, 128
    codes = torch.arange(n * k, dtype=torch.int64).reshape(n, k) % 16
    q = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    s = torch.full((n, k // 16), 0x38, dtype=torch.uint8)  # E4M3 1.0
    w = NVFP4Weight(q, s, torch.ones(1), (n,))
    dense = w.dequantize(torch.float32)
    for col in (0, 1, 2, 5, 7, 8, 33, 127):
        x = torch.zeros(1, k, dtype=torch.bfloat16)
        x[0, col] = 1.0
        out = torch.full((1, n), float("nan"))
        nm.launch_linear(x, w, out, num_warps=1, split_k=1)
        assert torch.equal(out[0], dense[:, col]), col


def _routing() -> torch.Tensor:
    """10 tokens, distinct top-3 of 5 experts: expert 1 gets 10 pairs (two MMA chunks of 8), expert 4 none."""
    others = torch.tensor([[0, 2], [2, 3], [3, 0], [0, 3], [2, 0], [3, 2], [0, 2], [2, 3], [3, 0], [0, 3]])
    return torch.cat([others[:, :1], torch.ones(10, 1, dtype=torch.int64), others[:, 1:]], dim=1)


def _assert_h_exact(h: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, w13: NVFP4Weight) -> None:
    """Every pair's h [pairs, I] written, and silu(gate) * up against float64 (top-3, I = h's width)."""
    assert not torch.isnan(h).any(), "a pair or column was never written"
    inter = h.shape[1]
    for p, e in enumerate(ids.reshape(-1).tolist()):
        gu = _exact(x[p // 3][None], w13.select(e))[0]
        want = gu[:inter] / (1 + torch.exp(-gu[:inter])) * gu[inter:]
        assert torch.allclose(h[p].double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item()), p


def _gate_up_twin(
    twin: str, l2_requests: list[int], seed: int, prefetch: bool, **kw: object
) -> tuple[NVFP4Weight, torch.Tensor, torch.Tensor, torch.Tensor, LaunchSpy]:
    """One launch of the VEC gate_up twin `twin` (its options `kw`) against the VEC kernel on the same random experts
    (I = 40, K of 6 steps) and routing, which asks L2 for nothing: h equal bit for bit. Returns (w13, flat ids, x,
    the twin's h, its launch spy)."""
    w13 = random_experts(5, 40, 768, seed=seed)
    ids = _routing().reshape(-1).contiguous()
    x = (torch.randn(10, 768, generator=torch.Generator().manual_seed(seed + 1)) * 0.5).to(torch.bfloat16)
    want = torch.full((30, 40), float("nan"))
    nm.launch_moe_gate_up(x, ids, w13, want, 3, 2, prefetch=prefetch, vec=True)
    assert not l2_requests
    got = torch.full((30, 40), float("nan"))
    spy = LaunchSpy(getattr(nm, twin))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, twin, spy)
        nm.launch_moe_gate_up(x, ids, w13, got, 3, 2, prefetch=prefetch, vec=True, **kw)
    assert spy.launches == 1 and torch.equal(got, want)
    return w13, ids, x, got, spy


def _assert_later_steps(l2_requests: list[int], qweight: torch.Tensor, l2_ahead: int, steps: int = 6) -> None:
    """Some lines were asked for, all inside the expert codes, each the line of a K step l2_ahead or more on (at most
    the last of `steps`; a row's K step is 64 code bytes), the last step's among them."""
    assert l2_requests
    offsets = np.array(l2_requests) - qweight.data_ptr()
    assert ((offsets >= 0) & (offsets < qweight.numel())).all()
    asked = (offsets % qweight.stride(-2)) // 64
    last = steps - 1
    assert set(asked.tolist()) <= {min(s, last) for s in range(l2_ahead, steps + l2_ahead)} and last in asked


# silu(gate) of a very negative gate: exp(-gate) overflows to inf in the interpreter, which gives the right -0.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("vec,prefetch", [(False, False), (False, True), (True, False)], ids=["8B", "prefetch", "16B"])
def test_moe_gate_up_kernel(emulated_ptx: None, prefetch: bool, vec: bool) -> None:
    """`_moe_gate_up_mma_kernel`: h = silu(gate) * up of every pair against float64, I = 40 (a ragged column tile),
    K of two steps."""
    w13 = random_experts(5, 40, 256, seed=5)
    ids = _routing()
    x = (torch.randn(10, 256, generator=torch.Generator().manual_seed(8)) * 0.5).to(torch.bfloat16)
    h = torch.full((30, 40), float("nan"))
    with _spied("_moe_gate_up_mma_kernel", vec) as spy:
        nm.launch_moe_gate_up(x, ids.reshape(-1).contiguous(), w13, h, 3, 2, prefetch=prefetch, vec=vec)
    assert spy.launches == 1
    _assert_h_exact(h, x, ids, w13)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize(
    "warps,warp_k,l2_ahead,prefetch", [(2, 2, 0, False), (4, 2, 2, True), (4, 4, 0, True), (4, 2, 4, False)]
)
def test_moe_gate_up_with_the_warps_splitting_k(
    emulated_ptx: None, l2_requests: list[int], warps: int, warp_k: int, l2_ahead: int, prefetch: bool
) -> None:
    """`_moe_gate_up_mma_ks_kernel` (MoEConfig.mma_warp_k): h of every pair against float64 with the warps splitting
    K (I = 40: ragged column tiles of 8 / 16 columns; K of 8 steps, so each part has 2-4; expert 1's 10 pairs take
    two chunks), the L2 requests only for later steps of the warp's own part, and bad splits named."""
    w13 = random_experts(5, 40, 1024, seed=21)
    ids = _routing()
    x = (torch.randn(10, 1024, generator=torch.Generator().manual_seed(22)) * 0.5).to(torch.bfloat16)
    h = torch.full((30, 40), float("nan"))
    spy = LaunchSpy(nm._moe_gate_up_mma_ks_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, "_moe_gate_up_mma_ks_kernel", spy)
        nm.launch_moe_gate_up(
            x, ids.reshape(-1).contiguous(), w13, h, 3, warps, prefetch=prefetch, vec=True, l2_ahead=l2_ahead,
            warp_k=warp_k,
        )  # fmt: skip
    assert spy.launches == 1
    _assert_h_exact(h, x, ids, w13)
    if l2_ahead:  # each part asks for its own later lines: step s of part q is K step q * parts + s
        offsets = np.array(l2_requests) - w13.qweight.data_ptr()
        steps = (offsets % w13.qweight.stride(1)) // 64
        per = 8 // warp_k
        asked = {q * per + min(s, per - 1) for q in range(warp_k) for s in range(l2_ahead, 2 * per)}
        assert set(steps.tolist()) <= asked
        assert {q * per + per - 1 for q in range(warp_k)} <= set(steps.tolist())
    else:
        assert not l2_requests
    for bad in (3, 8):
        with pytest.raises(ValueError, match="warp_k"):
            nm.launch_moe_gate_up(x, ids.reshape(-1).contiguous(), w13, h, 3, 4, vec=True, warp_k=bad)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("l2_ahead", [2, 4])
def test_moe_gate_up_asking_l2_ahead(emulated_ptx: None, l2_requests: list[int], l2_ahead: int, prefetch: bool) -> None:
    """`_moe_gate_up_mma_l2_kernel` (MoEConfig.mma_l2_ahead): the same h as the VEC kernel, bit for bit, and every
    line it asks L2 for is one of the expert codes a later K step of the same rows loads (K of 6 steps, so the
    requests both run ahead and stop at the last step)."""
    w13, ids, x, got, _ = _gate_up_twin(
        "_moe_gate_up_mma_l2_kernel", l2_requests, 11, prefetch=prefetch, l2_ahead=l2_ahead
    )  # fmt: skip
    _assert_later_steps(l2_requests, w13.qweight, l2_ahead)
    with pytest.raises(ValueError, match="even number"):
        nm.launch_moe_gate_up(x, ids, w13, got, 3, 2, vec=True, l2_ahead=3)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("l2_ahead,prefetch", [(0, False), (0, True), (2, True), (4, False)])
def test_moe_gate_up_wide_kernel(emulated_ptx: None, l2_requests: list[int], l2_ahead: int, prefetch: bool) -> None:
    """`_moe_gate_up_mma_wide_kernel` (MoEConfig.mma_wide): 16 columns a warp, two tiles sharing x's loads. The same
    h as the VEC kernel, bit for bit (each tile's MMAs run in the same order), with I = 40 in programs of 32 columns
    (the second program's tile two and warp two past I); its L2 requests only for later steps of the warp's own rows
    (K of 6 steps); wide with the warps splitting K refused."""
    w13, ids, x, got, spy = _gate_up_twin(
        "_moe_gate_up_mma_wide_kernel", l2_requests, 31, prefetch=prefetch, l2_ahead=l2_ahead, wide=True
    )  # fmt: skip
    assert spy.grids == [(2, 5)]
    _assert_h_exact(got, x, ids.reshape(10, 3), w13)
    if l2_ahead:
        _assert_later_steps(l2_requests, w13.qweight, l2_ahead)
    else:
        assert not l2_requests
    with pytest.raises(ValueError, match="wide and warp_k"):
        nm.launch_moe_gate_up(x, ids, w13, got, 3, 4, vec=True, warp_k=2, wide=True)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("prefetch", [False, True])
def test_moe_gate_up_wide_asking_l2_for_all_its_lines(
    emulated_ptx: None, l2_requests: list[int], prefetch: bool
) -> None:
    """`l2_ahead=L2_ALL` (MoEConfig.mma_l2_all) on the wide gate_up: the same h as the VEC kernel, bit for bit,
    and its L2 requests are every code line of every gate and up row of each expert with pairs, none of expert 4's
    (it has none), plus scale lines of those experts only; the other kernels refuse it. I = 40 (rows 0-79), K of 6
    steps: 3 code lines a row."""
    w13, ids, x, got, _ = _gate_up_twin(
        "_moe_gate_up_mma_wide_kernel", l2_requests, 33, prefetch=prefetch, l2_ahead=nm.L2_ALL, wide=True
    )  # fmt: skip
    _assert_h_exact(got, x, ids.reshape(10, 3), w13)
    q, sc = w13.qweight, w13.scales
    addr = np.array(l2_requests, dtype=np.int64)
    codes = (addr >= q.data_ptr()) & (addr < q.data_ptr() + q.numel())
    scales = (addr >= sc.data_ptr()) & (addr < sc.data_ptr() + sc.numel())
    assert (codes | scales).all() and scales.any()
    off = addr[codes] - q.data_ptr()
    expert, row, line = off // q.stride(0), (off % q.stride(0)) // q.stride(1), (off % q.stride(1)) // 128
    asked = set(zip(expert.tolist(), row.tolist(), line.tolist(), strict=True))
    assert asked == {(e, r, ln) for e in range(4) for r in range(80) for ln in range(3)}
    scale_rows = (addr[scales] - sc.data_ptr()) // sc.stride(1)  # the scale rows asked for, across experts
    assert set((scale_rows // sc.shape[1]).tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="wide gate_up"):
        nm.launch_moe_gate_up(x, ids, w13, got, 3, 2, vec=True, l2_ahead=nm.L2_ALL)
    with pytest.raises(ValueError, match="even number"):
        nm.launch_moe_gate_up(x, ids, w13, got, 3, 2, vec=True, l2_ahead=-2, wide=True)


@pytest.mark.parametrize("vec,prefetch", [(False, False), (False, True), (True, False)], ids=["8B", "prefetch", "16B"])
def test_moe_down_kernel(emulated_ptx: None, prefetch: bool, vec: bool) -> None:
    """`_moe_down_mma_kernel`: each pair's y against float64, N = 136 rows (a ragged row tile), two segments, K of
    two steps."""
    w2 = random_experts(5, 68, 256, seed=9)  # [E, 136, 256], segments (68, 68)
    ids = _routing()
    h = (torch.randn(30, 256, generator=torch.Generator().manual_seed(10)) * 0.5).to(torch.bfloat16)
    y = torch.full((30, 136), float("nan"))
    with _spied("_moe_down_mma_kernel", vec) as spy:
        nm.launch_moe_down(h, ids.reshape(-1).contiguous(), w2, y, num_warps=2, prefetch=prefetch, vec=vec)
    assert spy.launches == 1
    for p, e in enumerate(ids.reshape(-1).tolist()):
        we = w2.select(e)
        l1 = h[p].double().abs()[None] @ we.dequantize(torch.float64, with_global=True).abs().T
        _close_to_exact(y[p][None], _exact(h[p][None], we), l1)


@pytest.mark.parametrize("mode", [1, 2])
def test_moe_down_asking_l2(emulated_ptx: None, l2_requests: list[int], mode: int) -> None:
    """`_moe_down_mma_l2_kernel` (MoEConfig.mma_down_l2): the same y as the VEC kernel, bit for bit. Mode 1 asks
    only for lines a later K step of the same expert's rows loads; mode 2 asks, before the PDL wait, for every line
    of every row of each expert with pairs, and for none of expert 4's (it has none). K of 6 steps, 3 lines a row."""
    w2 = random_experts(5, 68, 768, seed=21)  # [E, 136, 768], segments (68, 68)
    ids = _routing().reshape(-1).contiguous()
    h = (torch.randn(30, 768, generator=torch.Generator().manual_seed(22)) * 0.5).to(torch.bfloat16)
    want = torch.full((30, 136), float("nan"))
    nm.launch_moe_down(h, ids, w2, want, num_warps=2, vec=True)
    assert not l2_requests and not torch.isnan(want).any()
    got = torch.full((30, 136), float("nan"))
    spy = LaunchSpy(nm._moe_down_mma_l2_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, "_moe_down_mma_l2_kernel", spy)
        nm.launch_moe_down(h, ids, w2, got, num_warps=2, vec=True, l2=mode)
    assert spy.launches == 1 and torch.equal(got, want)
    q = w2.qweight
    offsets = np.array(l2_requests) - q.data_ptr()
    assert ((offsets >= 0) & (offsets < q.numel())).all()
    expert, row, line = offsets // q.stride(0), (offsets % q.stride(0)) // q.stride(1), (offsets % q.stride(1)) // 128
    if mode == 1:
        assert set(line.tolist()) == {1, 2}  # the lines of steps 2-5 (step 0's line is loaded first)
    else:
        asked = set(zip(expert.tolist(), row.tolist(), line.tolist(), strict=True))
        assert asked == {(e, r, ln) for e in range(4) for r in range(136) for ln in range(3)}
    with pytest.raises(ValueError, match="0 \\(off\\)"):
        nm.launch_moe_down(h, ids, w2, got, num_warps=2, vec=True, l2=3)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_moe_down_wide_kernel(emulated_ptx: None, l2_requests: list[int], mode: int) -> None:
    """`_moe_down_mma_wide_kernel` (MoEConfig.mma_down_wide): 32 rows a warp, two tiles sharing h's loads. The same y
    as the VEC kernel, bit for bit, with N = 136 in programs of 64 rows (the last with one real half-tile); its L2
    requests as the VEC kernel's modes (mode 2: every line of every row of the experts with pairs, none of expert
    4's)."""
    w2 = random_experts(5, 68, 768, seed=41)  # [E, 136, 768], segments (68, 68)
    ids = _routing().reshape(-1).contiguous()
    h = (torch.randn(30, 768, generator=torch.Generator().manual_seed(42)) * 0.5).to(torch.bfloat16)
    want = torch.full((30, 136), float("nan"))
    nm.launch_moe_down(h, ids, w2, want, num_warps=2, vec=True)
    got = torch.full((30, 136), float("nan"))
    spy = LaunchSpy(nm._moe_down_mma_wide_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, "_moe_down_mma_wide_kernel", spy)
        nm.launch_moe_down(h, ids, w2, got, num_warps=2, vec=True, l2=mode, wide=True)
    assert spy.launches == 1 and spy.grids == [(3, 5)]
    assert not torch.isnan(got).any() and torch.equal(got, want)
    q = w2.qweight
    offsets = np.array(l2_requests, dtype=np.int64) - q.data_ptr()
    assert ((offsets >= 0) & (offsets < q.numel())).all()
    expert, row, line = offsets // q.stride(0), (offsets % q.stride(0)) // q.stride(1), (offsets % q.stride(1)) // 128
    if mode == 0:
        assert not l2_requests
    elif mode == 1:
        assert set(line.tolist()) == {1, 2}
    else:
        asked = set(zip(expert.tolist(), row.tolist(), line.tolist(), strict=True))
        assert asked == {(e, r, ln) for e in range(4) for r in range(136) for ln in range(3)}


# silu(gate) of a very negative gate: exp(-gate) overflows to inf in the interpreter, which gives the right -0.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_moe_kernels_compose_to_moe_ref(emulated_ptx: None) -> None:
    """Gate_up, h rounded to BF16, down, then the slot sum `_moe_reduce_kernel` does, against `moe_ref`."""
    w13 = random_experts(5, 128, 128, seed=5)
    w2 = random_experts(5, 64, 128, seed=6)  # [E, 128, 128]
    w13 = NVFP4Weight(w13.qweight, w13.scales, w13.global_scale / 64, w13.segments)
    w2 = NVFP4Weight(w2.qweight, w2.scales, w2.global_scale / 64, w2.segments)
    ids = _routing()
    tw = torch.rand(10, 3, generator=torch.Generator().manual_seed(7))
    x = (torch.randn(10, 128, generator=torch.Generator().manual_seed(8)) * 0.5).to(torch.bfloat16)
    flat = ids.reshape(-1).contiguous()
    h = torch.empty(30, 128)
    nm.launch_moe_gate_up(x, flat, w13, h, topk=3, num_warps=2)
    y = torch.empty(30, 128)
    nm.launch_moe_down(h.to(torch.bfloat16), flat, w2, y, num_warps=2)
    out = (y.to(torch.bfloat16).float().reshape(10, 3, -1) * tw[:, :, None]).sum(1).to(torch.bfloat16)
    want = moe_ref(x, tw, ids, w13, w2)
    assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


def _close_in_bf16(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: NVFP4Weight) -> None:
    """Equal up to FP32 summation order and the one rounding to BF16: within 2 BF16 ulps of the larger value plus
    2**-16 of the sum of |products| (what reordered FP32 sums can move a result that cancels)."""
    g, r = got.float().cpu(), want.float().cpu()
    assert not torch.isnan(g).any(), "an output was never written"
    l1 = (x.float().abs().cpu() @ w.dequantize(torch.float32).abs().cpu().T) * w.column_scale().cpu()
    tol = 2.0**-7 * torch.maximum(g.abs(), r.abs()) + 2.0**-16 * l1
    bad = (g - r).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} differ, e.g. {g[bad][:4]} vs {r[bad][:4]}"


def moe_gate_up_ref(x: torch.Tensor, ids: torch.Tensor, w13: NVFP4Weight) -> torch.Tensor:
    """h of every (token, slot) pair, as `moe_ref` computes it."""
    rows = [silu_and_mul_ref(linear_ref(x[p // ids.shape[1]][None], w13.select(int(e))))[0]
            for p, e in enumerate(ids.reshape(-1).tolist())]  # fmt: skip
    return torch.stack(rows)


def random_experts(n_exp: int, inter: int, k: int, seed: int) -> NVFP4Weight:
    parts = [random_nvfp4(2 * inter, k, seeded(seed + e), (inter, inter)) for e in range(n_exp)]
    return NVFP4Weight(
        torch.stack([p.qweight for p in parts]),
        torch.stack([p.scales for p in parts]),
        torch.stack([p.global_scale for p in parts]),
        (inter, inter),
    )


def test_bad_inputs_name_the_problem() -> None:
    w = random_nvfp4(64, 256, seeded(1), (64,))
    with pytest.raises(ValueError, match="1-64 aligned rows"):
        nm.linear(torch.zeros(65, 256, dtype=torch.bfloat16), w)
    assert not nm.supported(torch.zeros(2, 256, dtype=torch.bfloat16), w)  # not on a GPU


def test_kernels_compile_for_sm90_one_element_a_thread() -> None:
    """sm_90: the PTX's operands are one element a thread, thread t holding element t (the inline asm's tensors all
    in the 1-D blocked layout of one element a thread, which the fragments assume); the linear kernels have no layout
    conversion at all and 8 HMMAs a K step; no spills; the VEC kernels load codes and x 16 bytes at a time (six
    LDG.E.128 a K step at least; the rows kernel 8 HMMAs a group of 8 rows a K step, 2 + 4 a group LDG.E.128); the
    same for the gate_up whose warps split K too (`_moe_gate_up_mma_ks_kernel`); the MoE's wide twins (two tiles a
    warp, 16 HMMAs a K step) in at most 128 registers a thread; with ready scale bytes (an int8 scale pointer) the K
    loops at least 10% shorter and free of spills; the shared expert's twins with its programs first in the grid the
    same K loop as without."""
    code = f"""
import re, sys
sys.path.insert(0, {str(BENCHMARKS)!r})
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flint_kernels import nvfp4_mma_triton as nm
from kernel_sass import disassemble, profile
common = dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*u8", gs_ptr="*fp32")  # the down has h_ptr for x_ptr
lin = dict(out_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32")
gate_up, down = dict(ids_ptr="*i64", h_ptr="*bf16"), dict(h_ptr="*bf16", ids_ptr="*i64", y_ptr="*bf16")
cases = [
    (nm._nvfp4_mma_kernel, lin, dict(SPLIT_K=1, NW=4, PREFETCH=False, PDL=True)),
    (nm._nvfp4_mma_kernel, lin, dict(SPLIT_K=4, NW=4, PREFETCH=True, PDL=True)),
    (nm._nvfp4_mma_vec_kernel, lin, dict(SPLIT_K=4, NW=4, PREFETCH=False, PDL=True)),
    (nm._nvfp4_mma_rows_kernel, lin, dict(SPLIT_K=4, NW=4, PDL=True, VEC=False, GROUPS=4)),
    (nm._nvfp4_mma_rows_kernel, lin, dict(SPLIT_K=4, NW=4, PDL=True, VEC=True, GROUPS=4)),
    (nm._nvfp4_mma_rows_kernel, lin, dict(SPLIT_K=4, NW=4, PDL=True, VEC=True, GROUPS=8)),
    (nm._nvfp4_mma_wide_kernel, lin, dict(SPLIT_K=4, NW=4, PDL=True, VEC=True)),
    (nm._moe_gate_up_mma_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True)),
    (nm._moe_gate_up_mma_vec_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True)),
    (nm._moe_gate_up_mma_l2_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True, L2_AHEAD=2)),
    (nm._moe_gate_up_mma_ks_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True, L2_AHEAD=2, KSPLIT=2)),
    (nm._moe_gate_up_mma_ks_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True, L2_AHEAD=0, KSPLIT=4)),
    (nm._moe_gate_up_mma_ks_kernel, gate_up, dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True, L2_AHEAD=2, KSPLIT=2)),
    (nm._moe_down_mma_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True)),
    (nm._moe_down_mma_vec_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True)),
    (nm._moe_down_mma_l2_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True, L2_MODE=1)),
    (nm._moe_down_mma_l2_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True, L2_MODE=2)),
    (nm._moe_gate_up_mma_wide_kernel, gate_up, dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True, L2_AHEAD=2)),
    (nm._moe_gate_up_mma_wide_kernel, gate_up, dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True, L2_AHEAD=0)),
    (nm._moe_down_mma_wide_kernel, down, dict(P_PAD=256, NW=8, PREFETCH=False, PDL=True, L2_MODE=2)),
]
ready = dict(s_ptr="*i8")  # the ready scale bytes (nvfp4_mma_scales): the same kernels, another pointer type
cases += [
    (nm._nvfp4_mma_vec_kernel, dict(lin, **ready), dict(SPLIT_K=4, NW=4, PREFETCH=False, PDL=True)),
    (nm._nvfp4_mma_wide_kernel, dict(lin, **ready), dict(SPLIT_K=4, NW=4, PDL=True, VEC=True)),
    (nm._moe_gate_up_mma_wide_kernel, dict(gate_up, **ready), dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True,
                                                                  L2_AHEAD=2)),
    (nm._moe_down_mma_wide_kernel, dict(down, **ready), dict(P_PAD=256, NW=8, PREFETCH=False, PDL=True, L2_MODE=2)),
]
# the wide twins with the shared expert's programs (MoEConfig.mma_shared), reading ready scale bytes as installed
shared = dict(sw_ptr="*u8", ss_ptr="*i8", sgs_ptr="*fp32", hs_ptr="*bf16", ys_ptr="*bf16", **ready)
cases += [
    (nm._moe_gate_up_mma_wide_shared_kernel, dict(gate_up, **shared), dict(P_PAD=256, NW=4, PREFETCH=True, PDL=True,
                                                                           L2_AHEAD=2, PERM=True)),
    (nm._moe_down_mma_wide_shared_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                     L2_MODE=2, PERM=False)),
    (nm._moe_down_mma_wide_shared_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                     L2_MODE=2, PERM=True)),
    # and with the shared expert's programs first in the grid (MoEConfig.mma_shared_first)
    (nm._moe_gate_up_mma_wide_shared_first_kernel, dict(gate_up, **shared), dict(P_PAD=256, NW=4, PREFETCH=True,
                                                                                 PDL=True, L2_AHEAD=2, PERM=True)),
    (nm._moe_down_mma_wide_shared_first_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                           L2_MODE=2, PERM=True)),
    # the gate_up asking L2 for all of its tiles' lines at once (L2_ALL) instead of two K steps ahead in the loop
    (nm._moe_gate_up_mma_wide_shared_first_kernel, dict(gate_up, **shared), dict(P_PAD=256, NW=4, PREFETCH=True,
                                                                                 PDL=True, L2_AHEAD=-1, PERM=True)),
    # programs only for the experts in use (MoEConfig.mma_used_experts)
    (nm._moe_gate_up_mma_wide_shared_used_kernel, dict(gate_up, **shared), dict(P_PAD=256, NW=4, PREFETCH=True,
                                                                                PDL=True, L2_AHEAD=2, PERM=True,
                                                                                E_BINS=512)),
    (nm._moe_down_mma_wide_shared_used_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                          L2_MODE=2, PERM=True, E_BINS=512)),
]
for fn, ptrs, cx in cases:
    ptrs = dict(common, **ptrs)
    sig = {{n: ptrs.get(n, "constexpr" if n in cx else "i32") for n in fn.arg_names}}
    src = ASTSource(fn=fn, signature=sig, constexprs={{(fn.arg_names.index(k),): v for k, v in cx.items()}})
    opts = {{"num_warps": cx["NW"], "num_stages": 1}}
    if "_ks_" in fn.__name__ or "_gate_up_mma_wide_" in fn.__name__:  # launched with their register cap
        opts["maxnreg"] = nm.KS_MAXNREG
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    ttgir = k.asm["ttgir"]
    layouts = dict(re.findall(r"^(#\\w+) = (.*)$", ttgir, re.M))
    nw = cx["NW"]
    one = "#ttg.blocked<{{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [" + str(nw) + "], order = [0]}}>"
    asm = [line for line in ttgir.splitlines() if "elementwise_inline_asm" in line]
    used = set().union(*(re.findall(r"tensor<" + str(32 * nw) + r"x\\w+, (#\\w+)>", line) for line in asm))
    identity = int(bool(asm) and all(layouts.get(u) == one for u in used))
    code, res = disassemble(k.asm["cubin"])
    hmma = sum("HMMA" in op for _, op in code)
    wide = sum("LDG.E.128" in op for _, op in code)
    l2 = sum("CCTL.E.PF2" in op for _, op in code)  # prefetch.global.L2 (CCTL.IVALL is a semaphore's acquire)
    # the twins splitting K across warps and the MoE's wide twins are VEC kernels, with L2 requests where L2_AHEAD
    # or L2_MODE asks for them
    twin = "_ks_" in fn.__name__ or fn.__name__.startswith("_moe_") and "_wide_" in fn.__name__
    asks = cx.get("L2_AHEAD", 0) or cx.get("L2_MODE", 0)
    name = fn.__name__ + ("_vec_" if cx.get("VEC") or twin else "") + ("_l2_" if twin and asks else "")
    name += "_ready" if ptrs["s_ptr"] == "*i8" else ""
    first = "_shared_first_kernel" in name
    used = "_shared_used_kernel" in name
    name = name.replace("_shared_first_kernel", "_shared_kernel").replace("_shared_used_kernel", "_shared_kernel")
    name += ("_perm" if cx.get("PERM") else "") + ("_first" if first else "") + ("_used" if used else "")
    name += "_all" if cx.get("L2_AHEAD") == nm.L2_ALL else ""
    spills = res.get("LOCAL", 0) + res.get("STACK", 0)
    loops = [(int(m.group(1)), i) for i, op in code for m in [re.search(r"\\bBRA\\b.*->(\\d+)", op)]
             if m and int(m.group(1)) <= i and any("HMMA" in code[j][1] for j in range(int(m.group(1)), i + 1))]
    lo, hi = min(loops, key=lambda ab: ab[1] - ab[0])  # the K loop: the innermost loop with the MMAs
    loop_spills = sum(("LDL" in op or "STL" in op) for i, op in code if lo <= i <= hi)
    # the linear's wide kernel runs one quad of groups against two weight tiles: 64 HMMAs a K step; the MoE's wide
    # kernels one group against two tiles: 16
    groups = cx.get("GROUPS", (2 if fn.__name__.startswith("_moe_") else 8) if "_wide_" in fn.__name__ else 1)
    print(name, groups, identity, ttgir.count("convert_layout"), hmma, spills, wide, l2, res.get("REG", 0),
          loop_spills, hi - lo + 1)
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line.split() for line in r.stdout.strip().splitlines()[-32:]]
    assert len(lines) == 32, r.stdout
    k_loop = {line[0]: int(line[-1]) for line in lines}
    for name, groups, identity, converts, hmma, spills, wide, l2, regs, loop_spills, _ in lines:
        # The wide gate_up reading ready scales spills 16 bytes at its cap, outside its K loop (sm_90, Triton 3.6);
        # its twin with the shared expert's programs 40 on CI's Triton 3.9 (the epilogue's selected pointers).
        allowed = 16 if name.startswith("_moe_gate_up_mma_wide") and name.endswith("_ready") else 0
        allowed = 48 if name.startswith("_moe_gate_up_mma_wide_shared") else allowed
        if name.endswith("_all"):  # the requests before the K loop: none in it, so it is no longer than with them
            assert identity == "1" and int(spills) <= allowed and loop_spills == "0", (name, identity, spills)
            assert k_loop[name] <= k_loop[name.removesuffix("_all")] and int(regs) <= 128, (name, k_loop, regs)
            assert int(l2) >= 8, (name, l2)  # four tiles' rows of codes and of scales
            continue
        if name.endswith("_used"):  # the expert from a histogram of the ids, before the K loop: the same loop
            assert identity == "1" and int(spills) <= allowed and loop_spills == "0", (name, identity, spills)
            first = name.removesuffix("_used") + "_first"
            assert abs(k_loop[name] - k_loop[first]) <= 4 and int(regs) <= 128, (name, k_loop, regs)
            continue
        if name.endswith("_first"):  # the grid's order maps the program index back: the same K loop
            assert identity == "1" and int(spills) <= allowed and loop_spills == "0", (name, identity, spills)
            assert abs(k_loop[name] - k_loop[name.removesuffix("_first")]) <= 4 and int(regs) <= 128, (name, k_loop)
            continue
        down_perm = name.startswith("_moe_down") and name.endswith("_perm")
        if "_shared_" in name and not down_perm:  # the shared expert's programs add nothing to the K loop
            plain = name.replace("_shared_kernel", "_kernel").removesuffix("_perm")
            assert k_loop[name] <= k_loop[plain] + 4, (name, k_loop)
        if down_perm:  # no PRMTs: a K step's 16 fewer (ptxas already shares them between the two tiles)
            assert k_loop[name] <= k_loop[name.removesuffix("_perm")] - 16, (name, k_loop)
        assert identity == "1" and int(spills) <= allowed and loop_spills == "0", (name, identity, spills)
        if name.endswith("_ready") and "_shared_" not in name:  # one multiply-add a scale pair: >= 10% fewer a K step
            assert k_loop[name] < 0.9 * k_loop[name.removesuffix("_ready")], (name, k_loop)
        assert int(hmma) >= 8 * int(groups), (name, groups, hmma)
        if name.startswith("_nvfp4_mma"):
            assert converts == "0", (name, converts)
        if name.startswith("_moe_") and "_wide_" in name:  # x of one group (4) and both tiles' codes (2 each)
            assert int(wide) >= 4 + 2 * 2, (name, wide)
            # two 8-warp programs an SM, as for the installed kernels
            assert int(regs) <= 128, (name, regs)
        elif "_wide_" in name:  # x of four groups (4 each) and both tiles' codes (2 each)
            assert int(wide) >= 4 * 4 + 2 * 2, (name, wide)
        elif "_vec_" in name or "_l2_" in name:
            assert int(wide) >= 2 + 4 * int(groups), (name, groups, wide)
        # L2 requests only where asked for (two a K step's rows, in the loop and its prefetching form).
        assert (int(l2) >= 2) == ("_l2_" in name), (name, l2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 2, 5, 8])
@pytest.mark.parametrize("n,k,segments", [(5120, 2048, (4096, 512, 512)), (1000, 512, (1000,)), (2048, 4096, (2048,))])
@pytest.mark.parametrize("split_k", [None, 1])
@pytest.mark.parametrize("vec", [False, True], ids=["8B", "16B"])
def test_linear_on_the_gpu(m: int, n: int, k: int, segments: tuple[int, ...], split_k: int | None, vec: bool) -> None:
    """The kernel itself against `linear_ref` at Flint's shapes (qkv, a ragged N, o_proj), with and without split-K."""
    w = random_nvfp4(n, k, seeded(m + n), segments)
    w = NVFP4Weight(w.qweight.cuda(), w.scales.cuda(), w.global_scale.cuda(), segments)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 0.5).to(torch.bfloat16).cuda()
    _close_in_bf16(nm.linear(x, w, split_k=split_k, vec=vec), linear_ref(x, w), x, w)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [9, 16, 32, 40, 64])
@pytest.mark.parametrize("n,k,segments", [(5120, 2048, (4096, 512, 512)), (1000, 512, (1000,))])
@pytest.mark.parametrize("vec", [False, True], ids=["8B", "16B"])
@pytest.mark.parametrize("wide", [False, True], ids=["16rows", "32rows"])
def test_linear_rows_on_the_gpu(m: int, n: int, k: int, segments: tuple[int, ...], vec: bool, wide: bool) -> None:
    """9-64 rows (the rows kernel, 40 and 64 in launches of 32 and the rest; `wide` at 9-32) against `linear_ref`:
    qkv, a ragged N."""
    w = random_nvfp4(n, k, seeded(m + n), segments)
    w = NVFP4Weight(w.qweight.cuda(), w.scales.cuda(), w.global_scale.cuda(), segments)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 0.5).to(torch.bfloat16).cuda()
    _close_in_bf16(nm.linear(x, w, vec=vec, wide=wide), linear_ref(x, w), x, w)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 8, 32, 64])
@pytest.mark.parametrize("vec", [False, True], ids=["8B", "16B"])
def test_moe_gate_up_on_the_gpu(tokens: int, vec: bool) -> None:
    """The expert-major MoE gate_up against `moe_ref`'s h at Flint's expert shape (I 512, H 2048), 32 experts, top-6
    (so experts get 1-8+ pairs, some none)."""
    w13 = random_experts(32, 512, 2048, seed=tokens)
    w13 = NVFP4Weight(w13.qweight.cuda(), w13.scales.cuda(), w13.global_scale.cuda(), w13.segments)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(tokens)]).cuda()
    x = (torch.randn(tokens, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda()
    got, want = nm.moe_gate_up(x, ids, w13, vec=vec).float(), moe_gate_up_ref(x, ids, w13).float()
    tol = 3 * 2.0**-8 * torch.maximum(got.abs(), want.abs()) + 1e-3 * want.abs().max()
    assert ((got - want).abs() <= tol).all(), (got - want).abs().max()
    if vec:  # asking L2 ahead changes no result (MoEConfig.mma_l2_ahead), with or without the loads a step ahead
        for l2_ahead, prefetch in ((2, True), (4, False)):
            ahead = nm.moe_gate_up(x, ids, w13, vec=True, prefetch=prefetch, l2_ahead=l2_ahead).float()
            assert torch.equal(ahead, got), (l2_ahead, prefetch)
        # The warps splitting K (MoEConfig.mma_warp_k) sum in another order: within moe_ref's tolerance instead.
        for warps, warp_k, l2_ahead in ((4, 2, 2), (8, 2, 2), (8, 4, 0), (4, 4, 2)):
            split = nm.moe_gate_up(x, ids, w13, warps, vec=True, prefetch=True, l2_ahead=l2_ahead, warp_k=warp_k)
            split = split.float()
            assert ((split - want).abs() <= tol).all(), (warps, warp_k, (split - want).abs().max())
        # Two tiles a warp (MoEConfig.mma_wide) sum each tile in the same order: the same h, bit for bit.
        for warps, l2_ahead, prefetch in ((8, 2, True), (4, 0, False)):
            wide = nm.moe_gate_up(x, ids, w13, warps, vec=True, prefetch=prefetch, l2_ahead=l2_ahead, wide=True)
            assert torch.equal(wide.float(), got), (warps, l2_ahead, prefetch)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 5, 32, 64])
@pytest.mark.parametrize(
    "mma,mma_down,vec,warp_k,wide",
    [
        (True, False, False, 1, False),
        (True, True, False, 1, False),
        (False, True, False, 1, False),
        (True, True, True, 1, False),
        (True, True, True, 2, False),
        (True, True, True, 1, True),
    ],
)
def test_fused_moe_with_the_mma_kernels_on_the_gpu(
    tokens: int, mma: bool, mma_down: bool, vec: bool, warp_k: int, wide: bool
) -> None:
    """`moe_triton.fused_moe` with MoEConfig.mma (expert-major, shared expert apart) launches the MMA gate_up, with
    mma_down the MMA down and the slot reduce (also after the per-pair FMA gate_up), with mma_vec their 16-byte
    kernels, with mma_warp_k the gate_up whose warps split K, with mma_wide / mma_down_wide the wide twins, and
    stays within the MoE tests' BF16 tolerance of `moe_ref`."""
    import dataclasses

    from flint_kernels import moe_triton as mt

    w13 = random_experts(32, 512, 2048, seed=tokens)
    w13 = NVFP4Weight(w13.qweight.cuda(), w13.scales.cuda(), w13.global_scale.cuda() / 64, w13.segments)
    w2 = random_experts(32, 1024, 512, seed=100 + tokens)  # [E, 2048, 512] as two segments of 1024
    w2 = NVFP4Weight(w2.qweight.cuda(), w2.scales.cuda(), w2.global_scale.cuda() / 64, w2.segments)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(tokens)]).cuda()
    tw = torch.rand(tokens, 6, generator=g).cuda()
    tw = tw / tw.sum(-1, keepdim=True)
    x = (torch.randn(tokens, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda()
    cfg = dataclasses.replace(
        mt.decode_config(True, tokens, x.device),
        expert_major=mma, mma=mma, mma_down=mma_down, mma_vec=vec, use_dot=False, mma_l2_ahead=0, mma_down_l2=0,
        mma_warp_k=warp_k, mma_wide=wide, mma_down_wide=wide,
    )  # fmt: skip
    v = "_wide" if wide else "_vec" if vec else ""
    gate_up = "_moe_gate_up_mma_ks_kernel" if warp_k > 1 else f"_moe_gate_up_mma{v}_kernel"
    names = [gate_up] * mma + [f"_moe_down_mma{v}_kernel"] * mma_down
    spies = {n: LaunchSpy(getattr(nm, n)) for n in names}
    with pytest.MonkeyPatch.context() as mp:
        for n, spy in spies.items():
            mp.setattr(nm, n, spy)
        got = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg).float()
    want = moe_ref(x, tw, ids, w13, w2).float()
    assert {n: s.launches for n, s in spies.items()} == dict.fromkeys(names, 1)
    assert ((got - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 8, 64])
@pytest.mark.parametrize("vec", [False, True], ids=["8B", "16B"])
def test_moe_down_on_the_gpu(tokens: int, vec: bool) -> None:
    """The expert-major MoE down against `linear_ref` per pair at Flint's shape (H 2048, I 512), 32 experts, top-6."""
    w2 = random_experts(32, 1024, 512, seed=tokens)  # [E, 2048, 512]
    w2 = NVFP4Weight(w2.qweight.cuda(), w2.scales.cuda(), w2.global_scale.cuda(), w2.segments)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(tokens)]).cuda()
    h = (torch.randn(tokens * 6, 512, generator=g) * 0.5).to(torch.bfloat16).cuda()
    y = nm.moe_down(h, ids, w2, vec=vec)
    for p, e in enumerate(ids.reshape(-1).tolist()):
        _close_in_bf16(y[p][None], linear_ref(h[p][None], w2.select(e)), h[p][None], w2.select(e))
    if vec:  # asking L2 for the codes changes no result (MoEConfig.mma_down_l2), nor two tiles a warp (mma_down_wide)
        for mode in (1, 2):
            assert torch.equal(nm.moe_down(h, ids, w2, vec=True, l2=mode), y), mode
        for mode, warps in ((0, 4), (2, 8)):
            assert torch.equal(nm.moe_down(h, ids, w2, warps, vec=True, l2=mode, wide=True), y), (mode, warps)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 16, 32, 64])
def test_ready_scales_on_the_gpu(tokens: int) -> None:
    """Ready scale bytes (`nvfp4_mma_scales.prepare` on CUDA weights; TileConfig / MoEConfig.mma_ready) change no
    output: the linear at `tokens` rows (the 1-8-row, rows and wide kernels, 16-byte loads) and the MoE's gate_up and
    down (plain, L2 requests, wide) give the same bits as from the UE4M3 bytes; so does `fused_moe` with the table's
    config plus mma_ready."""
    import dataclasses

    from flint_kernels import moe_triton as mt

    w = random_nvfp4(5120, 2048, seeded(tokens), (4096, 512, 512))
    w = NVFP4Weight(w.qweight.cuda(), w.scales.cuda(), w.global_scale.cuda(), w.segments)
    w13 = random_experts(32, 512, 2048, seed=tokens)
    w13 = NVFP4Weight(w13.qweight.cuda(), w13.scales.cuda(), w13.global_scale.cuda() / 64, w13.segments)
    w2 = random_experts(32, 1024, 512, seed=300 + tokens)
    w2 = NVFP4Weight(w2.qweight.cuda(), w2.scales.cuda(), w2.global_scale.cuda() / 64, w2.segments)
    g = torch.Generator().manual_seed(tokens)
    x = (torch.randn(tokens, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(tokens)]).cuda()
    tw = torch.rand(tokens, 6, generator=g).cuda()
    tw = tw / tw.sum(-1, keepdim=True)
    h = (torch.randn(tokens * 6, 512, generator=g) * 0.5).to(torch.bfloat16).cuda()
    cfg = mt.decode_config(True, tokens, x.device)
    cfg = dataclasses.replace(cfg, expert_major=True, mma=True, mma_down=True, mma_vec=True, use_dot=False)

    def outputs() -> list[torch.Tensor]:
        return [
            nm.linear(x, w, vec=True, ready=True),
            nm.linear(x, w, vec=True, wide=True, ready=True),
            nm.moe_gate_up(x, ids, w13, vec=True, ready=True),
            nm.moe_gate_up(x, ids, w13, 8, vec=True, prefetch=True, l2_ahead=2, wide=True, ready=True),
            nm.moe_down(h, ids, w2, vec=True, l2=2, ready=True),
            nm.moe_down(h, ids, w2, vec=True, l2=2, wide=True, ready=True),
            mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(cfg, mma_ready=True)),
        ]

    before = outputs()  # no ready bytes yet: `ready` falls back to the UE4M3 ones
    for weight in (w, w13, w2):
        nvfp4_mma_scales.prepare(weight)
        assert weight.ready_scales is not None and weight.ready_scales.dtype == torch.int8
    for i, (want, got) in enumerate(zip(before, outputs(), strict=True)):
        assert torch.equal(got, want), i


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [9, 16, 32, 64])
@pytest.mark.parametrize("ready,perm", [(False, False), (True, False), (True, True)])
def test_the_shared_expert_in_the_moe_launches_on_the_gpu(tokens: int, ready: bool, perm: bool) -> None:
    """MoEConfig.mma_shared at Flint's shapes (256 experts of I 512 top-6, a shared expert of 1024, H 2048): two MoE
    launches and the slot reduce, no launch of the shared expert's own; the output within BF16 rounding of the
    shared expert run apart (its FP32 sums in another order) and near `moe_ref`; with perm (MoEConfig.mma_perm_h) the
    same bits as without, and with the shared expert's programs first (MoEConfig.mma_shared_first) too, with the
    gate_up asking L2 for all its lines at once (mma_l2_all), and with programs only for the experts in use
    (mma_used_experts)."""
    import dataclasses

    from flint_kernels import activation_triton, gemv_triton
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe import moe_ref

    def cuda(w: NVFP4Weight, scale: float = 1.0) -> NVFP4Weight:
        return NVFP4Weight(w.qweight.cuda(), w.scales.cuda(), w.global_scale.cuda() * scale, w.segments)

    w13 = cuda(random_experts(256, 512, 2048, seed=tokens), 1 / 64)
    w2 = cuda(random_experts(256, 1024, 512, seed=400 + tokens), 1 / 64)
    gate_up = cuda(random_nvfp4(2048, 2048, seeded(500 + tokens), (1024, 1024)), 1 / 64)
    down = cuda(random_nvfp4(2048, 1024, seeded(600 + tokens), (2048,)), 1 / 64)
    if ready:
        for w in (w13, w2, gate_up, down):
            nvfp4_mma_scales.make_ready(w)
    g = seeded(700 + tokens)
    x = (torch.randn(tokens, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(256, generator=g)[:6] for _ in range(tokens)]).cuda()
    tw = torch.rand(tokens, 6, generator=g).cuda()
    tw = tw / tw.sum(-1, keepdim=True)
    cfg = mt.decode_config(True, tokens, x.device)
    cfg = dataclasses.replace(
        cfg, expert_major=True, mma=True, mma_down=True, mma_vec=True, mma_wide=True, mma_down_wide=True,
        mma_l2_ahead=2, mma_down_l2=2, use_dot=False, mma_ready=ready,
        # the table sets these from 9 tokens (or may): pinned here
        mma_shared=False, mma_perm_h=False, mma_shared_first=False, mma_l2_all=False, mma_used_experts=False,
    )  # fmt: skip
    shared = (gate_up, down)
    assert mt._mma_shared(dataclasses.replace(cfg, mma_shared=True), x, w13, w2, shared)
    apart = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg, shared=shared)
    spy = LaunchSpy(nm._moe_down_mma_wide_shared_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, "_moe_down_mma_wide_shared_kernel", spy)
        folded = mt.fused_moe(
            x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(cfg, mma_shared=True), shared=shared
        )
    if perm:  # the same bits with h in the MMA's order (mma_perm_h), then each with it: the shared expert's programs
        # first in the grids (mma_shared_first), with the gate_up asking L2 for all of its tiles' lines at once
        # (mma_l2_all, hints only) or programs only for the experts in use (mma_used_experts)
        first = {"mma_perm_h": True, "mma_shared_first": True}
        for extra in ({"mma_perm_h": True}, first, {**first, "mma_l2_all": True}, {**first, "mma_used_experts": True}):
            got = mt.fused_moe(
                x, tw, ids, w13, w2, decode_max_tokens=64, shared=shared,
                config=dataclasses.replace(cfg, mma_shared=True, **extra),
            )  # fmt: skip
            assert torch.equal(got, folded), extra
    assert spy.launches == 1
    ys = mt.shared_expert(x, shared)
    # The two paths differ only where the shared expert's FP32 sums (another order) round to other BF16 values: its
    # intermediate h (at most one BF16 step, 2^-7 of |h|, which the down's K = 1024 sum carries through |W_down|),
    # its output ys and the output itself (a step each). Where ys cancels, h's steps dominate: a bound on |ys| alone
    # failed ~4 of 32,768 values at 16 and 64 tokens on the H200.
    hs = activation_triton.silu_and_mul(gemv_triton.linear(x, gate_up)).double()
    carried = hs.abs() @ down.dequantize(torch.float64, with_global=True).abs().T * 2.0**-7
    bound = carried + (ys.double().abs() + apart.double().abs()) * 2.0**-7 + 1e-6
    near = (folded.double() - apart.double()).abs() <= bound
    assert near.all(), float(near.double().mean())
    # Against the reference as the other MoE tests compare (an elementwise bound on magnitudes alone failed at 64
    # tokens on the H200, where outputs cancel; the bound above holds elementwise against the separate path).
    ref = moe_ref(x, tw, ids, w13, w2, shared).float()
    assert ((folded.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [9, 32, 64])
def test_moe_down_l2_before_the_wait_after_the_router_on_the_gpu(tokens: int) -> None:
    """MoEConfig.mma_down_l2 = 2 reads the router's ids before its PDL wait: in the engine's launch order (the
    router, then `fused_moe`'s MMA gate_up and down, all PDL launches, nothing between) each round's y equals the
    same MoE without the hints, with new ids every round, so ids read too early would show."""
    import dataclasses

    from flint_kernels import moe_triton as mt
    from flint_kernels import router_triton

    w13 = random_experts(32, 512, 2048, seed=tokens)
    w13 = NVFP4Weight(w13.qweight.cuda(), w13.scales.cuda(), w13.global_scale.cuda() / 64, w13.segments)
    w2 = random_experts(32, 1024, 512, seed=200 + tokens)
    w2 = NVFP4Weight(w2.qweight.cuda(), w2.scales.cuda(), w2.global_scale.cuda() / 64, w2.segments)
    g = torch.Generator().manual_seed(tokens)
    router = torch.randn(32, 2048, generator=g).cuda()
    xs = [(torch.randn(tokens, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda() for _ in range(4)]
    base = dataclasses.replace(
        mt.decode_config(True, tokens, xs[0].device),
        expert_major=True, mma=True, mma_down=True, mma_vec=True, use_dot=False,
    )  # fmt: skip
    outs = {}
    for mode in (0, 2):
        cfg = dataclasses.replace(base, mma_down_l2=mode)
        outs[mode] = []
        for x in xs:
            tw, ids = router_triton.sigmoid_topk(x, router, 6)
            outs[mode].append(mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg))
    torch.cuda.synchronize()
    for want, got in zip(outs[0], outs[2], strict=True):
        assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("fp32_out", [False, True])
@pytest.mark.parametrize("m", [2, 8, 32])
def test_gemv_linear_with_the_mma_config_on_the_gpu(m: int, fp32_out: bool) -> None:
    """`gemv_triton`'s linear with TileConfig.mma launches `nvfp4_mma_triton`'s kernel (BF16 or FP32 out, as the
    lm_head's logits, no fused norm)."""
    import dataclasses

    from flint_kernels import gemv_triton as gt

    w = random_nvfp4(5120, 2048, seeded(m), (4096, 512, 512))
    w = NVFP4Weight(w.qweight.cuda(), w.scales.cuda(), w.global_scale.cuda(), w.segments)
    x = (torch.randn(m, 2048, generator=torch.Generator().manual_seed(m)) * 0.5).to(torch.bfloat16).cuda()
    cfg = dataclasses.replace(gt.small_m_config(m, True, 2048, 5120, x.device), mma=True)
    calls = []
    real = nm.launch_linear
    try:
        nm.launch_linear = lambda *a, **kw: (calls.append(1), real(*a, **kw))
        got = gt._matmul(x, w, fp32_out=fp32_out, config=cfg)
    finally:
        nm.launch_linear = real
    assert calls == [1]
    if not fp32_out:
        _close_in_bf16(got, linear_ref(x, w), x, w)
        return
    assert got.dtype == torch.float32
    want = linear_fp32_out_ref(x, w).float().cpu()
    l1 = (x.float().abs().cpu() @ w.dequantize(torch.float32).abs().cpu().T) * w.column_scale().cpu()
    assert ((got.cpu() - want).abs() <= 2.0**-16 * l1 + 1e-6 * want.abs()).all()
