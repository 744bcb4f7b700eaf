"""Ready scale bytes in the UE4M3 bytes' place (`FLINT_MMA_READY_SCALES=replace`): the codec decodes them to the
same floats, a replaced weight keeps its values and its size, and every Triton path outside the MMA kernels (the
FMA and tensor-core GEMV tiles, the prefill copy kernel, the MoE's decode and grouped launches) gives the same bits
from them as from the UE4M3 bytes, under the interpreter in FP32 and FP16. (The MMA kernels' own tests are in
test_nvfp4_mma.py and test_nvfp4_mma_moe.py; their GPU runs and the prefill twins' are to come.)"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from flint_kernels import gemv_triton as gt
from flint_kernels import moe_triton as mt
from flint_kernels import nvfp4, nvfp4_mma_scales
from flint_kernels.linear import NVFP4Weight
from kernel_checks import random_nvfp4, random_nvfp4_experts, routing

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
interpreted = pytest.mark.skipif(
    not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def replaced(w: NVFP4Weight) -> NVFP4Weight:
    """A copy of w whose scales are ready bytes in the UE4M3 bytes' place."""
    out = NVFP4Weight(w.qweight.clone(), w.scales.clone(), w.global_scale.clone(), w.segments)
    nvfp4_mma_scales.make_ready(out, replace=True)
    assert out.scales.dtype == torch.int8 and out.ready_scales is out.scales
    return out


def test_ready_bytes_decode_to_the_ue4m3_floats() -> None:
    """All 256 UE4M3 bytes: their ready bytes decode (`nvfp4.ready_to_float`, through `scales_to_float`) to the same
    float32 bits; where the UE4M3 byte decodes to zero the ready byte is 0, which decodes to the smallest subnormal
    (its block's codes are zeroed instead, `make_ready`)."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = nvfp4.ue4m3_to_float(b)
    ready = nvfp4_mma_scales.ready_bytes(b)
    got = nvfp4.scales_to_float(ready)
    zero = nvfp4_mma_scales.zero_scale(b)
    assert torch.equal(got[~zero].view(torch.int32), want[~zero].view(torch.int32))
    assert (ready[zero] == 0).all() and (got[zero] == 2.0**-10).all() and got[1] == 2.0**-10


def test_a_replaced_weight_keeps_its_values_and_its_size() -> None:
    """`make_ready(replace=True)`: one byte a block (the weight's bytes as before) and the dequantised values, nonzero
    ones bit for bit (zero-scale blocks planted: their zeros may lose a sign, as `nvfp4_mma_scales` says)."""
    w = random_nvfp4(64, 256, torch.Generator().manual_seed(3), (64,))
    before, nbytes = w.dequantize(torch.float32), w.nbytes
    r = replaced(w)
    after = r.dequantize(torch.float32)
    assert r.nbytes == nbytes
    assert torch.equal(after, before)
    nonzero = before != 0
    assert torch.equal(after[nonzero].view(torch.int32), before[nonzero].view(torch.int32))


def test_replace_is_a_setting_and_wants_ready_bytes_on_any_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FLINT_MMA_READY_SCALES=replace` asks for ready bytes whatever the device's table says (`prepare` keeps to
    CUDA weights), and the model builder's hook then replaces the UE4M3 bytes."""
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", "replace")
    assert nvfp4_mma_scales.setting() == "replace"
    assert nvfp4_mma_scales.wanted(torch.device("cpu"))
    w = random_nvfp4(16, 128, torch.Generator().manual_seed(4), (16,))
    nvfp4_mma_scales.prepare(w)  # a CPU weight: left as it is
    assert w.ready_scales is None and w.scales.dtype == torch.uint8


@interpreted
@pytest.mark.parametrize("m", [1, 3, 8, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_linear_paths_read_replaced_scales(m: int, dtype: torch.dtype) -> None:
    """`gemv_triton.linear` and `lm_head` (FMA tiles at M = 1, tensor-core tiles above, the large-M path at 33), the
    FMA and tensor-core tile configs forced, and the prefill copy kernel: the same bits from ready bytes."""
    g = gen(m)
    w = random_nvfp4(120, 288, g, (72, 32, 16))
    r = replaced(w)
    x = (torch.randn(m, 288, generator=g, device=DEVICE) * 0.5).to(dtype)
    assert torch.equal(gt.linear(x, r), gt.linear(x, w))
    assert torch.equal(gt.lm_head(x, r), gt.lm_head(x, w))
    fma = gt.TileConfig(block_n=16, block_m=1, block_k=64, use_dot=False, num_warps=4, num_stages=1)
    dot = gt.TileConfig(32, 16 if m <= 16 else 64, 64, True, 4, 2)
    packed = dataclasses.replace(dot, packed=True)
    for cfg in (fma, dot, packed):
        if cfg is fma and m > 1:
            continue
        assert torch.equal(gt._matmul(x, r, False, config=cfg), gt._matmul(x, w, False, config=cfg)), cfg
    assert torch.equal(gt.dequantize(r, dtype), gt.dequantize(w, dtype))


@interpreted
@pytest.mark.parametrize("t", [1, 3])
def test_the_moe_paths_read_replaced_scales(t: int) -> None:
    """`moe_triton.fused_moe` on its decode path (per-pair FMA tiles, expert-major FMA gate_up, the folded shared
    expert) and its grouped tensor-core path: the same bits from ready bytes."""
    g = gen(40 + t)
    e, h, i, k = 6, 128, 48, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    shared = (random_nvfp4(2 * 2 * i, h, g, (2 * i, 2 * i)), random_nvfp4(h, 2 * i, g, (h,)))
    r13, r2 = replaced(w13), replaced(w2)
    rs = (replaced(shared[0]), replaced(shared[1]))
    fma = mt.MoEConfig(block_m=1, gu_block_i=16, gu_block_k=32, dn_block_n=32, dn_block_k=32, use_dot=False,
                       num_warps=4, num_stages=1)  # fmt: skip
    expert_major = dataclasses.replace(fma, gu_block_i=32, gu_block_k=64, expert_major=True)
    grouped = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
    runs = [
        dict(decode_max_tokens=64, config=fma),
        dict(decode_max_tokens=64, config=expert_major),
        dict(decode_max_tokens=64, config=fma, shared=True),
        dict(decode_max_tokens=0, config=grouped),
    ]
    for kw in runs:
        with_shared = kw.pop("shared", False)
        got = mt.fused_moe(x, tw, ids, r13, r2, shared=rs if with_shared else None, **kw)
        want = mt.fused_moe(x, tw, ids, w13, w2, shared=shared if with_shared else None, **kw)
        assert torch.equal(got, want), kw


@interpreted
@pytest.mark.parametrize("packed", [False, True], ids=["planes", "packed"])
def test_the_prefill_twins_read_replaced_scales(packed: bool) -> None:
    """The TMA-fed launches that decode NVFP4 in registers (`moe_grouped_tma_triton`, byte planes and packed pairs):
    the same bits from ready bytes, in FP32 and FP16."""
    from flint_kernels import moe_grouped_tma_triton as mt2
    from flint_kernels.configs import MoETmaConfig

    g = gen(11)
    e, h, i, k, t = 8, 128, 64, 3, 29
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    r13, r2 = replaced(w13), replaced(w2)
    cfg = MoETmaConfig(
        block_m=16, gate_up_block_n=16, gate_up_block_k=32, gate_up_stages=2, down_block_n=32, down_block_k=16,
        down_stages=2, packed_decode=packed,
    )  # fmt: skip
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
        tw, ids = routing(t, e - 1, k, g)
        assert mt2.fits(x, r13, r2, cfg)
        assert torch.equal(mt2.routed(x, tw, ids, r13, r2, cfg), mt2.routed(x, tw, ids, w13, w2, cfg)), dtype


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 2, 8, 16, 32, 64, 256, 2048])
def test_replaced_scales_on_the_gpu(tokens: int) -> None:
    """At Flint's shapes with BF16 activations and the device's table, every path a batch of `tokens` takes (the
    FMA and MMA linears, the MoE's decode paths with the shared expert, the prefill twins) gives the same bits from
    ready bytes in the UE4M3 bytes' place."""
    g = gen(tokens)
    w = random_nvfp4(5120, 2048, g, (4096, 512, 512))
    w13 = random_nvfp4_experts(256, 1024, 2048, g, (512, 512))
    w2 = random_nvfp4_experts(256, 2048, 512, g, (2048,))
    shared = (random_nvfp4(2048, 2048, g, (1024, 1024)), random_nvfp4(2048, 1024, g, (2048,)))
    for s in (w, w13, w2, *shared):
        s.global_scale.mul_(1 / 64)
    rw, r13, r2 = replaced(w), replaced(w13), replaced(w2)
    rs = (replaced(shared[0]), replaced(shared[1]))
    x = (torch.randn(tokens, 2048, generator=g, device=DEVICE) * 0.5).bfloat16()
    scores = torch.rand(tokens, 256, generator=g, device=DEVICE)
    tw, ids = torch.topk(scores, 6, dim=-1)
    tw = tw / tw.sum(-1, keepdim=True)
    assert torch.equal(gt.linear(x, rw), gt.linear(x, w))
    assert torch.equal(mt.fused_moe(x, tw, ids, r13, r2, shared=rs), mt.fused_moe(x, tw, ids, w13, w2, shared=shared))
