"""The routed MoE on the TMA-fed grouped launches (`moe_grouped_tma_triton`) against `moe_ref`, alone and through
`fused_moe`'s dispatch.

On the CPU the launches run in Triton's interpreter (fp32 and fp16; the interpreter's bf16 is not trusted) on small
tiles; BF16 at Flint's sizes with the H200 table's tiles runs on the GPU (`-m gpu`).
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from flint_kernels import moe_align_triton
from flint_kernels import moe_grouped_tma_triton as mt2
from flint_kernels import moe_triton as mt
from flint_kernels.configs import MoETmaConfig
from flint_kernels.moe import moe_ref, shared_expert_ref
from flint_kernels.moe_align import align_ref, sort_ref
from kernel_checks import LaunchSpy, poison_torch_empty, poisoned_empty, random_nvfp4_experts, rel_err, routing

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
pytestmark = pytest.mark.skipif(
    not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
MOE_DTYPES = [torch.bfloat16] if HAS_CUDA else [torch.float32, torch.float16]
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
# Interpreter-sized tiles: 16-row blocks, so experts' rows span several blocks and end in partial ones.
SMALL = MoETmaConfig(
    block_m=16, gate_up_block_n=16, gate_up_block_k=32, gate_up_stages=2, down_block_n=32, down_block_k=16,
    down_stages=2,
)  # fmt: skip


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mt, "_empty", poisoned_empty)
    poison_torch_empty(monkeypatch)  # h and y come from torch.empty: rows a launch misses stay NaN


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def experts(e: int, h: int, i: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w13 = torch.randn(e, 2 * i, h, generator=g, device=DEVICE) / math.sqrt(h)
    w2 = torch.randn(e, h, i, generator=g, device=DEVICE) / math.sqrt(i)
    return w13.to(dtype), w2.to(dtype)


@pytest.mark.parametrize("t", [1, 37, 400])
def test_sort_blocks_is_sort_with_aligns_block_table(t: int) -> None:
    """src and pos as `sort` makes them (up to order within an expert), meta exactly `align_ref`'s."""
    g = gen(1)
    e, k, block_m = 9, 3, 16
    _, ids = routing(t, e - 2, k, g)  # two experts get no pair
    src, pos, meta = moe_align_triton.sort_blocks(ids, e, block_m)
    _, ref_meta, n_blocks = align_ref(ids, e, block_m)
    assert meta.shape == (n_blocks, 3) and torch.equal(meta, ref_meta)
    ref_src, _, _ = sort_ref(ids, e)
    tokens = torch.arange(t * k, device=DEVICE) // k
    assert torch.equal(src[pos], tokens)  # each pair's row holds its token
    assert torch.equal(torch.sort(pos).values, torch.arange(t * k, device=DEVICE))
    rows_expert = torch.empty_like(ids.reshape(-1))
    rows_expert[pos] = ids.reshape(-1)
    assert torch.equal(rows_expert, torch.sort(ids.reshape(-1)).values)  # grouped by expert, in expert order
    assert torch.equal(torch.sort(src).values, torch.sort(ref_src).values)


@pytest.mark.parametrize("dtype", MOE_DTYPES, ids=str)
@pytest.mark.parametrize("gather", [True, False], ids=["gather", "sorted-copy"])
@pytest.mark.parametrize("with_add", [False, True], ids=["plain", "add"])
def test_routed_matches_moe_ref(dtype: torch.dtype, gather: bool, with_add: bool) -> None:
    """Both ways of reading x's rows; experts spanning several blocks, one expert unused, an `add` summed last."""
    g = gen(2)
    e, h, i, k, t = 8, 64, 32, 3, 45
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)
    w13, w2 = experts(e, h, i, dtype, g)
    add = torch.randn(t, h, generator=g, device=DEVICE).to(dtype) if with_add else None
    cfg = dataclasses.replace(SMALL, gather=gather)
    assert mt2.fits(x, w13, w2, cfg)
    out = mt2.routed(x, tw, ids, w13, w2, cfg, add=add)
    ref = moe_ref(x, tw, ids, w13, w2)
    if add is not None:
        ref = ref + add
    assert not out.isnan().any() and rel_err(out, ref) < TOL[dtype]


def test_copies_run_the_twins_tiles_at_most_two_stages_deep() -> None:
    """The plain launches on NVFP4's copies keep every tile of the twins' config and cap only the pipeline depth."""
    deep = dataclasses.replace(SMALL, block_m=256, gate_up_stages=3, down_stages=4, packed_decode=True)
    assert mt2.for_copies(deep) == dataclasses.replace(deep, gate_up_stages=2, down_stages=2)
    shallow = dataclasses.replace(SMALL, gate_up_stages=1, down_stages=2)
    assert mt2.for_copies(shallow) == shallow


@pytest.mark.parametrize("up_scales", [2, 1], ids=["gate-up-scales", "one-scale"])
def test_nvfp4_copies_scaled_in_the_epilogues(up_scales: int) -> None:
    """NVFP4 experts' copies (`ScaledWeight`): each expert's global scales on the FP32 accumulators before the one
    rounding (gate and up apart, down on its own), whatever torch's grouped GEMM can return."""
    g = gen(3)
    e, h, i, k, t = 8, 128, 64, 3, 30
    dtype = MOE_DTYPES[0]
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i) if up_scales == 2 else (2 * i,))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    c13, c2 = (mt._dequantized(w, dtype) for w in (w13, w2))
    assert mt2.fits(x, c13, c2, SMALL) and not mt2.fits(x, c13, w2, SMALL)  # copies and NVFP4 not mixed
    out = mt2.routed(x, tw, ids, c13, c2, SMALL)
    assert rel_err(out, moe_ref(x, tw, ids, w13, w2)) < TOL[dtype]


@pytest.mark.parametrize("dtype", MOE_DTYPES, ids=str)
@pytest.mark.parametrize("gather", [True, False], ids=["gather", "sorted-copy"])
def test_nvfp4_decoded_in_the_launches(dtype: torch.dtype, gather: bool) -> None:
    """NVFP4 experts with no copy: each K step decoded in registers (the MMA's left operand), global scales on the
    accumulators; `moe_ref` on the NVFP4 weights, and the copies' result through the plain launches."""
    g = gen(7)
    e, h, i, k, t = 8, 128, 64, 3, 37
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    cfg = dataclasses.replace(SMALL, gather=gather)
    assert mt2.fits(x, w13, w2, cfg)
    out = mt2.routed(x, tw, ids, w13, w2, cfg)
    assert not out.isnan().any() and rel_err(out, moe_ref(x, tw, ids, w13, w2)) < TOL[dtype]
    c13, c2 = (mt._dequantized(w, dtype) for w in (w13, w2))
    copies = mt2.routed(x, tw, ids, c13, c2, cfg)
    # The copies' values (times a power of two) in the transposed product: the interpreter sums in another order
    # (the H200's wgmma gives the copies' sums bit for bit: `test_flint_sizes_on_the_gpu`).
    assert rel_err(out, copies) < TOL[dtype]


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "sorted-copy"])
def test_nvfp4_packed_decode_in_the_launches(gather: bool) -> None:
    """`packed_decode`: the weights decoded two at a time and re-paired into K order; FP32 runs the interpreter's
    emulation, FP16 falls back to the byte planes. `moe_ref` on the NVFP4 weights, and the copies' sums (K in order:
    the same values in the same places)."""
    g = gen(11)
    e, h, i, k, t = 8, 128, 64, 3, 45
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    cfg = dataclasses.replace(SMALL, gather=gather, packed_decode=True)
    for dtype in MOE_DTYPES:
        x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
        tw, ids = routing(t, e - 1, k, g)
        assert mt2._packed(cfg, dtype) == {torch.float32: 2, torch.float16: 0, torch.bfloat16: 1}[dtype]
        out = mt2.routed(x, tw, ids, w13, w2, cfg)
        assert not out.isnan().any() and rel_err(out, moe_ref(x, tw, ids, w13, w2)) < TOL[dtype]
        c13, c2 = (mt._dequantized(w, dtype) for w in (w13, w2))
        assert torch.equal(out, mt2.routed(x, tw, ids, w13, w2, dataclasses.replace(cfg, packed_decode=False)))
        assert rel_err(out, mt2.routed(x, tw, ids, c13, c2, cfg)) < TOL[dtype]


def test_fits_declines_what_it_cannot_run() -> None:
    """Tiles that do not divide H or I, mixed dtypes, non-contiguous stacks or rows of x."""
    g = gen(4)
    e, h, i = 4, 64, 32
    dtype = MOE_DTYPES[0]
    x = torch.randn(5, h, generator=g, device=DEVICE).to(dtype)
    w13, w2 = experts(e, h, i, dtype, g)
    assert mt2.fits(x, w13, w2, SMALL)
    assert not mt2.fits(x, w13, w2, dataclasses.replace(SMALL, gate_up_block_n=64))  # 64 columns of I = 32
    assert not mt2.fits(x, w13, w2, dataclasses.replace(SMALL, down_block_n=128))  # 128 columns of H = 64
    assert not mt2.fits(x, w13.half() if dtype != torch.float16 else w13.float(), w2, SMALL)
    assert not mt2.fits(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, SMALL)
    assert not mt2.fits(x.t().contiguous().t(), w13, w2, SMALL)  # x's rows not contiguous
    # NVFP4 decoded in the down: blocks above 128 rows need 128 columns or more (64 gave NaN on an H100).
    n13 = random_nvfp4_experts(e, 2 * i, 256, g, (i, i))
    n2 = random_nvfp4_experts(e, 256, i, g, (256,))
    xn = torch.randn(5, 256, generator=g, device=DEVICE).to(dtype)
    p13, p2 = experts(e, 256, i, dtype, g)
    rows256 = dataclasses.replace(SMALL, block_m=256, down_block_n=128)
    assert mt2.fits(xn, n13, n2, rows256)
    narrow = dataclasses.replace(rows256, down_block_n=64)
    assert not mt2.fits(xn, n13, n2, narrow) and mt2.fits(xn, p13, p2, narrow)  # plain stacks are not declined


@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "shared"])
def test_fused_moe_takes_the_tma_launches_from_their_threshold(
    with_shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From `tma_min_tokens` the grouped path runs these launches (the shared expert apart, added by the reduce);
    below it, with a Triton grouped `config`, or where torch's grouped GEMM takes the batch, they do not run."""
    g = gen(5)
    e, h, i, k, t = 8, 64, 32, 3, 24
    dtype = MOE_DTYPES[0]
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)
    w13, w2 = experts(e, h, i, dtype, g)
    shared = None
    if with_shared:
        s13, s2 = experts(1, h, 2 * i, dtype, g)
        shared = (s13[0], s2[0])
    ref = moe_ref(x, tw, ids, w13, w2, shared)
    asked = []
    monkeypatch.setattr(mt2, "config", lambda ppe, nvfp4, device: asked.append(nvfp4) or SMALL)
    spy = LaunchSpy(mt2._gate_up_kernel)
    monkeypatch.setattr(mt2, "_gate_up_kernel", spy)
    base = dict(decode_max_tokens=0, shared=shared, grouped_gemm_min_tokens=0)
    out = mt.fused_moe(x, tw, ids, w13, w2, tma_min_tokens=t, **base)
    assert spy.launches == 1 and rel_err(out, ref) < TOL[dtype]
    if shared is not None:
        assert rel_err(out, moe_ref(x, tw, ids, w13, w2) + shared_expert_ref(x, shared)) < TOL[dtype]
    grouped = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
    for kwargs in ({"tma_min_tokens": t + 1}, {"tma_min_tokens": 0}, {"tma_min_tokens": 1, "config": grouped}):
        assert rel_err(mt.fused_moe(x, tw, ids, w13, w2, **base, **kwargs), ref) < TOL[dtype]
    assert spy.launches == 1
    # torch's grouped GEMM first where it takes the batch.
    out = mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=0, shared=shared, grouped_gemm_min_tokens=1,
                       tma_min_tokens=1)  # fmt: skip
    assert spy.launches == 1 and rel_err(out, ref) < TOL[dtype]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("t", [512, 2048, 4096, 8192])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_flint_sizes_on_the_gpu(t: int, fmt: str) -> None:
    """Flint's experts (256 x 2048 x 512, top-6) in BF16, or NVFP4's copies and NVFP4 decoded in the launches, with
    the tiles the GPU's table gives at this size (the H200's: 64-row blocks below 96 pairs an expert, 128-row from
    there, NVFP4's 256-row from 144)."""
    g = gen(6)
    e, h, i, k = 256, 2048, 512, 6
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    tw, ids = routing(t, e, k, g)
    if fmt == "bf16":
        w13, w2 = experts(e, h, i, torch.bfloat16, g)
        c13, c2 = w13, w2
    else:
        w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
        w2 = random_nvfp4_experts(e, h, i, g, (h,))
        c13, c2 = (mt._dequantized(w, torch.bfloat16) for w in (w13, w2))
    cfg = mt2.config(t * k / e, fmt == "nvfp4", x.device)
    assert mt2.fits(x, c13, c2, cfg)
    ref = moe_ref(x, tw, ids, w13, w2)
    plain = mt2.for_copies(cfg) if fmt == "nvfp4" else cfg  # NVFP4's copies through the twins' tiles
    for gather in (cfg.gather, not cfg.gather):
        out = mt2.routed(x, tw, ids, c13, c2, dataclasses.replace(plain, gather=gather))
        assert not out.isnan().any() and rel_err(out, ref) < 1e-2
    if fmt == "nvfp4":  # decoded in the launches: the copies' values, and the H200 gives the copies' sums
        copies = mt2.routed(x, tw, ids, c13, c2, plain)
        twins = dataclasses.replace(cfg, packed_decode=False)
        assert torch.equal(mt2.routed(x, tw, ids, w13, w2, twins), copies)
        # Decoded two at a time and re-paired into K order: the same tiles, so the same sums.
        assert torch.equal(mt2.routed(x, tw, ids, w13, w2, dataclasses.replace(cfg, packed_decode=True)), copies)


def _halves(meta: torch.Tensor) -> torch.Tensor:
    """The block table of 256-row blocks `meta` cut into blocks of at most 128 rows (the same sorted rows)."""
    cut = [(e, r0 + s, min(128, n - s)) for e, r0, n in meta.tolist() for s in range(0, n, 128)]
    return torch.tensor(cut, dtype=torch.int32, device=meta.device)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("gather", [True, False], ids=["gather", "sorted-copy"])
def test_nvfp4_256_row_blocks_on_the_gpu(gather: bool, stages: int) -> None:
    """NVFP4 decoded in 256-row blocks (8 warps; an 8K prompt's ~192 pairs an expert), each launch on its own: the
    same sorted rows through the 128-row tiles (to BF16 rounding) and the copies' sums through the same tiles. (The
    down in 64 columns left NaN in y on an H100, Triton 3.6: `fits` declines it.)"""
    g = gen(8)
    e, h, i, k, t = 256, 2048, 512, 6, 8192
    x = torch.randn(t, h, generator=g, device=DEVICE).bfloat16()
    _, ids = routing(t, e, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    c13, c2 = (mt._dequantized(w, torch.bfloat16) for w in (w13, w2))
    cfg = MoETmaConfig(
        block_m=256, gate_up_block_n=64, gate_up_block_k=128, gate_up_warps=8, gate_up_stages=stages, gather=gather,
        down_block_n=128, down_block_k=64, down_warps=8, down_stages=3, packed_decode=True,
    )  # fmt: skip
    rows128 = MoETmaConfig(
        block_m=128, gate_up_block_n=64, gate_up_block_k=128, gate_up_warps=4, gate_up_stages=2, gather=True,
        down_block_n=128, down_block_k=64, down_warps=8, down_stages=3, packed_decode=True,
    )  # fmt: skip
    assert mt2.fits(x, w13, w2, cfg)
    src, _, meta = moe_align_triton.sort_blocks(ids, e, 256)
    meta128 = _halves(meta)
    want = mt2.gate_up(x, src, meta128, w13, rows128)
    got = mt2.gate_up(x, src, meta, w13, cfg)
    assert not got.isnan().any() and rel_err(got, want) < 1e-2
    assert torch.equal(got, mt2.gate_up(x, src, meta, c13, mt2.for_copies(cfg)))  # the same sums
    want_y = mt2.down(want, meta128, w2, rows128)
    got_y = mt2.down(want, meta, w2, cfg)
    assert not got_y.isnan().any() and rel_err(got_y, want_y) < 1e-2
    assert torch.equal(got_y, mt2.down(want, meta, c2, cfg))


def test_fused_moe_decodes_nvfp4_in_the_launches_from_their_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """From `tma_nvfp4_min_tokens` to `tma_nvfp4_max_tokens` NVFP4 experts run on the decoding twins with no BF16 copy
    made, ahead of the copies' threshold; outside them the copies (from `dequant_min_tokens`) take the plain TMA
    launches, whose tiles are BF16's (the table's "nvfp4" entries pick the twins')."""
    g = gen(8)
    e, h, i, k, t = 8, 128, 64, 3, 20
    dtype = MOE_DTYPES[0]
    x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
    tw, ids = routing(t, e - 1, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    ref = moe_ref(x, tw, ids, w13, w2)
    asked = []
    monkeypatch.setattr(mt2, "config", lambda ppe, nvfp4, device: asked.append(nvfp4) or SMALL)
    twin, plain = LaunchSpy(mt2._gate_up_nvfp4_kernel), LaunchSpy(mt2._gate_up_kernel)
    monkeypatch.setattr(mt2, "_gate_up_nvfp4_kernel", twin)
    monkeypatch.setattr(mt2, "_gate_up_kernel", plain)
    made = []
    dequantized = mt._dequantized
    monkeypatch.setattr(mt, "_dequantized", lambda w, dt: made.append(w) or dequantized(w, dt))
    base = dict(decode_max_tokens=0, grouped_gemm_min_tokens=0, dequant_min_tokens=t, tma_min_tokens=t)
    out = mt.fused_moe(x, tw, ids, w13, w2, tma_nvfp4_min_tokens=t, **base)
    assert (twin.launches, plain.launches, len(made)) == (1, 0, 0) and rel_err(out, ref) < TOL[dtype]
    out = mt.fused_moe(x, tw, ids, w13, w2, tma_nvfp4_min_tokens=t + 1, **base)  # the copies instead
    assert (twin.launches, plain.launches, len(made)) == (1, 1, 2) and rel_err(out, ref) < TOL[dtype]
    out = mt.fused_moe(x, tw, ids, w13, w2, tma_nvfp4_min_tokens=t - 4, tma_nvfp4_max_tokens=t - 1, **base)
    assert (twin.launches, plain.launches, len(made)) == (1, 2, 4) and rel_err(out, ref) < TOL[dtype]
    out = mt.fused_moe(x, tw, ids, w13, w2, tma_nvfp4_min_tokens=t - 4, tma_nvfp4_max_tokens=t, **base)
    assert (twin.launches, plain.launches, len(made)) == (2, 2, 4) and rel_err(out, ref) < TOL[dtype]
    assert asked == [True, False, False, True]
