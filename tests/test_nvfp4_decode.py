"""`flint_kernels.nvfp4_decode_triton`: every E2M1 code and every scale byte decoded by the kernels' primitives,
bit for bit against the codec (`flint_kernels.nvfp4`), in Triton's interpreter (FP32 and integer results only)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from flint_kernels import nvfp4, nvfp4_mma_scales
from flint_kernels.nvfp4_decode_triton import (
    e2m1_bits,
    e2m1_pair_packed,
    e4m3_value,
    scale_value,
    segment_bounds,
    segment_scale,
)

ALL_BYTES = torch.arange(256, dtype=torch.int32)


@triton.jit
def _codes_kernel(q_ptr, lo_ptr, hi_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    q = tl.load(q_ptr + i)
    tl.store(lo_ptr + i, e2m1_bits(q, 0))
    tl.store(hi_ptr + i, e2m1_bits(q, 4))


@triton.jit
def _pairs_kernel(w_ptr, out_ptr, N: tl.constexpr, P: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, e2m1_pair_packed(tl.load(w_ptr + i), P))


@triton.jit
def _pair_kernel(w_ptr, r_ptr, out_ptr, P: tl.constexpr, N: tl.constexpr):
    """Row 0: `e2m1_pair_packed` of the engine's int32 words; row 1: of the ready words, read as uint32."""
    i = tl.arange(0, N)
    tl.store(out_ptr + i, e2m1_pair_packed(tl.load(w_ptr + i), P))
    ready = tl.load(r_ptr.to(tl.pointer_type(tl.uint32)) + i)
    tl.store(out_ptr + N + i, e2m1_pair_packed(ready, P))


@triton.jit
def _e4m3_kernel(b_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, e4m3_value(tl.load(b_ptr + i)))


@triton.jit
def _scales_kernel(s_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, scale_value(tl.load(s_ptr + i), s_ptr))


@triton.jit
def _segments_kernel(gs_ptr, out_ptr, seg1, seg2, seg3, N, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    ok = rows < N
    tl.store(out_ptr + rows, segment_scale(gs_ptr, rows, ok, seg1, seg2, seg3), mask=ok)


def _e2m1_scaled(codes: torch.Tensor) -> torch.Tensor:
    """E2M1X2[code] * 2**-127 in FP32 (subnormal for codes 1 and 9), -0.0 for code 8."""
    table = torch.tensor(nvfp4.E2M1X2, dtype=torch.float32)
    out = table[codes.long()] * 2.0**-127
    return torch.where(codes == 8, torch.tensor(-0.0), out)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def test_e2m1_bits_decodes_both_nibbles_of_every_byte_exactly() -> None:
    lo, hi = torch.full((256,), float("nan")), torch.full((256,), float("nan"))
    _codes_kernel[(1,)](ALL_BYTES, lo, hi, N=256)
    assert torch.equal(_bits(lo), _bits(_e2m1_scaled(ALL_BYTES & 15)))  # bits: signed zeros and subnormals too
    assert torch.equal(_bits(hi), _bits(_e2m1_scaled(ALL_BYTES >> 4)))


@pytest.mark.parametrize("p", [0, 1, 2, 3])
def test_e2m1_pair_packed_holds_nibbles_p_and_p_plus_4_as_bf16(p: int) -> None:
    """The low BF16 half is nibble p's value, the high half nibble p + 4's (E2M1X2 * 2**-127: the FP32 value's top
    16 bits, exact as E2M1 has one mantissa bit)."""
    words = torch.randint(-(2**31), 2**31, (512,), dtype=torch.int64, generator=torch.Generator().manual_seed(p))
    words = words.to(torch.int32)
    out = torch.zeros(512, dtype=torch.int32)
    _pairs_kernel[(1,)](words, out, N=512, P=p)
    lo_code, hi_code = (words >> (4 * p)) & 15, (words >> (4 * p + 16)) & 15
    want_lo = (_bits(_e2m1_scaled(lo_code)) >> 16) & 0xFFFF
    want_hi = (_bits(_e2m1_scaled(hi_code)) >> 16) & 0xFFFF
    assert torch.equal(out & 0xFFFF, want_lo)
    assert torch.equal((out >> 16) & 0xFFFF, want_hi)


def test_e4m3_value_is_twice_the_codec_scale_for_every_byte() -> None:
    """The low 7 bits as E4M3 (subnormals included; the top bit unused), 0x7F as 0: twice `ue4m3_to_float`, which
    carries ggml's 0.5."""
    out = torch.full((256,), float("nan"))
    _e4m3_kernel[(1,)](ALL_BYTES, out, N=256)
    want = 2 * nvfp4.ue4m3_to_float(ALL_BYTES.to(torch.uint8))
    assert torch.equal(out, want)


def test_scale_value_reads_ue4m3_and_ready_bytes_alike() -> None:
    """The pointer's type picks the decode: UE4M3 bytes (uint8) and the ready bytes made from them (int8) give the
    same value for every scale that is not 0 (a zero scale's ready byte is 0 and its codes are zeroed instead)."""
    ue4m3 = ALL_BYTES.to(torch.uint8)
    ready = nvfp4_mma_scales.ready_bytes(ue4m3)
    from_ue4m3, from_ready = torch.full((256,), float("nan")), torch.full((256,), float("nan"))
    _scales_kernel[(1,)](ue4m3, from_ue4m3, N=256)
    _scales_kernel[(1,)](ready, from_ready, N=256)
    live = ~nvfp4_mma_scales.zero_scale(ue4m3)
    assert int(live.sum()) >= 250  # only 0x00, 0x7F and 0x80 decode to 0
    assert torch.equal(from_ue4m3, 2 * nvfp4.ue4m3_to_float(ue4m3))
    assert torch.equal(from_ready[live], from_ue4m3[live])


@pytest.mark.parametrize(
    ("segments", "n"), [((4096, 512, 512), 5120), ((512, 512), 1024), ((1000,), 1000), ((2, 3, 4, 5), 14)]
)
def test_segment_scale_gives_each_row_its_segments_global_scale(segments: tuple[int, ...], n: int) -> None:
    gs = torch.tensor([0.5, 2.0, 3.0, 7.0][: len(segments)], dtype=torch.float32)
    seg = segment_bounds(segments, n)
    assert list(seg) == sorted(seg) and seg[len(segments) - 1 :] == (n,) * (4 - len(segments))
    out = torch.full((n,), float("nan"))
    _segments_kernel[(1,)](gs, out, *seg, n, BLOCK=triton.next_power_of_2(n))
    want = torch.cat([torch.full((s,), float(g)) for s, g in zip(segments, gs.tolist())])
    assert torch.equal(out, want)


@pytest.mark.parametrize("p", [0, 1, 2, 3])
def test_ready_words_decode_to_the_engine_words_pairs(p: int) -> None:
    """`e2m1_pair_packed` of uint32 words (ready codes, `nvfp4_mma_codes`) gives exactly the BF16 pair the engine's
    decode gives from the word they were made from: values p and p + 4, for words with every code at every place and
    random words."""
    import numpy as np
    from flint_kernels import nvfp4_mma_codes

    nibbles = np.arange(16, dtype=np.uint32)
    every = sum(((nibbles + i) % 16) << (4 * i) for i in range(8)).astype(np.uint32)
    rand = np.random.default_rng(p).integers(0, 2**32, 48, dtype=np.uint64).astype(np.uint32)
    words = torch.from_numpy(np.concatenate([every, rand]).view(np.int32).copy())
    ready = nvfp4_mma_codes.ready_words(words.view(torch.uint8)).view(torch.int32)
    out = torch.empty(2, words.numel(), dtype=torch.int32)
    _pair_kernel[(1,)](words, ready, out, P=p, N=words.numel())
    assert torch.equal(out[1], out[0])
