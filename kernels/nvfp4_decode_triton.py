"""NVFP4 decode on the GPU, shared by the linear, MoE and prefill kernels: E2M1 codes and UE4M3 block scales to FP32
or packed BF16 values, and each output row's per-segment global scale.

Exact and table-free: a code's 2 exponent bits and 1 mantissa bit are shifted into the bottom of an
FP32's exponent field and the top of its mantissa, its sign into bit 31. That FP32 equals E2M1X2[code] * 2**-127,
codes 0/1 landing exactly on subnormals (the kernels do not flush denormals). A scale byte's low 7 bits at bit 20
likewise give E4M3 * 2**-120. Two shifts and one LOP3 per value (the M == 1 path builds two values per 32-bit op
from int32 words, nibbles i and i + 4 sitting 16 bits apart); power-of-two offsets (2**64 on x or on the scale,
2**62 on the accumulator) keep every product and partial sum in FP32's normal range, and all of them are exact.

A fused weight (q|k|v, gate|up) keeps one FP32 global scale per segment of rows: up to MAX_SEGMENTS, passed to the
kernels as the segments' boundaries (`segment_bounds`) and applied on the FP32 accumulator (`segment_scale`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_mma_codes import LEFTOVER_MASK, LEFTOVER_TIMES, MAGNITUDE_SIGN, ROTATIONS

MAX_SEGMENTS = 4
_MAGNITUDE_SIGN = tl.constexpr(MAGNITUDE_SIGN)
_ROTATIONS = tl.constexpr(ROTATIONS)
_LEFTOVER_MASK = tl.constexpr(LEFTOVER_MASK)
_LEFTOVER_TIMES = tl.constexpr(LEFTOVER_TIMES)


@triton.jit
def e2m1_bits(q, SHIFT: tl.constexpr):
    """FP32 E2M1X2[nibble] * 2**-127 of the nibble at bit SHIFT (0 or 4) of int32 bytes `q`, exactly.

    The nibble's exponent bits land in the bottom of the FP32 exponent field and its mantissa bit on the top
    mantissa bit, so exponent 0 (codes 0, 1 and their negatives) is an FP32 subnormal with exactly the right
    value: two shifts and one AND/OR (a single LOP3), no table and no select. Code 8 gives -0.0.
    """
    mag = (q << (22 - SHIFT)) & 0x01C00000
    sign = (q << (28 - SHIFT)) & -2147483648  # bit 31 (an int32 literal, so q stays int32)
    return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_value(b):
    """FP32 E4M3 value of the low 7 bits of int32 scale bytes `b` (twice nvfp4.ue4m3_to_float); 0x7F gives 0.

    The 7 bits placed at FP32 bit 20 are the E4M3 value times 2**-120, subnormals included (exponent field 0).
    """
    v = ((b & 0x7F) << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2**120
    return tl.where(b == 0x7F, 0.0, v)


@triton.jit
def code_words(w_ptr):
    """The NVFP4 codes at w_ptr as 64-bit words (16 values each): unsigned for ready codes (an int8 pointer,
    `nvfp4_mma_codes`), whose words' type then tells each decoder, signed for the engine's uint8 codes."""
    if w_ptr.dtype.element_ty == tl.int8:
        return w_ptr.to(tl.pointer_type(tl.uint64))
    else:
        return w_ptr.to(tl.pointer_type(tl.int64))


@triton.jit
def scale_value(sb, s_ptr):
    """FP32 E4M3 value (`e4m3_value`'s) of scale bytes sb loaded from s_ptr: UE4M3 bytes (uint8), or ready bytes
    (int8, `nvfp4_mma_scales`: the value's FP32 bits are the byte plus 944, shifted; a block whose UE4M3 scale was 0
    has zero codes instead). The pointer's type picks, so no kernel needs a parameter for it."""
    if s_ptr.dtype.element_ty == tl.int8:
        return (((sb.to(tl.int32) & 0xFF) + 944) << 20).to(tl.float32, bitcast=True)
    else:
        return e4m3_value(sb.to(tl.int32))


@triton.jit
def nvfp4_planes(
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    k0,
    k_end,
    stride_wn,
    stride_sn,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """NVFP4 weight rows, columns k0..k0+BLOCK_K: (lo, hi, scale).

    lo / hi [BLOCK_N, G, 8] are E2M1X2 * 2**-127 of values 16g + 2j / 16g + 2j + 1 (the low / high nibble of
    byte j of group g); scale [BLOCK_N, G] is the E4M3 value of the group's scale byte (twice ue4m3). The weight
    is lo * scale * 2**126: the callers move 2**64 onto the scale or onto x, so every product and sum stays in
    FP32's normal range and the accumulator holds the true value times 2**-62. Out-of-range reads give 0.
    """
    G: tl.constexpr = BLOCK_K // 16
    offs_g = k0 // 16 + tl.arange(0, G)
    if w_ptr.dtype.element_ty == tl.int8:  # ready codes (`nvfp4_mma_codes`): whole words, not bytes
        lo, hi, scale = _ready_planes(w_ptr, s_ptr, rows, row_ok, k_end, stride_wn, stride_sn, offs_g, EVEN_K, BLOCK_N)
    else:
        lo, hi, scale = _byte_planes(w_ptr, s_ptr, rows, row_ok, k_end, stride_wn, stride_sn, offs_g, EVEN_K)
    return lo, hi, scale


@triton.jit
def _byte_planes(w_ptr, s_ptr, rows, row_ok, k_end, stride_wn, stride_sn, offs_g, EVEN_K: tl.constexpr):
    """`nvfp4_planes` of the engine's codes: each group's 8 bytes, low and high nibbles."""
    j = tl.arange(0, 8)
    q_ptrs = w_ptr + rows[:, None, None] * stride_wn + (offs_g * 8)[None, :, None] + j[None, None, :]
    s_ptrs = s_ptr + rows[:, None] * stride_sn + offs_g[None, :]
    if EVEN_K:
        q = tl.load(q_ptrs, mask=row_ok[:, None, None], other=0)
        sb = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
    else:
        g_ok = offs_g < k_end // 16
        q = tl.load(q_ptrs, mask=row_ok[:, None, None] & g_ok[None, :, None], other=0)
        sb = tl.load(s_ptrs, mask=row_ok[:, None] & g_ok[None, :], other=0)
    q = q.to(tl.int32)
    return e2m1_bits(q, 0), e2m1_bits(q, 4), scale_value(sb, s_ptr)


@triton.jit
def _ready_planes(w_ptr, s_ptr, rows, row_ok, k_end, stride_wn, stride_sn, offs_g, EVEN_K: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """`nvfp4_planes` of ready codes: each group's two words read as uint32 and decoded in pairs (values p, p + 4 of a
    word), then laid out as the byte planes are: lo = values 0, 2, 4, 6 of each word, hi = 1, 3, 5, 7."""
    G: tl.constexpr = offs_g.shape[0]
    wd = tl.arange(0, 2)
    w32 = w_ptr.to(tl.pointer_type(tl.uint32))
    word_ptrs = w32 + rows[:, None, None] * (stride_wn // 4) + (offs_g * 2)[None, :, None] + wd[None, None, :]
    s_ptrs = s_ptr + rows[:, None] * stride_sn + offs_g[None, :]
    if EVEN_K:
        words = tl.load(word_ptrs, mask=row_ok[:, None, None], other=0)
        sb = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
    else:
        g_ok = offs_g < k_end // 16
        words = tl.load(word_ptrs, mask=row_ok[:, None, None] & g_ok[None, :, None], other=0)
        sb = tl.load(s_ptrs, mask=row_ok[:, None] & g_ok[None, :], other=0)
    v0, v4 = e2m1_pair_bits(words, 0)
    v1, v5 = e2m1_pair_bits(words, 1)
    v2, v6 = e2m1_pair_bits(words, 2)
    v3, v7 = e2m1_pair_bits(words, 3)
    # join(join(a, b), join(c, d)) flattens to a, c, b, d: values 0, 2, 4, 6 (and 1, 3, 5, 7) of each word
    lo = tl.reshape(tl.join(tl.join(v0, v4), tl.join(v2, v6)), (BLOCK_N, G, 8))
    hi = tl.reshape(tl.join(tl.join(v1, v5), tl.join(v3, v7)), (BLOCK_N, G, 8))
    return lo, hi, scale_value(sb, s_ptr)


@triton.jit
def e2m1_pair_bits(words, P: tl.constexpr):
    """Nibbles P and P + 4 of int32 words as FP32 E2M1X2 * 2**-127: (value 8w + P, value 8w + P + 4).

    The two nibbles sit 16 bits apart, so one shift/shift/LOP3 builds both as a packed pair of BF16 bit patterns
    (exponent bits to bits 7-8 / 23-24, mantissa bit to 6 / 22, sign to 15 / 31); each half then becomes an FP32
    with one more op. Exponent 0 again lands on exact subnormals.
    """
    packed = e2m1_pair_packed(words, P)
    return (packed << 16).to(tl.float32, bitcast=True), (packed & -65536).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_pair_packed(words, P: tl.constexpr):
    """The int32 of two BF16 bit patterns, E2M1X2 * 2**-127 of nibble P (low half) and nibble P + 4 (high half).

    uint32 words are ready codes (`nvfp4_mma_codes`: each word's bits permuted; the loaders read them through an
    unsigned pointer when the codes' tensor is int8): values P and P + 4 come out as the same bits by their decode."""
    if words.dtype == tl.uint32:
        packed = _ready_pair_packed(words, P)
    else:
        if P < 2:
            mag = words << (6 - 4 * P)
        else:
            mag = words >> (4 * P - 6)  # arithmetic shift: the filled top bits are masked off
        packed = (mag & 0x01C001C0) | ((words << (12 - 4 * P)) & -2147450880)  # 0x80008000
    return packed


@triton.jit
def _ready_pair_packed(words, P: tl.constexpr):
    """`e2m1_pair_packed` of uint32 ready-code words: register P of `nvfp4_mma_codes`'s layout (a mask; a rotation
    and a mask; or a mask, a multiply making three copies that never overlap, and a mask), as int32."""
    if P < 3:
        if _ROTATIONS[P] == 0:
            m = words & _MAGNITUDE_SIGN
        else:
            m = ((words >> _ROTATIONS[P]) | (words << (32 - _ROTATIONS[P]))) & _MAGNITUDE_SIGN
    else:
        m = ((words & _LEFTOVER_MASK) * _LEFTOVER_TIMES) & _MAGNITUDE_SIGN
    return m.to(tl.int32, bitcast=True)


@triton.jit
def bf16x2_scaled(packed, scale2):
    """(low, high) BF16 halves of `packed` (two BF16 bit patterns) times the BF16 pair `scale2`: one FMA.BF16X2
    (plus -0, so a product's sign survives), exact for NVFP4 codes and E4M3 scales; BF16 subnormals are kept."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 z, p; mov.b32 z, 0x80008000; fma.rn.bf16x2 p, $2, $3, z; mov.b32 {$0, $1}, p; }",
        "=h,=h,r,r",
        [packed, scale2],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=1,
    )


@triton.jit
def segment_scale(gs_ptr, rows, row_ok, seg1, seg2, seg3):
    """FP32 global scale of each output row: segment boundaries seg1 <= seg2 <= seg3 (unused ones equal N)."""
    seg = (rows >= seg1).to(tl.int32) + (rows >= seg2).to(tl.int32) + (rows >= seg3).to(tl.int32)
    return tl.load(gs_ptr + seg, mask=row_ok, other=0.0)


def segment_bounds(segments: tuple[int, ...], n: int) -> tuple[int, int, int]:
    """Cumulative starts of segments 1..3, padded with n (a row >= n never exists)."""
    bounds = []
    acc = 0
    for s in segments[:-1]:
        acc += s
        bounds.append(acc)
    bounds += [n] * (3 - len(bounds))
    return bounds[0], bounds[1], bounds[2]
