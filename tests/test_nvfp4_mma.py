"""`flint_kernels.nvfp4_mma_triton`: NVFP4 on mma.sync with the weights decoded in PTX, the K step and the linear
(and the engine switch that launches it); the sm_90 compile test covers the MoE's kernels
(`nvfp4_mma_moe_triton`) too.

The CPU tests run the kernels themselves in Triton's interpreter with their K step's PTX emulated
(`nvfp4_mma_emulation`), and compare with float64. The sm_90 compile test checks what the lane mapping relies on:
the asm's operands are one element a thread, and the K step issues its 8 MMAs. The `gpu` tests run the compiled
kernels, alone and inside the engine's ops.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flint_kernels import nvfp4_mma_scales
from flint_kernels import nvfp4_mma_triton as nm
from flint_kernels.linear import NVFP4Weight, linear_fp32_out_ref, linear_ref
from kernel_checks import LaunchSpy, random_nvfp4
from nvfp4_mma_emulation import (
    _f64_to_bf16,
    _mma_m16n8k16,
    close_in_bf16,
    close_to_exact,
    emulate_ptx,
    exact,
    seeded,
    spied,
)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def emulated_ptx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels in Triton's interpreter with their K step's PTX emulated (`emulate_ptx`)."""
    emulate_ptx(monkeypatch)


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
    with spied(nm, "_nvfp4_mma_kernel", vec) as spy:
        nm.launch_linear(x, w, out, num_warps=2, split_k=split_k, prefetch=prefetch, vec=vec)
    assert spy.launches == 1
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    close_to_exact(out, exact(x, w), l1)


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
    with spied(nm, "_nvfp4_mma_rows_kernel", False) as rows, spied(nm, "_nvfp4_mma_kernel", vec) as small:
        nm.launch_linear(x, w, out, num_warps=2, split_k=split_k, vec=vec)
    assert (rows.launches, small.launches) == (1, 0)
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    close_to_exact(out, exact(x, w), l1)


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
    with spied(nm, "_nvfp4_mma_wide_kernel", False) as wide, spied(nm, "_nvfp4_mma_rows_kernel", False) as rows:
        nm.launch_linear(x, w, out, num_warps=2, split_k=split_k, vec=vec, wide=True)
    assert (wide.launches, rows.launches) == (1, 0)
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    close_to_exact(out, exact(x, w), l1)


def test_wide_only_for_one_quad_of_rows(emulated_ptx: None) -> None:
    """`wide` applies to 9-32 rows only: 40 rows still take the rows kernel's two quads."""
    w = random_nvfp4(48, 256, seeded(3), (48,))
    x = (torch.randn(40, 256, generator=torch.Generator().manual_seed(3)) * 0.5).to(torch.bfloat16)
    out = torch.full((40, 48), float("nan"))
    with spied(nm, "_nvfp4_mma_wide_kernel", False) as wide, spied(nm, "_nvfp4_mma_rows_kernel", False) as rows:
        nm.launch_linear(x, w, out, num_warps=2, split_k=1, wide=True)
    assert (wide.launches, rows.launches) == (0, 1)
    l1 = x.double().abs() @ w.dequantize(torch.float64, with_global=True).abs().T
    close_to_exact(out, exact(x, w), l1)


# (rows of x, 16-byte loads, wide, the kernel that runs): one case for each linear kernel and load width
EVERY_LINEAR_KERNEL = [
    (3, False, False, "_nvfp4_mma_kernel"),
    (8, True, False, "_nvfp4_mma_vec_kernel"),
    (30, True, False, "_nvfp4_mma_rows_kernel"),
    (40, False, False, "_nvfp4_mma_rows_kernel"),
    (30, True, True, "_nvfp4_mma_wide_kernel"),
]


@pytest.mark.parametrize("m,vec,wide,kernel", EVERY_LINEAR_KERNEL)
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


def test_perm_columns_is_the_mma_order() -> None:
    """Each 8 values v0..v7 as v0 v4 v1 v5 v2 v6 v3 v7, and the PTX step for it has no PRMT while the plain one has two
    an MMA (16 a K step)."""
    x = torch.arange(24).reshape(1, 24)
    assert nm.perm_columns(x).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 16, 20, 17, 21, 18,
                                            22, 19, 23]]  # fmt: skip
    assert nm.step_asm().count("prmt") == 16 and "prmt" not in nm.step_asm(perm=True)
    assert nm.step_asm(perm=True).count("mma.sync") == nm.step_asm().count("mma.sync") == 8


def test_the_emulators_bf16_rounding_and_mma_are_the_references() -> None:
    """The emulator's own pieces: BF16 rounding equals torch's conversion on every non-NaN FP32 bit pattern drawn
    (NaN gives PTX's canonical 0x7FFF), and an MMA over several warps gives each warp its own exact product."""
    rng = np.random.default_rng(5)
    f = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    want = torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = _f64_to_bf16(f.astype(np.float64))
    finite = ~np.isnan(f)
    assert np.array_equal(got[finite], want[finite]) and (got[~finite] == 0x7FFF).all() and (~finite).any()

    warps = 3
    a_vals = torch.randn(warps, 16, 16, generator=seeded(6)).to(torch.bfloat16)
    b_vals = torch.randn(warps, 16, 8, generator=seeded(7)).to(torch.bfloat16)
    # C on BF16's grid too: every sum is then exact in float64, whatever order a matmul takes.
    c_vals = torch.randn(warps, 16, 8, generator=seeded(8)).to(torch.bfloat16).double()
    bits_a = a_vals.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    bits_b = b_vals.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    # PTX's fragment layouts: A's four registers, B's two (two BF16 a register, K pairs), C's four floats.
    a = [
        bits_a[:, g + r, 2 * t + c] | (bits_a[:, g + r, 2 * t + c + 1] << 16)
        for r, c in ((0, 0), (8, 0), (0, 8), (8, 8))
    ]
    b = [bits_b[:, 2 * t + k, g] | (bits_b[:, 2 * t + k + 1, g] << 16) for k in (0, 8)]
    c = [c_vals.numpy()[:, g + r, 2 * t + o] for r, o in ((0, 0), (0, 1), (8, 0), (8, 1))]
    d = _mma_m16n8k16([x.reshape(-1) for x in a], [x.reshape(-1) for x in b], [x.reshape(-1) for x in c])
    want_d = (a_vals.double() @ b_vals.double() + c_vals).numpy()
    for reg, (r, o) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
        assert np.array_equal(d[reg].reshape(warps, 32), want_d[:, g + r, 2 * t + o]), reg


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
from flint_kernels import nvfp4_mma_moe_triton as mm, nvfp4_mma_triton as nm
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
    (mm._moe_gate_up_mma_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True)),
    (mm._moe_gate_up_mma_vec_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True)),
    (mm._moe_gate_up_mma_l2_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True, L2_AHEAD=2)),
    (mm._moe_gate_up_mma_ks_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True, L2_AHEAD=2, KSPLIT=2)),
    (mm._moe_gate_up_mma_ks_kernel, gate_up, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True, L2_AHEAD=0, KSPLIT=4)),
    (mm._moe_gate_up_mma_ks_kernel, gate_up, dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True, L2_AHEAD=2, KSPLIT=2)),
    (mm._moe_down_mma_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True)),
    (mm._moe_down_mma_vec_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True)),
    (mm._moe_down_mma_l2_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True, L2_MODE=1)),
    (mm._moe_down_mma_l2_kernel, down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True, L2_MODE=2)),
    (mm._moe_gate_up_mma_wide_kernel, gate_up, dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True, L2_AHEAD=2)),
    (mm._moe_gate_up_mma_wide_kernel, gate_up, dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True, L2_AHEAD=0)),
    (mm._moe_down_mma_wide_kernel, down, dict(P_PAD=256, NW=8, PREFETCH=False, PDL=True, L2_MODE=2)),
]
ready = dict(s_ptr="*i8")  # the ready scale bytes (nvfp4_mma_scales): the same kernels, another pointer type
cases += [
    (nm._nvfp4_mma_vec_kernel, dict(lin, **ready), dict(SPLIT_K=4, NW=4, PREFETCH=False, PDL=True)),
    (nm._nvfp4_mma_wide_kernel, dict(lin, **ready), dict(SPLIT_K=4, NW=4, PDL=True, VEC=True)),
    (mm._moe_gate_up_mma_wide_kernel, dict(gate_up, **ready), dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True,
                                                                  L2_AHEAD=2)),
    (mm._moe_down_mma_wide_kernel, dict(down, **ready), dict(P_PAD=256, NW=8, PREFETCH=False, PDL=True, L2_MODE=2)),
]
# the wide twins with the shared expert's programs (MoEConfig.mma_shared), reading ready scale bytes as installed
shared = dict(sw_ptr="*u8", ss_ptr="*i8", sgs_ptr="*fp32", hs_ptr="*bf16", ys_ptr="*bf16", **ready)
cases += [
    (mm._moe_gate_up_mma_wide_shared_kernel, dict(gate_up, **shared), dict(P_PAD=256, NW=4, PREFETCH=True, PDL=True,
                                                                           L2_AHEAD=2, PERM=True)),
    (mm._moe_down_mma_wide_shared_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                     L2_MODE=2, PERM=False)),
    (mm._moe_down_mma_wide_shared_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                     L2_MODE=2, PERM=True)),
    # and with the shared expert's programs first in the grid (MoEConfig.mma_shared_first)
    (mm._moe_gate_up_mma_wide_shared_first_kernel, dict(gate_up, **shared), dict(P_PAD=256, NW=4, PREFETCH=True,
                                                                                 PDL=True, L2_AHEAD=2, PERM=True)),
    (mm._moe_down_mma_wide_shared_first_kernel, dict(down, **shared), dict(P_PAD=256, NW=4, PREFETCH=False, PDL=True,
                                                                           L2_MODE=2, PERM=True)),
]
for fn, ptrs, cx in cases:
    ptrs = dict(common, **ptrs)
    sig = {{n: ptrs.get(n, "constexpr" if n in cx else "i32") for n in fn.arg_names}}
    src = ASTSource(fn=fn, signature=sig, constexprs={{(fn.arg_names.index(k),): v for k, v in cx.items()}})
    opts = {{"num_warps": cx["NW"], "num_stages": 1}}
    if "_ks_" in fn.__name__ or "_gate_up_mma_wide_" in fn.__name__:  # launched with their register cap
        opts["maxnreg"] = mm.KS_MAXNREG
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
    name = name.replace("_shared_first_kernel", "_shared_kernel") + ("_perm" if cx.get("PERM") else "")
    name += "_first" if first else ""
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
    lines = [line.split() for line in r.stdout.strip().splitlines()[-29:]]
    assert len(lines) == 29, r.stdout
    k_loop = {line[0]: int(line[-1]) for line in lines}
    for name, groups, identity, converts, hmma, spills, wide, l2, regs, loop_spills, _ in lines:
        # The wide gate_up reading ready scales spills 16 bytes at its cap, outside its K loop (sm_90, Triton 3.6);
        # its twin with the shared expert's programs 40 on CI's Triton 3.9 (the epilogue's selected pointers).
        allowed = 16 if name.startswith("_moe_gate_up_mma_wide") and name.endswith("_ready") else 0
        allowed = 48 if name.startswith("_moe_gate_up_mma_wide_shared") else allowed
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
    close_in_bf16(nm.linear(x, w, split_k=split_k, vec=vec), linear_ref(x, w), x, w)


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
    close_in_bf16(nm.linear(x, w, vec=vec, wide=wide), linear_ref(x, w), x, w)


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
        close_in_bf16(got, linear_ref(x, w), x, w)
        return
    assert got.dtype == torch.float32
    want = linear_fp32_out_ref(x, w).float().cpu()
    l1 = (x.float().abs().cpu() @ w.dequantize(torch.float32).abs().cpu().T) * w.column_scale().cpu()
    assert ((got.cpu() - want).abs() <= 2.0**-16 * l1 + 1e-6 * want.abs()).all()
