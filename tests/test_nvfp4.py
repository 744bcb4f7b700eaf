"""NVFP4 codec: decode bit-exact with gguf, lossless repack, encoder round trips, edge codes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from flint_kernels import nvfp4
from flint_kernels.linear import NVFP4Weight, linear_ref


def _random_blocks(rows: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, k // 64 * 36), generator=g, dtype=torch.int32).to(torch.uint8)


def test_scale_decode_matches_gguf_for_every_byte() -> None:
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ref = gguf.quants.NVFP4.ue4m3_to_fp32(every.numpy()).astype(np.float32)
    assert np.array_equal(ref.view(np.uint32), nvfp4.ue4m3_to_float(every).numpy().view(np.uint32))


@pytest.mark.parametrize("k", [64, 128, 2048])
def test_decode_bit_exact_with_gguf(k: int) -> None:
    raw = _random_blocks(33, k, seed=k)
    ref = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.NVFP4)
    ours = nvfp4.dequantize_gguf_blocks(raw, k).numpy()
    assert ours.shape == ref.shape == (33, k)
    assert np.array_equal(ref.view(np.uint32), ours.view(np.uint32))


def test_edge_codes() -> None:
    """0, -0 (code 8), max (7 / 15) and the 0x7F (zero) and 0x7E (448) scale bytes."""
    codes = torch.tensor([0, 8, 7, 15, 1, 9] + [3] * 58, dtype=torch.uint8)
    qweight = (codes[0::2] | (codes[1::2] << 4)).reshape(1, 32)
    for scale_byte, expect_scale in ((0x7F, 0.0), (0x7E, 448.0 * 0.5), (0x00, 0.0), (0x38, 0.5)):
        scales = torch.full((1, 4), scale_byte, dtype=torch.uint8)
        w = nvfp4.dequantize(qweight, scales)[0]
        table = torch.tensor(nvfp4.E2M1X2)
        assert torch.equal(w, table[codes.long()] * expect_scale)
        raw = nvfp4.engine_to_gguf_blocks(qweight, scales)
        ref = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.NVFP4)[0]
        assert np.array_equal(ref, w.numpy())


def test_repack_round_trip_is_bit_identical() -> None:
    raw = _random_blocks(17, 512, seed=1)
    q, s = nvfp4.gguf_blocks_to_engine(raw, 512)
    assert q.shape == (17, 256) and s.shape == (17, 32)
    assert torch.equal(nvfp4.engine_to_gguf_blocks(q, s), raw)
    q3 = torch.randint(0, 256, (3, 5, 64), dtype=torch.int32).to(torch.uint8)  # stacked experts
    s3 = torch.randint(0, 256, (3, 5, 8), dtype=torch.int32).to(torch.uint8)
    assert torch.equal(torch.stack(nvfp4.gguf_blocks_to_engine(nvfp4.engine_to_gguf_blocks(q3, s3), 128)[0:1])[0], q3)


def test_dequantised_values_are_exact_in_bf16() -> None:
    raw = _random_blocks(8, 256, seed=5)
    q, s = nvfp4.gguf_blocks_to_engine(raw, 256)
    w32 = nvfp4.dequantize(q, s, torch.float32)
    assert torch.equal(nvfp4.dequantize(q, s, torch.bfloat16).float(), w32)


def test_encoder_accuracy_and_idempotence() -> None:
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(2)) * 0.03
    g = nvfp4.choose_global_scale(w.abs().amax())
    assert float(torch.log2(g)) == round(float(torch.log2(g)))  # power of two
    q, s = nvfp4.quantize(w, g)
    deq = nvfp4.dequantize(q, s) * g
    rel = ((deq - w).norm() / w.norm()).item()
    assert 0.0 < rel < 0.12  # 4-bit E2M1 with per-16 scales: ~10% RMS error on Gaussian data
    q2, s2 = nvfp4.quantize(deq, g)  # a representable tensor encodes to itself
    assert torch.equal(nvfp4.dequantize(q2, s2) * g, deq)


def test_encoder_rounds_to_nearest() -> None:
    # Block maximum 6 gives scale 1.0 exactly, so the grid is the E2M1 values themselves; ties go to even.
    w = torch.tensor([[0.2, 0.26, 0.74, 1.26, 1.74, 2.6, 3.4, 5.1, -0.3, -5.9, -6.0, 0.0, 1.25, 2.5, 3.5, 6.0] * 4])
    q, s = nvfp4.quantize(w, torch.tensor(1.0))
    got = nvfp4.dequantize(q, s)[0, :16]
    expect = torch.tensor([0.0, 0.5, 0.5, 1.5, 1.5, 3.0, 3.0, 6.0, -0.5, -6.0, -6.0, 0.0, 1.0, 2.0, 4.0, 6.0])
    assert torch.equal(got, expect)


def test_linear_with_global_scale_on_accumulator() -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(32, 128, generator=gen)
    x = torch.randn(5, 128, generator=gen)
    q, s = nvfp4.quantize(w / 3.0, None)
    for g, exact in ((0.25, True), (0.3, False)):
        weight = NVFP4Weight(q, s, torch.tensor([g]), (32,))
        assert weight.scales_are_powers_of_two() is exact
        y = linear_ref(x, weight)
        ref = (x.double() @ nvfp4.dequantize(q, s).double().T * g).float()
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_stacked_weight_scales_per_expert_and_segment() -> None:
    """An expert handed out by `select` knows whether its own global scales are powers of two (read once for the
    whole stack), and each output row takes its segment's scale."""
    gen = torch.Generator().manual_seed(5)
    q, s = nvfp4.quantize(torch.randn(3, 48, 64, generator=gen))
    g = torch.tensor([[0.5, 2.0], [0.5, 0.3], [0.0, 4.0]])
    w = NVFP4Weight(q, s, g, (16, 32))
    assert w.scales_are_powers_of_two() is False
    assert [w.select(e).scales_are_powers_of_two() for e in range(3)] == [True, False, True]
    expect = torch.repeat_interleave(g, torch.tensor([16, 32]), dim=-1)
    assert torch.equal(w.column_scale(), expect)
    assert torch.equal(w.select(1).column_scale(), expect[1])
    x = torch.randn(4, 64, generator=gen)
    for e in range(3):
        ref = (x.double() @ nvfp4.dequantize(q[e], s[e]).double().T * expect[e].double()).float()
        torch.testing.assert_close(linear_ref(x, w.select(e)), ref, rtol=1e-5, atol=1e-5)
