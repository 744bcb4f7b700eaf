"""NVFP4 codes with each word's bits in the order the MMA K step decodes in fewer instructions ("ready codes").

`nvfp4_mma_triton`'s K step turns each 32-bit word of codes (8 values, value i in nibble i) into four BF16x2
registers: register r = 2h + p holds values r (low half) and r + 4 (high half) as BF16 bit patterns with E2M1's
e1 e0 m at bits 8-6 and its sign at bit 15 of each half (`MAGNITUDE_SIGN`), which one FMA.BF16X2 then scales. From
the engine's nibbles that costs a register a mask, a multiply making two copies (the magnitude and the sign need
different shifts) and a mask, registers 2 and 3 after one shift of the word by 8: 13 integer instructions a word.

Ready codes hold the same 32 bits permuted within each word, so that
- register 0 is the word masked (one LOP3),
- registers 1 and 2 are the word rotated right by 3 and 6, masked (SHF, LOP3 each),
- register 3 is the bits left over (0, 1, 3 and 4 of each half) masked, times 2**3 + 2**8 + 2**14, masked: the
  three shifted copies of the four bits never overlap, so no carry reaches a kept bit (LOP3, IMAD, LOP3):
8 integer instructions a word. No four rotations tile a word with `MAGNITUDE_SIGN`'s shape (an exhaustive search
over rotations, and over byte permutations with them, found none), hence the multiply for the last register.
Compiled for sm_90 as the H200 table launches them (`benchmarks/mma_k_loops.py`: ready scale bytes, the launch's
specialisations; Triton 3.6), the installed MMA kernels' K steps are 15-22% shorter: the wide MoE down 361 -> 281
instructions, the wide linear 483 -> 403, the 1-8-row linear 203 -> 163, the rows kernel 292 -> 249; the wide MoE
gate_up 434 -> 348, and 301 (-31%) as its ready-code loop takes two steps an iteration
(`nvfp4_mma_triton._k_loop_wide_pairs`, which drops the predicated L2 requests of every other step). Every result
stays as it was: each register holds the same bits, each sum runs in the same order.

The kernels take ready codes as an int8 tensor of the codes' shape (`NVFP4Weight.ready_codes`): the pointer's type
picks the K step (`nvfp4_mma_triton._weight_bases`), so no kernel gains a parameter. The tuning table's
`mma_ready_codes` (TileConfig, MoEConfig) has the MMA kernels read them, and the fused path makes them when the model
is built (`prepare`, after the ready scales: those zero the codes of blocks whose scale is 0) where the device's
table reads them (`auto`, the default; the H200's MMA entries since the forty-seventh session: NVFP4 b16 -5.1%, b32
-4.1% on an H200), in the engine's codes' place: no byte is added, and every other decoder reads them too, chosen by
the code pointer's type as well (`nvfp4_decode_triton.e2m1_pair_packed` for uint32 words, which the FMA and
tensor-core GEMV tiles, the MoE and the TMA-fed prefill launches load through an unsigned pointer; its byte planes
from whole words; `nvfp4.dequantize` puts the bits back), so the MMA kernels read them whatever the table says.
`FLINT_MMA_READY_CODES=replace` does the same on every CUDA device, `=0` never (then `mma_ready_codes` entries read
the engine's codes), `=1` on every CUDA device beside the engine's codes, which the FMA, prefill and reference paths
then keep reading (one byte per two values, ~20 GB more on the full NVFP4 model: for A/Bs of the MMA kernels alone).
"""

from __future__ import annotations

import torch

from . import nvfp4_mma_scales, tuning
from .linear import NVFP4Weight

# Bits 6-8 (E2M1's m, e0, e1) and 15 (its sign) of each BF16 half: a register's bits once decoded.
MAGNITUDE_SIGN = 0x81C081C0
# Registers 0-2: the ready word rotated right by these, masked with MAGNITUDE_SIGN.
ROTATIONS = (0, 3, 6)
# Register 3: the ready word's bits 0, 1, 3 and 4 of each half, times LEFTOVER_TIMES (three copies, shifted by 3, 8
# and 14), masked with MAGNITUDE_SIGN.
LEFTOVER_MASK = 0x001B001B
LEFTOVER_TIMES = (1 << 3) | (1 << 8) | (1 << 14)
_BF16_BITS = (6, 7, 8, 15)  # where E2M1's m, e0, e1 and sign go in a BF16 half
_LEFTOVER_BITS = (3, 4, 0, 1)  # where register 3's m, e0, e1 and sign are in each half of a ready word
WORDS_AT_ONCE = 1 << 22  # words a pass of `ready_words` converts (bounds its temporaries to ~100 MB)

ENV = "FLINT_MMA_READY_CODES"


def source_bit(register: int, half: int, bit: int) -> int:
    """Where in a ready word bit `bit` (0 m, 1 e0, 2 e1, 3 sign) of register `register`'s value in `half` lies: that
    value is the word's value `register + 4 * half`."""
    if register < len(ROTATIONS):
        return (_BF16_BITS[bit] + 16 * half + ROTATIONS[register]) % 32
    return _LEFTOVER_BITS[bit] + 16 * half


_MOVES = tuple(
    (4 * (register + 4 * half) + bit, source_bit(register, half, bit))
    for register in range(4)
    for half in range(2)
    for bit in range(4)
)  # (bit in the engine's word, bit in the ready word)


_byte_tables: dict[tuple[tuple[tuple[int, int], ...], torch.device], torch.Tensor] = {}


def _moved_bytes(moves: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """int64 [4, 256]: where `moves` send the bits of each value of a word's byte i (bits 8i..8i+7), made once."""
    key = (moves, device)
    tables = _byte_tables.get(key)
    if tables is None:
        tables = torch.zeros(4, 256, dtype=torch.int64)
        byte = torch.arange(256, dtype=torch.int64)
        for a, b in moves:
            tables[a // 8] |= ((byte >> (a % 8)) & 1) << b
        tables = _byte_tables[key] = tables.to(device)
    return tables


def _permute(words: torch.Tensor, moves: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """int32 words with bit a of each moved to bit b, for every (a, b) of `moves` (a permutation of 0..31)."""
    # A word's bits gathered byte by byte from tables: four lookups, where a shift and mask per bit took 128 ops
    # (the plain path un-permutes ready codes at each use of a weight).
    tables = _moved_bytes(moves, words.device)
    out = torch.empty_like(words)
    flat, dst = words.reshape(-1), out.view(-1)
    for lo in range(0, flat.numel(), WORDS_AT_ONCE):
        b = flat[lo : lo + WORDS_AT_ONCE].view(torch.uint8).view(-1, 4).to(torch.int32)  # little-endian: byte 0 low
        acc = tables[0][b[:, 0]] | tables[1][b[:, 1]] | tables[2][b[:, 2]] | tables[3][b[:, 3]]
        dst[lo : lo + WORDS_AT_ONCE] = (acc - ((acc >> 31) << 32)).to(torch.int32)
    return out


def _words(codes: torch.Tensor) -> torch.Tensor:
    if codes.shape[-1] % 4:
        raise ValueError(f"NVFP4 codes of {codes.shape[-1]} bytes a row are not whole 32-bit words")
    return codes.contiguous().view(torch.int32)


def ready_words(qweight: torch.Tensor) -> torch.Tensor:
    """int8 ready codes (module docstring) of the engine's uint8 codes [..., K/2], the same shape."""
    if qweight.dtype != torch.uint8:
        raise ValueError(f"ready codes are made from the engine's uint8 codes, not {qweight.dtype} (ready already?)")
    return _permute(_words(qweight), _MOVES).view(torch.int8).view(qweight.shape)


def engine_words(ready: torch.Tensor) -> torch.Tensor:
    """The engine's uint8 codes back from ready codes (`ready_words`'s inverse)."""
    moves = tuple((b, a) for a, b in _MOVES)
    return _permute(_words(ready), moves).view(torch.uint8).view(ready.shape)


def setting() -> str:
    """`FLINT_MMA_READY_CODES` (`nvfp4_mma_scales.env_setting`: auto, 0, 1 or replace)."""
    return nvfp4_mma_scales.env_setting(ENV)


def table_reads(table: tuning.Table) -> bool:
    """Whether a tuning table has an entry whose kernels read ready codes."""
    return nvfp4_mma_scales.table_has(table, "mma_ready_codes")


def wanted(device: torch.device) -> bool:
    """Whether weights on `device` get ready codes (`nvfp4_mma_scales.wanted_by`: `FLINT_MMA_READY_CODES`, the
    table's `mma_ready_codes`)."""
    return nvfp4_mma_scales.wanted_by(ENV, "mma_ready_codes", device)


def extra_bytes(values: int) -> int:
    """Bytes ready codes add beside the engine's codes for `values` NVFP4 weight values."""
    return values // 2


def make_ready(w: NVFP4Weight, replace: bool = False) -> None:
    """Give `w` its ready codes from its codes as they are now (after `nvfp4_mma_scales.make_ready`, which may change
    them). `replace`: they take the engine's codes' place (`qweight`), so the weight keeps half a byte a value: every
    kernel (`nvfp4_decode_triton.e2m1_pair_packed` and the byte planes through the code pointer's type, the MMA K
    step) and `nvfp4.dequantize` read either form."""
    if w.ready_codes is None:
        w.ready_codes = ready_words(w.qweight)
    if replace:
        w.qweight = w.ready_codes


def replaces() -> bool:
    """Whether ready codes, where made, take the engine's codes' place: under `replace`, and under `auto` (the
    default), which makes them only where the table reads them; `1` keeps them beside the codes (A/Bs)."""
    return setting() in ("auto", "replace")


def prepare(w: object) -> None:
    """Ready codes for an NVFP4 weight on a CUDA device that wants them (`wanted`; others are left as they are), in
    the engine's codes' place unless `FLINT_MMA_READY_CODES=1` (`replaces`)."""
    if isinstance(w, NVFP4Weight) and w.qweight.is_cuda and wanted(w.qweight.device):
        make_ready(w, replace=replaces())
