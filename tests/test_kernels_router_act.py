"""Triton SiLU-and-mul and sigmoid top-k router against the PyTorch references (interpreter on CPU, `gpu` on CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flint_kernels import rmsnorm_triton, router_triton, split_k_triton, tuning
from flint_kernels.activation import silu_and_mul_ref
from flint_kernels.activation_triton import silu_and_mul
from flint_kernels.rmsnorm import add_rms_norm_ref
from flint_kernels.router import add_rms_norm_sigmoid_topk_ref, sigmoid_topk_ref
from flint_kernels.router_triton import SMALL_BATCH, add_rms_norm_sigmoid_topk, fused_norm_fits, sigmoid_topk
from kernel_checks import LaunchSpy, poison_torch_empty

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor the kernels allocate starts as NaN (floats) or -77 (ints), so unwritten elements show."""
    poison_torch_empty(monkeypatch)


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------ SiLU-and-mul
def _check_silu(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    x = _rand(shape, dtype, 1, device) * 3
    out = silu_and_mul(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert not out.isnan().any()
    if dtype == torch.float32:
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-6
    else:
        # silu rounded, then the product rounded: the reference's order, so (almost) every element is identical.
        assert (out == ref).float().mean().item() >= 0.999
        assert ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item() < 1e-2


@pytest.mark.parametrize("shape", [(1, 2 * 96), (7, 2 * 768), (3, 4, 2 * 1536), (2, 2 * 3000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_interp(poison: None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _check_silu(shape, dtype, "cpu")


@pytest.mark.parametrize("shape", [(301, 2 * 96), (257, 2 * 600)], ids=["ragged-rows", "two-column-tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_rows_interp(
    poison: None, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """From ROWS_MIN rows (a prefill's) a program takes several rows: a last partial group of rows, and an
    intermediate width over ROWS_BLOCK in two column tiles, the second partial."""
    from flint_kernels import activation_triton

    assert shape[0] >= activation_triton.ROWS_MIN and shape[0] % activation_triton.ROWS
    one_row = LaunchSpy(activation_triton._silu_and_mul_kernel)
    rows = LaunchSpy(activation_triton._silu_and_mul_rows_kernel)
    monkeypatch.setattr(activation_triton, "_silu_and_mul_kernel", one_row)
    monkeypatch.setattr(activation_triton, "_silu_and_mul_rows_kernel", rows)
    _check_silu(shape, dtype, "cpu")
    assert (one_row.launches, rows.launches) == (0, 1)


def test_silu_and_mul_empty_interp() -> None:
    assert silu_and_mul(torch.zeros((0, 8))).shape == (0, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(
    "shape", [(1, 2 * 768), (64, 2 * 768), (8192, 2 * 768), (37, 2 * 5000), (300, 2 * 512), (4099, 2 * 6144)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_and_mul_gpu(poison: None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _check_silu(shape, dtype, "cuda")


# ------------------------------------------------------------------------------------------------------ router
def _check_router(
    t: int,
    hidden: int,
    experts: int,
    k: int,
    renorm: bool,
    scaling: float,
    x_dtype: torch.dtype,
    device: str,
    w_dtype: torch.dtype | None = None,
) -> None:
    x = _rand((t, hidden), x_dtype, 2, device)
    w = (_rand((experts, hidden), torch.float32, 3, device) * hidden**-0.5).to(w_dtype or x_dtype)
    weights, ids = sigmoid_topk(x, w, k, renorm, scaling)
    ref_w, ref_ids = sigmoid_topk_ref(x, w, k, renorm, scaling)
    _check_topk(weights, ids, ref_w, ref_ids, x, w, renorm, scaling)


def _check_topk(
    weights: torch.Tensor,
    ids: torch.Tensor,
    ref_w: torch.Tensor,
    ref_ids: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    renorm: bool,
    scaling: float,
) -> None:
    """Top-k weights within 1e-5 (x scaling) of the reference's; ids equal except where x's true scores tie."""
    t, k = ref_w.shape
    device = x.device
    assert weights.shape == ref_w.shape == (t, k) and ids.shape == (t, k)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    # The logits sum in another order than the GEMM, so near-ties may swap: where ids differ, the true scores must
    # be (almost) equal.
    exact = torch.sigmoid(x.double() @ w.double().T)
    mismatch = ids != ref_ids
    if mismatch.any():
        ours = exact.gather(1, ids)[mismatch]
        theirs = exact.gather(1, ref_ids)[mismatch]
        assert (ours - theirs).abs().max().item() < 1e-5, "different experts chosen where scores are not tied"
    assert mismatch.float().mean().item() <= 0.01
    # Descending order, no duplicates.
    assert (weights[:, :-1] >= weights[:, 1:]).all()
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()
    assert (weights - ref_w).abs().max().item() < 1e-5 * max(1.0, scaling)
    if renorm:
        assert torch.allclose(weights.sum(1), torch.full((t,), scaling, device=device), rtol=1e-5)


@pytest.mark.parametrize(
    ("t", "hidden", "experts", "k", "renorm", "scaling"),
    [
        (1, 2048, 256, 6, True, 1.0),
        (5, 64, 256, 8, True, 2.5),
        (3, 96, 40, 1, False, 1.0),
        (SMALL_BATCH, 64, 256, 6, False, 1.0),
    ],
)
def test_sigmoid_topk_interp(
    poison: None,
    monkeypatch: pytest.MonkeyPatch,
    t: int,
    hidden: int,
    experts: int,
    k: int,
    renorm: bool,
    scaling: float,
) -> None:
    if hidden > 1000:
        # Flint's 256 x 2048 router with 16 experts a program: the interpreter pays per program.
        monkeypatch.setattr(router_triton, "_BLOCK_E", 16)
    _check_router(t, hidden, experts, k, renorm, scaling, torch.float32, "cpu")


def test_sigmoid_topk_ties_interp(poison: None) -> None:
    """Identical expert rows give exactly tied scores: the lower expert id comes first."""
    x = _rand((3, 64), torch.float32, 5)
    w = _rand((16, 64), torch.float32, 6) * 0.1
    w[9] = w[2]
    w[12] = w[2]
    w[5] = w[7]
    weights, ids = sigmoid_topk(x, w, 8)
    # Duplicated rows give bit-identical scores in FP64 too; expected order: score descending, then id ascending.
    scores = torch.sigmoid(x.double() @ w.double().T)
    for row in range(3):
        expect = sorted(range(16), key=lambda e, r=row: (-scores[r, e].item(), e))[:8]
        assert ids[row].tolist() == expect
    assert (weights[:, :-1] >= weights[:, 1:]).all()


@pytest.mark.parametrize("experts", [256, 1000])
@pytest.mark.parametrize("t", [1, 5, SMALL_BATCH])
def test_sigmoid_topk_one_launch_interp(poison: None, monkeypatch: pytest.MonkeyPatch, t: int, experts: int) -> None:
    """The last program's top-k covers every token (in chunks of tokens when experts are many), repeats
    bit-for-bit, and leaves the shared arrival counters zero for the next launch or graph replay."""
    if experts > 256:
        monkeypatch.setattr(router_triton, "_BLOCK_E", 8)  # the interpreter pays per program
    x = _rand((t, 256), torch.float32, 11)
    w = _rand((experts, 256), torch.float32, 12) * 256**-0.5
    first = sigmoid_topk(x, w, 6, True, 2.5)
    second = sigmoid_topk(x, w, 6, True, 2.5)
    assert not split_k_triton.counters(x.device).any()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    ref_w, ref_ids = sigmoid_topk_ref(x, w, 6, True, 2.5)
    assert torch.equal(first[1], ref_ids)
    assert (first[0] - ref_w).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    ("t", "hidden", "experts", "k", "one_pass"),
    [
        (SMALL_BATCH + 1, 64, 256, 6, False),  # experts split over tiles, top-k in the last tile to arrive
        (40, 80, 256, 6, False),  # K not a multiple of the K step
        (1100, 64, 40, 3, True),  # one tile holds all experts (not a power of two); several token blocks
        (33, 96, 1000, 8, False),  # many experts: top-k over the logits in row chunks
    ],
)
def test_sigmoid_topk_tiles_interp(poison: None, t: int, hidden: int, experts: int, k: int, one_pass: bool) -> None:
    """Above SMALL_BATCH tokens the tensor-core tiles run (FP32 dots here), in both of their forms; repeats
    bit-for-bit and leaves the arrival counters zero."""
    block_e = router_triton.tiles_config(t, experts, torch.device("cpu")).block_e
    assert (block_e >= triton_next_pow2(experts)) == one_pass
    _check_router(t, hidden, experts, k, True, 1.0, torch.float32, "cpu")
    x = _rand((t, hidden), torch.float32, 21)
    w = _rand((experts, hidden), torch.float32, 22) * hidden**-0.5
    first = sigmoid_topk(x, w, k, False, 2.0)
    second = sigmoid_topk(x, w, k, False, 2.0)
    assert not split_k_triton.counters(x.device).any()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize(("hidden", "split_k", "splits", "block_t"), [(512, 0, 2, 32), (80, 3, 3, 32), (80, 3, 3, 16)])
def test_sigmoid_topk_tiles_split_k_interp(poison: None, hidden: int, split_k: int, splits: int, block_t: int) -> None:
    """Decode-sized batches above SMALL_BATCH split K over programs (automatically: 20 tokens, 4 K steps give 2
    splits; or as configured, here with a partial last K step, in one or two token blocks); the last arrival of a
    token block adds the partial logits in split order and takes the top-k: the reference's result, repeated bit
    for bit, counters left zero."""
    t, experts, k = 20, 256, 6
    x = _rand((t, hidden), torch.float32, 23)
    w = _rand((experts, hidden), torch.float32, 24) * hidden**-0.5
    cfg = router_triton.RouterTilesConfig(block_t, 16, 128 if split_k == 0 else 32, 4, 2, split_k)
    blocks = -(-t // block_t)
    assert router_triton._k_split(cfg.split_k, blocks, 16, hidden, cfg.block_k, x.device)[0] == splits
    outs = []
    for _ in range(2):
        out_w = torch.empty(t, k)
        out_ids = torch.empty(t, k, dtype=torch.int64)
        router_triton._tiles(x, w, k, True, 1.0, out_w, out_ids, cfg)
        outs.append((out_w, out_ids))
    ref_w, ref_ids = sigmoid_topk_ref(x, w, k)
    assert torch.equal(outs[0][1], ref_ids)
    assert (outs[0][0] - ref_w).abs().max().item() < 1e-5
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert not split_k_triton.counters(x.device).any()


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_split_bf16x3_is_exact() -> None:
    """The many-token kernel's weight split: hi + mid + lo in BF16 gives back an FP32 weight to its last 24 bits,
    so BF16 x times each part is exact and the logits carry FP32 accuracy (checked here in PyTorch, on the GPU in
    test_sigmoid_topk_gpu with FP32 weights)."""
    w = _rand((256, 2048), torch.float32, 9) * 2048**-0.5
    hi = w.bfloat16()
    rest = w - hi.float()
    mid = rest.bfloat16()
    lo = (rest - mid.float()).bfloat16()
    back = hi.double() + mid.double() + lo.double()
    assert ((back - w.double()).abs() <= w.double().abs() * 2.0**-24).all()
    x = _rand((64, 2048), torch.bfloat16, 10)
    parts = sum((x.double() @ p.double().T) for p in (hi, mid, lo))
    exact = x.double() @ w.double().T
    assert ((parts - exact).abs().max() / exact.abs().max()).item() < 1e-7


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 5, 8, 16, 17, 32, 64, 300, 8192])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("renorm", "scaling"), [(True, 1.0), (False, 2.5)])
def test_sigmoid_topk_gpu(poison: None, t: int, x_dtype: torch.dtype, renorm: bool, scaling: float) -> None:
    # FP32 router weights as the engine keeps them (BF16 x then runs the three-part split above SMALL_BATCH).
    _check_router(t, 2048, 256, 6, renorm, scaling, x_dtype, "cuda", torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [17, 64, 1000])
@pytest.mark.parametrize("presplit", [False, True])
def test_router_tiles_split_gpu(poison: None, t: int, presplit: bool) -> None:
    """BF16 x against FP32 weights on tensor cores, the weight split in the kernel or made ahead: the logits carry
    FP32 accuracy (a BF16-only weight would put the routing weights ~1e-4 off), same result either way."""
    x = _rand((t, 2048), torch.bfloat16, 31, "cuda")
    w = _rand((256, 2048), torch.float32, 32, "cuda") * 2048**-0.5
    split = router_triton.split_weight(w) if presplit else None
    out_w = torch.empty(t, 6, device="cuda")
    out_ids = torch.empty(t, 6, device="cuda", dtype=torch.int64)
    router_triton._tiles(x, w, 6, True, 1.0, out_w, out_ids, None, split)
    ref_w, ref_ids = sigmoid_topk_ref(x, w, 6)
    assert (out_w - ref_w).abs().max().item() < 1e-5
    assert (out_ids != ref_ids).float().mean().item() <= 0.01
    assert not split_k_triton.counters(x.device).any()


def test_prepare_keeps_the_split_while_the_weight_lives() -> None:
    w = _rand((32, 64), torch.float32, 41)
    router_triton.prepare(w)
    split = router_triton._split_of(w)
    assert split is not None and split.shape == (3, 32, 64) and split.dtype == torch.bfloat16
    assert torch.equal(split.double().sum(0), (split[0].double() + split[1].double() + split[2].double()))
    router_triton.prepare(w)
    assert router_triton._split_of(w) is split  # made once
    key = id(w)
    del w
    assert key not in router_triton._splits
    half = _rand((32, 64), torch.float32, 42).bfloat16()
    router_triton.prepare(half)  # only FP32 weights are split
    assert router_triton._split_of(half) is None


def test_router_tiles_fit_the_shared_memory_of_smaller_gpus() -> None:
    """On the H200 the measured tiles stand; the estimate flags the two configurations that overflowed there (Triton
    asked for 258048 and 323584 bytes); on GPUs with less shared memory (A100 163 KB, Ada 99 KB) the tiles shrink
    until the estimate fits, instead of failing at launch and dropping the router to the reference for good."""
    rt = router_triton
    h200 = rt.H200_SHARED_MEMORY
    assert rt.tiles_config(8192, 256) == rt.RouterTilesConfig(128, 128, 64, 8, 3, 1)
    assert rt.tiles_config(2048, 256) == rt.RouterTilesConfig(64, 64, 64, 4, 4, 1)
    assert rt.tiles_config(32, 256) == rt.tiles_config(64, 256) == rt.RouterTilesConfig(16, 16, 128, 4, 3, 4)
    assert rt.tiles_config(65, 256) == rt.RouterTilesConfig(64, 16, 128, 4, 3, 1)
    for cfg, presplit, asked in ((rt.RouterTilesConfig(64, 256, 64, 8, 3), False, 258048),
                                 (rt.RouterTilesConfig(64, 256, 64, 8, 3), True, 323584)):  # fmt: skip
        est = rt.shared_memory_bytes(cfg, presplit)
        assert est > h200 and abs(est - asked) <= 0.03 * asked
    for limit in (166912, 101376, 49152):
        for tokens in (32, 2048, 8192):
            for presplit in (True, False):
                big = rt.fit_shared_memory(rt.tiles_config(tokens, 256), presplit, h200)
                cfg = rt.fit_shared_memory(big, presplit, limit)
                assert rt.shared_memory_bytes(cfg, presplit) <= limit, (limit, tokens, presplit)
                assert min(cfg.block_t, cfg.block_e, cfg.block_k) >= 16 and cfg.num_stages >= 2
    a100 = rt.fit_shared_memory(rt.tiles_config(8192, 256), True, 166912)
    assert a100 == rt.RouterTilesConfig(128, 128, 64, 8, 2, 1)  # one stage fewer is enough there


# ------------------------------------------------------------------------------- residual add + RMSNorm + router
EPS = 1e-6


def _norm_router_inputs(
    t: int, hidden: int, experts: int, dtype: torch.dtype, device: str, seed: int = 50
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, residual, norm weight FP32, router weight FP32) as at a MoE layer: random, no zeros by construction."""
    x = _rand((t, hidden), dtype, seed, device) * 3
    res = _rand((t, hidden), dtype, seed + 1, device)
    norm_w = _rand((hidden,), torch.float32, seed + 2, device) * 0.5 + 1
    router_w = _rand((experts, hidden), torch.float32, seed + 3, device) * hidden**-0.5
    return x, res, norm_w, router_w


def _check_normed(normed: torch.Tensor, ref: torch.Tensor, new_res: torch.Tensor, norm_w: torch.Tensor) -> None:
    """`normed` as the reference rounds it: where the bits differ, the FP32 value the reference rounds lies within
    2^-20 of a rounding boundary of the dtype (our rstd may differ in its last bit: the variance sums in another
    order), i.e. ours is as close to that value as the reference's, up to 2^-20 of it. In FP32 (no rounding after
    the FP32 product) that is |ours - ref| <= 2^-20 |ref|, a few ulps; in FP16 / BF16 it allows a one-ulp flip at a
    near-tie only (seen: ~1 in 2000 FP16 elements in the interpreter; a few in a million expected in BF16)."""
    s32 = new_res.float()
    pre = norm_w.float() * (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + EPS))  # `rms_norm_ref` unrounded
    assert normed.shape == ref.shape and normed.dtype == ref.dtype
    assert not normed.isnan().any()
    ours, theirs = (normed.float() - pre).abs(), (ref.float() - pre).abs()
    assert (ours <= theirs + pre.abs() * 2.0**-20).all(), (ours - theirs).max().item()
    if normed.dtype != torch.float32:  # (in FP32 a row whose rstd differs differs everywhere, by an ulp or two)
        # Near-ties are rare (within 2^-20 of a boundary: ~2^-8 of FP16 values, ~2^-11 of BF16 ones), flips rarer.
        assert (normed != ref).float().mean().item() <= 0.01


def _check_norm_router(
    t: int, hidden: int, experts: int, k: int, renorm: bool, scaling: float, dtype: torch.dtype, device: str
) -> None:
    x, res, norm_w, router_w = _norm_router_inputs(t, hidden, experts, dtype, device)
    normed, new_res, weights, ids = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, k, renorm, scaling)
    ref_normed, ref_res, ref_w, ref_ids = add_rms_norm_sigmoid_topk_ref(
        x, res, norm_w, EPS, router_w, k, renorm, scaling
    )
    assert new_res.shape == (t, hidden) and new_res.dtype == dtype
    assert torch.equal(new_res, ref_res)  # one add in the dtype: always bit-identical
    _check_normed(normed, ref_normed, ref_res, norm_w)
    _check_topk(weights, ids, ref_w, ref_ids, ref_normed, router_w, renorm, scaling)
    again = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, k, renorm, scaling)
    assert all(torch.equal(a, b) for a, b in zip(again, (normed, new_res, weights, ids)))
    assert not split_k_triton.counters(x.device).any()


def test_add_rms_norm_sigmoid_topk_ref_is_the_composition() -> None:
    x, res, norm_w, router_w = _norm_router_inputs(3, 64, 16, torch.float32, "cpu")
    normed, new_res, weights, ids = add_rms_norm_sigmoid_topk_ref(x, res, norm_w, EPS, router_w, 4, False, 2.0)
    want_normed, want_res = add_rms_norm_ref(x, res, norm_w, EPS)
    want_w, want_ids = sigmoid_topk_ref(want_normed, router_w, 4, False, 2.0)
    for got, want in ((normed, want_normed), (new_res, want_res), (weights, want_w), (ids, want_ids)):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("t", "hidden", "experts", "k", "renorm", "scaling", "fused"),
    [
        (1, 2048, 256, 6, True, 1.0, True),  # Flint's router
        (3, 2048, 256, 6, False, 2.5, True),
        (4, 2048, 256, 6, True, 1.0, True),  # 4 x 2048 is the whole product tile: the last one-launch batch
        (5, 2048, 256, 6, True, 1.0, False),  # Triton add+RMSNorm, then the small-batch router
        (1, 96, 16, 4, True, 1.0, True),  # hidden no power of two: masked K
        (3, 96, 16, 1, False, 1.0, True),
        (4, 96, 16, 4, True, 2.5, True),
        (SMALL_BATCH + 1, 96, 16, 4, True, 1.0, False),  # add+RMSNorm, then the router tiles
        (1, 200, 40, 8, True, 2.5, True),
        (3, 200, 40, 6, True, 1.0, True),
        (4, 200, 40, 6, False, 1.0, True),
        (SMALL_BATCH, 200, 40, 6, True, 1.0, True),  # 16 x 256 fits one K step: still one launch
        (SMALL_BATCH + 1, 200, 40, 6, True, 1.0, False),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_sigmoid_topk_interp(
    poison: None,
    monkeypatch: pytest.MonkeyPatch,
    t: int,
    hidden: int,
    experts: int,
    k: int,
    renorm: bool,
    scaling: float,
    fused: bool,
    dtype: torch.dtype,
) -> None:
    """Residual add + RMSNorm + router against the reference composition: residual bit-identical, normed as
    `_check_normed`, top-k as the router tests; repeats bit-for-bit and leaves the arrival counters zero."""
    if hidden > 1000:
        # 16 experts a program (the interpreter pays per program) and a product tile 16 times larger, so the K
        # steps and the one-launch limit stay those of the GPU (Flint's 256 programs run in the launch test).
        monkeypatch.setattr(router_triton, "_BLOCK_E", 16)
        monkeypatch.setattr(router_triton, "_PRODUCT_TILE", 16 * router_triton._PRODUCT_TILE)
    assert fused_norm_fits(t, hidden) == fused
    _check_norm_router(t, hidden, experts, k, renorm, scaling, dtype, "cpu")


class _Launches:
    """A Triton kernel that counts its launches (`kernel[grid](...)`)."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        self.count += 1
        return self.kernel[grid]


@pytest.mark.parametrize(
    ("t", "launches"),
    [
        (1, {"_router_norm_kernel": 1}),
        (4, {"_router_norm_kernel": 1}),
        (5, {"add_rms_norm": 1, "_router_kernel": 1}),
        (SMALL_BATCH + 1, {"add_rms_norm": 1, "_router_tiles_kernel": 1}),
    ],
)
def test_add_rms_norm_sigmoid_topk_launches_interp(
    poison: None, monkeypatch: pytest.MonkeyPatch, t: int, launches: dict[str, int]
) -> None:
    """At Flint's hidden 2048 up to 4 tokens run one launch (the router with the norm prologue); above, Triton
    add+RMSNorm and then the router, whose results are exactly that composition's."""
    counted = {name: _Launches(getattr(router_triton, name)) for name in
               ("_router_norm_kernel", "_router_kernel", "_router_tiles_kernel")}  # fmt: skip
    for name, kernel in counted.items():
        monkeypatch.setattr(router_triton, name, kernel)
    norm_calls = []
    real_add_rms_norm = rmsnorm_triton.add_rms_norm

    def add_rms_norm(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        norm_calls.append(args)
        return real_add_rms_norm(*args)

    monkeypatch.setattr(rmsnorm_triton, "add_rms_norm", add_rms_norm)
    x, res, norm_w, router_w = _norm_router_inputs(t, 2048, 16, torch.float32, "cpu")  # 16 experts: cheap here
    out = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, 6)
    got = {name: kernel.count for name, kernel in counted.items() if kernel.count} | (
        {"add_rms_norm": len(norm_calls)} if norm_calls else {}
    )
    assert got == launches
    if norm_calls:
        normed, new_res = real_add_rms_norm(x, res, norm_w, EPS)
        want = (normed, new_res, *sigmoid_topk(normed, router_w, 6))
        assert all(torch.equal(a, b) for a, b in zip(out, want))
    else:
        ref = add_rms_norm_sigmoid_topk_ref(x, res, norm_w, EPS, router_w, 6)
        assert torch.equal(out[1], ref[1]) and torch.equal(out[3], ref[3])
        _check_normed(out[0], ref[0], ref[1], norm_w)


@pytest.mark.parametrize(("t", "hidden", "experts", "k"), [(1, 96, 16, 6), (3, 200, 40, 8), (9, 96, 16, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_router_top_k_as_a_launch_of_its_own_interp(
    poison: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    t: int,
    hidden: int,
    experts: int,
    k: int,
    dtype: torch.dtype,
) -> None:
    """`RouterSmallConfig.tail_launch` (a tuning table asks for it): the tailless router and then the one-program
    top-k launch give the counter tail's results bit for bit, with and without the add+RMSNorm prologue (9 tokens:
    the plain router after Triton's add+RMSNorm), and never touch the arrival counter."""
    x, res, norm_w, router_w = _norm_router_inputs(t, hidden, experts, dtype, "cpu", seed=60)
    shipped = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, k, True, 2.5)
    plain = sigmoid_topk(x, router_w, k, False, 1.0)
    table = {"router.small": [{"when": {"tokens_max": SMALL_BATCH}, "config": {"tail_launch": True}, "source": "t"}]}
    (tmp_path / "table.json").write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV, str(tmp_path / "table.json"))  # read per call; restored after the test
    assert router_triton.small_config(t, experts, x.device).tail_launch
    names = ("_router_kernel", "_router_norm_kernel", "_router_logits_kernel", "_router_norm_logits_kernel",
             "_router_topk_kernel")  # fmt: skip
    counted = {name: _Launches(getattr(router_triton, name)) for name in names}
    for name, kernel in counted.items():
        monkeypatch.setattr(router_triton, name, kernel)
    launched = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, k, True, 2.5)
    launched_plain = sigmoid_topk(x, router_w, k, False, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(launched, shipped))
    assert all(torch.equal(a, b) for a, b in zip(launched_plain, plain))
    fused = fused_norm_fits(t, hidden)
    assert [counted[n].count for n in names] == [0, 0, 1 + (not fused), int(fused), 2]
    assert not split_k_triton.counters(x.device).any()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [1, 4, 12])
def test_gpu_router_top_k_as_a_launch_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, t: int) -> None:
    """Flint's router (BF16 tokens, 256 experts, top-6) with its top-k as a launch of its own: the counter tail's
    results bit for bit, inside and outside a CUDA graph, with the arrival counter left at zero."""
    x, res, norm_w, router_w = _norm_router_inputs(t, 2048, 256, torch.bfloat16, "cuda", seed=70)
    shipped = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, 6)
    table = {"router.small": [{"config": {"tail_launch": True}, "source": "test"}]}
    (tmp_path / "table.json").write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV, str(tmp_path / "table.json"))  # read per call; restored after the test
    eager = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, 6)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, 6)
    graph.replay()
    torch.cuda.synchronize()
    for got in (eager, captured):
        assert all(torch.equal(a, b) for a, b in zip(got, shipped))
    assert not split_k_triton.counters(x.device).any()


def test_add_rms_norm_sigmoid_topk_strided_interp(poison: None) -> None:
    """Rows of wider buffers (o_proj output and residual views with a row stride above hidden) in one launch."""
    x_buf, res_buf, norm_w, router_w = _norm_router_inputs(3, 160, 16, torch.float16, "cpu")
    x, res = x_buf[:, 16:112], res_buf[:, :96]
    norm_w, router_w = norm_w[:96], router_w[:, :96].contiguous()
    assert fused_norm_fits(3, 96) and x.stride(0) == res.stride(0) == 160
    normed, new_res, weights, ids = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, 4)
    ref = add_rms_norm_sigmoid_topk_ref(x, res, norm_w, EPS, router_w, 4)
    assert torch.equal(new_res, ref[1]) and new_res.is_contiguous() and normed.is_contiguous()
    _check_normed(normed, ref[0], ref[1], norm_w)
    _check_topk(weights, ids, ref[2], ref[3], ref[0], router_w, True, 1.0)


def test_add_rms_norm_sigmoid_topk_fallbacks_interp(poison: None) -> None:
    """What the Triton ops leave to the reference still gets the reference's results: top_k above MAX_TOP_K, a
    residual of another dtype (PyTorch's promotion), an empty batch."""
    x, res, norm_w, router_w = _norm_router_inputs(2, 64, 16, torch.float32, "cpu")
    k = router_triton.MAX_TOP_K + 1
    got = add_rms_norm_sigmoid_topk(x, res, norm_w, EPS, router_w, k)
    want = add_rms_norm_sigmoid_topk_ref(x, res, norm_w, EPS, router_w, k)
    assert torch.equal(got[1], want[1]) and torch.equal(got[3], want[3])
    _check_normed(got[0], want[0], want[1], norm_w)
    half = x.half()
    got = add_rms_norm_sigmoid_topk(half, res, norm_w, EPS, router_w, 4)
    want = add_rms_norm_sigmoid_topk_ref(half, res, norm_w, EPS, router_w, 4)
    assert got[0].dtype == got[1].dtype == torch.float32
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    _check_topk(got[2], got[3], want[2], want[3], want[0], router_w, True, 1.0)
    empty = add_rms_norm_sigmoid_topk(x[:0], res[:0], norm_w, EPS, router_w, 4)
    assert [tuple(a.shape) for a in empty] == [(0, 64), (0, 64), (0, 4), (0, 4)]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 2, 4, 5, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rms_norm_sigmoid_topk_gpu(poison: None, t: int, dtype: torch.dtype) -> None:
    """Flint's shapes: one launch up to 4 tokens, the composition above; BF16 residual bit-identical, normed too
    but for one-ulp flips at rounding near-ties (`_check_normed`)."""
    assert fused_norm_fits(t, 2048) == (t <= 4)
    _check_norm_router(t, 2048, 256, 6, True, 1.0, dtype, "cuda")
    _check_norm_router(t, 2048, 256, 6, False, 2.5, dtype, "cuda")
