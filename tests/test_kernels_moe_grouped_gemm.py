"""The routed MoE on torch's grouped GEMM (`moe_grouped_gemm`) against `moe_ref`, through `fused_moe`'s dispatch.

On the CPU the grouped GEMM is torch's CPU kernel and the slot reduce runs in Triton's interpreter (fp32 and fp16;
the interpreter's bf16 is not trusted); BF16 at Flint's sizes runs on the GPU (`-m gpu`).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from flint_kernels import moe_align_triton
from flint_kernels import moe_grouped_gemm as mg
from flint_kernels import moe_triton as mt
from flint_kernels.moe import moe_ref, shared_expert_ref
from flint_kernels.moe_align import sort_ref
from kernel_checks import LaunchSpy, poison_torch_empty, poisoned_empty, random_nvfp4_experts, rel_err, routing

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
pytestmark = pytest.mark.skipif(
    not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
GROUPED = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
# What the path takes: BF16 on CUDA; on the CPU fp32 and fp16 (the interpreter's bf16 is not trusted).
MOE_DTYPES = [torch.bfloat16] if HAS_CUDA else [torch.float32, torch.float16]
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mt, "_empty", poisoned_empty)
    poison_torch_empty(monkeypatch)  # the grouped-GEMM path allocates through torch.empty / empty_like


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def copies_take_the_grouped_gemm(x: torch.Tensor) -> bool:
    """Whether NVFP4 experts' copies can run on this torch's grouped GEMM: it must give FP32 results of x's dtype."""
    return x.dtype == torch.float32 or mg._fp32_out(x.device)


def experts(e: int, h: int, i: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w13 = torch.randn(e, 2 * i, h, generator=g, device=DEVICE) / math.sqrt(h)
    w2 = torch.randn(e, h, i, generator=g, device=DEVICE) / math.sqrt(i)
    return w13.to(dtype), w2.to(dtype)


@pytest.mark.parametrize("t", [1, 37, 400])  # 400 * 3 pairs: two programs of the count and rank launches
def test_sort_matches_the_stable_reference_up_to_order_within_an_expert(t: int) -> None:
    g = gen(1)
    e, k = 9, 3
    _, ids = routing(t, e - 2, k, g)  # two experts get no pair
    src, pos, offs = moe_align_triton.sort(ids, e)
    ref_src, ref_pos, ref_offs = sort_ref(ids, e)
    assert offs.dtype == torch.int32 and torch.equal(offs, ref_offs)
    assert offs[-1] == t * k and offs[-1] == offs[-2] == offs[-3]  # unused experts: empty groups at the end
    flat = ids.reshape(-1)
    tokens = torch.arange(t * k, device=DEVICE) // k
    for order_src, order_pos in ((src, pos), (ref_src, ref_pos)):
        assert torch.equal(order_src[order_pos], tokens)  # each pair's row holds its token
        assert torch.equal(torch.sort(order_pos).values, torch.arange(t * k, device=DEVICE))  # a permutation
        rows_expert = torch.empty_like(flat)
        rows_expert[order_pos] = flat
        assert torch.equal(rows_expert, torch.sort(flat).values)  # rows grouped by expert, in expert order
    # The reference is the stable sort: an expert's pairs in pair order.
    assert torch.equal(ref_pos, torch.sort(flat, stable=True).indices.argsort())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("with_add", [False, True], ids=["plain", "add"])
def test_reduce_sorted_sums_slots_in_order(dtype: torch.dtype, with_add: bool) -> None:
    """Each token's k rows read through pos, weighted in FP32, added in slot order, rounded once (then the add)."""
    g = gen(2)
    t, k, h = 11, 4, 80  # H not a power of two: a masked tail
    y = torch.randn(t * k, h, generator=g, device=DEVICE).to(dtype)
    pos = torch.randperm(t * k, generator=g, device=DEVICE)
    tw = torch.rand(t, k, generator=g, device=DEVICE)
    add = torch.randn(t, h, generator=g, device=DEVICE).to(dtype) if with_add else None
    out = mg.reduce_sorted(y, pos, tw, torch.empty(t, h, dtype=dtype, device=DEVICE), add)
    rows = y[pos].float().view(t, k, h) * tw[:, :, None]
    ref = rows.sum(1).to(dtype)
    if add is not None:
        ref = ref + add
    assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("dtype", MOE_DTYPES, ids=str)
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "shared"])
def test_fused_moe_takes_the_grouped_gemm_from_its_threshold(
    dtype: torch.dtype, with_shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From `grouped_gemm_min_tokens` tokens the grouped path runs on the grouped GEMM and matches `moe_ref` (the
    shared expert, run apart, added by the sorted reduce); below it the Triton grouped kernels run."""
    g = gen(3)
    e, h, i, k, t = 8, 64, 32, 3, 24
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)  # expert 7 unused: an empty group
    w13, w2 = experts(e, h, i, dtype, g)
    shared = experts(1, h, 2 * i, dtype, g) if with_shared else None
    if shared is not None:
        shared = (shared[0][0], shared[1][0])
    ref = moe_ref(x, tw, ids, w13, w2, shared)
    spy = LaunchSpy(mg._moe_reduce_sorted_kernel)
    monkeypatch.setattr(mg, "_moe_reduce_sorted_kernel", spy)
    tol = TOL[dtype]
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, shared=shared, grouped_gemm_min_tokens=t)
    assert spy.launches == 1 and rel_err(out, ref) < tol
    below = mt.fused_moe(
        x, tw, ids, w13, w2, decode_max_tokens=0, config=GROUPED, shared=shared, grouped_gemm_min_tokens=t + 1
    )
    assert spy.launches == 1 and rel_err(below, ref) < tol
    if shared is not None:  # the add really is the shared expert's
        assert rel_err(out, moe_ref(x, tw, ids, w13, w2) + shared_expert_ref(x, shared)) < tol


def test_grouped_gemm_declines_what_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode-sized batches, NVFP4 experts, mixed dtypes, non-contiguous stacks, unaligned rows, other dtypes than
    BF16 on CUDA and a zero threshold stay on the Triton kernels; the shipped default (no table entry) is zero."""
    g = gen(4)
    e, h, i = 4, 64, 32
    dtype = MOE_DTYPES[0]
    x = torch.randn(5, h, generator=g, device=DEVICE).to(dtype)
    w13, w2 = experts(e, h, i, dtype, g)
    assert mg.fits(x, w13, w2)
    assert not mg.fits(x, w13.half() if dtype != torch.float16 else w13.float(), w2)
    if HAS_CUDA:
        assert not mg.fits(x.float(), w13.float(), w2.float())
    assert not mg.fits(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2)
    assert not mg.fits(x, mt.ScaledWeight(w13, torch.ones(e, 2), (i, i)), w2)
    assert not mg.fits(x[:, :63], w13[..., :63].contiguous(), w2[:, :63].contiguous())  # rows not 16-byte aligned
    assert mt.MoEPaths(64, 8).grouped_gemm_min_tokens == 0
    tw, ids = routing(5, e, 2, g)
    ref = moe_ref(x, tw, ids, w13, w2)
    spy = LaunchSpy(mg._moe_reduce_sorted_kernel)
    monkeypatch.setattr(mg, "_moe_reduce_sorted_kernel", spy)
    for kwargs in (
        {"decode_max_tokens": 64, "grouped_gemm_min_tokens": 1},
        {"decode_max_tokens": 0, "grouped_gemm_min_tokens": 0},
    ):
        out = mt.fused_moe(x, tw, ids, w13, w2, config=GROUPED, **kwargs)
        assert rel_err(out, ref) < TOL[dtype]
    assert spy.launches == 0


@pytest.mark.parametrize("up_scales", [2, 1], ids=["gate-up-scales", "one-scale"])
def test_nvfp4_copies_on_the_grouped_gemm(up_scales: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVFP4 experts from `dequant_min_tokens` run as BF16 copies; from `grouped_gemm_min_tokens` those copies run on
    the grouped GEMM with FP32 results, each expert's global scales applied before the one rounding (gate and up
    apart, and down in the reduce): `moe_ref` on the NVFP4 weights, with and without the shared expert's add."""
    g = gen(5)
    e, h, i, k, t = 8, 128, 64, 3, 20
    dtype = MOE_DTYPES[0]
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i) if up_scales == 2 else (2 * i,))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    add = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    spy = LaunchSpy(mg._moe_reduce_sorted_scaled_kernel)
    monkeypatch.setattr(mg, "_moe_reduce_sorted_scaled_kernel", spy)
    ref = moe_ref(x, tw, ids, w13, w2)
    copies = dict(decode_max_tokens=0, dequant_min_tokens=t, config=GROUPED)
    # Torch's grouped GEMM gives FP32 results of BF16 inputs on the GPU only from some version on (not 2.11): where it
    # cannot, the copies must stay on the Triton kernels with the same results.
    takes = copies_take_the_grouped_gemm(x)
    out = mt.fused_moe(x, tw, ids, w13, w2, grouped_gemm_min_tokens=t, **copies)
    assert spy.launches == int(takes) and rel_err(out, ref) < TOL[dtype]
    triton_copies = mt.fused_moe(x, tw, ids, w13, w2, grouped_gemm_min_tokens=0, **copies)
    assert spy.launches == int(takes) and rel_err(out, triton_copies) < TOL[dtype]
    c13, c2 = (mt._dequantized(w, dtype) for w in (w13, w2))
    assert mg.fits(x, c13, c2) == takes
    if takes:  # the grouped GEMM with a shared expert's output to add, called directly on the copies
        both = mg.routed(x, tw, ids, c13, c2, add=add)
        assert spy.launches == 2 and rel_err(both, ref + add) < TOL[dtype]


def test_nvfp4_copies_need_fp32_results() -> None:
    """Where the grouped GEMM cannot return FP32 results for x's dtype (torch's CPU kernel for fp16), the copies
    stay on the Triton kernels; copies whose segments are not gate|up (one scale or one each) and down (one) too."""
    g = gen(6)
    e, h, i = 4, 64, 32
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    x = torch.randn(3, h, generator=g, device=DEVICE).to(MOE_DTYPES[0])
    c13, c2 = (mt._dequantized(w, x.dtype) for w in (w13, w2))
    assert mg.fits(x, c13, c2) == copies_take_the_grouped_gemm(x)
    assert not mg.fits(x, c13, w2)  # NVFP4 itself never
    odd = mt.ScaledWeight(c13.data, c13.global_scale.repeat(1, 2), (i // 2, i // 2, i))
    assert not mg.fits(x, odd, c2)
    if not HAS_CUDA:
        xh = x.half()
        h13, h2 = (mt._dequantized(w, torch.float16) for w in (w13, w2))
        assert not mg._fp32_out(x.device) and not mg.fits(xh, h13, h2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [700, 4100])
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "shared"])
def test_gpu_grouped_gemm_flint_shapes(t: int, with_shared: bool) -> None:
    """BF16 at Flint's sizes (256 experts of 512, top-6, the 1024-wide shared expert): the grouped-GEMM path
    against `moe_ref` and against the Triton grouped kernels."""
    g = gen(t)
    e, h, i, k = 256, 2048, 512, 6
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    w13, w2 = experts(e, h, i, torch.bfloat16, g)
    shared = None
    if with_shared:
        s13, s2 = experts(1, h, 1024, torch.bfloat16, g)
        shared = (s13[0], s2[0])
    assert mg.fits(x, w13, w2)
    ref = moe_ref(x, tw, ids, w13, w2, shared)
    gemm = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, shared=shared, grouped_gemm_min_tokens=1)
    triton_path = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, shared=shared, grouped_gemm_min_tokens=0)
    assert rel_err(gemm, ref) < 1e-2
    assert rel_err(gemm, triton_path) < 1e-2
    assert torch.equal(gemm, mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, shared=shared,
                                          grouped_gemm_min_tokens=1))  # fmt: skip


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [700, 4100])
def test_gpu_nvfp4_copies_on_the_grouped_gemm_flint_shapes(t: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVFP4 experts at Flint's sizes as BF16 copies on the grouped GEMM (FP32 results, global scales in the
    SiLU-and-mul and reduce launches) against `moe_ref` and against the copies on the Triton grouped kernels."""
    g = gen(t + 1)
    e, h, i, k = 256, 2048, 512, 6
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    takes = copies_take_the_grouped_gemm(x)
    assert mg.fits(x, *(mt._dequantized(w, x.dtype) for w in (w13, w2))) == takes
    ref = moe_ref(x, tw, ids, w13, w2)
    copies = dict(decode_max_tokens=0, dequant_min_tokens=1)
    spy = LaunchSpy(mg._moe_reduce_sorted_scaled_kernel)
    monkeypatch.setattr(mg, "_moe_reduce_sorted_scaled_kernel", spy)
    gemm = mt.fused_moe(x, tw, ids, w13, w2, grouped_gemm_min_tokens=1, **copies)
    assert spy.launches == int(takes)
    triton_path = mt.fused_moe(x, tw, ids, w13, w2, grouped_gemm_min_tokens=0, **copies)
    assert rel_err(gemm, ref) < 1e-2
    assert rel_err(gemm, triton_path) < 1e-2
