"""Correctness and speed of the Triton GEMV/GEMM (`kernels/gemv_triton.py`) and MoE (`kernels/moe_triton.py`) kernels.

CUDA only (exits 1 with a message otherwise). Each row is first checked against the reference (relative error
< 1e-2 in BF16), then timed. Every timed call runs inside a CUDA graph of many calls that rotate over several
weight copies (so L2 never holds the weights), timed by triton.testing.do_bench's median; the per-call time
includes the ~1 us gap a graph leaves between kernels, as in the engine. GB/s counts the bytes a call must move
(weights touched, scales included, activations in and out); TFLOP/s counts 2*M*N*K. Baselines: torch/cuBLAS on
the same BF16 weight ("torch us"; for NVFP4 rows, cuBLAS on the dequantised BF16 weight) and, for MoE, `moe_ref`
run eagerly.

    python benchmarks/kernels_moe_gemv.py            # table + benchmarks/results/kernels_moe_gemv.json
    python benchmarks/kernels_moe_gemv.py --sweep    # also time alternative tile configurations
    python benchmarks/kernels_moe_gemv.py --only moe --sweep --match "dot expert"   # only the candidates named so
    python benchmarks/kernels_moe_gemv.py --only shared --ts 1 8 32   # routed + shared expert: folded vs apart
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import flint_kernels  # noqa: F401
except ImportError:  # running from a checkout without the package installed
    import importlib.util

    spec = importlib.util.spec_from_file_location("flint_kernels", ROOT / "kernels" / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["flint_kernels"] = module
    spec.loader.exec_module(module)

L2_BYTES = 60 * 2**20
HIDDEN, EXPERTS, INTER, TOPK = 2048, 256, 512, 6
SWEEP_SHAPES = ("qkv", "o", "shared_down", "lm_head")
GEMV_SHAPES = {  # name: (N, K)
    "qkv": (5120, 2048),
    "o": (2048, 4096),
    "shared_gate_up": (2048, 2048),
    "shared_down": (2048, 1024),
    "dense_gate_up": (12288, 2048),
    "dense_down": (2048, 6144),
    "lm_head": (150144, 2048),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64; NaN anywhere gives inf."""
    a64, b64 = a.double(), b.double()
    if not torch.isfinite(a64).all():
        return math.inf
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()


def time_graph(calls: list[Callable[[], object]], reps: int | None = None) -> float:
    """Median ms per call of `calls` (one per weight copy) replayed `reps` times inside one CUDA graph."""
    import triton

    reps = reps or reps_for(len(calls))
    for c in calls:  # compile and allocate outside the capture
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                for c in calls:
                    c()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    return ms / (reps * len(calls))


def time_eager(fn: Callable[[], object]) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def copies_for(nbytes: int) -> int:
    """Enough weight copies that one rotation is over 4x the L2."""
    return max(2, min(256, math.ceil(4 * L2_BYTES / max(nbytes, 1))))


def reps_for(ncalls: int) -> int:
    """Graph repetitions so one replay holds at least ~40 calls."""
    return max(1, math.ceil(40 / ncalls))


def random_nvfp4(lead: tuple[int, ...], n: int, k: int, gen: torch.Generator, segments: tuple[int, ...] | None = None):
    """Random codes and realistic scale bytes (exponent field 6..8), non-power-of-two global scales."""
    from flint_kernels.linear import NVFP4Weight

    dev = "cuda"
    q = torch.randint(0, 256, (*lead, n, k // 2), generator=gen, device=dev, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(0x30, 0x48, (*lead, n, k // 16), generator=gen, device=dev, dtype=torch.int32).to(torch.uint8)
    segments = segments or (n,)
    g = (torch.rand((*lead, len(segments)), generator=gen, device=dev) + 0.5) / (4.2 * math.sqrt(k))
    return NVFP4Weight(q, s, g.float(), segments)


def gemv_rows(ms: list[int], sweep: bool, shapes: tuple[str, ...] | None = None) -> list[dict]:
    """Check and time every (shape, format, M); `shapes` limits the shapes (names of GEMV_SHAPES)."""
    from flint_kernels import gemv_triton as gt
    from flint_kernels.linear import linear_fp32_out_ref, linear_ref, weight_nbytes

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (n, k) in GEMV_SHAPES.items():
        if shapes is not None and name not in shapes:
            continue
        fp32_out = name == "lm_head"
        fast = gt.lm_head if fp32_out else gt.linear
        ref = linear_fp32_out_ref if fp32_out else linear_ref
        for fmt in ("bf16", "nvfp4"):
            if fmt == "bf16":
                one = (torch.randn(n, k, generator=gen, device="cuda") / math.sqrt(k)).bfloat16()
                copies = [one] + [one.clone() for _ in range(copies_for(weight_nbytes(one)) - 1)]
            else:
                segs = (4096, 512, 512) if name == "qkv" else (n // 2, n // 2) if "gate_up" in name else None
                copies = [random_nvfp4((), n, k, gen, segs) for _ in range(copies_for(n * k * 9 // 16))]
            for m in ms:
                if (fmt == "bf16" or name == "lm_head") and m > gt.SMALL_M:
                    continue  # dense prefill is cuBLAS; the lm_head only sees the last tokens
                try:
                    row = gemv_row(name, fmt, m, copies, fast, ref, fp32_out, sweep, gen)
                except Exception as e:  # keep timing the other rows; the failure is reported
                    err = f"{type(e).__name__}: {e}"[:300]
                    row = {"op": name, "fmt": fmt, "M": m, "rel_err": math.inf, "error": err}
                rows.append(row)
                print_row(row)
            del copies
            torch.cuda.empty_cache()
    return rows


def gemv_row(name, fmt, m, copies, fast, ref, fp32_out, sweep, gen) -> dict:
    """Check and time one (shape, format, M)."""
    from flint_kernels import gemv_triton as gt
    from flint_kernels.linear import NVFP4Weight, linear_fp32_out_ref, linear_ref, weight_nbytes

    n, k = GEMV_SHAPES[name]
    wbytes = weight_nbytes(copies[0])
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    y = fast(x, copies[0])
    if isinstance(copies[0], NVFP4Weight):
        dense = copies[0].dequantize(torch.bfloat16)
        y_ref = (gt.linear_fp32_out_ref(x, dense) * copies[0].column_scale()).to(y.dtype)
        del dense
    else:
        y_ref = ref(x, copies[0])
    err = rel_err(y, y_ref)
    moved = wbytes + x.numel() * 2 + y.numel() * y.element_size()
    t_fast = time_graph([lambda w=w: fast(x, w) for w in copies])
    row = {
        "op": name, "fmt": fmt, "M": m, "N": n, "K": k, "rel_err": err,
        "ms": t_fast, "GB/s": moved / t_fast / 1e6, "TFLOP/s": 2 * m * n * k / t_fast / 1e9,
    }  # fmt: skip
    if fmt == "bf16":
        t_ref = time_graph([lambda w=w: ref(x, w) for w in copies])
        row["torch_ms"] = t_ref
        row["torch_GB/s"] = moved / t_ref / 1e6
    else:
        dense_copies = [w.dequantize(torch.bfloat16, with_global=True) for w in copies[:2]]
        bf16_ref = linear_fp32_out_ref if fp32_out else linear_ref
        row["torch_bf16_ms"] = time_graph([lambda d=d: bf16_ref(x, d) for d in dense_copies])
        del dense_copies
        if m >= gt.DEQUANT_MIN_M and not fp32_out:  # the FP32 output and scale pass the alpha epilogue replaced
            passed = [lambda w=w: gt.dequant_matmul(x, w, False, alpha=False) for w in copies]
            row["scale_pass_rel_err"] = rel_err(passed[0](), y_ref)
            row["scale_pass_ms"] = time_graph(passed)
    if sweep and ((m in (1, 8, 64) and name in SWEEP_SHAPES) or (m > 64 and name in ("qkv", "dense_gate_up"))):
        row["sweep"] = gemv_sweep(x, copies, fp32_out, moved, y_ref)
    return row


def gemv_candidates(m: int, nvfp4: bool) -> dict:
    """The tile configurations the sweep times at M rows, by name ("dequant": dequantise + cuBLAS)."""
    from flint_kernels import gemv_triton as gt

    tc = gt.TileConfig
    bm = max(16, 1 << (m - 1).bit_length())
    cands: dict[str, tc | str] = {}
    if m == 1 and nvfp4:
        for bn, bk, nw in ((8, 1024, 4), (16, 512, 4), (8, 2048, 4), (16, 1024, 4), (16, 1024, 8), (4, 1024, 4)):
            cands[f"fma n{bn} k{bk} w{nw}"] = tc(bn, 1, bk, False, nw, 1)
        cands["dot n64 k128"] = tc(64, 16, 128, True, 4, 3)
    elif m == 1:
        for bn, bk, nw in ((8, 512, 4), (16, 512, 4), (8, 1024, 4), (16, 1024, 4), (4, 1024, 4)):
            cands[f"fma n{bn} k{bk} w{nw}"] = tc(bn, 1, bk, False, nw, 1)
        cands["dot n64 k128 s3"] = tc(64, 16, 128, True, 4, 3)
    elif m <= gt.SMALL_M:
        cands["dot n64 k128 s3"] = tc(64, bm, 128, True, 4, 3)
        cands["dot n64 k256 s3"] = tc(64, bm, 256, True, 4, 3)
        cands["dot n32 k128 s3"] = tc(32, bm, 128, True, 4, 3)
        cands["dot n64 k128 s5"] = tc(64, bm, 128, True, 4, 5)
        if nvfp4 and gt.WORDS_SUPPORTED:
            cands["words n64 k128 s3"] = tc(64, bm, 128, True, 4, 3, words=True)
        if nvfp4:  # NVFP4 decoded as packed BF16 pairs (FMA.BF16X2), about two instructions a value
            cands["packed n64 k128 s3"] = tc(64, bm, 128, True, 4, 3, packed=True)
            cands["packed n64 k256 s3"] = tc(64, bm, 256, True, 4, 3, packed=True)
            cands["packed n128 k128 w8 s3"] = tc(128, bm, 128, True, 8, 3, packed=True)
    else:
        cands["fused n128 m128 k64 w8"] = tc(128, 128, 64, True, 8, 3)
        cands["fused n128 m64 k64 w4"] = tc(128, 64, 64, True, 4, 3)
        cands["fused n64 m128 k128 w4"] = tc(64, 128, 128, True, 4, 3)
        cands["dequant+cublas"] = "dequant"  # each segment's global scale as cuBLAS's alpha
        cands["dequant+cublas fp32+scale pass"] = "dequant_pass"
    return cands


def gemv_sweep(x: torch.Tensor, copies: list, fp32_out: bool, moved: int, y_ref: torch.Tensor) -> dict:
    """Alternative tile configurations (GB/s, or TFLOP/s for M > 64), to pick the tiles in the tuning table.

    A configuration whose result is off the reference (rel. error >= 1e-2) is reported as such, not timed."""
    from flint_kernels import gemv_triton as gt
    from flint_kernels.linear import NVFP4Weight

    m, k = x.shape
    n = copies[0].shape[0]
    out = {}
    for key, c in gemv_candidates(m, isinstance(copies[0], NVFP4Weight)).items():
        try:
            if c in ("dequant", "dequant_pass"):
                calls = [lambda w=w, a=c == "dequant": gt.dequant_matmul(x, w, fp32_out, alpha=a) for w in copies]
            else:
                calls = [lambda w=w, c=c: gt._matmul(x, w, fp32_out, config=c) for w in copies]
            err = rel_err(calls[0](), y_ref)
            if not err < 1e-2:
                out[key] = f"rel_err {err:.2e}"
                continue
            t = time_graph(calls)
            out[key] = round(moved / t / 1e6, 1) if m <= gt.SMALL_M else round(2 * m * n * k / t / 1e9, 1)
        except Exception as e:  # a config the compiler rejects (e.g. out of shared memory)
            out[key] = f"error: {type(e).__name__}"
    return out


def moe_weights(fmt: str, gen: torch.Generator):
    from flint_kernels.linear import NVFP4Weight, weight_nbytes

    if fmt == "bf16":
        w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, device="cuda") / math.sqrt(HIDDEN)).bfloat16()
        w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=gen, device="cuda") / math.sqrt(INTER)).bfloat16()
    else:
        w13 = random_nvfp4((EXPERTS,), 2 * INTER, HIDDEN, gen, (INTER, INTER))
        w2 = random_nvfp4((EXPERTS,), HIDDEN, INTER, gen)
    assert isinstance(w13, torch.Tensor | NVFP4Weight)
    return w13, w2, weight_nbytes(w13) + weight_nbytes(w2)


def routing(t: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.rand(t, EXPERTS, generator=gen, device="cuda")
    w, ids = torch.topk(scores, TOPK, dim=-1)
    return (w / w.sum(-1, keepdim=True)).float(), ids


def moe_rows(
    ts: list[int], sweep: bool, formats: tuple[str, ...] = ("bf16", "nvfp4"), match: tuple[str, ...] = ()
) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for fmt in formats:
        w13, w2, stack_bytes = moe_weights(fmt, gen)
        per_expert = stack_bytes / EXPERTS
        ncopies = 2 if fmt == "bf16" else 4
        stacks = [(w13, w2)] + [moe_weights(fmt, gen)[:2] for _ in range(ncopies - 1)]
        for t in ts:
            try:
                row = moe_row(fmt, t, stacks, per_expert, sweep, gen, match)
            except Exception as e:  # keep timing the other rows; the failure is reported
                row = {"op": "moe", "fmt": fmt, "T": t, "rel_err": math.inf, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print_row(row)
        del stacks, w13, w2
        torch.cuda.empty_cache()
    return rows


def moe_row(
    fmt: str, t: int, stacks: list, per_expert: float, sweep: bool, gen: torch.Generator, match: tuple[str, ...] = ()
) -> dict:
    """Check and time one (format, T); the sweep times the candidates whose name holds one of `match` (all if none)."""
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe import moe_ref

    w13, w2 = stacks[0]
    x = torch.randn(t, HIDDEN, generator=gen, device="cuda").bfloat16()
    tw, ids = routing(t, gen)
    y = mt.moe(x, tw, ids, w13, w2)
    err = rel_err(y, moe_ref(x, tw, ids, w13, w2))
    distinct = torch.unique(ids).numel()
    moved = distinct * per_expert + x.numel() * 2 * 2
    flops = 2 * t * TOPK * 3 * HIDDEN * INTER
    calls = [lambda s=s: mt.moe(x, tw, ids, s[0], s[1]) for s in stacks]
    t_fast = time_graph(calls, reps=4 if t > 64 else None)
    row = {
        "op": "moe", "fmt": fmt, "T": t, "distinct_experts": distinct, "rel_err": err, "ms": t_fast,
        "GB/s": moved / t_fast / 1e6, "TFLOP/s": flops / t_fast / 1e9,
    }  # fmt: skip
    if t <= 64 or fmt == "bf16":
        row["torch_ref_ms"] = time_eager(lambda: moe_ref(x, tw, ids, w13, w2))
    if sweep:
        row["sweep"] = moe_sweep(x, tw, ids, stacks, moved, t, match)
    return row


def moe_candidates(t: int) -> dict:
    """The paths and tiles the sweep times at T tokens, by name: (decode_max_tokens that forces the path, tiles,
    dequant_min_tokens: 0 runs NVFP4 experts from BF16 copies, 10**9 decodes them in registers)."""
    from flint_kernels import moe_triton as mt

    mc = mt.MoEConfig
    cands: dict[str, tuple] = {}
    dec, grp, regs = 10**9, 0, 10**9
    if t <= 64:
        cands["dec fma i8 k1024"] = (dec, mc(1, 8, 1024, 8, 512, False, 4, 1), regs)
        cands["dec fma i8 k2048"] = (dec, mc(1, 8, 2048, 8, 512, False, 4, 1), regs)
        cands["dec fma i4 k2048"] = (dec, mc(1, 4, 2048, 8, 512, False, 4, 1), regs)
        cands["dec fma i32 k512"] = (dec, mc(1, 32, 512, 32, 512, False, 4, 1), regs)
        cands["dec fma i16 k512"] = (dec, mc(1, 16, 512, 16, 512, False, 4, 1), regs)
        cands["dec dot i16 k128"] = (dec, mc(16, 16, 128, 32, 128, True, 4, 3), regs)
        # More warps a program: the NVFP4 FMA tiles hold ~250 registers a thread at 4 warps (ncu: 12.5% occupancy).
        cands["dec fma i32 k512 w8"] = (dec, mc(1, 32, 512, 32, 512, False, 8, 1), regs)
        cands["dec fma i64 k512 w8"] = (dec, mc(1, 64, 512, 64, 512, False, 8, 1), regs)
        cands["dec fma i32 k1024 w8"] = (dec, mc(1, 32, 1024, 32, 512, False, 8, 1), regs)
        cands["dec fma i16 k512 w2"] = (dec, mc(1, 16, 512, 16, 512, False, 2, 1), regs)
        # NVFP4 on tensor cores decoded as packed BF16 pairs (FMA.BF16X2; BF16 weights ignore the flag).
        cands["dec dot i16 k128 packed"] = (dec, mc(16, 16, 128, 32, 128, True, 4, 3, packed=True), regs)
        # BF16's decode path from 3 tokens is the dot tiles above; its down launch reads at ~55% of the copy rate
        # at batch 32 (H200 profile, 2026-11-30), so wider/deeper down tiles and other gate_up tiles are timed too.
        cands["dec dot i16 k128 / n64 k128"] = (dec, mc(16, 16, 128, 64, 128, True, 4, 3), regs)
        cands["dec dot i16 k128 / n16 k256"] = (dec, mc(16, 16, 128, 16, 256, True, 4, 3), regs)
        cands["dec dot i16 k128 / n32 k256"] = (dec, mc(16, 16, 128, 32, 256, True, 4, 3), regs)
        cands["dec dot i16 k256 / n32 k256"] = (dec, mc(16, 16, 256, 32, 256, True, 4, 3), regs)
        cands["dec dot i32 k128 / n64 k128"] = (dec, mc(16, 32, 128, 64, 128, True, 4, 3), regs)
        cands["dec dot i16 k128 / n32 k128 s4"] = (dec, mc(16, 16, 128, 32, 128, True, 4, 4), regs)
        cands["dec dot i16 k128 / n32 k128 w2"] = (dec, mc(16, 16, 128, 32, 128, True, 2, 3), regs)
        cands["dec dot i16 k512 / n32 k512 s2"] = (dec, mc(16, 16, 512, 32, 512, True, 4, 2), regs)
        cands["dec dot i32 k64 / n128 k64"] = (dec, mc(16, 32, 64, 128, 64, True, 4, 3), regs)
        # NVFP4 gate_up expert-major (each weight decoded once for two of an expert's pairs; the down launch per
        # pair as in "dec fma i16 k512 w2"). BF16 weights ignore the flag. Tiles without register spills on sm_90.
        cands["dec expert i16 k256 w2"] = (dec, mc(1, 16, 256, 16, 512, False, 2, 1, expert_major=True), regs)
        cands["dec expert i16 k512 w4"] = (dec, mc(1, 16, 512, 16, 512, False, 4, 1, expert_major=True), regs)
        cands["dec expert i8 k512 w2"] = (dec, mc(1, 8, 512, 16, 512, False, 2, 1, expert_major=True), regs)
        # Expert-major on tensor cores: the grouped launches over blocks found in the unsorted ids (no sort launches;
        # each expert's weights read once per tile for all its pairs, against once per pair on the decode path).
        em = {"expert_major": True}
        cands["dec dot expert i32 k128 / n64 k128"] = (dec, mc(16, 32, 128, 64, 128, True, 4, 3, **em), regs)
        cands["dec dot expert i16 k128 / n32 k128"] = (dec, mc(16, 16, 128, 32, 128, True, 4, 3, **em), regs)
        cands["dec dot expert i64 k64 / n128 k64"] = (dec, mc(16, 64, 64, 128, 64, True, 4, 3, **em), regs)
        cands["dec dot expert i32 k256 / n64 k256"] = (dec, mc(16, 32, 256, 64, 256, True, 4, 3, **em), regs)
        cands["dec dot expert i64 k64 / n128 k64 s4"] = (dec, mc(16, 64, 64, 128, 64, True, 4, 4, **em), regs)
        cands["dec dot expert i64 k64 / n64 k64"] = (dec, mc(16, 64, 64, 64, 64, True, 4, 3, **em), regs)
        cands["dec dot expert i64 k128 / n128 k128"] = (dec, mc(16, 64, 128, 128, 128, True, 4, 3, **em), regs)
        cands["dec dot expert i128 k64 / n128 k64 w8"] = (dec, mc(16, 128, 64, 128, 64, True, 8, 3, **em), regs)
        cands["dec dot expert i64 k64 / n256 k64 w8"] = (dec, mc(16, 64, 64, 256, 64, True, 8, 3, **em), regs)
        cands["dec dot expert i64 k64 / n128 k64 w2"] = (dec, mc(16, 64, 64, 128, 64, True, 2, 3, **em), regs)
        # The installed BF16 tiles with each token's slots summed in the down launch (no reduce launch).
        cands["dec dot expert i64 k128 / n128 k128 slots"] = (
            dec, mc(16, 64, 128, 128, 128, True, 4, 3, expert_major=True, slots_in_down=True), regs
        )  # fmt: skip
    # Small-group tiles at every T: above 64 tokens the groups are still small (6 * T / 256 pairs per expert).
    cands["grp m16 i32 k128"] = (grp, mc(16, 32, 128, 64, 128, True, 4, 3), regs)
    cands["grp m16 i64 k64"] = (grp, mc(16, 64, 64, 128, 64, True, 4, 3), regs)
    cands["grp m32 i64 k64"] = (grp, mc(32, 64, 64, 128, 64, True, 4, 3), regs)
    cands["grp m16 i64 k64 packed"] = (grp, mc(16, 64, 64, 128, 64, True, 4, 3, packed=True), regs)
    cands["grp m32 i64 k128 packed"] = (grp, mc(32, 64, 128, 128, 128, True, 4, 3, packed=True), regs)
    if t > 64:
        cands["grp m128 k64 w8"] = (grp, mc(128, 64, 64, 128, 64, True, 8, 3), regs)
        cands["grp m64 k64 w8"] = (grp, mc(64, 64, 64, 128, 64, True, 8, 3), regs)
        cands["grp m128 k128 w8"] = (grp, mc(128, 64, 128, 128, 128, True, 8, 3), regs)
        cands["grp m64 k64 w4"] = (grp, mc(64, 64, 64, 64, 64, True, 4, 3), regs)
        cands["grp m64 k64 w4 packed"] = (grp, mc(64, 64, 64, 64, 64, True, 4, 3, packed=True), regs)
        cands["grp m128 k64 w8 packed"] = (grp, mc(128, 64, 64, 128, 64, True, 8, 3, packed=True), regs)
        # NVFP4 experts copied to BF16 for the call, then the BF16 grouped GEMM (the same as the rows above for BF16).
        cands["grp dq m128 k64 w8"] = (grp, mc(128, 64, 64, 128, 64, True, 8, 3), 0)
        cands["grp dq m64 k64 w8"] = (grp, mc(64, 64, 64, 128, 64, True, 8, 3), 0)
    if t >= 2048:
        # Prefill-sized groups (8K tokens: 192 pairs an expert). The installed m128 k64 w8 tiles ran gate_up at ~340
        # and down at ~245 TFLOP/s in the 8K profile (2026-11-30): wider weight tiles, deeper pipelines.
        # Random routing gives ~192 +- 14 pairs an expert at 8K: 128-row blocks pad each expert to 256 rows (a third
        # of the MMAs wasted), 64-row blocks to ~200, so 64-row tiles with wider weight tiles are timed too.
        # Each also as "grp dq": NVFP4 from the layer's BF16 copy (the path NVFP4 takes from dequant_min_tokens).
        prefill = {
            "m128 i128 k64 w8": mc(128, 128, 64, 128, 64, True, 8, 3),
            "m64 i128 k64 w8": mc(64, 128, 64, 128, 64, True, 8, 3),
            "m128 k64 / n256 k64 w8": mc(128, 64, 64, 256, 64, True, 8, 3),
            "m128 k64 w8 s4": mc(128, 64, 64, 128, 64, True, 8, 4),
            "m128 i128 k64 / n256 k64 w8 s4": mc(128, 128, 64, 256, 64, True, 8, 4),
            "m64 i128 k64 / n256 k64 w8": mc(64, 128, 64, 256, 64, True, 8, 3),
            "m64 i128 k64 w8 s4": mc(64, 128, 64, 128, 64, True, 8, 4),
            "m64 i64 k64 / n128 k64 w4 s4": mc(64, 64, 64, 128, 64, True, 4, 4),
            "m64 i128 k64 / n128 k64 w4": mc(64, 128, 64, 128, 64, True, 4, 3),
            "m64 i64 k128 / n128 k128 w4": mc(64, 64, 128, 128, 128, True, 4, 3),
        }
        for name, c in prefill.items():
            cands[f"grp {name}"] = (grp, c, regs)
            cands[f"grp dq {name}"] = (grp, c, 0)
    return cands


def moe_sweep(x, tw, ids, stacks, moved: float, t: int, match: tuple[str, ...] = ()) -> dict:
    """Alternative MoE paths and tiles (us per call), to pick the decode/grouped crossover and the tiles.

    A configuration whose result is off `moe_ref` (rel. error >= 1e-2) is reported as such, not timed."""
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe import moe_ref

    y_ref = moe_ref(x, tw, ids, stacks[0][0], stacks[0][1])
    out = {}
    for name, (dmt, c, dq) in moe_candidates(t).items():
        if match and not any(m in name for m in match):
            continue
        try:
            calls = [lambda s=s, c=c, d=dmt, q=dq: mt.fused_moe(x, tw, ids, s[0], s[1], decode_max_tokens=d, config=c,
                                                                 dequant_min_tokens=q)
                     for s in stacks]  # fmt: skip
            err = rel_err(calls[0](), y_ref)
            if not err < 1e-2:
                out[name] = f"rel_err {err:.2e}"
                continue
            ms = time_graph(calls, reps=4 if t > 64 else None)
            out[name] = round(ms * 1000, 2)  # us
        except Exception as e:
            out[name] = f"error: {type(e).__name__}: {str(e)[:80]}"
    return out


def shared_weights(fmt: str, gen: torch.Generator) -> tuple:
    """Flint's shared expert (gate|up [2048, 2048], down [2048, 1024]) in the format of the routed ones."""
    i_s = 2 * INTER
    if fmt == "bf16":
        gu = (torch.randn(2 * i_s, HIDDEN, generator=gen, device="cuda") / math.sqrt(HIDDEN)).bfloat16()
        dn = (torch.randn(HIDDEN, i_s, generator=gen, device="cuda") / math.sqrt(i_s)).bfloat16()
        return gu, dn
    return random_nvfp4((), 2 * i_s, HIDDEN, gen, (i_s, i_s)), random_nvfp4((), HIDDEN, i_s, gen)


def shared_tiles() -> dict:
    """The decode tiles `shared_rows` times with the shared expert folded in, by name (its rows say "folded NAME")."""
    from flint_kernels import moe_triton as mt

    mc = mt.MoEConfig
    return {
        "fma i8 k1024 / n8 k512": mc(1, 8, 1024, 8, 512, False, 4, 1),
        "fma i16 k512 / n16 k512": mc(1, 16, 512, 16, 512, False, 4, 1),
        "fma i32 k512 / n32 k512": mc(1, 32, 512, 32, 512, False, 4, 1),
        "dot i16 k128 / n32 k128": mc(16, 16, 128, 32, 128, True, 4, 3),
        # Expert-major blocks with the slots summed in the down launch: the shared expert as blocks of 16 tokens.
        "dot expert i64 k128 / n128 k128 slots": mc(16, 64, 128, 128, 128, True, 4, 3, expert_major=True,
                                                    slots_in_down=True),
    }  # fmt: skip


def shared_rows(ts: list[int]) -> list[dict]:
    """Routed + shared expert per decode batch: folded into the MoE launches vs run apart, and decode tiles folded."""
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe import moe_ref

    tiles = shared_tiles()
    gen = torch.Generator(device="cuda").manual_seed(2)
    rows = []
    for fmt in ("bf16", "nvfp4"):
        stacks = [(*moe_weights(fmt, gen)[:2], *shared_weights(fmt, gen)) for _ in range(2 if fmt == "bf16" else 4)]
        for t in ts:
            x = torch.randn(t, HIDDEN, generator=gen, device="cuda").bfloat16()
            tw, ids = routing(t, gen)
            w13, w2, gu, dn = stacks[0]
            ref = moe_ref(x, tw, ids, w13, w2, (gu, dn))
            row: dict = {"op": "moe+shared", "fmt": fmt, "T": t}
            variants = {"apart (default tiles)": (None, 0), "folded (default tiles)": (None, 64)}
            variants.update({f"folded {k}": (c, 64) for k, c in tiles.items()})
            for name, (cfg, fold) in variants.items():
                try:
                    out = mt.fused_moe(x, tw, ids, w13, w2, config=cfg, shared=(gu, dn), fold_max_tokens=fold)
                    err = rel_err(out, ref)
                    calls = [
                        lambda s=s, c=cfg, f=fold, a=(x, tw, ids): mt.fused_moe(
                            *a, s[0], s[1], config=c, shared=(s[2], s[3]), fold_max_tokens=f
                        )
                        for s in stacks
                    ]
                    row[name] = round(time_graph(calls) * 1000, 2) if err < 1e-2 else f"rel_err {err:.2e}"
                except Exception as e:
                    row[name] = f"error: {type(e).__name__}: {str(e)[:80]}"
            print(json.dumps(row))
            rows.append(row)
        del stacks
        torch.cuda.empty_cache()
    return rows


def print_row(row: dict) -> None:
    keys = (
        "op",
        "fmt",
        "M",
        "T",
        "error",
        "rel_err",
        "ms",
        "GB/s",
        "TFLOP/s",
        "torch_ms",
        "torch_bf16_ms",
        "torch_ref_ms",
        "scale_pass_ms",
    )
    parts = []
    for k in keys:
        if k in row:
            v = row[k]
            parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    if "sweep" in row:
        parts.append(f"sweep={row['sweep']}")
    print("  ".join(parts), flush=True)


def print_table(rows: list[dict]) -> None:
    """One line per measured row: time against the torch baseline, bandwidth and (for large M) TFLOP/s."""
    head = f"{'op':<15}{'fmt':<7}{'M/T':>6}{'us':>10}{'torch us':>10}{'GB/s':>9}{'TFLOP/s':>9}{'rel_err':>10}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['op']:<15}{r['fmt']:<7}{r.get('M', r.get('T')):>6}  error: {r['error'][:60]}")
            continue
        base = r.get("torch_ms", r.get("torch_bf16_ms", r.get("torch_ref_ms")))
        base_us = f"{base * 1000:10.1f}" if base is not None else f"{'-':>10}"
        print(
            f"{r['op']:<15}{r['fmt']:<7}{r.get('M', r.get('T')):>6}{r['ms'] * 1000:10.1f}{base_us}"
            f"{r['GB/s']:9.0f}{r['TFLOP/s']:9.1f}{r['rel_err']:10.2e}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help="also time alternative tile configurations")
    ap.add_argument("--only", choices=("gemv", "moe", "shared"), help="run one part")
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 8, 32, 64, 256, 1024, 8192], help="GEMV rows")
    ap.add_argument("--ts", type=int, nargs="+", default=[1, 8, 32, 64, 8192], help="MoE tokens")
    ap.add_argument("--formats", nargs="+", choices=("bf16", "nvfp4"), default=["bf16", "nvfp4"], help="MoE weights")
    ap.add_argument("--match", nargs="+", default=[], help="sweep only MoE candidates whose name holds one of these")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "kernels_moe_gemv.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernels_moe_gemv: needs a CUDA GPU (the Triton interpreter is far too slow to time)", file=sys.stderr)
        return 1
    start = time.time()
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    result["triton"] = triton.__version__
    failures = []
    if args.only in (None, "gemv"):
        result["gemv"] = gemv_rows(args.ms, args.sweep)
        failures += [r for r in result["gemv"] if not r["rel_err"] < 1e-2]
    if args.only in (None, "moe"):
        result["moe"] = moe_rows(args.ts, args.sweep, tuple(args.formats), tuple(args.match))
        failures += [r for r in result["moe"] if not r["rel_err"] < 1e-2]
    if args.only == "shared":
        result["moe_shared_us"] = shared_rows([t for t in args.ts if t <= 64])
        failures += [r for r in result["moe_shared_us"] if any(str(v).startswith(("rel", "err")) for v in r.values())]
    result["seconds"] = time.time() - start
    print_table(result.get("gemv", []) + result.get("moe", []))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out} in {result['seconds']:.0f} s; {len(failures)} correctness failures")
    for r in failures:
        print("FAILED:", r)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
