"""The routed MoE of prefills on tensor-core tiles fed by TMA (sm_90, sm_100), beside `moe_grouped_gemm`'s CUTLASS path.

Same grouping and numerics as `moe_grouped_gemm.routed` (pairs sorted by expert, each pair's y rounded, the slots
summed in slot order by `reduce_sorted`), in two launches of our own instead of torch's grouped GEMMs:
- gate_up with SiLU-and-mul in its epilogue: each program holds a gate tile and the matching up tile of one block of
  up to BLOCK_M sorted rows of one expert, so the [P, 2I] gate_up never goes through memory and no SiLU launch runs;
  x's rows come either gathered by pointer from the unsorted activations (`gather`: no gathered copy of x) or from
  the sorted copy through a TMA descriptor;
- down: each block's h rows against the expert's [H, I] weights, y rounded once (after the global scale for NVFP4's
  BF16 copies).
Blocks come from `moe_align_triton.sort_blocks`: (expert, first sorted row, rows) per block, so a block never mixes
experts. The table picks the block height by pairs an expert (`MoETmaConfig`): 64-row blocks compute fewer unused
rows at a few dozen pairs an expert, 128-row ones read each weight tile once for more rows, and for NVFP4's twins
256-row ones (8 warps) decode each expert's weights once for an 8K prompt's ~192 pairs an expert. Rows of a tile
past its block's belong to the next expert (or are TMA's zero fill): computed and never stored.

Numerics (`moe_ref`'s): gate and up rounded to x's dtype after each segment's global scale on the FP32 accumulator,
silu(gate) rounded, times up rounded; y rounded after its scale. Only the FP32 accumulation order differs from
CUTLASS's, as any GEMM's does.

NVFP4 experts run either as the BF16 copies `moe_triton` makes (`ScaledWeight`, through the launches above) or, with
no copy, through twin launches that decode each K step of codes and scales in registers (`_nvfp4_weights`: exact
values, times 2**-62 in BF16 as the Triton GEMV's tensor-core path keeps them; the accumulator gets the 2**62 back),
the decoded tile the MMA's left operand from registers (the product transposed: Triton 3.6 fails to compile the
decoded tile as the right operand, through shared memory, at these tiles). The decoded values equal the copies', so
the sums are the copies' too.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from . import moe_align_triton, moe_grouped_gemm, tuning
from .configs import MoETmaConfig
from .gemv_triton import _INTERPRET, nvfp4_packed_weights
from .linear import NVFP4Weight, ScaledWeight
from .nvfp4_decode_triton import nvfp4_planes
from .pdl import launch_options, pdl_entry

try:  # Triton >= 3.4: host-side TMA descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor

    HAVE_TMA = True
except ImportError:
    HAVE_TMA = False


def config(pairs_per_expert: float, nvfp4: bool = False, device: torch.device | None = None) -> MoETmaConfig:
    """The launches' tiles for a batch of `pairs_per_expert` pairs an expert on average; table op "moe.grouped_tma"
    (shape pairs_per_expert, nvfp4: the twins that decode NVFP4 in registers; NVFP4's BF16 copies take BF16's). The
    default (64-row blocks, gate_up rows gathered by pointer) is the H200's
    best at 512-2,048 tokens."""
    return tuning.tuned(
        "moe.grouped_tma", MoETmaConfig(), device, pairs_per_expert=float(pairs_per_expert), nvfp4=nvfp4
    )


def for_copies(cfg: MoETmaConfig) -> MoETmaConfig:
    """`cfg`'s tiles as the plain launches run them on NVFP4's BF16 copies: their weight tiles sit in shared memory
    too, so at most 2 stages deep (a 256-row gate_up or down 128 deep in 3 stages needs 295 KB). A pipeline's depth
    changes no sum, so the twins' results can be compared with these bit for bit."""
    return dataclasses.replace(cfg, gate_up_stages=min(cfg.gate_up_stages, 2), down_stages=min(cfg.down_stages, 2))


def fits(x: torch.Tensor, w13: object, w2: object, cfg: MoETmaConfig) -> bool:
    """Whether these launches take x [T, H] against w13 [E, 2I, H] and w2 [E, H, I]: contiguous stacks of x's dtype or
    NVFP4's `ScaledWeight` copies (as `moe_grouped_gemm.fits` takes them, whatever torch's grouped GEMM returns), BF16
    or FP16 on an sm_90 or sm_100 device (any float dtype in the interpreter: the tests), the tiles dividing H and
    I."""
    # x's rows are read by pointer with unit steps along H (the gather) or copied (index_select), so its last stride
    # must be 1.
    if not HAVE_TMA or x.dim() != 2 or x.stride(-1) != 1 or w13.shape[0] != w2.shape[0]:  # type: ignore[attr-defined]
        return False
    inter, hidden = w2.shape[-1], x.shape[1]  # type: ignore[attr-defined]
    plain = moe_grouped_gemm.plain_fits(x, w13) and moe_grouped_gemm.plain_fits(x, w2)
    # NVFP4's BF16 copies: the global scales multiply the FP32 accumulators in the epilogues (whatever torch's grouped
    # GEMM can return).
    scaled = moe_grouped_gemm.scaled_fits(x, w13, ((2 * inter,), (inter, inter))) and moe_grouped_gemm.scaled_fits(
        x, w2, ((hidden,),)
    )
    if not (plain or scaled or (_nvfp4_fits(x, w13, (2 * inter,), (inter, inter)) and _nvfp4_fits(x, w2, (hidden,)))):
        return False
    # The decoding down in blocks of more than 128 rows with fewer than 128 columns: on an H100 (Triton 3.6) 256-row
    # blocks of 64 columns in 8 warps left NaN in y where 128 columns gave the copies' sums
    # (`test_nvfp4_256_row_blocks_on_the_gpu`); the transposed product's rows are then split between warp groups.
    if isinstance(w2, NVFP4Weight) and cfg.block_m > 128 and cfg.down_block_n < 128:
        return False
    if x.is_cuda:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        # sm_90 and sm_100 (H100/H200, B200): TMA with the ~228 KB of shared memory the pipelined tiles take
        # (consumer Blackwell's ~100 KB would not hold them).
        if x.dtype not in (torch.bfloat16, torch.float16) or torch.cuda.get_device_capability(index)[0] not in (9, 10):
            return False
    return (
        hidden % cfg.gate_up_block_k == 0
        and inter % cfg.gate_up_block_n == 0
        and inter % cfg.down_block_k == 0
        and hidden % cfg.down_block_n == 0
    )


def _nvfp4_fits(x: torch.Tensor, w: object, *segments: tuple[int, ...]) -> bool:
    """A stack of NVFP4 experts the twin launches read: contiguous codes and scales, FP32 global scales [E, G] for
    one of `segments`, on x's device."""
    if not isinstance(w, NVFP4Weight) or w.qweight.dim() != 3 or w.segments not in segments:
        return False
    gs = w.global_scale
    return (
        w.qweight.is_contiguous()
        and w.scales.is_contiguous()
        and w.qweight.device == x.device
        and gs.dim() == 2
        and gs.shape == (w.qweight.shape[0], len(w.segments))
        and gs.dtype == torch.float32
    )


@triton.jit
def _block(meta_ptr):
    """(expert, first sorted row, rows) of this program's block (program axis 1)."""
    b = tl.program_id(1)
    return tl.load(meta_ptr + b * 3), tl.load(meta_ptr + b * 3 + 1), tl.load(meta_ptr + b * 3 + 2)


@triton.jit
def _x_rows(x_ptr, src_ptr, row0, rows, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Pointers to the first K step of x's rows for the block's sorted rows (each row's token; padding rows read
    token 0, never stored)."""
    m = tl.arange(0, BLOCK_M)
    tok = tl.load(src_ptr + row0 + m, mask=m < rows, other=0)
    return x_ptr + tok[:, None] * stride_x + tl.arange(0, BLOCK_K)[None, :]


@triton.jit
def _x_step(x_desc, a_ptrs, row0, k, GATHER: tl.constexpr):
    """x's [BLOCK_M, BLOCK_K] tile at K step k: gathered by pointer, or from the sorted copy through TMA."""
    if GATHER:
        a = tl.load(a_ptrs + k)
    else:
        a = x_desc.load([row0, k])
    return a


@triton.jit
def _swiglu(acc_g, acc_u, xdt: tl.constexpr):
    """round(round(silu(round(gate))) * round(up)) of the scaled FP32 gate and up accumulators."""
    g32 = acc_g.to(xdt).to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(xdt)
    return (act.to(tl.float32) * acc_u.to(xdt).to(tl.float32)).to(xdt)


@triton.jit
def _store_rows(out_ptr, vals, row0, rows, n0, stride, TRANSPOSED: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):  # fmt: skip
    """out[row0 + m, n0 + n] = vals for the block's rows m (vals [BLOCK_M, BLOCK_N], or its transpose)."""
    m = tl.arange(0, BLOCK_M)
    n = n0 + tl.arange(0, BLOCK_N)
    r = (row0 + m).to(tl.int64)
    if TRANSPOSED:
        tl.store(out_ptr + r[None, :] * stride + n[:, None], vals, mask=(m < rows)[None, :])
    else:
        tl.store(out_ptr + r[:, None] * stride + n[None, :], vals, mask=(m < rows)[:, None])


@triton.jit
def _gate_up_kernel(
    x_desc, x_ptr, src_ptr, meta_ptr, w_desc, gs_ptr, h_ptr, H, INTER, stride_x, stride_h, stride_gs,
    GATHER: tl.constexpr, GSCALE: tl.constexpr, UP_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """h[r, n] = round(round(silu(round(gate[r, n]))) * round(up[r, n])) for the block's rows r and BLOCK_N columns."""
    pdl_entry(PDL)
    e, row0, rows = _block(meta_ptr)
    if rows == 0:
        return
    n0 = tl.program_id(0) * BLOCK_N
    w_gate = e * 2 * INTER + n0
    w_up = w_gate + INTER
    a_ptrs = _x_rows(x_ptr, src_ptr, row0, rows, stride_x, BLOCK_M, BLOCK_K) if GATHER else x_ptr
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        a = _x_step(x_desc, a_ptrs, row0, k, GATHER)
        acc_g = tl.dot(a, w_desc.load([w_gate, k]).T, acc_g)
        acc_u = tl.dot(a, w_desc.load([w_up, k]).T, acc_u)
    if GSCALE:
        acc_g = acc_g * tl.load(gs_ptr + e * stride_gs)
        acc_u = acc_u * tl.load(gs_ptr + e * stride_gs + UP_SCALE)
    h = _swiglu(acc_g, acc_u, h_ptr.dtype.element_ty)
    _store_rows(h_ptr, h, row0, rows, n0, stride_h, False, BLOCK_M, BLOCK_N)


@triton.jit
def _down_kernel(
    h_desc, meta_ptr, w_desc, gs_ptr, y_ptr, INTER, HID, stride_y, stride_gs, GSCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """y[r, n] = round(gs[e] * sum_k h[r, k] w2[e, n, k]) for the block's rows r and BLOCK_N columns."""
    pdl_entry(PDL)
    e, row0, rows = _block(meta_ptr)
    if rows == 0:
        return
    n0 = tl.program_id(0) * BLOCK_N
    w_row = e * HID + n0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, INTER, BLOCK_K):
        acc = tl.dot(h_desc.load([row0, k]), w_desc.load([w_row, k]).T, acc)
    if GSCALE:
        acc = acc * tl.load(gs_ptr + e * stride_gs)
    _store_rows(y_ptr, acc.to(y_ptr.dtype.element_ty), row0, rows, n0, stride_y, False, BLOCK_M, BLOCK_N)


@triton.jit
def _nvfp4_weights(
    w_ptr, s_ptr, row0, k, stride_wn, stride_sn, wdt: tl.constexpr, PACKED: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Rows row0..row0+BLOCK_N, columns k..k+BLOCK_K of an NVFP4 stack, decoded to `wdt` in K order: the true values for
    FP16 (whose range is narrow), the true values times 2**-62 otherwise (exact in BF16 and FP32). PACKED (BF16; 2:
    emulated in FP32 by the interpreter): two at a time by FMA.BF16X2 (`nvfp4_packed_weights`, in K order)."""
    rows = row0.to(tl.int64) + tl.arange(0, BLOCK_N)
    if PACKED:
        return nvfp4_packed_weights(
            w_ptr, s_ptr, rows, rows >= 0, k, k + BLOCK_K, stride_wn, stride_sn, True, PACKED == 2, wdt, BLOCK_N,
            BLOCK_K, IN_ORDER=True,
        )  # fmt: skip
    lo, hi, scale = nvfp4_planes(
        w_ptr, s_ptr, rows, rows >= 0, k, k + BLOCK_K, stride_wn, stride_sn, True, BLOCK_N, BLOCK_K
    )  # [BLOCK_N, G, 8] nibble planes (times 2**-127), [BLOCK_N, G] E4M3 scales
    if wdt == tl.float16:
        sc = scale[:, :, None]
        lo = lo * sc * 8.507059173023462e37  # 2**126
        hi = hi * sc * 8.507059173023462e37
    else:
        sc = (scale * 1.8446744073709552e19)[:, :, None]  # 2**64
        lo = lo * sc
        hi = hi * sc
    return tl.reshape(tl.join(lo.to(wdt), hi.to(wdt)), (BLOCK_N, BLOCK_K))


@triton.jit
def _gate_up_nvfp4_kernel(
    x_desc, x_ptr, src_ptr, meta_ptr, w_ptr, s_ptr, gs_ptr, h_ptr, H, INTER, stride_x, stride_h, stride_wn,
    stride_sn, stride_gs, GATHER: tl.constexpr, UP_SCALE: tl.constexpr, PACKED: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`_gate_up_kernel` on NVFP4 experts, each K step of gate and up rows decoded in registers (no BF16 copy), the
    products transposed ([BLOCK_N, BLOCK_M] accumulators); PACKED: the weights decoded two at a time."""
    pdl_entry(PDL)
    e, row0, rows = _block(meta_ptr)
    if rows == 0:
        return
    n0 = tl.program_id(0) * BLOCK_N
    w_gate = e * 2 * INTER + n0
    w_up = w_gate + INTER
    xdt = h_ptr.dtype.element_ty
    a_ptrs = _x_rows(x_ptr, src_ptr, row0, rows, stride_x, BLOCK_M, BLOCK_K) if GATHER else x_ptr
    acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        a = _x_step(x_desc, a_ptrs, row0, k, GATHER)
        wg = _nvfp4_weights(w_ptr, s_ptr, w_gate, k, stride_wn, stride_sn, xdt, PACKED, BLOCK_N, BLOCK_K)
        acc_g = tl.dot(wg, tl.trans(a), acc_g)
        wu = _nvfp4_weights(w_ptr, s_ptr, w_up, k, stride_wn, stride_sn, xdt, PACKED, BLOCK_N, BLOCK_K)
        acc_u = tl.dot(wu, tl.trans(a), acc_u)
    if xdt != tl.float16:  # the decoded weights were the true ones times 2**-62 (exact)
        acc_g = acc_g * 4.611686018427388e18
        acc_u = acc_u * 4.611686018427388e18
    h = _swiglu(acc_g * tl.load(gs_ptr + e * stride_gs), acc_u * tl.load(gs_ptr + e * stride_gs + UP_SCALE), xdt)
    _store_rows(h_ptr, h, row0, rows, n0, stride_h, True, BLOCK_M, BLOCK_N)


@triton.jit
def _down_nvfp4_kernel(
    h_desc, meta_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, INTER, HID, stride_y, stride_wn, stride_sn, stride_gs,
    PACKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`_down_kernel` on NVFP4 experts, each K step decoded in registers (no BF16 copy), the product transposed;
    PACKED: the weights decoded two at a time."""
    pdl_entry(PDL)
    e, row0, rows = _block(meta_ptr)
    if rows == 0:
        return
    n0 = tl.program_id(0) * BLOCK_N
    w_row = e * HID + n0
    xdt = y_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(0, INTER, BLOCK_K):
        w = _nvfp4_weights(w_ptr, s_ptr, w_row, k, stride_wn, stride_sn, xdt, PACKED, BLOCK_N, BLOCK_K)
        acc = tl.dot(w, tl.trans(h_desc.load([row0, k])), acc)
    if xdt != tl.float16:
        acc = acc * 4.611686018427388e18
    y = (acc * tl.load(gs_ptr + e * stride_gs)).to(xdt)
    _store_rows(y_ptr, y, row0, rows, n0, stride_y, True, BLOCK_M, BLOCK_N)


def _plain(w: torch.Tensor | ScaledWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(w, ScaledWeight):
        return w.data, w.global_scale
    return w, None


def _packed(cfg: MoETmaConfig, dtype: torch.dtype) -> int:
    """The twins' PACKED constexpr for `packed_decode`: 1 with BF16 activations, 2 under the interpreter (which runs
    no PTX: the same values from FP32 operations), 0 otherwise (FP16 needs the true weights, which the packed pairs
    times 2**-62 are not; GPUs take only BF16 and FP16)."""
    if not cfg.packed_decode or dtype == torch.float16:
        return 0
    if _INTERPRET:
        return 2
    return 1 if dtype == torch.bfloat16 else 0


def gate_up(
    x: torch.Tensor,
    src: torch.Tensor,
    meta: torch.Tensor,
    w13: torch.Tensor | ScaledWeight | NVFP4Weight,
    cfg: MoETmaConfig,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """h [P, I] (sorted rows; into `out` when given) of x [T, H] through the stacked gate|up experts w13 [E, 2I, H],
    for the blocks of `meta`."""
    hidden, inter = x.shape[1], w13.shape[1] // 2  # type: ignore[union-attr]
    h = torch.empty((src.numel(), inter), dtype=x.dtype, device=x.device) if out is None else out
    bn, bk = cfg.gate_up_block_n, cfg.gate_up_block_k
    xs = x if cfg.gather else x.index_select(0, src)
    grid = (inter // bn, meta.shape[0])
    opts = dict(BLOCK_M=cfg.block_m, BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg.gate_up_warps,
                num_stages=cfg.gate_up_stages, **launch_options(x.device))  # fmt: skip
    if isinstance(w13, NVFP4Weight):
        gs = w13.global_scale
        x_desc = TensorDescriptor.from_tensor(xs, [cfg.block_m, bk])  # unused when gathering
        _gate_up_nvfp4_kernel[grid](
            x_desc, x, src, meta, w13.qweight, w13.scales, gs, h, hidden, inter, x.stride(0), h.stride(0),
            w13.qweight.stride(1), w13.scales.stride(1), gs.stride(0), GATHER=cfg.gather, UP_SCALE=gs.shape[1] - 1,
            PACKED=_packed(cfg, x.dtype), **opts,
        )  # fmt: skip
        return h
    data, gs = _plain(w13)
    w_desc = TensorDescriptor.from_tensor(data.view(-1, hidden), [bn, bk])
    x_desc = w_desc if cfg.gather else TensorDescriptor.from_tensor(xs, [cfg.block_m, bk])  # unused when gathering
    _gate_up_kernel[grid](
        x_desc, x, src, meta, w_desc, gs if gs is not None else h, h, hidden, inter, x.stride(0), h.stride(0),
        gs.stride(0) if gs is not None else 0, GATHER=cfg.gather, GSCALE=gs is not None,
        UP_SCALE=gs.shape[1] - 1 if gs is not None else 0, **opts,
    )  # fmt: skip
    return h


def down(
    h: torch.Tensor,
    meta: torch.Tensor,
    w2: torch.Tensor | ScaledWeight | NVFP4Weight,
    cfg: MoETmaConfig,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [P, H] (sorted rows, each rounded; into `out` when given) of h [P, I] through the stacked down experts w2
    [E, H, I], for the blocks of `meta`."""
    hidden, inter = w2.shape[1], h.shape[1]  # type: ignore[union-attr]
    y = torch.empty((h.shape[0], hidden), dtype=h.dtype, device=h.device) if out is None else out
    bn, bk = cfg.down_block_n, cfg.down_block_k
    h_desc = TensorDescriptor.from_tensor(h, [cfg.block_m, bk])
    grid = (hidden // bn, meta.shape[0])
    opts = dict(BLOCK_M=cfg.block_m, BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg.down_warps, num_stages=cfg.down_stages,
                **launch_options(h.device))  # fmt: skip
    if isinstance(w2, NVFP4Weight):
        gs = w2.global_scale
        _down_nvfp4_kernel[grid](
            h_desc, meta, w2.qweight, w2.scales, gs, y, inter, hidden, y.stride(0), w2.qweight.stride(1),
            w2.scales.stride(1), gs.stride(0), PACKED=_packed(cfg, h.dtype), **opts,
        )  # fmt: skip
        return y
    data, gs = _plain(w2)
    w_desc = TensorDescriptor.from_tensor(data.view(-1, inter), [bn, bk])
    _down_kernel[grid](
        h_desc, meta, w_desc, gs if gs is not None else y, y, inter, hidden, y.stride(0),
        gs.stride(0) if gs is not None else 0, GSCALE=gs is not None, **opts,
    )  # fmt: skip
    return y


def routed(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor | ScaledWeight | NVFP4Weight,
    w2: torch.Tensor | ScaledWeight | NVFP4Weight,
    cfg: MoETmaConfig,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """`moe_grouped_gemm.routed`'s result [T, H] (plus `add`) through these launches; the caller checks `fits`."""
    out = torch.empty_like(x)
    if topk_ids.shape[0] == 0:
        return out
    src, pos, meta = moe_align_triton.sort_blocks(topk_ids, w13.shape[0], cfg.block_m)
    h = gate_up(x, src, meta, w13, cfg)
    y = down(h, meta, w2, cfg)
    del h
    return moe_grouped_gemm.reduce_sorted(y, pos, topk_weights, out, add)
