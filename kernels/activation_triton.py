"""Triton SiLU-and-mul (SwiGLU) with `silu_and_mul_ref`'s rounding: silu rounded to the dtype, then the product."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, pdl_entry

_BLOCK = 1024
# From this many rows (a prefill's) a program takes ROWS rows of up to ROWS_BLOCK columns: one row a program moves
# 3 KB in 8-byte pieces at Flint's expert width, too little to keep the memory system busy (H200, an 8K prefill's
# experts: 60.2 us one row a program, 36.5 four, 37.3 eight; benchmarks/kernels_moe_glue.py). Decode keeps one row a
# program, so its launches and their compiled variants are what they were.
ROWS_MIN = 256
ROWS = 4
ROWS_BLOCK = 512


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,
    out_ptr,
    inter,
    stride_in,
    stride_out,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[r, c] = round(round(silu(gate[r, c])) * up[r, c]) for one row r and BLOCK columns."""
    pdl_entry(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < inter
    row = gate_up_ptr + r * stride_in
    g = tl.load(row + c, mask=ok, other=0.0)
    u = tl.load(row + inter + c, mask=ok, other=0.0)
    g32 = g.to(tl.float32)
    # F.silu computes x / (1 + exp(-x)) in FP32 and rounds once; the multiply is a second op in the dtype.
    act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)
    y = act.to(tl.float32) * u.to(tl.float32)
    tl.store(out_ptr + r * stride_out + c, y.to(g.dtype), mask=ok)


# The row count changes with every prefill: not specialised on, so no new prompt length compiles a variant.
@triton.jit(do_not_specialize=["rows"])
def _silu_and_mul_rows_kernel(
    gate_up_ptr,
    out_ptr,
    rows,
    inter,
    stride_in,
    stride_out,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """`_silu_and_mul_kernel` for ROWS rows x BLOCK columns a program."""
    pdl_entry(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = (r < rows)[:, None] & (c < inter)[None, :]
    row = gate_up_ptr + r.to(tl.int64)[:, None] * stride_in + c[None, :]
    g = tl.load(row, mask=ok, other=0.0)
    u = tl.load(row + inter, mask=ok, other=0.0)
    g32 = g.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)
    y = act.to(tl.float32) * u.to(tl.float32)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_out + c[None, :], y.to(g.dtype), mask=ok)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate columns first) -> [..., I]; same contract as `silu_and_mul_ref`."""
    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"last dimension must be even, got {two_i}")
    inter = two_i // 2
    x = gate_up.reshape(-1, two_i)
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    if rows >= ROWS_MIN and inter:
        block = min(ROWS_BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_rows_kernel[(triton.cdiv(rows, ROWS), triton.cdiv(inter, block))](
            x, out, rows, inter, x.stride(0), out.stride(0), ROWS=ROWS, BLOCK=block, num_warps=4,
            **launch_options(x.device),
        )  # fmt: skip
    elif rows and inter:
        block = min(_BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
            x, out, inter, x.stride(0), out.stride(0), BLOCK=block, num_warps=4, **launch_options(x.device)
        )
    return out.view(*gate_up.shape[:-1], inter)
