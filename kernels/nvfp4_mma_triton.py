"""NVFP4 (W4A16) on `mma.sync` tensor cores, the weights decoded two a register in PTX: the K step (the PTX, the
loads, the K loops) and a linear for up to 64 rows of x. The MoE's expert-major gate_up and down run the same K
steps in `nvfp4_mma_moe_triton`.

`linear` computes `linear_ref`'s function for a BF16 x [M <= 64, K] and an NVFP4 weight [N, K]: FP32 accumulation,
the per-segment global scale on the accumulator, one rounding. `TileConfig.mma` puts it inside `gemv_triton.linear`;
the H200 table selects it where a whole-step A/B had it ahead (its entries' sources; docs/performance.md, nineteenth
session). Why: the
FMA path spends ~5 instructions a weight value and token (sm_90 SASS), and the tl.dot paths move decoded tiles
through shared memory to reach the MMA operand layout. Here each thread decodes exactly the weights its MMA
fragments hold, so nothing moves: ~2 instructions a value for the decode (AND, IMAD, AND and one FMA.BF16X2 for two
values) and one HMMA per 8 values a thread, for up to 8 rows of x.

Lanes: a warp owns 16 weight rows; lane L = 4g + c holds rows g and g + 8 (A fragment) and row g of x (B fragment;
rows past the real ones read the last real row, and their columns of D are never stored). Every thread runs the PTX
once per K step on its own registers: the asm's tensors are one element a thread, thread t holding element t (the
compile test checks their layout). A K step is 128 values a row: lane c reads int32 words 4c..4c+3 of the step
(values 32c + 8j + i of word j); word j's nibbles p and p + 4 become one BF16x2 register (`nvfp4_decode_triton`'s
`e2m1_pair_packed` bits: E2M1X2 * 2**-127, exact, subnormals included) times the block scale * 2**64, so the MMA
inputs are the weights times 2**-62, exact and normal. Ready codes (`nvfp4_mma_codes`: each word's bits permuted at
load; an int8 code pointer, which `_weight_bases` turns into a uint64 one) give the same registers in 8 integer
instructions a word instead of 13 (`_decode_ready`). The MMA of (word j, half h) takes pairs 2h and 2h + 1 of
rows g and g + 8, and the matching x pairs built by PRMT from the same positions: a permutation of K, the same for
A and B, which changes only the order of the FP32 sums. The accumulator leaves the PTX as the D fragment (rows g,
g + 8; x rows 2c, 2c + 1), is multiplied by 2**62 and the row's global scale, and rounded once.

Rows of x: one MMA takes 8 (its N side). Up to 8 rows `_nvfp4_mma_kernel` runs; 9-32 rows the rows kernel, whose K
step decodes each weight pair once for four MMAs (x rows g, g + 8, g + 16, g + 24: `step_asm(4)`, a quad); 33-64
rows the same kernel with two quads, the weights loaded once and decoded once a quad.

Split-K (`linear`) as in `split_k_triton` (deterministic, in one launch): each split stores its D fragments per thread,
the last to arrive on the tile's counter sums them in split order.

Loads: Triton's loads of one element a thread are 8 bytes wide, so a lane's K step takes 4 loads of codes, 4 of scale
bytes and 8 of x, and Nsight Compute found the MoE kernels bound by the L1 (75-90% of its throughput, a third of
DRAM's). Each kernel therefore has a VEC twin (`_..._vec_kernel`, the same body) that loads codes and x 16 bytes at
a time (`_ld16`, PTX's ld.global.nc.v2.b64) and the scales 2 bytes at a time, when the rows are aligned for it
(`_vec_fits`); `vec=True` / `mma_vec` choose it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .l2_prefetch import prefetch_lines
from .linear import NVFP4Weight
from .nvfp4_decode_triton import MAX_SEGMENTS, code_words, e4m3_value, segment_bounds, segment_scale
from .nvfp4_mma_codes import LEFTOVER_MASK, LEFTOVER_TIMES, MAGNITUDE_SIGN, ROTATIONS
from .nvfp4_mma_scales import READY_PAIR_ADD
from .pdl import launch_options, pdl_entry
from .split_k_triton import COUNTER_SLOTS, choose_split_k, counters

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_M = 8  # rows of x: the MMA's N side
# The rows kernel's groups of 8 x rows a decoded weight (`step_asm(ROW_GROUPS)`, one quad); 33-64 rows run two quads.
ROW_GROUPS = 4
MAX_ROWS = 64
BLOCK_K = 128  # values a K step, a row: 16 bytes a lane
ROWS_PER_WARP = 16
# Each kernel can load a K step ahead (`prefetch`). On the H200 (2026-12-02) that lost for the linear (e.g. qkv at 8
# rows 10.1 against 8.8 us) and the MoE down, and won for the MoE gate_up at 1-2 and 64 tokens (MoEConfig.mma_prefetch).
PREFETCH = False


def _decode_pair(word: str, p: int, scale: str, out: str) -> list[str]:
    """PTX for nibbles p and p + 4 (p = 0 or 1) of `word` as a BF16x2 register `out`, times the BF16x2 `scale`.

    One multiply moves both fields: the nibble pair masked out of the word, times 2**(6 - 4p) + 2**(12 - 4p), is
    two disjoint copies, one with the magnitude bits at 6-8 / 22-24 and one with the sign at 15 / 31; a mask keeps
    those (`nvfp4_decode_triton.e2m1_pair_packed`'s bits, in three operations instead of five). Nibbles 2, 3, 6 and
    7 are nibbles 0, 1, 4 and 5 of the word shifted right by 8."""
    nibbles = 0x000F000F << (4 * p)
    times = (1 << (6 - 4 * p)) + (1 << (12 - 4 * p))
    return [
        f"and.b32 m, {word}, {nibbles:#010x};",
        f"mul.lo.u32 m, m, {times:#x};",
        "and.b32 m, m, 0x81C081C0;",
        f"fma.rn.bf16x2 {out}, m, {scale}, z;",
    ]


def _decode_ready(word: str, register: int, scale: str, out: str) -> list[str]:
    """PTX for register `register` (values r and r + 4 of the word) of a ready-code `word` (`nvfp4_mma_codes`) as a
    BF16x2 register `out`, times the BF16x2 `scale`: the same bits `_decode_pair` gives from the engine's codes, in
    one (register 0), two (1, 2: a rotation first) or three (3) integer instructions."""
    mask = f"{MAGNITUDE_SIGN:#010x}"
    if register < len(ROTATIONS) and ROTATIONS[register] == 0:
        body = [f"and.b32 m, {word}, {mask};"]
    elif register < len(ROTATIONS):
        body = [f"shf.r.wrap.b32 m, {word}, {word}, {ROTATIONS[register]};", f"and.b32 m, m, {mask};"]
    else:
        body = [f"and.b32 m, {word}, {LEFTOVER_MASK:#010x};", f"mul.lo.u32 m, m, {LEFTOVER_TIMES:#x};"]
        body.append(f"and.b32 m, m, {mask};")
    return [*body, f"fma.rn.bf16x2 {out}, m, {scale}, z;"]


def step_asm(groups: int = 1, perm: bool = False, ready_codes: bool = False) -> str:
    """The PTX of one K step: operands $0-$3 the D fragment (out), $4/$5 row g's words 0-1 / 2-3 (b64), $6/$7 row
    g + 8's, $8/$9 row g's BF16x2 scales of words 0-1 / 2-3, $10/$11 row g + 8's, $12-$19 x (b64: values 4q..4q+3
    of the lane's 32), $20-$23 the D fragment (in). With `groups` G > 1 (the rows kernel's quads, G = 4): G D
    fragments out ($0 .. $4G-1), the weights and scales after them, then G groups of 8 x words (group q: x rows
    g + 8q) and the G D fragments in; each weight pair is decoded once for the G MMAs. `perm`: x in the MMA's order
    (`perm_columns`: each 8 values v0..v7 stored as v0 v4 v1 v5 v2 v6 v3 v7), so each MMA takes two of its words as
    they are and the step has no PRMT. `ready_codes`: the words are ready codes (`nvfp4_mma_codes`, `_decode_ready`);
    every register, MMA and result is the same."""
    o = 4 * groups  # the first input operand
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    lines = [
        "{",
        f".reg .b32 wa<4>, wb<4>, ra, rb, x<{16 * groups}>, a<4>, b<2>, m, z;",
        "mov.b32 z, 0x80008000;",
        f"mov.b64 {{wa0, wa1}}, ${o};",
        f"mov.b64 {{wa2, wa3}}, ${o + 1};",
        f"mov.b64 {{wb0, wb1}}, ${o + 2};",
        f"mov.b64 {{wb2, wb3}}, ${o + 3};",
    ]
    lines += [f"mov.b64 {{x{2 * q}, x{2 * q + 1}}}, ${o + 8 + q};" for q in range(8 * groups)]
    lines += [f"mov.f32 ${i}, ${o + 8 + 8 * groups + i};" for i in range(4 * groups)]
    for j in range(4):
        sa, sb = (f"${o + 4}", f"${o + 6}") if j < 2 else (f"${o + 5}", f"${o + 7}")
        if not ready_codes:
            lines += [f"shr.u32 ra, wa{j}, 8;", f"shr.u32 rb, wb{j}, 8;"]
        for h in range(2):
            if ready_codes:  # register 2h + p holds values 2h + p and 2h + p + 4, as below
                lines += _decode_ready(f"wa{j}", 2 * h, sa, "a0")
                lines += _decode_ready(f"wb{j}", 2 * h, sb, "a1")
                lines += _decode_ready(f"wa{j}", 2 * h + 1, sa, "a2")
                lines += _decode_ready(f"wb{j}", 2 * h + 1, sb, "a3")
            else:
                wa, wb = (f"wa{j}", f"wb{j}") if h == 0 else ("ra", "rb")
                lines += _decode_pair(wa, 0, sa, "a0")
                lines += _decode_pair(wb, 0, sb, "a1")
                lines += _decode_pair(wa, 1, sa, "a2")
                lines += _decode_pair(wb, 1, sb, "a3")
            for q in range(groups):
                d = ", ".join(f"${4 * q + i}" for i in range(4))
                if perm:  # word 4j + i holds values (8j + i, 8j + i + 4): pairs 2h and 2h + 1 as they are
                    b = f"x{16 * q + 4 * j + 2 * h}, x{16 * q + 4 * j + 2 * h + 1}"
                    lines.append(f"{mma} {{{d}}}, {{a0, a1, a2, a3}}, {{{b}}}, {{{d}}};")
                    continue
                # x words 4j..4j+3 hold values 8j + 2i, 8j + 2i + 1; pair p is (8j + p, 8j + p + 4).
                lo, hi = f"x{16 * q + 4 * j + h}", f"x{16 * q + 4 * j + 2 + h}"
                lines += [f"prmt.b32 b0, {lo}, {hi}, 0x5410;", f"prmt.b32 b1, {lo}, {hi}, 0x7632;"]
                lines.append(f"{mma} {{{d}}}, {{a0, a1, a2, a3}}, {{b0, b1}}, {{{d}}};")
    lines.append("}")
    return "\n".join(lines)


_STEP_ASM = tl.constexpr(step_asm())
_STEP_PERM_ASM = tl.constexpr(step_asm(perm=True))
_STEP_READY_ASM = tl.constexpr(step_asm(ready_codes=True))
_STEP_PERM_READY_ASM = tl.constexpr(step_asm(perm=True, ready_codes=True))


def perm_columns(x: torch.Tensor) -> torch.Tensor:
    """x's last dimension in the MMA's order (`step_asm`'s perm): each 8 values v0..v7 as v0 v4 v1 v5 v2 v6 v3 v7."""
    return x.unflatten(-1, (-1, 2, 4)).transpose(-1, -2).flatten(-3)


_STEP_CONSTRAINTS = tl.constexpr("=f,=f,=f,=f,l,l,l,l,r,r,r,r,l,l,l,l,l,l,l,l,f,f,f,f")


@triton.jit
def _mma_step(w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3):
    """The K step (`step_asm`) on code words loaded through w64, whose type says ready codes (`_weight_bases`)."""
    if w64.dtype.element_ty == tl.uint64:
        asm: tl.constexpr = _STEP_READY_ASM
    else:
        asm: tl.constexpr = _STEP_ASM
    return tl.inline_asm_elementwise(
        asm,
        _STEP_CONSTRAINTS,
        [wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )


_STEP4_ASM = tl.constexpr(step_asm(ROW_GROUPS))
_STEP4_READY_ASM = tl.constexpr(step_asm(ROW_GROUPS, ready_codes=True))
# 16 D values out; 4 code words, 4 scales, 32 x words, 16 D values in.
_STEP4_CONSTRAINTS = tl.constexpr(",".join(["=f"] * 16 + ["l"] * 4 + ["r"] * 4 + ["l"] * 32 + ["f"] * 16))


@triton.jit
def _mma_step_perm(w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3):
    """`_mma_step` for x in the MMA's order (`step_asm`'s perm): no PRMT."""
    if w64.dtype.element_ty == tl.uint64:
        asm: tl.constexpr = _STEP_PERM_READY_ASM
    else:
        asm: tl.constexpr = _STEP_PERM_ASM
    return tl.inline_asm_elementwise(
        asm,
        _STEP_CONSTRAINTS,
        [wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def _tile_step(w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3,
               PERM: tl.constexpr):  # fmt: skip
    """One 16-row tile's K step from its raw scale bytes (`_scale_pair`): `_mma_step`, or with PERM x in the MMA's
    order `_mma_step_perm`."""
    ta, tb = _scale_pair(sa0, s_ptr), _scale_pair(sa1, s_ptr)
    tc, td = _scale_pair(sb0, s_ptr), _scale_pair(sb1, s_ptr)
    if PERM:
        return _mma_step_perm(w64, wa0, wa1, wb0, wb1, ta, tb, tc, td, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3)
    else:
        return _mma_step(w64, wa0, wa1, wb0, wb1, ta, tb, tc, td, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3)


@triton.jit
def _mma_step4(
    w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1,
    x0, x1, x2, x3, x4, x5, x6, x7, y0, y1, y2, y3, y4, y5, y6, y7,
    u0, u1, u2, u3, u4, u5, u6, u7, v0, v1, v2, v3, v4, v5, v6, v7,
    d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
):  # fmt: skip
    """The K step (`step_asm(4)`) for x rows g, g + 8, g + 16, g + 24 (x, y, u, v; D fragments d, e, f, h)."""
    if w64.dtype.element_ty == tl.uint64:
        asm: tl.constexpr = _STEP4_READY_ASM
    else:
        asm: tl.constexpr = _STEP4_ASM
    return tl.inline_asm_elementwise(
        asm,
        _STEP4_CONSTRAINTS,
        [
            wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1,
            x0, x1, x2, x3, x4, x5, x6, x7, y0, y1, y2, y3, y4, y5, y6, y7,
            u0, u1, u2, u3, u4, u5, u6, u7, v0, v1, v2, v3, v4, v5, v6, v7,
            d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
        ],
        dtype=(
            tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32,
            tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32,
        ),
        is_pure=True,
        pack=1,
    )  # fmt: skip


@triton.jit
def _scale2(b):
    """The BF16x2 (both halves equal) of block scale bytes b's E4M3 value times 2**64 (exact in BF16)."""
    v = (e4m3_value(b.to(tl.int32)) * 1.8446744073709552e19).to(tl.bfloat16)  # 2**64
    bits = v.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return bits | (bits << 16)


_READY_ADD = tl.constexpr(READY_PAIR_ADD)


@triton.jit
def _scale_pair(b, s_ptr):
    """The BF16 pair (`_scale2`'s) of a scale byte b loaded from s_ptr: UE4M3 bytes (uint8) decoded, ready bytes (int8,
    `nvfp4_mma_scales`: E4M3's subnormals as normals) in one multiply-add. The pointer's type picks, so no kernel
    needs a parameter for it."""
    if s_ptr.dtype.element_ty == tl.int8:
        return (b.to(tl.int32) & 0xFF) * 0x100010 + _READY_ADD
    else:
        return _scale2(b)


@triton.jit
def _weight_bases(w_ptr, s_ptr, ra, rb, c, stride_wn, stride_sn):
    """(codes as int64 words, scale bytes, then each lane's int64 word index of rows ra / rb and scale byte index of
    ra / rb at K = 0): lane c's 16 bytes of a row's K step start at word 2c, its two scale groups at byte 2c."""
    return (
        code_words(w_ptr),  # ready codes (`nvfp4_mma_codes`): the words' type tells the K step
        s_ptr,
        ra * (stride_wn // 8) + c * 2,
        rb * (stride_wn // 8) + c * 2,
        ra * stride_sn + c * 2,
        rb * stride_sn + c * 2,
    )


@triton.jit
def _ld16(p):
    """The two int64 words at p (16-byte aligned) in one 128-bit load through the read-only path: Triton's own loads
    of one element a thread stay 8 bytes wide, and wider ones reach this layout only through shared memory."""
    return tl.inline_asm_elementwise(
        "ld.global.nc.v2.b64 {$0, $1}, [$2];", "=l,=l,l", [p], dtype=(tl.int64, tl.int64), is_pure=True, pack=1
    )


@triton.jit
def _load_x(x64, xa_base, k0, VEC: tl.constexpr):
    """The lane's 8 int64 words of its x row for the K step at k0 (VEC: in four 16-byte loads)."""
    xq = xa_base + k0 // 4
    if VEC:
        x0, x1 = _ld16(x64 + xq)
        x2, x3 = _ld16(x64 + xq + 2)
        x4, x5 = _ld16(x64 + xq + 4)
        x6, x7 = _ld16(x64 + xq + 6)
    else:
        x0 = tl.load(x64 + xq)
        x1 = tl.load(x64 + xq + 1)
        x2 = tl.load(x64 + xq + 2)
        x3 = tl.load(x64 + xq + 3)
        x4 = tl.load(x64 + xq + 4)
        x5 = tl.load(x64 + xq + 5)
        x6 = tl.load(x64 + xq + 6)
        x7 = tl.load(x64 + xq + 7)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k0, VEC: tl.constexpr):
    """Rows g / g + 8's code words and scale bytes of the K step at k0 (VEC: 16-byte code loads, 2-byte scale
    loads)."""
    wq = k0 // 16
    if VEC:
        wa0, wa1 = _ld16(w64 + wa_base + wq)
        wb0, wb1 = _ld16(w64 + wb_base + wq)
        s16 = s_ptr.to(tl.pointer_type(tl.int16))
        sa = tl.load(s16 + (sa_base + wq) // 2).to(tl.int32) & 0xFFFF
        sb = tl.load(s16 + (sb_base + wq) // 2).to(tl.int32) & 0xFFFF
        sa0, sa1, sb0, sb1 = sa & 0xFF, sa >> 8, sb & 0xFF, sb >> 8
    else:
        wa0 = tl.load(w64 + wa_base + wq)
        wa1 = tl.load(w64 + wa_base + wq + 1)
        wb0 = tl.load(w64 + wb_base + wq)
        wb1 = tl.load(w64 + wb_base + wq + 1)
        sa0 = tl.load(s_ptr + sa_base + wq)
        sa1 = tl.load(s_ptr + sa_base + wq + 1)
        sb0 = tl.load(s_ptr + sb_base + wq)
        sb1 = tl.load(s_ptr + sb_base + wq + 1)
    return wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1


@triton.jit
def _load_step(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, x64, xa_base, k0, VEC: tl.constexpr):
    """The raw operands of the K step at k0: rows g / g + 8's code words and scale bytes, and the lane's x words.
    VEC: 16-byte loads for the codes and x (`_ld16`) and 2-byte loads for the scales, half the L1 requests."""
    wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k0, VEC)
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa_base, k0, VEC)
    return wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _l2_ahead(w64, wa_base, wb_base, k0, k_hi, L2_AHEAD: tl.constexpr):
    """Ask L2 for rows g / g + 8's codes of the K step L2_AHEAD on from k0 (at most the last, k_hi - 128). A row's
    two steps share a 128-byte line, so only every other step asks, for the line the step L2_AHEAD (even) on
    starts; a warp's request covers 8 rows' lines (its 4 lanes a row fall in one)."""
    if (k0 // 128) % 2 == 0:
        ahead = tl.minimum(k0 + L2_AHEAD * 128, k_hi - 128) // 16
        prefetch_lines(w64 + wa_base + ahead)
        prefetch_lines(w64 + wb_base + ahead)


@triton.jit
def _k_loop(
    w64,
    wa_base,
    wb_base,
    s_ptr,
    sa_base,
    sb_base,
    x64,
    xa_base,
    k_lo,
    k_hi,
    NT: tl.constexpr,
    PREFETCH: tl.constexpr,
    VEC: tl.constexpr,
    L2_AHEAD: tl.constexpr,
):
    """The D fragments (FP32, weights times 2**-62) of rows g / g + 8 against x rows g over K steps k_lo..k_hi
    (k_lo < k_hi). PREFETCH: each step's loads are issued before the previous step's MMAs (loop-carried registers),
    so a program keeps two steps of loads in flight instead of waiting out one memory round trip a step. L2_AHEAD
    (even, > 0): the codes of the step that many ahead are asked into L2 as well (`_l2_ahead`), more bytes in
    flight without registers."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1 = tl.zeros((NT,), dtype=tl.float32)
    d2 = tl.zeros((NT,), dtype=tl.float32)
    d3 = tl.zeros((NT,), dtype=tl.float32)
    if PREFETCH:
        k_last = k_hi - 128
        wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7 = _load_step(
            w64, wa_base, wb_base, s_ptr, sa_base, sb_base, x64, xa_base, k_lo, VEC
        )
        for k0 in range(k_lo, k_hi, 128):
            if L2_AHEAD > 0:
                _l2_ahead(w64, wa_base, wb_base, k0, k_hi, L2_AHEAD)
            # The last step loads itself again (cached) rather than branch: no load past k_hi.
            na0, na1, nb0, nb1, ta0, ta1, tb0, tb1, y0, y1, y2, y3, y4, y5, y6, y7 = _load_step(
                w64, wa_base, wb_base, s_ptr, sa_base, sb_base, x64, xa_base, tl.minimum(k0 + 128, k_last), VEC
            )
            d0, d1, d2, d3 = _mma_step(
                w64, wa0, wa1, wb0, wb1,
                _scale_pair(sa0, s_ptr), _scale_pair(sa1, s_ptr), _scale_pair(sb0, s_ptr), _scale_pair(sb1, s_ptr),
                x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3,
            )  # fmt: skip
            wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = na0, na1, nb0, nb1, ta0, ta1, tb0, tb1
            x0, x1, x2, x3, x4, x5, x6, x7 = y0, y1, y2, y3, y4, y5, y6, y7
    else:
        for k0 in range(k_lo, k_hi, 128):
            if L2_AHEAD > 0:
                _l2_ahead(w64, wa_base, wb_base, k0, k_hi, L2_AHEAD)
            wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, x0, x1, x2, x3, x4, x5, x6, x7 = _load_step(
                w64, wa_base, wb_base, s_ptr, sa_base, sb_base, x64, xa_base, k0, VEC
            )
            d0, d1, d2, d3 = _mma_step(
                w64, wa0, wa1, wb0, wb1,
                _scale_pair(sa0, s_ptr), _scale_pair(sa1, s_ptr), _scale_pair(sb0, s_ptr), _scale_pair(sb1, s_ptr),
                x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3,
            )  # fmt: skip
    return d0, d1, d2, d3


@triton.jit
def _k_loop_wide_pairs(w64, wa_base, wb_base, wc_base, wd_base, s_ptr, sa_base, sb_base, sc_base, sd_base, x64, xa_base,
                       k_lo, k_hi, NT: tl.constexpr, VEC: tl.constexpr, L2_AHEAD: tl.constexpr,
                       PERM: tl.constexpr):  # fmt: skip
    """`_k_loop_wide` with PREFETCH and L2_AHEAD, two K steps an iteration, for an even number of steps (the MoE
    launchers see to it, `pairs_fit`, else they load no step ahead; a tail step after the loop made the compiler spill
    248 bytes): the L2 request the loop makes every other step is then unconditional instead of predicated, and the
    loop's counters and clamps are paid once for two steps. The same loads, MMAs and sums in the same order. Taken
    with ready codes only, so the installed kernels keep their loop until a GPU judges both (sm_90 SASS with Triton
    3.9, thirty-eighth session: the ready-code MoE gate_up 354 instructions a step -> 301; with the engine's codes it
    would be 438 -> 381)."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1, d2, d3 = d0, d0, d0
    e0, e1, e2, e3 = d0, d0, d0, d0
    k_last = k_hi - 128
    wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k_lo, VEC)
    wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, k_lo, VEC)
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa_base, k_lo, VEC)
    for k0 in range(k_lo, k_hi, 256):
        # `_l2_ahead`'s request: the line the step L2_AHEAD on starts (a row's two steps share a line)
        ahead = tl.minimum(k0 + L2_AHEAD * 128, k_last) // 16
        prefetch_lines(w64 + wa_base + ahead)
        prefetch_lines(w64 + wb_base + ahead)
        prefetch_lines(w64 + wc_base + ahead)
        prefetch_lines(w64 + wd_base + ahead)
        kn = k0 + 128
        na0, na1, nb0, nb1, ta0, ta1, tb0, tb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, kn, VEC)
        nc0, nc1, nd0, nd1, tc0, tc1, td0, td1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, kn, VEC)
        y0, y1, y2, y3, y4, y5, y6, y7 = _load_x(x64, xa_base, kn, VEC)
        d0, d1, d2, d3 = _tile_step(
            w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3, PERM
        )  # fmt: skip
        e0, e1, e2, e3 = _tile_step(
            w64, wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, e0, e1, e2, e3, PERM
        )  # fmt: skip
        # the step after the pair (the last one again at the end: cached, no load past k_hi)
        km = tl.minimum(k0 + 256, k_last)
        wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, km, VEC)
        wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, km, VEC)
        x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa_base, km, VEC)
        d0, d1, d2, d3 = _tile_step(
            w64, na0, na1, nb0, nb1, ta0, ta1, tb0, tb1, s_ptr, y0, y1, y2, y3, y4, y5, y6, y7, d0, d1, d2, d3, PERM
        )  # fmt: skip
        e0, e1, e2, e3 = _tile_step(
            w64, nc0, nc1, nd0, nd1, tc0, tc1, td0, td1, s_ptr, y0, y1, y2, y3, y4, y5, y6, y7, e0, e1, e2, e3, PERM
        )  # fmt: skip
    return d0, d1, d2, d3, e0, e1, e2, e3


@triton.jit
def _k_loop_wide(w64, wa_base, wb_base, wc_base, wd_base, s_ptr, sa_base, sb_base, sc_base, sd_base, x64, xa_base, k_lo,
                 k_hi, NT: tl.constexpr, PREFETCH: tl.constexpr, VEC: tl.constexpr,
                 L2_AHEAD: tl.constexpr, PERM: tl.constexpr = False):  # fmt: skip
    """`_k_loop` for two 16-row weight tiles (rows g / g + 8 at wa / wb, tile two's at wc / wd) against the same x rows:
    each K step's x words are loaded once for both tiles' MMAs (the MoE's `mma_wide`). Returns tile one's D fragment,
    then tile two's. PERM: x in the MMA's order (`perm_columns`)."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1, d2, d3 = d0, d0, d0
    e0, e1, e2, e3 = d0, d0, d0, d0
    if PREFETCH and L2_AHEAD > 0 and w64.dtype.element_ty == tl.uint64:  # ready codes: two steps an iteration
        return _k_loop_wide_pairs(w64, wa_base, wb_base, wc_base, wd_base, s_ptr, sa_base, sb_base, sc_base, sd_base,
                                  x64, xa_base, k_lo, k_hi, NT, VEC, L2_AHEAD, PERM)  # fmt: skip
    if PREFETCH:
        k_last = k_hi - 128
        wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k_lo, VEC)
        wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, k_lo, VEC)
        x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa_base, k_lo, VEC)
        for k0 in range(k_lo, k_hi, 128):
            if L2_AHEAD > 0:
                _l2_ahead(w64, wa_base, wb_base, k0, k_hi, L2_AHEAD)
                _l2_ahead(w64, wc_base, wd_base, k0, k_hi, L2_AHEAD)
            kn = tl.minimum(k0 + 128, k_last)  # the last step loads itself again (cached): no load past k_hi
            na0, na1, nb0, nb1, ta0, ta1, tb0, tb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, kn, VEC)
            nc0, nc1, nd0, nd1, tc0, tc1, td0, td1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, kn, VEC)
            y0, y1, y2, y3, y4, y5, y6, y7 = _load_x(x64, xa_base, kn, VEC)
            d0, d1, d2, d3 = _tile_step(
                w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3, PERM
            )  # fmt: skip
            e0, e1, e2, e3 = _tile_step(
                w64, wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, e0, e1, e2, e3, PERM
            )  # fmt: skip
            wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = na0, na1, nb0, nb1, ta0, ta1, tb0, tb1
            wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1 = nc0, nc1, nd0, nd1, tc0, tc1, td0, td1
            x0, x1, x2, x3, x4, x5, x6, x7 = y0, y1, y2, y3, y4, y5, y6, y7
    else:
        for k0 in range(k_lo, k_hi, 128):
            if L2_AHEAD > 0:
                _l2_ahead(w64, wa_base, wb_base, k0, k_hi, L2_AHEAD)
                _l2_ahead(w64, wc_base, wd_base, k0, k_hi, L2_AHEAD)
            wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k0, VEC)
            wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, k0, VEC)
            x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa_base, k0, VEC)
            d0, d1, d2, d3 = _tile_step(
                w64, wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, d0, d1, d2, d3, PERM
            )  # fmt: skip
            e0, e1, e2, e3 = _tile_step(
                w64, wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1, s_ptr, x0, x1, x2, x3, x4, x5, x6, x7, e0, e1, e2, e3, PERM
            )  # fmt: skip
    return d0, d1, d2, d3, e0, e1, e2, e3


@triton.jit
def _quad_step(w64, wa0, wa1, wb0, wb1, s0, s1, s2, s3, x64, xa, xb, xc, xd, k0, VEC: tl.constexpr,
               d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3):  # fmt: skip
    """One K step of four groups of 8 x rows (the lane's rows at int64 words xa, xb, xc, xd; BF16x2 scales s0-s3):
    their x words loaded, each weight pair decoded once for the four MMAs (`_mma_step4`)."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa, k0, VEC)
    y0, y1, y2, y3, y4, y5, y6, y7 = _load_x(x64, xb, k0, VEC)
    u0, u1, u2, u3, u4, u5, u6, u7 = _load_x(x64, xc, k0, VEC)
    v0, v1, v2, v3, v4, v5, v6, v7 = _load_x(x64, xd, k0, VEC)
    return _mma_step4(
        w64, wa0, wa1, wb0, wb1, s0, s1, s2, s3,
        x0, x1, x2, x3, x4, x5, x6, x7, y0, y1, y2, y3, y4, y5, y6, y7,
        u0, u1, u2, u3, u4, u5, u6, u7, v0, v1, v2, v3, v4, v5, v6, v7,
        d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
    )  # fmt: skip


@triton.jit
def _k_loop4(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, x64, xa, xb, xc, xd, k_lo, k_hi, NT: tl.constexpr,
             VEC: tl.constexpr):  # fmt: skip
    """`_k_loop` for four groups of 8 x rows (the lane's rows at int64 words xa, xb, xc, xd): the D fragments of
    each, every weight pair decoded once for the four MMAs."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1, d2, d3 = d0, d0, d0
    e0, e1, e2, e3 = d0, d0, d0, d0
    f0, f1, f2, f3 = d0, d0, d0, d0
    h0, h1, h2, h3 = d0, d0, d0, d0
    for k0 in range(k_lo, k_hi, 128):
        wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k0, VEC)
        d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3 = _quad_step(
            w64, wa0, wa1, wb0, wb1,
            _scale_pair(sa0, s_ptr), _scale_pair(sa1, s_ptr), _scale_pair(sb0, s_ptr), _scale_pair(sb1, s_ptr),
            x64, xa, xb, xc, xd, k0, VEC,
            d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
        )  # fmt: skip
    return d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3


@triton.jit
def _k_loop8(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, x64, xa, xb, xc, xd, xe, xf, xg, xh, k_lo, k_hi,
             NT: tl.constexpr, VEC: tl.constexpr):  # fmt: skip
    """`_k_loop4` for eight groups of 8 x rows (two quads, xa-xd and xe-xh): each K step's weights loaded once for
    both quads and decoded once a quad (the decode is ALU work; the weight bytes are what a step waits on)."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1, d2, d3 = d0, d0, d0
    e0, e1, e2, e3 = d0, d0, d0, d0
    f0, f1, f2, f3 = d0, d0, d0, d0
    h0, h1, h2, h3 = d0, d0, d0, d0
    i0, i1, i2, i3 = d0, d0, d0, d0
    j0, j1, j2, j3 = d0, d0, d0, d0
    l0, l1, l2, l3 = d0, d0, d0, d0
    o0, o1, o2, o3 = d0, d0, d0, d0
    for k0 in range(k_lo, k_hi, 128):
        wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k0, VEC)
        s0, s1 = _scale_pair(sa0, s_ptr), _scale_pair(sa1, s_ptr)
        s2, s3 = _scale_pair(sb0, s_ptr), _scale_pair(sb1, s_ptr)
        d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3 = _quad_step(
            w64, wa0, wa1, wb0, wb1, s0, s1, s2, s3, x64, xa, xb, xc, xd, k0, VEC,
            d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
        )  # fmt: skip
        i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3 = _quad_step(
            w64, wa0, wa1, wb0, wb1, s0, s1, s2, s3, x64, xe, xf, xg, xh, k0, VEC,
            i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3,
        )  # fmt: skip
    return (d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
            i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3)  # fmt: skip


@triton.jit
def _lanes(pid_n, N, NW: tl.constexpr):
    """Each thread's place: (thread index, lane's c, weight rows g and g + 8 of its warp's 16, whether they are
    rows of W)."""
    NT: tl.constexpr = 32 * NW
    t = tl.arange(0, NT)
    lane = t % 32
    c = lane % 4
    row0 = pid_n * (16 * NW) + (t // 32) * 16 + lane // 4  # ROWS_PER_WARP
    row1 = row0 + 8
    return t, c, row0, row1, row0 < N, row1 < N


@triton.jit
def _tile_weights(w_ptr, s_ptr, row0, row1, c, N, stride_wn, stride_sn):
    """`_weight_bases` for the thread's weight rows, rows past N reading row N - 1 (their results are never stored;
    a masked load would cost a register clear each)."""
    r0 = tl.minimum(row0, N - 1).to(tl.int64)
    r1 = tl.minimum(row1, N - 1).to(tl.int64)
    return _weight_bases(w_ptr, s_ptr, r0, r1, c, stride_wn, stride_sn)


@triton.jit
def _arrive(cnt_ptr, pid_n, SPLIT_K: tl.constexpr):
    """After a split stored its part: whether this program arrived last on its tile's counter (and sums)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
    return arrived == SPLIT_K - 1


@triton.jit
def _row_scales(gs_ptr, row0, row1, ok0, ok1, seg1, seg2, seg3):
    """Rows row0 / row1's global scales times 2**62 (the MMA inputs were the weights times 2**-62)."""
    post = 4.611686018427388e18
    gs0 = segment_scale(gs_ptr, row0, ok0, seg1, seg2, seg3) * post
    gs1 = segment_scale(gs_ptr, row1, ok1, seg1, seg2, seg3) * post
    return gs0, gs1


@triton.jit
def _ws_put(base, d0, d1, d2, d3, NT: tl.constexpr):
    """One D fragment into a split's workspace slot (four [NT] rows)."""
    tl.store(base, d0)
    tl.store(base + NT, d1)
    tl.store(base + 2 * NT, d2)
    tl.store(base + 3 * NT, d3)


@triton.jit
def _ws_sum(base, stride, SPLIT_K: tl.constexpr, NT: tl.constexpr):
    """The D fragment at `base` summed over the splits (slots `stride` apart), in split order."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1 = tl.zeros((NT,), dtype=tl.float32)
    d2 = tl.zeros((NT,), dtype=tl.float32)
    d3 = tl.zeros((NT,), dtype=tl.float32)
    for s in range(SPLIT_K):
        d0 += tl.load(base + s * stride, cache_modifier=".cg")
        d1 += tl.load(base + s * stride + NT, cache_modifier=".cg")
        d2 += tl.load(base + s * stride + 2 * NT, cache_modifier=".cg")
        d3 += tl.load(base + s * stride + 3 * NT, cache_modifier=".cg")
    return d0, d1, d2, d3


@triton.jit
def _store_d(out_ptr, d0, d1, d2, d3, row0, row1, ok0, ok1, gs0, gs1, tok0, M, stride_om):
    """A D fragment (x rows tok0, tok0 + 1; weight rows row0, row1) times the rows' global scales, rounded once."""
    tok1 = tok0 + 1
    odt = out_ptr.dtype.element_ty
    tl.store(out_ptr + tok0 * stride_om + row0, (d0 * gs0).to(odt), mask=ok0 & (tok0 < M))
    tl.store(out_ptr + tok1 * stride_om + row0, (d1 * gs0).to(odt), mask=ok0 & (tok1 < M))
    tl.store(out_ptr + tok0 * stride_om + row1, (d2 * gs1).to(odt), mask=ok1 & (tok0 < M))
    tl.store(out_ptr + tok1 * stride_om + row1, (d3 * gs1).to(odt), mask=ok1 & (tok1 < M))


@triton.jit
def _quad_put(slot, d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3, NT: tl.constexpr):
    """A quad's four D fragments into a split's workspace (16 [NT] rows from `slot`)."""
    _ws_put(slot, d0, d1, d2, d3, NT)
    _ws_put(slot + 4 * NT, e0, e1, e2, e3, NT)
    _ws_put(slot + 8 * NT, f0, f1, f2, f3, NT)
    _ws_put(slot + 12 * NT, h0, h1, h2, h3, NT)


@triton.jit
def _quad_sum(base, stride, SPLIT_K: tl.constexpr, NT: tl.constexpr):
    """A quad's four D fragments summed over the splits (`_ws_sum`)."""
    d0, d1, d2, d3 = _ws_sum(base, stride, SPLIT_K, NT)
    e0, e1, e2, e3 = _ws_sum(base + 4 * NT, stride, SPLIT_K, NT)
    f0, f1, f2, f3 = _ws_sum(base + 8 * NT, stride, SPLIT_K, NT)
    h0, h1, h2, h3 = _ws_sum(base + 12 * NT, stride, SPLIT_K, NT)
    return d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3


@triton.jit
def _quad_store(out_ptr, d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3, row0, row1, ok0, ok1, gs0,
                gs1, tok0, M, stride_om):  # fmt: skip
    """A quad's four D fragments (x rows tok0 + 8q, + 1) into out (`_store_d`)."""
    _store_d(out_ptr, d0, d1, d2, d3, row0, row1, ok0, ok1, gs0, gs1, tok0, M, stride_om)
    _store_d(out_ptr, e0, e1, e2, e3, row0, row1, ok0, ok1, gs0, gs1, tok0 + 8, M, stride_om)
    _store_d(out_ptr, f0, f1, f2, f3, row0, row1, ok0, ok1, gs0, gs1, tok0 + 16, M, stride_om)
    _store_d(out_ptr, h0, h1, h2, h3, row0, row1, ok0, ok1, gs0, gs1, tok0 + 24, M, stride_om)


@triton.jit
def _quad_x(g, c, M, stride_xm, first):
    """The lane's int64 word offsets of x rows first + g + 8q (q = 0..3) for a quad of groups, rows past M reading
    row M - 1 (their columns of D are never stored)."""
    xrow = stride_xm // 4  # int64 words a row of x
    xa = tl.minimum(first + g, M - 1).to(tl.int64) * xrow + c * 8
    xb = tl.minimum(first + g + 8, M - 1).to(tl.int64) * xrow + c * 8
    xc = tl.minimum(first + g + 16, M - 1).to(tl.int64) * xrow + c * 8
    xd = tl.minimum(first + g + 24, M - 1).to(tl.int64) * xrow + c * 8
    return xa, xb, xc, xd


@triton.jit
def _linear_body(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    k_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    seg1,
    seg2,
    seg3,
    SPLIT_K: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    VEC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    NT: tl.constexpr = 32 * NW
    t, c, row0, row1, ok0, ok1 = _lanes(pid_n, N, NW)
    # Loads need no masks: rows past N read row N - 1 and tokens past M token M - 1, whose results (other rows of
    # D, other columns) are never stored; a masked load would cost a register clear each.
    w64, sp, wa_base, wb_base, sa_base, sb_base = _tile_weights(w_ptr, s_ptr, row0, row1, c, N, stride_wn, stride_sn)
    tok = tl.minimum((t % 32) // 4, M - 1).to(tl.int64)
    x64 = x_ptr.to(tl.pointer_type(tl.int64))
    xa_base = tok * (stride_xm // 4) + c * 8  # the lane's 32 values of x row `tok`, as int64 words
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    pdl_entry(PDL)
    d0, d1, d2, d3 = _k_loop(
        w64, wa_base, wb_base, sp, sa_base, sb_base, x64, xa_base, k_lo, k_hi, NT, PREFETCH, VEC, 0
    )  # fmt: skip
    store = True
    if SPLIT_K > 1:
        base = ws_ptr + pid_n.to(tl.int64) * (SPLIT_K * 4 * NT) + t
        _ws_put(base + pid_k * (4 * NT), d0, d1, d2, d3, NT)
        store = _arrive(cnt_ptr, pid_n, SPLIT_K)
        if store:
            d0, d1, d2, d3 = _ws_sum(base, 4 * NT, SPLIT_K, NT)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
    if store:
        gs0, gs1 = _row_scales(gs_ptr, row0, row1, ok0, ok1, seg1, seg2, seg3)
        _store_d(out_ptr, d0, d1, d2, d3, row0, row1, ok0, ok1, gs0, gs1, 2 * c, M, stride_om)


@triton.jit(do_not_specialize=["M"])
def _nvfp4_mma_rows_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    k_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    seg1,
    seg2,
    seg3,
    SPLIT_K: tl.constexpr,
    NW: tl.constexpr,
    PDL: tl.constexpr,
    VEC: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """The linear for 9-32 rows of x (GROUPS 4) or 33-64 (GROUPS 8): x rows g + 8q of the groups q against the
    warp's weight rows, each K step's weights decoded once a quad of groups (rows past M read row M - 1 and are not
    stored)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    NT: tl.constexpr = 32 * NW
    t, c, row0, row1, ok0, ok1 = _lanes(pid_n, N, NW)
    w64, sp, wa_base, wb_base, sa_base, sb_base = _tile_weights(w_ptr, s_ptr, row0, row1, c, N, stride_wn, stride_sn)
    g = (t % 32) // 4
    xa, xb, xc, xd = _quad_x(g, c, M, stride_xm, 0)
    x64 = x_ptr.to(tl.pointer_type(tl.int64))
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    pdl_entry(PDL)
    if GROUPS == 8:
        xe, xf, xg, xh = _quad_x(g, c, M, stride_xm, 32)
        (d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
         i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3) = _k_loop8(
            w64, wa_base, wb_base, sp, sa_base, sb_base, x64, xa, xb, xc, xd, xe, xf, xg, xh, k_lo, k_hi, NT, VEC
        )  # fmt: skip
    else:
        d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3 = _k_loop4(
            w64, wa_base, wb_base, sp, sa_base, sb_base, x64, xa, xb, xc, xd, k_lo, k_hi, NT, VEC
        )
    store = True
    if SPLIT_K > 1:
        per: tl.constexpr = 4 * GROUPS * NT  # a split's workspace slot
        base = ws_ptr + pid_n.to(tl.int64) * (SPLIT_K * per) + t
        slot = base + pid_k * per
        _quad_put(slot, d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3, NT)
        if GROUPS == 8:
            _quad_put(slot + 16 * NT, i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3, NT)
        store = _arrive(cnt_ptr, pid_n, SPLIT_K)
        if store:
            d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3 = _quad_sum(base, per, SPLIT_K, NT)
            if GROUPS == 8:
                i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3 = _quad_sum(
                    base + 16 * NT, per, SPLIT_K, NT
                )
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
    if store:
        gs0, gs1 = _row_scales(gs_ptr, row0, row1, ok0, ok1, seg1, seg2, seg3)
        _quad_store(out_ptr, d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3, row0, row1, ok0, ok1,
                    gs0, gs1, 2 * c, M, stride_om)  # fmt: skip
        if GROUPS == 8:
            _quad_store(out_ptr, i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3, row0, row1, ok0,
                        ok1, gs0, gs1, 2 * c + 32, M, stride_om)  # fmt: skip


@triton.jit
def _k_loop4_wide(w64, wa_base, wb_base, wc_base, wd_base, s_ptr, sa_base, sb_base, sc_base, sd_base, x64, xa, xb, xc,
                  xd, k_lo, k_hi, NT: tl.constexpr, VEC: tl.constexpr):  # fmt: skip
    """`_k_loop4` for two 16-row weight tiles (rows g / g + 8 at wa / wb, rows g + 16 / g + 24 at wc / wd): each K
    step's x words are loaded once for both tiles' MMAs. Returns tile one's D fragments, then tile two's."""
    d0 = tl.zeros((NT,), dtype=tl.float32)
    d1, d2, d3 = d0, d0, d0
    e0, e1, e2, e3 = d0, d0, d0, d0
    f0, f1, f2, f3 = d0, d0, d0, d0
    h0, h1, h2, h3 = d0, d0, d0, d0
    i0, i1, i2, i3 = d0, d0, d0, d0
    j0, j1, j2, j3 = d0, d0, d0, d0
    l0, l1, l2, l3 = d0, d0, d0, d0
    o0, o1, o2, o3 = d0, d0, d0, d0
    for k0 in range(k_lo, k_hi, 128):
        wa0, wa1, wb0, wb1, sa0, sa1, sb0, sb1 = _load_w(w64, wa_base, wb_base, s_ptr, sa_base, sb_base, k0, VEC)
        wc0, wc1, wd0, wd1, sc0, sc1, sd0, sd1 = _load_w(w64, wc_base, wd_base, s_ptr, sc_base, sd_base, k0, VEC)
        x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x64, xa, k0, VEC)
        y0, y1, y2, y3, y4, y5, y6, y7 = _load_x(x64, xb, k0, VEC)
        u0, u1, u2, u3, u4, u5, u6, u7 = _load_x(x64, xc, k0, VEC)
        v0, v1, v2, v3, v4, v5, v6, v7 = _load_x(x64, xd, k0, VEC)
        d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3 = _mma_step4(
            w64, wa0, wa1, wb0, wb1,
            _scale_pair(sa0, s_ptr), _scale_pair(sa1, s_ptr), _scale_pair(sb0, s_ptr), _scale_pair(sb1, s_ptr),
            x0, x1, x2, x3, x4, x5, x6, x7, y0, y1, y2, y3, y4, y5, y6, y7,
            u0, u1, u2, u3, u4, u5, u6, u7, v0, v1, v2, v3, v4, v5, v6, v7,
            d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
        )  # fmt: skip
        i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3 = _mma_step4(
            w64, wc0, wc1, wd0, wd1,
            _scale_pair(sc0, s_ptr), _scale_pair(sc1, s_ptr), _scale_pair(sd0, s_ptr), _scale_pair(sd1, s_ptr),
            x0, x1, x2, x3, x4, x5, x6, x7, y0, y1, y2, y3, y4, y5, y6, y7,
            u0, u1, u2, u3, u4, u5, u6, u7, v0, v1, v2, v3, v4, v5, v6, v7,
            i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3,
        )  # fmt: skip
    return (d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
            i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3)  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _nvfp4_mma_wide_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    k_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    seg1,
    seg2,
    seg3,
    SPLIT_K: tl.constexpr,
    NW: tl.constexpr,
    PDL: tl.constexpr,
    VEC: tl.constexpr,
):
    """The rows kernel (9-32 rows of x, one quad) with 32 weight rows a warp, two 16-row tiles whose MMAs share each K
    step's x words: at 32 rows a warp's x loads are ~7x its weight bytes, and the MMA kernels were found bound by
    the L1's throughput, so the wide tiles halve the x loads a weight row."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    NT: tl.constexpr = 32 * NW
    t = tl.arange(0, NT)
    lane = t % 32
    c = lane % 4
    row0 = pid_n * (32 * NW) + (t // 32) * 32 + lane // 4  # 2 * ROWS_PER_WARP a warp
    row1, row2, row3 = row0 + 8, row0 + 16, row0 + 24
    ok0, ok1, ok2, ok3 = row0 < N, row1 < N, row2 < N, row3 < N
    w64, sp, wa_base, wb_base, sa_base, sb_base = _tile_weights(w_ptr, s_ptr, row0, row1, c, N, stride_wn, stride_sn)
    _, _, wc_base, wd_base, sc_base, sd_base = _tile_weights(w_ptr, s_ptr, row2, row3, c, N, stride_wn, stride_sn)
    g = lane // 4
    xa, xb, xc, xd = _quad_x(g, c, M, stride_xm, 0)
    x64 = x_ptr.to(tl.pointer_type(tl.int64))
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    pdl_entry(PDL)
    (d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3,
     i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3) = _k_loop4_wide(
        w64, wa_base, wb_base, wc_base, wd_base, sp, sa_base, sb_base, sc_base, sd_base, x64, xa, xb, xc, xd, k_lo,
        k_hi, NT, VEC,
    )  # fmt: skip
    store = True
    if SPLIT_K > 1:
        per: tl.constexpr = 32 * NT  # a split's workspace slot: two tiles' four D fragments
        base = ws_ptr + pid_n.to(tl.int64) * (SPLIT_K * per) + t
        slot = base + pid_k * per
        _quad_put(slot, d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3, NT)
        _quad_put(slot + 16 * NT, i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3, NT)
        store = _arrive(cnt_ptr, pid_n, SPLIT_K)
        if store:
            d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3 = _quad_sum(base, per, SPLIT_K, NT)
            i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3 = _quad_sum(base + 16 * NT, per, SPLIT_K, NT)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
    if store:
        gs0, gs1 = _row_scales(gs_ptr, row0, row1, ok0, ok1, seg1, seg2, seg3)
        _quad_store(out_ptr, d0, d1, d2, d3, e0, e1, e2, e3, f0, f1, f2, f3, h0, h1, h2, h3, row0, row1, ok0, ok1,
                    gs0, gs1, 2 * c, M, stride_om)  # fmt: skip
        gs2, gs3 = _row_scales(gs_ptr, row2, row3, ok2, ok3, seg1, seg2, seg3)
        _quad_store(out_ptr, i0, i1, i2, i3, j0, j1, j2, j3, l0, l1, l2, l3, o0, o1, o2, o3, row2, row3, ok2, ok3,
                    gs2, gs3, 2 * c, M, stride_om)  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _nvfp4_mma_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    k_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    seg1,
    seg2,
    seg3,
    SPLIT_K: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    """The linear (`_linear_body`) with 8-byte loads."""
    _linear_body(
        x_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, k_split, stride_xm, stride_wn, stride_sn,
        stride_om, seg1, seg2, seg3, SPLIT_K, NW, PREFETCH, PDL, False
    )  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _nvfp4_mma_vec_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    k_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    seg1,
    seg2,
    seg3,
    SPLIT_K: tl.constexpr,
    NW: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    """The linear (`_linear_body`) with 16-byte loads (VEC)."""
    _linear_body(
        x_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, k_split, stride_xm, stride_wn, stride_sn,
        stride_om, seg1, seg2, seg3, SPLIT_K, NW, PREFETCH, PDL, True
    )  # fmt: skip


def _fits(x: torch.Tensor, w: NVFP4Weight) -> bool:
    """What every kernel here needs: a CUDA GPU of sm_80 or later (not the interpreter, which runs no PTX), BF16
    activations [rows, K] with rows on 8 bytes, NVFP4 weights [..., N, K] with K a multiple of BLOCK_K and code rows
    on 8 bytes, at most MAX_SEGMENTS segments."""
    if _INTERPRET or not (x.is_cuda and isinstance(w, NVFP4Weight) and x.dtype == torch.bfloat16 and x.dim() == 2):
        return False
    return (
        torch.cuda.get_device_capability(x.device) >= (8, 0)
        and x.stride(1) == 1
        and x.stride(0) % 4 == 0
        and x.data_ptr() % 8 == 0
        and _weight_fits(w, x.shape[1])
    )


def _weight_fits(w: NVFP4Weight, k: int) -> bool:
    """The weight's part of `_fits` for activations of K = k."""
    q = w.qweight
    return (
        k == q.shape[-1] * 2
        and k % BLOCK_K == 0
        and q.stride(-1) == 1
        and all(st % 8 == 0 for st in q.stride()[:-1])
        and q.data_ptr() % 8 == 0
        and w.scales.stride(-1) == 1
        and len(w.segments) <= MAX_SEGMENTS
    )


def _vec_fits(x: torch.Tensor, w: NVFP4Weight) -> bool:
    """What the VEC kernels' 16-byte loads need besides `_fits`: x rows and code rows on 16 bytes, scale rows on 2
    (else the 8-byte kernels run)."""
    return x.data_ptr() % 16 == 0 and x.stride(0) % 8 == 0 and _vec_weight(w)


def _vec_weight(w: NVFP4Weight) -> bool:
    """The weight's part of `_vec_fits`: code rows on 16 bytes, scale rows on 2."""
    q, s = w.qweight, w.scales
    return (
        q.data_ptr() % 16 == 0
        and all(st % 16 == 0 for st in q.stride()[:-1])
        and s.data_ptr() % 2 == 0
        and all(st % 2 == 0 for st in s.stride()[:-1])
    )


def _with_ready_bytes(w: NVFP4Weight, ready: bool, ready_codes: bool = False) -> NVFP4Weight:
    """w, or the same weight reading its ready scale bytes (`ready`; int8, `nvfp4_mma_scales`: the kernels build each
    scale pair in one multiply-add, `_scale_pair`) and its ready codes (`ready_codes`; int8, `nvfp4_mma_codes`: the K
    step decodes a word in 8 integer instructions instead of 13, `_decode_ready`) where it has them."""
    scales = w.ready_scales if ready and w.ready_scales is not None else w.scales
    codes = w.ready_codes if ready_codes and w.ready_codes is not None else w.qweight
    if scales is w.scales and codes is w.qweight:
        return w
    return NVFP4Weight(codes, scales, w.global_scale, w.segments)


def supported(x: torch.Tensor, w: NVFP4Weight) -> bool:
    """Whether `linear` takes this call: `_fits`, 1-64 rows of x, a 2-D weight."""
    return _fits(x, w) and w.qweight.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS


def linear(
    x: torch.Tensor,
    w: NVFP4Weight,
    num_warps: int = 4,
    split_k: int | None = None,
    prefetch: bool = PREFETCH,
    vec: bool = False,
    wide: bool = False,
    ready: bool = False,
    ready_codes: bool = False,
) -> torch.Tensor:
    """x [M <= 64, K] @ W^T in BF16 with `linear_ref`'s numerics (FP32 accumulation in the MMA's order)."""
    if not supported(x, w):
        raise ValueError(
            f"nvfp4_mma.linear takes BF16 x of 1-{MAX_ROWS} aligned rows on a CUDA GPU and a 2-D NVFP4 weight with K "
            f"a multiple of {BLOCK_K}; got x {tuple(x.shape)} {x.dtype} on {x.device}, weight {w.shape}"
        )
    out = torch.empty((x.shape[0], w.qweight.shape[0]), dtype=x.dtype, device=x.device)
    launch_linear(x, w, out, num_warps, split_k, prefetch, vec, wide, ready, ready_codes)
    return out


def launch_linear(
    x: torch.Tensor,
    w: NVFP4Weight,
    out: torch.Tensor,
    num_warps: int = 4,
    split_k: int | None = None,
    prefetch: bool = PREFETCH,
    vec: bool = False,
    wide: bool = False,
    ready: bool = False,
    ready_codes: bool = False,
) -> None:
    """Fill out [M, N] (BF16, or FP32 where the interpreter runs it) with x @ W^T; `supported(x, w)` must hold on a
    GPU. Up to 8 rows `_nvfp4_mma_kernel`, 9-32 the rows kernel in four groups of 8 (`wide`: 32 weight rows a warp,
    `_nvfp4_mma_wide_kernel`), 33-64 in eight. K splits: `split_k`, else `split_k_triton.choose_split_k`'s (~4
    programs per SM). vec: 16-byte loads where the rows are aligned for them. prefetch: the 1-8 row kernel only.
    ready: the weight's ready scale bytes where it has them (`nvfp4_mma_scales`; TileConfig.mma_ready); ready_codes:
    its ready codes where it has them (`nvfp4_mma_codes`; TileConfig.mma_ready_codes)."""
    w = _with_ready_bytes(w, ready, ready_codes)
    m, k = x.shape
    n = w.qweight.shape[0]
    groups = 1 if m <= MAX_M else 4 if m <= 32 else 8
    wide = wide and groups == 4
    tiles = triton.cdiv(n, ROWS_PER_WARP * num_warps * (2 if wide else 1))
    split, per = choose_split_k(tiles, k, BLOCK_K, x.device)
    if split_k is not None and tiles <= COUNTER_SLOTS:  # one arrival counter a tile
        per = triton.cdiv(k // BLOCK_K, min(split_k, k // BLOCK_K)) * BLOCK_K
        split = triton.cdiv(k, per)
    fragments = 4 * groups * (2 if wide else 1)  # FP32 values a thread keeps
    ws = torch.empty((tiles * split * fragments * 32 * num_warps,) if split > 1 else (1,), dtype=torch.float32,
                     device=x.device)  # fmt: skip
    seg1, seg2, seg3 = segment_bounds(w.segments, n)
    vec = vec and _vec_fits(x, w)
    args = (
        x, w.qweight, w.scales, w.global_scale, out, ws, counters(x.device), m, n, k, per,
        x.stride(0), w.qweight.stride(0), w.scales.stride(0), out.stride(0), seg1, seg2, seg3,
    )  # fmt: skip
    opts = dict(SPLIT_K=split, NW=num_warps, num_warps=num_warps, num_stages=1, **launch_options(x.device))
    if groups == 1:
        kernel = _nvfp4_mma_vec_kernel if vec else _nvfp4_mma_kernel
        kernel[(tiles, split)](*args, PREFETCH=prefetch, **opts)
    elif wide:
        _nvfp4_mma_wide_kernel[(tiles, split)](*args, VEC=vec, **opts)
    else:
        _nvfp4_mma_rows_kernel[(tiles, split)](*args, VEC=vec, GROUPS=groups, **opts)
