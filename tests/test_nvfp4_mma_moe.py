"""`flint_kernels.nvfp4_mma_moe_triton`: the MoE's expert-major gate_up and down for NVFP4 on mma.sync (the
shared expert's programs, the L2 requests) and the engine switches that launch them.

The CPU tests run the kernels themselves in Triton's interpreter with their K step's PTX emulated
(`nvfp4_mma_emulation`), and compare with float64 and with `moe_ref`. Their sm_90 compile test is
`test_nvfp4_mma.py`'s. The `gpu` tests run the compiled kernels, alone and inside the engine's ops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flint_kernels import nvfp4_mma_moe_triton as mm
from flint_kernels import nvfp4_mma_scales
from flint_kernels import nvfp4_mma_triton as nm
from flint_kernels.activation import silu_and_mul_ref
from flint_kernels.linear import NVFP4Weight, linear_ref
from flint_kernels.moe import moe_ref
from kernel_checks import LaunchSpy, random_nvfp4
from nvfp4_mma_emulation import (
    close_in_bf16,
    close_to_exact,
    emulate_ptx,
    exact,
    record_l2_requests,
    seeded,
    spied,
)

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def emulated_ptx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels in Triton's interpreter with their K step's PTX emulated (`emulate_ptx`)."""
    emulate_ptx(monkeypatch)


@pytest.fixture
def l2_requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The addresses the kernels ask L2 for while the test runs (with `emulated_ptx`)."""
    return record_l2_requests(monkeypatch)


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
        mm.launch_moe_gate_up(x, ids, w13, h, 3, 2, vec=vec, l2_ahead=l2, wide=wide, ready=True)
        y = torch.full((30, 136), float("nan"))
        mm.launch_moe_down(hh, ids, w2, y, num_warps=2, vec=vec, l2=l2, wide=wide, ready=True)
        outs.append((h, y))
    assert not torch.isnan(outs[0][0]).any() and not torch.isnan(outs[0][1]).any()
    assert torch.equal(outs[1][0], outs[0][0]) and torch.equal(outs[1][1], outs[0][1])


def _stacked(w: NVFP4Weight) -> NVFP4Weight:
    """A 2-D NVFP4 weight as a stack of one expert."""
    return NVFP4Weight(w.qweight[None], w.scales[None], w.global_scale[None], w.segments)


@pytest.mark.parametrize("ready,perm,first", [(False, False, False), (True, False, False), (True, True, True)])
def test_moe_with_the_shared_expert_in_its_programs(
    emulated_ptx: None, l2_requests: list[int], ready: bool, perm: bool, first: bool
) -> None:
    """MoEConfig.mma_shared: the wide gate_up and down launches with the shared expert (I_s twice the experts' I)
    in programs of their own give the routed h and y bit for bit as without it, and the shared expert's hs and ys bit
    for bit as the same kernels give it run as a stack of one expert that every token routes to (10 tokens: a full
    group of 8 and a part); with ready scale bytes too (both weights need them, or neither reads them). With perm
    (MoEConfig.mma_perm_h) the gate_up writes h and hs in the MMA's order (`perm_columns` of the same values) and the
    down, reading them so, gives the same bits without its PRMTs. With first (MoEConfig.mma_shared_first) the shared
    expert's programs come first in the grids: the same bits again."""
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
    mm.launch_moe_gate_up(x, ids, w13, h_want, 3, 2, vec=True, l2_ahead=2, wide=True, ready=ready)
    hs_want = torch.full((10, 80), float("nan"))
    mm.launch_moe_gate_up(x, every, _stacked(gate_up), hs_want, 1, 2, vec=True, l2_ahead=2, wide=True, ready=ready)
    h, hs = torch.full((30, 40), float("nan")), torch.full((10, 80), float("nan"))
    name = "_moe_gate_up_mma_wide_shared_first_kernel" if first else "_moe_gate_up_mma_wide_shared_kernel"
    spy = LaunchSpy(getattr(mm, name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, name, spy)
        mm.launch_moe_gate_up(
            x, ids, w13, h, 3, 2, vec=True, l2_ahead=2, wide=True, ready=ready, shared=(gate_up, hs), perm=perm,
            first=first,
        )  # fmt: skip
    assert spy.launches == 1
    if perm:
        h_want, hs_want = nm.perm_columns(h_want), nm.perm_columns(hs_want)
    assert not torch.isnan(h_want).any() and torch.equal(h, h_want)
    assert not torch.isnan(hs_want).any() and torch.equal(hs, hs_want)

    y_want = torch.full((30, 136), float("nan"))
    mm.launch_moe_down(hh, ids, w2, y_want, num_warps=2, vec=True, l2=2, wide=True, ready=ready)
    ys_want = torch.full((10, 136), float("nan"))
    mm.launch_moe_down(hs_in, every, _stacked(down), ys_want, num_warps=2, vec=True, l2=2, wide=True, ready=ready)
    y, ys = torch.full((30, 136), float("nan")), torch.full((10, 136), float("nan"))
    name = "_moe_down_mma_wide_shared_first_kernel" if first else "_moe_down_mma_wide_shared_kernel"
    spy = LaunchSpy(getattr(mm, name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, name, spy)
        hh_in, hs_down = (nm.perm_columns(hh), nm.perm_columns(hs_in)) if perm else (hh, hs_in)
        mm.launch_moe_down(
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
    close_to_exact(ys, exact(hs_in, down), l1)


def test_the_shared_expert_launches_refuse_wrong_shapes() -> None:
    """The shared expert's weights and outputs are checked before any launch, with the shapes named."""
    w13 = random_experts(5, 40, 768, seed=61)
    ids = _routing().reshape(-1).contiguous()
    x = torch.zeros(10, 768, dtype=torch.bfloat16)
    gate_up = random_nvfp4(120, 768, seeded(63), (60, 60))  # I_s 60: not a multiple of 40
    with pytest.raises(ValueError, match="I_s a multiple of 40"):
        mm.launch_moe_gate_up(x, ids, w13, torch.empty(30, 40), 3, 2, vec=True, wide=True,
                              shared=(gate_up, torch.empty(10, 60)))  # fmt: skip
    w2 = random_experts(5, 68, 256, seed=62)
    down = random_nvfp4(136, 512, seeded(64), (136,))
    hh, hs = torch.zeros(30, 256, dtype=torch.bfloat16), torch.zeros(10, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ys \\[T, 136\\]"):
        mm.launch_moe_down(
            hh, ids, w2, torch.empty(30, 136), 2, vec=True, wide=True, shared=(down, hs, torch.empty(10, 100))
        )
    for flag in ("perm", "first"):
        with pytest.raises(ValueError, match="come with the shared expert's programs"):
            mm.launch_moe_down(hh, ids, w2, torch.empty(30, 136), 2, vec=True, wide=True, **{flag: True})
        with pytest.raises(ValueError, match="come with the shared expert's programs"):
            mm.launch_moe_gate_up(x, ids, w13, torch.empty(30, 40), 3, 2, vec=True, wide=True, **{flag: True})


def _routing() -> torch.Tensor:
    """10 tokens, distinct top-3 of 5 experts: expert 1 gets 10 pairs (two MMA chunks of 8), expert 4 none."""
    others = torch.tensor([[0, 2], [2, 3], [3, 0], [0, 3], [2, 0], [3, 2], [0, 2], [2, 3], [3, 0], [0, 3]])
    return torch.cat([others[:, :1], torch.ones(10, 1, dtype=torch.int64), others[:, 1:]], dim=1)


def _assert_h_exact(h: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, w13: NVFP4Weight) -> None:
    """Every pair's h [pairs, I] written, and silu(gate) * up against float64 (top-3, I = h's width)."""
    assert not torch.isnan(h).any(), "a pair or column was never written"
    inter = h.shape[1]
    for p, e in enumerate(ids.reshape(-1).tolist()):
        gu = exact(x[p // 3][None], w13.select(e))[0]
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
    mm.launch_moe_gate_up(x, ids, w13, want, 3, 2, prefetch=prefetch, vec=True)
    assert not l2_requests
    got = torch.full((30, 40), float("nan"))
    spy = LaunchSpy(getattr(mm, twin))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, twin, spy)
        mm.launch_moe_gate_up(x, ids, w13, got, 3, 2, prefetch=prefetch, vec=True, **kw)
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
    with spied(mm, "_moe_gate_up_mma_kernel", vec) as spy:
        mm.launch_moe_gate_up(x, ids.reshape(-1).contiguous(), w13, h, 3, 2, prefetch=prefetch, vec=vec)
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
    spy = LaunchSpy(mm._moe_gate_up_mma_ks_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, "_moe_gate_up_mma_ks_kernel", spy)
        mm.launch_moe_gate_up(
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
            mm.launch_moe_gate_up(x, ids.reshape(-1).contiguous(), w13, h, 3, 4, vec=True, warp_k=bad)


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
        mm.launch_moe_gate_up(x, ids, w13, got, 3, 2, vec=True, l2_ahead=3)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("l2_ahead,prefetch", [(0, False), (0, True), (2, True), (4, False)])
def test_moe_gate_up_wide_kernel(emulated_ptx: None, l2_requests: list[int], l2_ahead: int, prefetch: bool) -> None:
    """`_moe_gate_up_mma_wide_kernel` (MoEConfig.mma_wide): 16 columns a warp, two tiles sharing x's loads. The same
    h as the VEC kernel, bit for bit (each tile's MMAs run in the same order), with I = 40 in programs of 32 columns
    (the second program's tile two and warp two past I); its L2 requests only for later steps of the warp's own rows
    (K of 6 steps); wide with the warps splitting K, or a negative l2_ahead, refused."""
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
        mm.launch_moe_gate_up(x, ids, w13, got, 3, 4, vec=True, warp_k=2, wide=True)
    with pytest.raises(ValueError, match="even number"):
        mm.launch_moe_gate_up(x, ids, w13, got, 3, 2, vec=True, l2_ahead=-2, wide=True)


@pytest.mark.parametrize("vec,prefetch", [(False, False), (False, True), (True, False)], ids=["8B", "prefetch", "16B"])
def test_moe_down_kernel(emulated_ptx: None, prefetch: bool, vec: bool) -> None:
    """`_moe_down_mma_kernel`: each pair's y against float64, N = 136 rows (a ragged row tile), two segments, K of
    two steps."""
    w2 = random_experts(5, 68, 256, seed=9)  # [E, 136, 256], segments (68, 68)
    ids = _routing()
    h = (torch.randn(30, 256, generator=torch.Generator().manual_seed(10)) * 0.5).to(torch.bfloat16)
    y = torch.full((30, 136), float("nan"))
    with spied(mm, "_moe_down_mma_kernel", vec) as spy:
        mm.launch_moe_down(h, ids.reshape(-1).contiguous(), w2, y, num_warps=2, prefetch=prefetch, vec=vec)
    assert spy.launches == 1
    for p, e in enumerate(ids.reshape(-1).tolist()):
        we = w2.select(e)
        l1 = h[p].double().abs()[None] @ we.dequantize(torch.float64, with_global=True).abs().T
        close_to_exact(y[p][None], exact(h[p][None], we), l1)


@pytest.mark.parametrize("mode", [1, 2])
def test_moe_down_asking_l2(emulated_ptx: None, l2_requests: list[int], mode: int) -> None:
    """`_moe_down_mma_l2_kernel` (MoEConfig.mma_down_l2): the same y as the VEC kernel, bit for bit. Mode 1 asks
    only for lines a later K step of the same expert's rows loads; mode 2 asks, before the PDL wait, for every line
    of every row of each expert with pairs, and for none of expert 4's (it has none). K of 6 steps, 3 lines a row."""
    w2 = random_experts(5, 68, 768, seed=21)  # [E, 136, 768], segments (68, 68)
    ids = _routing().reshape(-1).contiguous()
    h = (torch.randn(30, 768, generator=torch.Generator().manual_seed(22)) * 0.5).to(torch.bfloat16)
    want = torch.full((30, 136), float("nan"))
    mm.launch_moe_down(h, ids, w2, want, num_warps=2, vec=True)
    assert not l2_requests and not torch.isnan(want).any()
    got = torch.full((30, 136), float("nan"))
    spy = LaunchSpy(mm._moe_down_mma_l2_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, "_moe_down_mma_l2_kernel", spy)
        mm.launch_moe_down(h, ids, w2, got, num_warps=2, vec=True, l2=mode)
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
        mm.launch_moe_down(h, ids, w2, got, num_warps=2, vec=True, l2=3)


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
    mm.launch_moe_down(h, ids, w2, want, num_warps=2, vec=True)
    got = torch.full((30, 136), float("nan"))
    spy = LaunchSpy(mm._moe_down_mma_wide_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, "_moe_down_mma_wide_kernel", spy)
        mm.launch_moe_down(h, ids, w2, got, num_warps=2, vec=True, l2=mode, wide=True)
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
    mm.launch_moe_gate_up(x, flat, w13, h, topk=3, num_warps=2)
    y = torch.empty(30, 128)
    mm.launch_moe_down(h.to(torch.bfloat16), flat, w2, y, num_warps=2)
    out = (y.to(torch.bfloat16).float().reshape(10, 3, -1) * tw[:, :, None]).sum(1).to(torch.bfloat16)
    want = moe_ref(x, tw, ids, w13, w2)
    assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


def moe_gate_up_ref(x: torch.Tensor, ids: torch.Tensor, w13: NVFP4Weight) -> torch.Tensor:
    """h of every (token, slot) pair, as `moe_ref` computes it."""
    rows = [silu_and_mul_ref(linear_ref(x[p // ids.shape[1]][None], w13.select(int(e))))[0]
            for p, e in enumerate(ids.reshape(-1).tolist())]  # fmt: skip
    return torch.stack(rows)


def gpu_operands(tokens: int) -> tuple:
    """(w [5120, 2048] in three segments, w13 [32, 1024, 2048], w2 [32, 2048, 512], x [tokens, 2048], ids, routing
    weights, h [tokens * 6, 512]) on the GPU, seeded by `tokens`: the linear's and the MoE's operands of the GPU
    tests that compare two ways of reading the same weights (the experts' global scales / 64 keep outputs small)."""

    def cuda(w: NVFP4Weight, scale: float = 1.0) -> NVFP4Weight:
        return NVFP4Weight(w.qweight.cuda(), w.scales.cuda(), w.global_scale.cuda() * scale, w.segments)

    w = cuda(random_nvfp4(5120, 2048, seeded(tokens), (4096, 512, 512)))
    w13 = cuda(random_experts(32, 512, 2048, seed=tokens), 1 / 64)
    w2 = cuda(random_experts(32, 1024, 512, seed=300 + tokens), 1 / 64)
    g = torch.Generator().manual_seed(tokens)
    x = (torch.randn(tokens, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(tokens)]).cuda()
    tw = torch.rand(tokens, 6, generator=g).cuda()
    tw = tw / tw.sum(-1, keepdim=True)
    h = (torch.randn(tokens * 6, 512, generator=g) * 0.5).to(torch.bfloat16).cuda()
    return w, w13, w2, x, ids, tw, h


def random_experts(n_exp: int, inter: int, k: int, seed: int) -> NVFP4Weight:
    parts = [random_nvfp4(2 * inter, k, seeded(seed + e), (inter, inter)) for e in range(n_exp)]
    return NVFP4Weight(
        torch.stack([p.qweight for p in parts]),
        torch.stack([p.scales for p in parts]),
        torch.stack([p.global_scale for p in parts]),
        (inter, inter),
    )


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
    got, want = mm.moe_gate_up(x, ids, w13, vec=vec).float(), moe_gate_up_ref(x, ids, w13).float()
    tol = 3 * 2.0**-8 * torch.maximum(got.abs(), want.abs()) + 1e-3 * want.abs().max()
    assert ((got - want).abs() <= tol).all(), (got - want).abs().max()
    if vec:  # asking L2 ahead changes no result (MoEConfig.mma_l2_ahead), with or without the loads a step ahead
        for l2_ahead, prefetch in ((2, True), (4, False)):
            ahead = mm.moe_gate_up(x, ids, w13, vec=True, prefetch=prefetch, l2_ahead=l2_ahead).float()
            assert torch.equal(ahead, got), (l2_ahead, prefetch)
        # The warps splitting K (MoEConfig.mma_warp_k) sum in another order: within moe_ref's tolerance instead.
        for warps, warp_k, l2_ahead in ((4, 2, 2), (8, 2, 2), (8, 4, 0), (4, 4, 2)):
            split = mm.moe_gate_up(x, ids, w13, warps, vec=True, prefetch=True, l2_ahead=l2_ahead, warp_k=warp_k)
            split = split.float()
            assert ((split - want).abs() <= tol).all(), (warps, warp_k, (split - want).abs().max())
        # Two tiles a warp (MoEConfig.mma_wide) sum each tile in the same order: the same h, bit for bit.
        for warps, l2_ahead, prefetch in ((8, 2, True), (4, 0, False)):
            wide = mm.moe_gate_up(x, ids, w13, warps, vec=True, prefetch=prefetch, l2_ahead=l2_ahead, wide=True)
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
    spies = {n: LaunchSpy(getattr(mm, n)) for n in names}
    with pytest.MonkeyPatch.context() as mp:
        for n, spy in spies.items():
            mp.setattr(mm, n, spy)
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
    y = mm.moe_down(h, ids, w2, vec=vec)
    for p, e in enumerate(ids.reshape(-1).tolist()):
        close_in_bf16(y[p][None], linear_ref(h[p][None], w2.select(e)), h[p][None], w2.select(e))
    if vec:  # asking L2 for the codes changes no result (MoEConfig.mma_down_l2), nor two tiles a warp (mma_down_wide)
        for mode in (1, 2):
            assert torch.equal(mm.moe_down(h, ids, w2, vec=True, l2=mode), y), mode
        for mode, warps in ((0, 4), (2, 8)):
            assert torch.equal(mm.moe_down(h, ids, w2, warps, vec=True, l2=mode, wide=True), y), (mode, warps)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 16, 32, 64])
def test_ready_scales_on_the_gpu(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ready scale bytes (`nvfp4_mma_scales.prepare` on CUDA weights; TileConfig / MoEConfig.mma_ready) change no
    output: the linear at `tokens` rows (the 1-8-row, rows and wide kernels, 16-byte loads) and the MoE's gate_up and
    down (plain, L2 requests, wide) give the same bits as from the UE4M3 bytes; so does `fused_moe` with the table's
    config plus mma_ready."""
    import dataclasses

    # Made on any GPU: by default only where the device's tuning table reads them (the H200's, not an H100's).
    monkeypatch.setenv(nvfp4_mma_scales.ENV, "1")

    from flint_kernels import moe_triton as mt

    w, w13, w2, x, ids, tw, h = gpu_operands(tokens)
    cfg = mt.decode_config(True, tokens, x.device)
    cfg = dataclasses.replace(cfg, expert_major=True, mma=True, mma_down=True, mma_vec=True, use_dot=False)

    def outputs() -> list[torch.Tensor]:
        return [
            nm.linear(x, w, vec=True, ready=True),
            nm.linear(x, w, vec=True, wide=True, ready=True),
            mm.moe_gate_up(x, ids, w13, vec=True, ready=True),
            mm.moe_gate_up(x, ids, w13, 8, vec=True, prefetch=True, l2_ahead=2, wide=True, ready=True),
            mm.moe_down(h, ids, w2, vec=True, l2=2, ready=True),
            mm.moe_down(h, ids, w2, vec=True, l2=2, wide=True, ready=True),
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
@pytest.mark.parametrize("tokens", [5, 8, 9, 16, 32, 64])
@pytest.mark.parametrize("ready,perm", [(False, False), (True, False), (True, True)])
def test_the_shared_expert_in_the_moe_launches_on_the_gpu(tokens: int, ready: bool, perm: bool) -> None:
    """MoEConfig.mma_shared at Flint's shapes (256 experts of I 512 top-6, a shared expert of 1024, H 2048): two MoE
    launches and the slot reduce, no launch of the shared expert's own; the output within BF16 rounding of the
    shared expert run apart (its FP32 sums in another order) and near `moe_ref`; with perm (MoEConfig.mma_perm_h) the
    same bits as without, and with the shared expert's programs first (MoEConfig.mma_shared_first) too."""
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
        mma_shared=False, mma_perm_h=False, mma_shared_first=False,
    )  # fmt: skip
    shared = (gate_up, down)
    assert mt._mma_shared(dataclasses.replace(cfg, mma_shared=True), x, w13, w2, shared)
    apart = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg, shared=shared)
    spy = LaunchSpy(mm._moe_down_mma_wide_shared_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mm, "_moe_down_mma_wide_shared_kernel", spy)
        folded = mt.fused_moe(
            x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(cfg, mma_shared=True), shared=shared
        )
    if perm:  # the same bits with h in the MMA's order (mma_perm_h), then with it the shared expert's programs first
        # in the grids (mma_shared_first)
        for extra in ({"mma_perm_h": True}, {"mma_perm_h": True, "mma_shared_first": True}):
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
