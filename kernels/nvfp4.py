"""NVFP4 codec in torch (CPU and GPU): exact decode, an encoder for test checkpoints, lossless repack.

Two byte layouts hold the same information:

GGUF block layout (ggml type 40, what files store)
    Each row of K values is K/64 blocks of 36 bytes: 4 UE4M3 scale bytes (one per 16 values), then 32 code
    bytes. In sub-block s (values 16s..16s+15) byte ``qs[8s + j]`` holds value ``16s + j`` in its low nibble
    and value ``16s + 8 + j`` in its high nibble.

Engine W4A16 layout (what the engine and its GPU kernels read), for a weight of shape [..., N, K]
    ``qweight``  uint8 [..., N, K/2]: byte i holds value 2i in its low nibble and value 2i+1 in its high nibble.
    ``scales``   uint8 [..., N, K/16]: the raw UE4M3 byte of each run of 16 values along K.
    A separate float32 global scale multiplies the FP32 accumulator (one per tensor or per expert).

Value of a code c with scale byte b (ggml convention): ``E2M1X2[c] * ue4m3(b) * 0.5`` where E2M1X2 is the doubled
E2M1 table and ue4m3(b) decodes the low 7 bits as E4M3 (bias 7); b == 0 and b == 0x7F decode to 0. The product is
exact in bfloat16 (at most 6 significant bits), so a dequantised weight loses nothing in BF16.
"""

from __future__ import annotations

import torch

QK = 64  # values per GGUF block
QK_SUB = 16  # values per scale
BLOCK_BYTES = 36
# E2M1 values doubled (ggml's kvalues_mxfp4 convention); the 0.5 lives in the scale decode.
E2M1X2 = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0)
E2M1_MAX = 6.0
UE4M3_MAX = 448.0


class NVFP4FormatError(ValueError):
    """Bytes or shapes that are not valid NVFP4."""


# Decode tables per (device, what): made once, since building one is a host-to-device copy the plain path would
# otherwise pay at every weight it dequantises.
_tables: dict[tuple[torch.device, str], torch.Tensor] = {}


def _table(device: torch.device, what: str) -> torch.Tensor:
    """float32 tables indexed by a byte: "codes" [256, 2] the two values a code byte holds (low nibble first);
    "ue4m3" / "ready" [256] the multiplier of a UE4M3 / ready scale byte (`ue4m3_to_float` / `ready_to_float` of
    every byte, so a lookup decodes exactly as they do)."""
    key = (device, what)
    table = _tables.get(key)
    if table is None:
        byte = torch.arange(256, dtype=torch.int32)
        if what == "codes":
            e2m1 = torch.tensor(E2M1X2, dtype=torch.float32)
            table = torch.stack((e2m1[byte & 0xF], e2m1[byte >> 4]), dim=-1)
        elif what == "ue4m3":
            table = ue4m3_to_float(byte)
        else:
            table = ready_to_float(byte.to(torch.uint8).view(torch.int8))
        table = _tables[key] = table.to(device)
    return table


def ue4m3_to_float(b: torch.Tensor) -> torch.Tensor:
    """Decode UE4M3 scale bytes to float32, including ggml's 0.5 factor (bit-exact with gguf 0.19)."""
    b = b.to(torch.int32)
    e = (b >> 3) & 0xF
    m = (b & 0x7).to(torch.float32)
    sub = m * 2.0**-9
    normal = (1.0 + m / 8.0) * torch.exp2((e - 7).to(torch.float32))
    raw = torch.where(e == 0, sub, normal)
    zero = (b == 0) | (b == 0x7F)
    return torch.where(zero, torch.zeros_like(raw), raw * 0.5)


def ready_to_float(u: torch.Tensor) -> torch.Tensor:
    """Decode ready scale bytes (int8, `nvfp4_mma_scales`: u = (exponent + 9) << 3 | mantissa) as `ue4m3_to_float`
    decodes the UE4M3 bytes they were made from. Byte 0 is E4M3's smallest subnormal (2**-9, halved); a block whose
    UE4M3 scale decoded to 0 has byte 0 and zero codes, so its values stay (signed) zeros."""
    bits = (u.view(torch.uint8).to(torch.int32) + 936) << 20  # FP32 exponent field: the byte's exponent - 1 + 127
    return bits.view(torch.float32)


def scales_to_float(scales: torch.Tensor) -> torch.Tensor:
    """Block scales as float32 from either form: UE4M3 bytes (uint8) or ready bytes (int8)."""
    return ready_to_float(scales) if scales.dtype == torch.int8 else ue4m3_to_float(scales)


def _ue4m3_table(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted decoded values (without the 0.5 factor) of the canonical bytes 0x00..0x7E, and those bytes."""
    codes = torch.arange(0, 0x7F, dtype=torch.int32, device=device)
    vals = ue4m3_to_float(codes) * 2.0
    vals[0] = 0.0
    return vals, codes.to(torch.uint8)


def float_to_ue4m3(x: torch.Tensor) -> torch.Tensor:
    """Round non-negative float32 scales to the nearest UE4M3 byte (ties to even mantissa), saturating at 448."""
    vals, codes = _ue4m3_table(x.device)
    x = x.to(torch.float32).clamp(min=0.0, max=UE4M3_MAX)
    idx = torch.bucketize(x, vals).clamp(1, len(vals) - 1)
    lo, hi = vals[idx - 1], vals[idx]
    pick_hi = (hi - x) < (x - lo)
    tie = (hi - x) == (x - lo)
    pick_hi = pick_hi | (tie & ((codes[idx].to(torch.int32) & 1) == 0))
    out = torch.where(pick_hi, idx, idx - 1)
    return codes[out]


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values (already divided by their scale) to 4-bit E2M1 codes, ties to even, saturating at 6."""
    mags = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), device=x.device)
    a = x.abs().clamp(max=E2M1_MAX)
    idx = torch.bucketize(a, mags).clamp(1, 7)
    lo, hi = mags[idx - 1], mags[idx]
    pick_hi = (hi - a) < (a - lo)
    tie = (hi - a) == (a - lo)
    pick_hi = pick_hi | (tie & (idx % 2 == 0))  # code idx is even -> even mantissa
    code = torch.where(pick_hi, idx, idx - 1).to(torch.uint8)
    neg = torch.signbit(x)
    return code | (neg.to(torch.uint8) << 3)


def choose_global_scale(amax: torch.Tensor, power_of_two: bool = True) -> torch.Tensor:
    """Per-tensor FP32 scale so the largest value maps to E2M1 max x UE4M3 max.

    A power of two keeps `dequantised weight x global scale` exact in BF16, which lets tests compare an NVFP4
    model bit for bit with the BF16 model built from the dequantised weights.
    """
    amax = amax.to(torch.float32)
    g = amax / (E2M1_MAX * UE4M3_MAX)
    g = torch.where(g > 0, g, torch.ones_like(g))
    if power_of_two:
        g = torch.exp2(torch.ceil(torch.log2(g)))
    return g


def quantize(w: torch.Tensor, global_scale: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode [..., N, K] floats to the engine layout; returns (qweight, scales) for the given global scale.

    Round-to-nearest E2M1 with UE4M3 per-16 scales. `global_scale` (broadcastable to [...]) defaults to 1.
    """
    if w.shape[-1] % QK:
        raise NVFP4FormatError(f"NVFP4 needs the last dimension to be a multiple of {QK}, got {w.shape[-1]}")
    w = w.to(torch.float32)
    lead = w.shape[:-2]
    if global_scale is None:
        g = torch.ones(lead, dtype=torch.float32, device=w.device)
    else:
        g = torch.as_tensor(global_scale, dtype=torch.float32, device=w.device).expand(lead)
    g = g.reshape(*lead, 1, 1, 1)
    blocks = w.reshape(*w.shape[:-1], -1, QK_SUB)
    bmax = blocks.abs().amax(dim=-1, keepdim=True)
    # ue4m3 decode carries a factor 0.5: stored scale s gives value multiplier s/2 on the doubled table.
    scale_bytes = float_to_ue4m3(bmax / (E2M1_MAX * g))
    sval = ue4m3_to_float(scale_bytes) * 2.0 * g  # multiplier for real E2M1 values
    safe = torch.where(sval > 0, sval, torch.ones_like(sval))
    codes = float_to_e2m1(torch.where(sval > 0, blocks / safe, torch.zeros_like(blocks)))
    codes = codes.reshape(*w.shape)
    qweight = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return qweight.contiguous(), scale_bytes.reshape(*w.shape[:-1], -1).contiguous()


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode the engine layout to [..., N, K] (without the global scale). Exact in bfloat16 and float32. int8 codes
    are ready codes (`nvfp4_mma_codes`), decoded after their bits are put back; int8 scales ready scale bytes."""
    if qweight.dtype == torch.int8:
        from .nvfp4_mma_codes import engine_words  # here: that module imports the weight types, which import this

        qweight = engine_words(qweight)
    lead, k = qweight.shape[:-1], qweight.shape[-1] * 2
    # Table lookups by byte (a code byte's two values, a scale byte's multiplier): a few large ops, none per value
    # kind, since the plain path dequantises every NVFP4 weight at each use.
    vals = _table(qweight.device, "codes")[qweight.to(torch.int32)].reshape(*lead, k // QK_SUB, QK_SUB)
    kind = "ready" if scales.dtype == torch.int8 else "ue4m3"
    s = _table(scales.device, kind)[scales.view(torch.uint8).to(torch.int32)]
    return (vals * s.unsqueeze(-1)).reshape(*lead, k).to(dtype)


def gguf_blocks_to_engine(raw: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless repack of GGUF NVFP4 bytes [..., N, K/64*36] (or flat per row) into (qweight, scales)."""
    if k % QK:
        raise NVFP4FormatError(f"row length {k} is not a multiple of {QK}")
    nb = k // QK
    if raw.dtype != torch.uint8:
        raise NVFP4FormatError(f"NVFP4 data must be uint8 bytes, got {raw.dtype}")
    if raw.shape[-1] != nb * BLOCK_BYTES:
        raise NVFP4FormatError(f"expected {nb * BLOCK_BYTES} bytes per row of {k} values, got {raw.shape[-1]}")
    lead = raw.shape[:-1]
    blk = raw.reshape(*lead, nb, BLOCK_BYTES)
    scales = blk[..., :4].reshape(*lead, nb * 4)
    qs = blk[..., 4:].reshape(*lead, nb, 4, 8)
    lo = qs & 0xF  # values 16s + j
    hi = qs >> 4  # values 16s + 8 + j
    codes = torch.cat((lo, hi), dim=-1).reshape(*lead, k)
    qweight = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return qweight.contiguous(), scales.contiguous()


def engine_to_gguf_blocks(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of `gguf_blocks_to_engine`: (qweight, scales) back to GGUF bytes [..., N, K/64*36]."""
    if qweight.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise NVFP4FormatError("GGUF takes the engine's uint8 codes and UE4M3 scale bytes, not ready ones")
    lead = qweight.shape[:-1]
    k = qweight.shape[-1] * 2
    nb = k // QK
    codes = torch.stack((qweight & 0xF, qweight >> 4), dim=-1).reshape(*lead, nb, 4, 16)
    qs = codes[..., :8] | (codes[..., 8:] << 4)
    blk = torch.cat((scales.reshape(*lead, nb, 4), qs.reshape(*lead, nb, 32)), dim=-1)
    return blk.reshape(*lead, nb * BLOCK_BYTES).contiguous()


def dequantize_gguf_blocks(raw: torch.Tensor, k: int) -> torch.Tensor:
    """Decode GGUF NVFP4 bytes straight to float32 [..., N, K] (the same values as gguf.quants.dequantize)."""
    return dequantize(*gguf_blocks_to_engine(raw, k))


def nbytes(n: int, k: int) -> int:
    """Bytes of one [n, k] NVFP4 matrix in either layout (4.5 bits per value)."""
    return n * (k // QK) * BLOCK_BYTES
