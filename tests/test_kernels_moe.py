"""Triton routed experts (`flint_kernels.moe_triton`) against `moe_ref`, on both the decode and grouped paths.

Interpreter (CPU) runs are float32 (relative error < 1e-5) and float16 (< 1e-3), with every output, intermediate
and workspace allocated NaN-filled. The grouped (prefill) path is forced with `decode_max_tokens=0`. The `gpu`
tests check bfloat16 at Flint's expert shapes (< 1e-2), CUDA-graph capture and run-to-run determinism.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from flint_kernels import gemv_triton as gt
from flint_kernels import moe_triton as mt
from flint_kernels import nvfp4, split_k_triton
from flint_kernels.linear import NVFP4Weight
from flint_kernels.moe import moe_add_rms_norm_ref, moe_ref
from kernel_checks import LaunchSpy, poisoned_empty, rel_err, replaced, routing
from kernel_checks import random_nvfp4_experts as random_nvfp4

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
pytestmark = pytest.mark.skipif(
    not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

# Small tiles so the tiny test shapes still have ragged tails, several K steps and a real K split.
DECODE_FMA = mt.MoEConfig(block_m=1, gu_block_i=16, gu_block_k=32, dn_block_n=32, dn_block_k=32, use_dot=False,
                          num_warps=4, num_stages=1)  # fmt: skip
DECODE_DOT = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
GROUPED = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
GROUPED_WORDS = mt.MoEConfig(16, 16, 128, 32, 128, True, 4, 2, words=True)
GROUPED_PACKED = mt.MoEConfig(16, 16, 64, 32, 64, True, 4, 2, packed=True)


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mt, "_empty", poisoned_empty)
    monkeypatch.setattr(gt, "_empty", poisoned_empty)


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def dense_experts(e: int, h: int, i: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    w13 = torch.randn(e, 2 * i, h, generator=g, device=DEVICE) / math.sqrt(h)
    w2 = torch.randn(e, h, i, generator=g, device=DEVICE) / math.sqrt(i)
    return w13.to(dtype), w2.to(dtype)


def quantized_experts(e: int, h: int, i: int, g: torch.Generator) -> tuple[NVFP4Weight, NVFP4Weight]:
    """Experts made by the project's encoder: gate|up with separate per-expert scales, down with one."""

    def enc(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gs = nvfp4.choose_global_scale(w.abs().amax(dim=(1, 2)), power_of_two=False) * 1.1
        q, s = nvfp4.quantize(w, gs)
        return q, s, gs

    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    qg, sg, gg = enc(w13[:, :i])
    qu, su, gu = enc(w13[:, i:])
    qd, sd, gd = enc(w2)
    n13 = NVFP4Weight(torch.cat((qg, qu), 1), torch.cat((sg, su), 1), torch.stack((gg, gu), 1), (i, i))
    return n13, NVFP4Weight(qd, sd, gd[:, None], (h,))


# ----------------------------------------------------------------------------------------------- decode path
@pytest.mark.parametrize(
    "t,config", [(1, DECODE_FMA), (8, DECODE_FMA), (3, DECODE_DOT)], ids=["fma-1", "fma-8", "dot-3"]
)
def test_decode_dense_fp32(t: int, config: mt.MoEConfig) -> None:
    g = gen(t)
    e, h, i, k = 8, 96, 48, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=config, split_k=2)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5


@pytest.mark.parametrize("t,split_k", [(1, 3), (3, 1)])
def test_decode_nvfp4_fp32(t: int, split_k: int) -> None:
    g = gen(10 + t)
    e, h, i, k = 6, 128, 48, 4
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13 = random_nvfp4(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4(e, h, i, g, (h,))
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=DECODE_FMA, split_k=split_k)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5


EXPERT_MAJOR = dataclasses.replace(DECODE_FMA, gu_block_i=32, gu_block_k=64, expert_major=True)


@pytest.mark.parametrize(("dtype", "h"), [(torch.float32, 160), (torch.float16, 128)])
def test_decode_nvfp4_expert_major(dtype: torch.dtype, h: int) -> None:
    """Gate_up expert-major: each (I-tile, expert) program finds its pairs and decodes each weight once for two of
    them at a time. Experts with 0, 1, 2, 3 and 5 pairs (odd counts end on the one-row path), a ragged I tile (48
    of 64) and H = 160 (a partial K step): the per-pair kernels' output with the same tiles bit for bit, and the
    reference's."""
    g = gen(30 + h)
    t, e, i, k = 5, 8, 48, 3
    ids = torch.tensor([[0, 1, 2], [0, 2, 3], [0, 3, 4], [0, 2, 6], [0, 3, 6]], device=DEVICE)
    tw = torch.rand(t, k, generator=g, device=DEVICE)
    tw = (tw / tw.sum(-1, keepdim=True)).float()
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    w13 = random_nvfp4(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4(e, h, i, g, (h,))
    same_tiles = dataclasses.replace(EXPERT_MAJOR, expert_major=False)
    per_pair = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=same_tiles, split_k=1)
    spy = LaunchSpy(mt._moe_gate_up_expert_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_gate_up_expert_kernel", spy)
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=EXPERT_MAJOR)
    assert spy.launches == 1
    assert torch.equal(out, per_pair)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < (1e-5 if dtype == torch.float32 else 1e-3)


def test_mma_gate_up_falls_back_where_it_cannot_run() -> None:
    """MoEConfig.mma (and mma_down) ask for `nvfp4_mma_moe_triton`'s kernels, which need BF16 x on a GPU (PTX): with
    float32 x, or under the interpreter, the FMA expert-major launches run instead and give their result bit for
    bit."""
    g = gen(41)
    t, e, i, k, h = 4, 8, 48, 3, 128
    ids = torch.tensor([[0, 1, 2], [0, 2, 3], [0, 3, 4], [5, 2, 6]], device=DEVICE)
    tw = torch.rand(t, k, generator=g, device=DEVICE)
    tw = (tw / tw.sum(-1, keepdim=True)).float()
    x = torch.randn(t, h, generator=g, device=DEVICE)
    w13 = random_nvfp4(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4(e, h, i, g, (h,))
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=EXPERT_MAJOR)
    spy = LaunchSpy(mt._moe_gate_up_expert_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_gate_up_expert_kernel", spy)
        mma = dataclasses.replace(EXPERT_MAJOR, mma=True, mma_down=True)
        got = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=mma)
    assert spy.launches == 1
    assert torch.equal(got, want)
    # mma_down alone, after the per-pair FMA gate_up: the FMA down runs.
    per_pair = dataclasses.replace(EXPERT_MAJOR, expert_major=False)
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=per_pair)
    got = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(per_pair, mma_down=True))
    assert torch.equal(got, want)


UNSORTED = dataclasses.replace(DECODE_DOT, expert_major=True)
UNSORTED_SLOTS = dataclasses.replace(UNSORTED, slots_in_down=True)


@pytest.mark.parametrize("slots_in_down", [False, True], ids=["reduce-launch", "slots-in-down"])
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
def test_decode_expert_major_on_tensor_cores(fmt: str, slots_in_down: bool) -> None:
    """Expert-major tensor-core tiles at decode size: the grouped launches with blocks found in the unsorted ids,
    no sort launch. Expert 0 has all 20 tokens (two 16-pair chunks), others 0-some; a ragged I tile (48 of 32-col
    tiles) and a partial K step (H = 80): the sorted grouped path's output bit for bit, and the reference's. With
    `slots_in_down` the down launch sums each token's slots itself (no reduce launch), counters left zero."""
    config = UNSORTED_SLOTS if slots_in_down else UNSORTED
    g = gen(40 if fmt == "dense" else 41)
    t, e, h, i, k = 20, 8, 80, 48, 3
    rest = torch.stack([torch.randperm(e - 2, generator=g)[: k - 1] + 1 for _ in range(t)]).to(DEVICE)
    ids = torch.cat((torch.zeros(t, 1, dtype=rest.dtype, device=DEVICE), rest), 1)  # expert 7 unused
    tw = torch.rand(t, k, generator=g, device=DEVICE)
    tw = (tw / tw.sum(-1, keepdim=True)).float()
    x = torch.randn(t, h, generator=g, device=DEVICE)
    if fmt == "dense":
        w13, w2 = dense_experts(e, h, i, torch.float32, g)
    else:
        x = x.half()
        w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    sorted_grouped = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=DECODE_DOT, dequant_min_tokens=10**9)
    sorts, align, reduce = [], mt.align, LaunchSpy(mt._moe_reduce_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "align", lambda *a: sorts.append(a) or align(*a))
        mp.setattr(mt, "_moe_reduce_kernel", reduce)
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=config)
    assert sorts == [] and reduce.launches == (0 if slots_in_down else 1)
    assert not split_k_triton.counters(x.device).any()
    assert torch.equal(out, sorted_grouped)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < (1e-5 if fmt == "dense" else 1e-3)


def test_decode_quantized_default_config() -> None:
    g = gen(20)
    e, h, i, k = 8, 128, 64, 3
    x = torch.randn(1, h, generator=g, device=DEVICE)
    tw, ids = routing(1, e, k, g)
    w13, w2 = quantized_experts(e, h, i, g)
    assert rel_err(mt.moe(x, tw, ids, w13, w2), moe_ref(x, tw, ids, w13, w2)) < 1e-5


# ----------------------------------------------------------------------------------------------- shared expert
def dense_shared(h: int, i_s: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    gate_up = torch.randn(2 * i_s, h, generator=g, device=DEVICE) / math.sqrt(h)
    down = torch.randn(h, i_s, generator=g, device=DEVICE) / math.sqrt(i_s)
    return gate_up.to(dtype), down.to(dtype)


def nvfp4_shared(h: int, i_s: int, g: torch.Generator) -> tuple[NVFP4Weight, NVFP4Weight]:
    return random_nvfp4(1, 2 * i_s, h, g, (i_s, i_s)).select(0), random_nvfp4(1, h, i_s, g, (h,)).select(0)


@pytest.mark.parametrize(
    "t,config,split_k", [(1, DECODE_FMA, 2), (5, DECODE_FMA, 1), (3, DECODE_DOT, 2)], ids=["fma-1", "fma-5", "dot-3"]
)
def test_decode_folds_shared_expert_dense_fp32(t: int, config: mt.MoEConfig, split_k: int) -> None:
    """I_s = 2I: each token's shared expert runs as two extra gate_up rows and one extra down slot."""
    g = gen(200 + t)
    e, h, i, k = 8, 96, 48, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    shared = dense_shared(h, 2 * i, torch.float32, g)
    assert mt.foldable(shared, x, w13, w2)
    out = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=64, config=config, split_k=split_k, shared=shared, fold_max_tokens=64
    )
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-5
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0


def shared_case(fmt: str, t: int, g: torch.Generator) -> tuple:
    """t tokens of 8 experts (H 80, I 48, top-3) with a 2I-wide shared expert: FP32 "dense" ones with FP32 x, or
    NVFP4 ones with FP16 x."""
    e, h, i, k = 8, 80, 48, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    if fmt == "dense":
        w13, w2 = dense_experts(e, h, i, torch.float32, g)
        return x, tw, ids, w13, w2, dense_shared(h, 2 * i, torch.float32, g)
    w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    return x.half(), tw, ids, w13, w2, nvfp4_shared(h, 2 * i, g)


@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
def test_expert_major_slots_in_down_folds_shared_expert(fmt: str) -> None:
    """Expert-major tensor-core tiles that sum the slots in the down launch fold the shared expert at any decode
    size (here 20 tokens, above the fold limit): its blocks of BLOCK_M tokens (two 16-token chunks, I_s = 2I in two
    parts) run in the same two launches and arrive as one more slot; no reduce launch, no separate shared-expert
    launches. The reference's output, and the unfolded run's (shared expert apart, then added) to rounding."""
    g = gen(210 if fmt == "dense" else 211)
    x, tw, ids, w13, w2, shared = shared_case(fmt, 20, g)
    assert mt.foldable(shared, x, w13, w2)
    apart = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=UNSORTED, shared=shared, fold_max_tokens=8)
    spy_reduce, spies = LaunchSpy(mt._moe_reduce_kernel), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_reduce_kernel", spy_reduce)
        mp.setattr(mt, "shared_expert", lambda *a: spies.append(a))
        out = mt.fused_moe(
            x, tw, ids, w13, w2, decode_max_tokens=64, config=UNSORTED_SLOTS, shared=shared, fold_max_tokens=8
        )
    assert spy_reduce.launches == 0 and spies == []
    tol = 1e-5 if fmt == "dense" else 1e-3
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2, shared)) < tol
    assert rel_err(out, apart) < tol
    assert not split_k_triton.counters(x.device).any()


@pytest.mark.parametrize("t", [1, 2])
def test_decode_folds_shared_expert_nvfp4_fp32(t: int) -> None:
    g = gen(210 + t)
    e, h, i, k = 6, 128, 32, 4
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13 = random_nvfp4(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4(e, h, i, g, (h,))
    shared = nvfp4_shared(h, 2 * i, g)
    assert mt.foldable(shared, x, w13, w2)
    out = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=64, config=DECODE_FMA, split_k=2, shared=shared, fold_max_tokens=64
    )
    ref = moe_ref(x, tw, ids, w13, w2, shared)
    assert rel_err(out, ref) < 1e-5
    # The shared part is really there: without it the result is far off.
    assert rel_err(moe_ref(x, tw, ids, w13, w2), ref) > 1e-2
    runs = [
        mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=DECODE_FMA, shared=shared, fold_max_tokens=64)
        for _ in "ab"
    ]
    assert torch.equal(runs[0], runs[1])
    # The per-pair tensor-core tiles with the packed BF16-pair decode (emulated here), shared expert folded in.
    packed = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2, packed=True)
    out = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=64, config=packed, split_k=2, shared=shared, fold_max_tokens=64
    )
    assert rel_err(out, ref) < 1e-5


def moe_case(fmt: str, t: int, e: int, h: int, i: int, k: int, with_shared: bool, g: torch.Generator) -> tuple:
    """x [t, h] FP32, routing, experts ("dense" FP32 or "nvfp4") and the 2I-wide shared expert (or None)."""
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    if fmt == "dense":
        w13, w2 = dense_experts(e, h, i, torch.float32, g)
        shared = dense_shared(h, 2 * i, torch.float32, g) if with_shared else None
    else:
        w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
        shared = nvfp4_shared(h, 2 * i, g) if with_shared else None
    return x, tw, ids, w13, w2, shared


# The down launch of a program a (output tile, token), the slots added in registers (MoEConfig.dn_token_slots).
TOKEN_SLOTS = dataclasses.replace(DECODE_FMA, dn_block_n=16, dn_token_slots=True)


@pytest.mark.parametrize(
    "fmt,t,k,i,with_shared",
    [("dense", 1, 3, 48, True), ("dense", 2, 6, 64, False), ("nvfp4", 1, 6, 32, True), ("nvfp4", 2, 5, 48, False)],
)
def test_decode_down_adds_a_tokens_slots_in_one_program(fmt: str, t: int, k: int, i: int, with_shared: bool) -> None:
    """The reference's output with neither the per-pair down launch nor its counters; K (I = 48) not a power of two,
    top-k 3, 5 and 6 (padded to 4 and 8 slots), H (80) not a multiple of the 16-column tile, the shared expert folded
    in or not; the per-pair launch's output to FP32 rounding, and the same bits on every run."""
    x, tw, ids, w13, w2, shared = moe_case(
        fmt, t, 8, 80 if fmt == "dense" else 128, i, k, with_shared, gen(230 + t + k)
    )
    kw = {"decode_max_tokens": 64, "shared": shared, "fold_max_tokens": 64}
    per_pair = mt.fused_moe(x, tw, ids, w13, w2, config=DECODE_FMA, **kw)
    spy = LaunchSpy(mt._moe_down_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_down_kernel", spy)
        runs = [mt.fused_moe(x, tw, ids, w13, w2, config=TOKEN_SLOTS, **kw) for _ in "ab"]
    assert spy.launches == 0
    assert rel_err(runs[0], moe_ref(x, tw, ids, w13, w2, shared)) < 1e-5
    assert rel_err(runs[0], per_pair) < 1e-6
    assert torch.equal(runs[0], runs[1])
    assert not split_k_triton.counters(DEVICE).any()


@pytest.mark.parametrize(
    "fmt,t,k,i", [("dense", 1, 6, 32), ("dense", 2, 5, 32), ("nvfp4", 1, 6, 32), ("nvfp4", 1, 5, 32)]
)
def test_decode_down_takes_the_shared_expert_in_its_padding_slots(fmt: str, t: int, k: int, i: int) -> None:
    """`MoEConfig.dn_shared_slots`: the 2I-wide shared expert's two parts in the slot rows padding top-k 6 (all
    eight rows used, as Flint's) or 5 (one left empty) to 8, 1-2 tokens (dense) and 1 (NVFP4), H (80) not a multiple
    of the 16-column tile: the reference's output, the token-slots launch's without it to FP32 rounding (only the
    shared K sum's order differs), the same bits on every run, on its own kernel."""
    x, tw, ids, w13, w2, shared = moe_case(fmt, t, 8, 80 if fmt == "dense" else 128, i, k, True, gen(250 + t + k))
    kw = {"decode_max_tokens": 64, "shared": shared, "fold_max_tokens": 64}
    own_tile = mt.fused_moe(x, tw, ids, w13, w2, config=TOKEN_SLOTS, **kw)
    cfg = dataclasses.replace(TOKEN_SLOTS, dn_shared_slots=True)
    ds = mt.moe_down_slots_triton
    slots, own = LaunchSpy(ds._moe_down_shared_slots_kernel), LaunchSpy(ds._moe_down_slots_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds, "_moe_down_shared_slots_kernel", slots)
        mp.setattr(ds, "_moe_down_slots_kernel", own)
        runs = [mt.fused_moe(x, tw, ids, w13, w2, config=cfg, **kw) for _ in "ab"]
    assert (slots.launches, own.launches) == (2, 0)
    assert rel_err(runs[0], moe_ref(x, tw, ids, w13, w2, shared)) < 1e-5
    assert rel_err(runs[0], own_tile) < 1e-6
    assert torch.equal(runs[0], runs[1])


def test_shared_slots_fit_only_the_padding() -> None:
    """The shared expert's parts go into the padding slots only where they all fit and INTER is one K step; else the
    token-slots launch keeps its own tile for it (Flint: 6 + 1024 / 512 = 8 fits)."""
    from flint_kernels import moe_down_slots_triton as ds

    assert ds.shared_slots_fit(6, 512, 1024)
    assert ds.shared_slots_fit(5, 32, 64) and not ds.shared_slots_fit(7, 32, 64)
    assert not ds.shared_slots_fit(3, 32, 64)  # 3 + 2 > 4
    assert not ds.shared_slots_fit(6, 48, 96)  # INTER not a power of two
    assert not ds.shared_slots_fit(6, 32, 48) and not ds.shared_slots_fit(6, 32, 0)
    flint = (2048, 6, 512, 1024)
    # 4 columns a program: 8 slots x 4 x 512 values over 128 threads, 256 bytes a thread with the shared expert in
    # the padding (320 with its tile of 4 x 1024); 8 columns: 512 bytes, past the bound either way.
    four = dataclasses.replace(TOKEN_SLOTS, dn_block_n=4, dn_shared_slots=True)
    assert mt._token_slots(four, True, 2, *flint)
    assert not mt._token_slots(dataclasses.replace(four, dn_block_n=8), True, 2, *flint)
    x, tw, ids, w13, w2, shared = moe_case("dense", 1, 8, 80, 48, 6, True, gen(260))
    slots, own = LaunchSpy(ds._moe_down_shared_slots_kernel), LaunchSpy(ds._moe_down_slots_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds, "_moe_down_shared_slots_kernel", slots)
        mp.setattr(ds, "_moe_down_slots_kernel", own)
        cfg = dataclasses.replace(TOKEN_SLOTS, dn_shared_slots=True)
        out = mt.fused_moe(x, tw, ids, w13, w2, config=cfg, decode_max_tokens=64, shared=shared, fold_max_tokens=64)
    assert (slots.launches, own.launches) == (0, 1)  # I = 48: the shared expert keeps its own tile
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-5


def test_decode_down_token_slots_keep_the_per_pair_launch_where_they_do_not_fit() -> None:
    """Tiles past the register bound (Flint's down at 16 columns a program: 8 slots x 16 x 512 and the shared
    16 x 1024 values over 128 threads), experts whose rows are not stacked, tensor-core tiles, or the option off:
    the per-pair launch runs."""
    flint = (2048, 6, 512, 1024)
    four = dataclasses.replace(TOKEN_SLOTS, dn_block_n=4)
    assert mt._token_slots(four, True, 2, *flint)  # 320 bytes a thread, BF16 or NVFP4
    assert not mt._token_slots(TOKEN_SLOTS, True, 2, *flint)
    assert mt._token_slots(dataclasses.replace(TOKEN_SLOTS, num_warps=16), True, 2, *flint)
    assert not mt._token_slots(four, False, 2, *flint)
    assert not mt._token_slots(dataclasses.replace(four, use_dot=True), True, 2, *flint)
    assert not mt._token_slots(dataclasses.replace(four, dn_token_slots=False), True, 2, *flint)
    g = gen(240)
    t, e, h, i, k = 1, 8, 64, 32, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    padded = torch.zeros(e, h + 1, i, device=DEVICE)
    padded[:, :h] = w2
    w2 = padded[:, :h]  # the same values, a spare row between experts: not stacked
    spy = LaunchSpy(mt._moe_down_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_down_kernel", spy)
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=TOKEN_SLOTS)
    assert spy.launches == 1
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5


@pytest.mark.parametrize("case", ["width", "storage", "grouped", "tokens"])
def test_shared_expert_not_folded_runs_apart(case: str) -> None:
    """A shared width that is not a multiple of I, mixed storage, the grouped path, or more tokens than the fold
    threshold: the shared expert runs on its own, then is added."""
    g = gen(220)
    e, h, i, k, t = 6, 64, 32, 2, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    shared = dense_shared(h, 48 if case == "width" else 2 * i, torch.float32, g)
    if case == "storage":
        w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    assert mt.foldable(shared, x, w13, w2) == (case in ("grouped", "tokens"))
    dmt = 0 if case == "grouped" else 64
    config = GROUPED if case == "grouped" else DECODE_FMA
    fold_max = t - 1 if case == "tokens" else 64
    out = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=dmt, config=config, shared=shared, fold_max_tokens=fold_max
    )
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("config", [GROUPED, UNSORTED], ids=["grouped", "expert-major"])
def test_shared_expert_apart_added_by_the_reduce_launch(dtype: torch.dtype, config: mt.MoEConfig) -> None:
    """With the shared expert apart, the slot-reduce launch adds its output: the same bits as adding it after the
    routed sum (the reference's add in x's dtype), and no separate add."""
    g = gen(225)
    e, h, i, k, t = 6, 64, 32, 2, 20
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, dtype, g)
    shared = dense_shared(h, 2 * i, dtype, g)
    dmt = 0 if config is GROUPED else 64
    reduce = LaunchSpy(mt._moe_reduce_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_reduce_kernel", reduce)
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=dmt, config=config, shared=shared, fold_max_tokens=0)
    assert reduce.launches == 1
    routed = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=dmt, config=config)
    assert torch.equal(out, routed + mt.shared_expert(x, shared))
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2, shared)) < (1e-5 if dtype == torch.float32 else 1e-3)


def test_moe_op_with_shared_expert_default_config() -> None:
    g = gen(230)
    e, h, i, k = 8, 128, 64, 3
    x = torch.randn(2, h, generator=g, device=DEVICE)
    tw, ids = routing(2, e, k, g)
    w13, w2 = quantized_experts(e, h, i, g)
    shared = nvfp4_shared(h, 2 * i, g)
    assert rel_err(mt.moe(x, tw, ids, w13, w2, shared), moe_ref(x, tw, ids, w13, w2, shared)) < 1e-5


# ------------------------------------------------------------------------------------- add+RMSNorm epilogue
@pytest.mark.parametrize("fmt,t,with_shared", [("dense", 1, True), ("dense", 5, False), ("nvfp4", 2, True)])
def test_moe_add_rms_norm_in_the_down_launch_fp32(fmt: str, t: int, with_shared: bool) -> None:
    """Each token's last down tile adds the residual and normalises the row (dense H = 200 at T = 5: a ragged last
    tile of the tensor-core down tiles)."""
    g = gen(500 + t)
    h = 200 if fmt == "dense" else 208  # NVFP4 needs K (the hidden size for gate_up) in 16-value groups
    x, tw, ids, w13, w2, shared = moe_case(fmt, t, 6, h, 32, 3, with_shared, g)
    residual = torch.randn(t, h, generator=g, device=DEVICE) * 2
    norm_w = torch.rand(h, generator=g, device=DEVICE) + 0.5
    want_h, want_res = moe_add_rms_norm_ref(x, tw, ids, w13, w2, shared, residual, norm_w, 1e-6)
    runs = [mt.moe_add_rms_norm(x, tw, ids, w13, w2, shared, residual, norm_w, 1e-6) for _ in "ab"]
    for got_h, got_res in runs:
        assert rel_err(got_h, want_h) < 1e-5 and rel_err(got_res, want_res) < 1e-5
    assert torch.equal(runs[0][0], runs[1][0])
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0


def test_moe_add_rms_norm_falls_back_outside_the_decode_path() -> None:
    """Past the shared-expert fold limit the MoE and the add+RMSNorm kernel run one after the other."""
    g = gen(510)
    e, h, i, k, t = 6, 64, 32, 2, 20
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    shared = dense_shared(h, 2 * i, torch.float32, g)
    residual = torch.randn(t, h, generator=g, device=DEVICE)
    norm_w = torch.rand(h, generator=g, device=DEVICE) + 0.5
    got = mt.moe_add_rms_norm(x, tw, ids, w13, w2, shared, residual, norm_w, 1e-6)
    want = moe_add_rms_norm_ref(x, tw, ids, w13, w2, shared, residual, norm_w, 1e-6)
    assert rel_err(got[0], want[0]) < 1e-5 and rel_err(got[1], want[1]) < 1e-5


# ----------------------------------------------------------------------------------------------- grouped path
@pytest.mark.parametrize("t", [5, 33])
def test_grouped_dense_fp32(t: int) -> None:
    """E = 4 and k = 3 put up to 33 pairs on one expert: several blocks per expert, ragged last blocks."""
    g = gen(30 + t)
    e, h, i, k = 4, 96, 48, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5
    if t == 5:  # int32 expert ids work too
        out = mt.fused_moe(x, tw, ids.int(), w13, w2, decode_max_tokens=0, config=GROUPED)
        assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5


def test_grouped_nvfp4_fp32_with_unused_experts() -> None:
    g = gen(40)
    e, h, i, k, t = 8, 128, 64, 2, 8
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e - 3, k, g)  # experts 5..7 get no tokens
    w13 = random_nvfp4(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4(e, h, i, g, (h,))
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED_PACKED)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5
    if gt.WORDS_SUPPORTED:
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED_WORDS)
        assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < 1e-5
    w13q, w2q = quantized_experts(e, h, i, g)
    out = mt.fused_moe(x, tw, ids, w13q, w2q, decode_max_tokens=0)  # default grouped tiles
    assert rel_err(out, moe_ref(x, tw, ids, w13q, w2q)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_nvfp4_from_dequantised_copies(dtype: torch.dtype) -> None:
    """Long prefills run NVFP4 experts from exact copies in x's dtype: per-expert, per-segment global scales still
    multiply the FP32 accumulators, so the result matches the reference as the in-register path does."""
    g = gen(45)
    e, h, i, k, t = 8, 128, 64, 2, 12
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 2, k, g)
    w13 = random_nvfp4(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4(e, h, i, g, (h,))
    ref = moe_ref(x, tw, ids, w13, w2)
    copies = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED, dequant_min_tokens=t)
    registers = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED, dequant_min_tokens=t + 1)
    tol = 1e-5 if dtype == torch.float32 else 1e-3
    assert rel_err(copies, ref) < tol and rel_err(registers, ref) < tol
    assert rel_err(copies, registers) < tol
    dense = mt._dequantized(w13, dtype)
    assert isinstance(dense, mt.ScaledWeight) and dense.data.dtype == dtype and dense.shape == (e, 2 * i, h)
    assert mt._dequantized(dense.data, dtype) is dense.data  # a dense weight stays as it is
    # The engine's default threshold sends short prefills through the registers path.
    assert mt.paths_config(True, x.device).dequant_min_tokens > 64


# ----------------------------------------------------------------------------------------------- both paths
def test_fp16_both_paths() -> None:
    g = gen(60)
    e, h, i, k, t = 6, 64, 32, 2, 6
    x = torch.randn(t, h, generator=g, device=DEVICE).half()
    tw, ids = routing(t, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float16, g)
    ref = moe_ref(x, tw, ids, w13, w2)
    assert rel_err(mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=DECODE_FMA), ref) < 1e-3
    assert rel_err(mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED), ref) < 1e-3


def test_decode_is_deterministic_and_leaves_counters_zero() -> None:
    g = gen(70)
    e, h, i, k = 6, 64, 32, 3
    x = torch.randn(2, h, generator=g, device=DEVICE)
    tw, ids = routing(2, e, k, g)
    w13, w2 = dense_experts(e, h, i, torch.float32, g)
    runs = [mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=DECODE_FMA, split_k=2) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0


def test_uncovered_inputs_fall_back_to_reference() -> None:
    g = gen(80)
    x = torch.randn(3, 64, generator=g, device=DEVICE)
    tw, ids = routing(3, 4, 2, g)
    w13, w2 = dense_experts(4, 64, 32, torch.float32, g)
    w2_bad = w2.transpose(1, 2).contiguous().transpose(1, 2)  # K not unit-stride
    assert torch.equal(mt.moe(x, tw, ids, w13, w2_bad), moe_ref(x, tw, ids, w13, w2_bad))


def test_empty_widths_take_the_reference() -> None:
    """The kernels read a first K step before their loop, so an expert or shared width of 0 never reaches them."""
    g = gen(81)
    x = torch.randn(3, 64, generator=g, device=DEVICE)
    tw, ids = routing(3, 4, 2, g)
    w13, w2 = dense_experts(4, 64, 0, torch.float32, g)
    assert not mt.supported(x, w13, w2)
    assert torch.equal(mt.moe(x, tw, ids, w13, w2), moe_ref(x, tw, ids, w13, w2))
    w13, w2 = dense_experts(4, 64, 32, torch.float32, g)
    assert not mt.foldable(dense_shared(64, 0, torch.float32, g), x, w13, w2)


# ----------------------------------------------------------------------------------------------- GPU (bf16)
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [1, 4, 8, 33, 192, 300])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_bf16_flint_shapes(t: int, fmt: str) -> None:
    g = gen(t)
    e, h, i, k = 256, 2048, 512, 6
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    if fmt == "bf16":
        w13, w2 = dense_experts(e, h, i, torch.bfloat16, g)
    else:
        w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    ref = moe_ref(x, tw, ids, w13, w2)
    assert rel_err(mt.moe(x, tw, ids, w13, w2), ref) < 1e-2
    # Both paths whatever the default threshold; the decode path at every size (the H200's NVFP4 runs it up to 192
    # tokens: ids scans 2,048 wide).
    for dmt in (0, max(t, 64)):
        assert rel_err(mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=dmt), ref) < 1e-2
    if fmt == "nvfp4" and t > 8:  # the grouped path on BF16 copies of the experts, and decoding in registers
        for dq in (0, 10**9):
            out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, dequant_min_tokens=dq)
            assert rel_err(out, ref) < 1e-2


def flint_moe_inputs(t: int, fmt: str, g: torch.Generator) -> tuple:
    """BF16 tokens, routing and Flint-sized experts (256 x 512 wide, top-6) with the 1024-wide shared expert."""
    e, h, i, k = 256, 2048, 512, 6
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    if fmt == "bf16":
        w13, w2 = dense_experts(e, h, i, torch.bfloat16, g)
        return x, tw, ids, w13, w2, dense_shared(h, 1024, torch.bfloat16, g)
    w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    return x, tw, ids, w13, w2, nvfp4_shared(h, 1024, g)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [8, 32, 64])
def test_gpu_nvfp4_expert_major_flint_shapes(t: int) -> None:
    """Flint's NVFP4 experts, BF16 tokens: gate_up expert-major gives the per-pair kernels' output up to the order
    of the in-register reductions, which the GPU compiler picks per layout (the interpreter test is bit for bit;
    on the H200 the two differ in a few h roundings, 2026-11-30)."""
    g = gen(700 + t)
    x, tw, ids, w13, w2, _ = flint_moe_inputs(t, "nvfp4", g)
    per_pair = mt.MoEConfig(1, 16, 512, 16, 512, False, 2, 1)
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=per_pair, split_k=1)
    got = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(per_pair, expert_major=True)
    )
    assert rel_err(got, want) < 2e-3
    assert rel_err(got, moe_ref(x, tw, ids, w13, w2)) < 1e-2


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [3, 16, 32, 64])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_expert_major_tensor_cores_flint_shapes(t: int, fmt: str) -> None:
    """Flint's experts at decode sizes, expert-major on tensor cores (blocks from the unsorted ids): the sorted
    grouped launches' output bit for bit (the same kernels and tiles), and the reference's. With the slots summed in
    the down launch (`slots_in_down`) the same sums up to FMA contraction (the reduce launch may fuse its multiply
    and add; the down launch stores the products first), counters left zero."""
    g = gen(720 + t)
    x, tw, ids, w13, w2, _ = flint_moe_inputs(t, fmt, g)
    tiles = mt.MoEConfig(16, 32, 128, 64, 128, True, 4, 3)
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=tiles, dequant_min_tokens=10**9)
    got = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=dataclasses.replace(tiles, expert_major=True))
    assert torch.equal(got, want)
    assert rel_err(got, moe_ref(x, tw, ids, w13, w2)) < 1e-2
    slots = dataclasses.replace(tiles, expert_major=True, slots_in_down=True)
    here = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=slots)
    assert rel_err(here, want) < 1e-3
    assert not split_k_triton.counters(x.device).any()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [9, 32, 64])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_expert_major_slots_fold_shared_flint_shapes(t: int, fmt: str) -> None:
    """Flint's experts and 1024-wide shared expert, expert-major on tensor cores with the slots summed in the down
    launch: the shared expert folded as blocks of 16 tokens; the reference's output, and the run with the shared
    expert apart to rounding; counters left zero."""
    g = gen(760 + t)
    x, tw, ids, w13, w2, shared = flint_moe_inputs(t, fmt, g)
    tiles = mt.MoEConfig(16, 64, 128, 128, 128, True, 4, 3, expert_major=True)
    apart = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=tiles, shared=shared, fold_max_tokens=0)
    slots = dataclasses.replace(tiles, slots_in_down=True)
    got = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=slots, shared=shared, fold_max_tokens=0)
    assert rel_err(got, apart) < 2e-3
    assert rel_err(got, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-2
    assert not split_k_triton.counters(x.device).any()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [1, 8, 33])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_shared_expert_flint_shapes(t: int, fmt: str) -> None:
    """Routed + the 1024-wide shared expert in one op (folded into the decode launches up to the threshold)."""
    g = gen(300 + t)
    x, tw, ids, w13, w2, shared = flint_moe_inputs(t, fmt, g)
    ref = moe_ref(x, tw, ids, w13, w2, shared)
    assert rel_err(mt.moe(x, tw, ids, w13, w2, shared), ref) < 1e-2
    for dmt in (0, 64):
        assert rel_err(mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=dmt, shared=shared), ref) < 1e-2
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize(
    "fmt,block_n,shared_slots",
    [("bf16", 1, False), ("bf16", 2, False), ("nvfp4", 1, False), ("nvfp4", 2, False), ("bf16", 2, True),
     ("bf16", 4, True), ("nvfp4", 2, True), ("nvfp4", 4, True)],
)  # fmt: skip
def test_gpu_down_token_slots_flint_shapes(t: int, fmt: str, block_n: int, shared_slots: bool) -> None:
    """Flint's experts with the folded shared expert (in a tile of its own or in the padding slots), BF16 tokens,
    the down of a program a (tile, token) at the tiles its A/Bs try: the reference's output, and the per-pair
    launch's up to a few roundings (the K sums' order follows each tile's layout), without the per-pair launch."""
    g = gen(760 + t)
    x, tw, ids, w13, w2, shared = flint_moe_inputs(t, fmt, g)
    base = mt.decode_config(fmt == "nvfp4", t, x.device)
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=base, shared=shared)
    spy = LaunchSpy(mt._moe_down_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_moe_down_kernel", spy)
        cfg = dataclasses.replace(base, dn_token_slots=True, dn_block_n=block_n, dn_shared_slots=shared_slots)
        got = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg, shared=shared)
    assert spy.launches == 0
    assert rel_err(got, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-2
    assert rel_err(got, want) < 5e-3
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("block_n", [2, 4])
def test_gpu_down_token_slots_on_ready_bytes(block_n: int) -> None:
    """The installed 1-token NVFP4 down (token slots, the shared expert in the padding slots) on weights whose ready
    scales and codes took their own bytes' place, as the engine makes them on an H100 or H200: the bits of the same
    launch on the engine's UE4M3 scales and codes."""
    g = gen(770 + block_n)
    x, tw, ids, w13, w2, shared = flint_moe_inputs(1, "nvfp4", g)
    cfg = dataclasses.replace(mt.decode_config(True, 1, x.device), dn_token_slots=True, dn_block_n=block_n,
                              dn_shared_slots=True)  # fmt: skip
    want = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg, shared=shared)

    r13, r2 = replaced(w13, "both"), replaced(w2, "both")
    rs = (replaced(shared[0], "both"), replaced(shared[1], "both"))
    slots = LaunchSpy(mt.moe_down_slots_triton._moe_down_shared_slots_kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt.moe_down_slots_triton, "_moe_down_shared_slots_kernel", slots)
        got = mt.fused_moe(x, tw, ids, r13, r2, decode_max_tokens=64, config=cfg, shared=rs)
    assert slots.launches == 1
    assert torch.equal(got, want)
    assert rel_err(got, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-2


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("fmt", "t"), [("bf16", 4), ("bf16", 32), ("nvfp4", 4)])
def test_gpu_shared_beside_equals_in_line(fmt: str, t: int) -> None:
    """The shared expert run apart on a side stream beside the routed launches (`MoEPaths.shared_beside`) gives the
    bits of it run in line, eagerly and replayed from a CUDA graph that reads new tokens in place (the side stream
    forks from the step's stream and is joined before its output is added)."""
    g = gen(790 + t)
    x, tw, ids, w13, w2, shared = flint_moe_inputs(t, fmt, g)
    x2 = torch.randn(x.shape, generator=g, device=DEVICE).bfloat16()
    kw = dict(decode_max_tokens=64, fold_max_tokens=0)  # the shared expert apart at any size
    want = mt.fused_moe(x, tw, ids, w13, w2, shared=shared, shared_beside=False, **kw)
    want2 = mt.fused_moe(x2, tw, ids, w13, w2, shared=shared, shared_beside=False, **kw)
    forks: list[torch.device] = []
    side_stream = mt._side_stream
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mt, "_side_stream", lambda device: forks.append(device) or side_stream(device))
        got = mt.fused_moe(x, tw, ids, w13, w2, shared=shared, shared_beside=True, **kw)
        assert len(forks) == 1
        assert torch.equal(got, want)
        assert rel_err(got, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-2
        static = x.clone()
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            mt.fused_moe(static, tw, ids, w13, w2, shared=shared, shared_beside=True, **kw)
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mt.fused_moe(static, tw, ids, w13, w2, shared=shared, shared_beside=True, **kw)
        for tokens, expected in ((x2, want2), (x, want)):
            static.copy_(tokens)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, expected)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [1, 8])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_moe_add_rms_norm_flint_shapes(t: int, fmt: str) -> None:
    """Routed + shared experts with the next layer's add+RMSNorm in the down launch, as the model calls it."""
    g = gen(600 + t)
    x, tw, ids, w13, w2, shared = flint_moe_inputs(t, fmt, g)
    residual = (torch.randn(t, 2048, generator=g, device=DEVICE) * 2).bfloat16()
    norm_w = torch.rand(2048, generator=g, device=DEVICE) + 0.5
    want = moe_add_rms_norm_ref(x, tw, ids, w13, w2, shared, residual, norm_w, 1e-6)
    for _ in range(3):
        got = mt.moe_add_rms_norm(x, tw, ids, w13, w2, shared, residual, norm_w, 1e-6)
        assert rel_err(got[0], want[0]) < 1e-2 and rel_err(got[1], want[1]) < 1e-2
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0


@pytest.mark.gpu
@gpu
def test_gpu_all_configs_bf16() -> None:
    g = gen(90)
    e, h, i, k, t = 16, 1024, 256, 6, 5
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    ref = moe_ref(x, tw, ids, w13, w2)
    packed = mt.MoEConfig(16, 16, 128, 32, 128, True, 4, 3, packed=True)
    configs = (mt.decode_config(True), DECODE_FMA, DECODE_DOT, mt.MoEConfig(16, 16, 256, 32, 256, True, 4, 3), packed)
    for cfg in configs:
        for split in (1, 4):
            out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg, split_k=split)
            assert rel_err(out, ref) < 1e-2, (cfg, split)
    for ppe in (1.0, 30.0, 100.0):
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=mt.grouped_config(ppe))
        assert rel_err(out, ref) < 1e-2, ppe
    for cfg in (packed, mt.MoEConfig(32, 64, 64, 128, 64, True, 4, 3, packed=True)):
        out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, config=cfg)
        assert rel_err(out, ref) < 1e-2, cfg


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [1, 8, 64])
def test_gpu_cuda_graph_capture_and_determinism(t: int) -> None:
    g = gen(100 + t)
    e, h, i, k = 256, 2048, 512, 6
    w13, w2 = random_nvfp4(e, 2 * i, h, g, (i, i)), random_nvfp4(e, h, i, g, (h,))
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    shared = nvfp4_shared(h, 1024, g)
    mt.moe(x, tw, ids, w13, w2, shared)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mt.moe(x, tw, ids, w13, w2, shared)
    for _ in range(3):
        x.copy_(torch.randn(t, h, generator=g, device=DEVICE))
        new_w, new_ids = routing(t, e, k, g)
        tw.copy_(new_w)
        ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, mt.moe(x, tw, ids, w13, w2, shared))
        assert rel_err(out, moe_ref(x, tw, ids, w13, w2, shared)) < 1e-2
    assert int(split_k_triton.counters(DEVICE).abs().sum()) == 0
