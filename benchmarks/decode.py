"""Decode and prefill latency of Flint with random weights built on the GPU (BF16 and NVFP4 W4A16).

    python benchmarks/decode.py                      # full model, H200-sized sweep
    python benchmarks/decode.py --preset tiny --device cpu --kernels reference --batches 1 2 --contexts 64

Measures in one run: copy bandwidth; a whole-model check of the fused path against the plain PyTorch path
(logits and greedy tokens); decode step latency (CUDA-graph replay, median) per batch and context; CUDA kernels
per decode step and time per kernel family (torch profiler); an 8K-token prefill; the plain path's step; and the
bandwidth floor from the bytes a step must move. Prints a table and writes JSON (benchmarks/results/decode.json,
or --out). Results are written after every measurement so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
from fast_path_accuracy import (  # a sibling script: benchmarks/ is on sys.path
    agreement,
    forced,
    forced_agreement,
    greedy,
    rel_err,
)
from flint_kernels import precompile, tuning
from flint_kernels.dispatch import REFERENCE, select_kernels
from flint_kernels.fast import fast_kernels, parse_ops

from flint_engine.config import FlintConfig, preset
from flint_engine.forward_batch import ForwardBatch
from flint_engine.kv_cache import KVCache
from flint_engine.model import FlintModel
from flint_engine.weights import FlintWeights, random_weights

RESULTS = Path(__file__).parent / "results"
# Top-2 gap (log-probability) of the plain path under which a teacher-forced difference is a near-tie (the random
# model's free-running divergences came at gaps of 0.016-0.057).
TIE = 0.1

FAMILIES = (
    ("nvfp4 dequant", ("dequant", "scale_rows")),
    ("attention", ("attention", "attn", "flash", "decode", "prefill", "combine")),
    ("moe", ("moe",)),
    ("router", ("router", "topk")),
    ("norm", ("norm",)),
    ("rope", ("rope",)),
    ("gemv/gemm", ("gemv", "gemm", "linear", "matmul", "nvjet", "cutlass", "sm90", "xmma", "dot", "nvfp4_mma")),
    ("activation", ("silu",)),
)


def family(kernel: str) -> str:
    """The profile's family of a kernel name: the first in FAMILIES with a key in the name (so the MoE's MMA kernels
    count as MoE, the MMA linear's as GEMV/GEMM), or "other"."""
    name = kernel.lower()
    return next((f for f, keys in FAMILIES if any(k in name for k in keys)), "other")


class Report:
    def __init__(self, path: Path, meta: dict[str, Any], deadline: float) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta, "rows": [], "checks": [], "notes": []}
        self.deadline = deadline

    def add(self, kind: str, row: dict[str, Any]) -> None:
        self.data[kind].append(row)
        print(json.dumps(row), flush=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2))

    def time_left(self) -> float:
        return self.deadline - time.monotonic()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev: torch.device, reps: int, warmup: int = 2) -> float:
    """Median milliseconds of `fn` (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def ab_rounds(
    g, step, variant, batch, dev: torch.device, reps: int, tuning_files: list[str] | None = None, rounds: int = 3
) -> dict:
    """Main graph vs the variant's, captured once under each of `tuning_files` as the tuning table (or once under
    the default table when none is given), in alternating rounds (same process, same order each round): medians.
    The first variant's rounds are `ab_variant_ms`; with several files each one's are in `ab_variants`."""
    graphs = []
    saved = os.environ.get(tuning.ENV)
    for tuning_file in tuning_files or [None]:
        if tuning_file:
            os.environ[tuning.ENV] = tuning_file  # read per launch: the variant's graph keeps the tiles it captured
        try:
            step(variant, batch)
            sync(dev)
            gv = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gv):
                step(variant, batch)
            graphs.append(gv)
        finally:
            if saved is None:
                os.environ.pop(tuning.ENV, None)
            else:
                os.environ[tuning.ENV] = saved
    main_ms: list[float] = []
    var_ms: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        main_ms.append(timed(g.replay, dev, reps))
        for times, gv in zip(var_ms, graphs):
            times.append(timed(gv.replay, dev, reps))
    out: dict[str, Any] = {
        "ab_main_ms": [round(t, 4) for t in main_ms],
        "ab_variant_ms": [round(t, 4) for t in var_ms[0]],
    }
    if tuning_files and len(tuning_files) > 1:
        out["ab_variants"] = [
            {"tuning_file": f, "ms": [round(t, 4) for t in times]} for f, times in zip(tuning_files, var_ms)
        ]
    return out


def copy_bandwidth(dev: torch.device) -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    n = 2**30 if dev.type == "cuda" else 2**24
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), dev, reps=20)
    return 2 * n / (ms / 1e3)


def decode_batch(cfg: FlintConfig, b: int, ctx: int, bs: int, dev: torch.device, gen: torch.Generator) -> ForwardBatch:
    """B sequences each decoding its token at position ctx-1; distinct blocks per sequence in both pools."""
    nb = -(-ctx // bs)
    full = torch.arange(b * nb, dtype=torch.int32).reshape(b, nb)
    window = -(-cfg.sliding_window // bs) + 1
    first = max(0, (ctx - cfg.sliding_window)) // bs
    sliding = torch.full((b, nb), -1, dtype=torch.int32)
    for i in range(b):
        sliding[i, first:nb] = torch.arange(i * window, i * window + (nb - first), dtype=torch.int32)
    pos = ctx - 1
    blk, off = divmod(pos, bs)
    return ForwardBatch(
        input_ids=torch.randint(0, cfg.vocab_size, (b,), generator=gen).to(dev),
        positions=torch.full((b,), pos, dtype=torch.int64, device=dev),
        query_start=list(range(b + 1)),
        seq_lens=[ctx] * b,
        full_block_tables=full.to(dev),
        sliding_block_tables=sliding.to(dev),
        full_slots=(full[:, blk].long() * bs + off).to(dev),
        sliding_slots=(sliding[:, blk].long() * bs + off).to(dev),
        logits_indices=torch.arange(b, device=dev),
    )


def prefill_batches(ids: list[int], bs: int, dev: torch.device, chunk: int = 0) -> list[ForwardBatch]:
    """One prompt's prefill as the engine's chunked prefill runs it: consecutive chunks of `chunk` tokens (0: one),
    each attending to the cache the earlier ones wrote, both pools in consecutive blocks; logits of each last row."""
    n = len(ids)
    chunk = chunk or n
    table = torch.arange(-(-n // bs), dtype=torch.int32, device=dev)[None]
    batches = []
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        slots = torch.arange(start, end, dtype=torch.int64, device=dev)
        batches.append(
            ForwardBatch(
                torch.tensor(ids[start:end], device=dev),
                torch.arange(start, end, device=dev),
                [0, end - start],
                [end],
                table,
                table,
                slots,
                slots,
                torch.tensor([end - start - 1], device=dev),
            )
        )
    return batches


def step_bytes(cfg: FlintConfig, w: FlintWeights, b: int, ctx: int) -> float:
    """Bytes a decode step must read: every non-expert weight, the experts B tokens touch (uniform routing), the
    embedding rows, and the KV of every sequence. An NVFP4 weight counts its own codes and scales only: the MMA
    kernels read its ready scales or codes instead of those, not as well (`NVFP4Weight.extra_nbytes`)."""
    total = 0
    for t in w.tensors():
        total += t.numel() * t.element_size()
    total -= sum(nv.extra_nbytes for nv in w.nvfp4_weights())
    embed = w.embed.nbytes  # dense tensors and NVFP4Weight both report their bytes
    total += b * embed / cfg.vocab_size - embed
    for layer in w.layers:
        mlp = layer.mlp
        if hasattr(mlp, "experts_gate_up"):
            exp = 0
            for t in (mlp.experts_gate_up, mlp.experts_down):
                exp += t.nbytes - t.extra_nbytes if not isinstance(t, torch.Tensor) else t.numel() * t.element_size()
            distinct = cfg.num_experts * (1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** b)
            total -= exp * (1 - distinct / cfg.num_experts)
    kv_full = cfg.kv_bytes_per_token() * ctx * b
    kv_slide = cfg.sliding_kv_bytes_per_slot() * min(ctx, cfg.sliding_window) * b
    return total + kv_full + kv_slide


def count_kernels(fn, dev: torch.device) -> tuple[int, dict[str, float], list[dict[str, Any]]]:
    """Kernels one call of `fn` launches, GPU ms by family, and the kernels by name (count, total, mean)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(dev)
    families: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    n = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        n += 1
        fam = family(e.name)
        families[fam] = families.get(fam, 0.0) + e.device_time / 1e3
        by_name.setdefault(e.name[:80], []).append(e.device_time)
    kernels = [
        {"name": k, "count": len(v), "total_ms": round(sum(v) / 1e3, 4), "mean_us": round(sum(v) / len(v), 2)}
        for k, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    ]
    return n, {k: round(v, 4) for k, v in sorted(families.items(), key=lambda kv: -kv[1])}, kernels


def plans_that_fit(cfg: FlintConfig, plans: list[tuple[int, int]], bs: int, free: float) -> list[tuple[int, int]]:
    """The (batch, context) plans whose BF16 KV cache fits in `free` bytes: the full layers' tokens and 40 blocks of
    sliding slots a sequence."""
    per_tok, per_slot = cfg.kv_bytes_per_token(2), cfg.sliding_kv_bytes_per_slot()
    return [(b, c) for b, c in plans if b * c * per_tok + b * 40 * bs * per_slot < free]


def check_fast_vs_plain(
    fast: FlintModel, plain: FlintModel, cfg: FlintConfig, dev: torch.device, steps: int, batch: int, bs: int
) -> dict[str, Any]:
    """Prefill logits of both paths, then each path's engine greedy-decodes `steps` tokens (prefill + decode over
    the paged cache, as in serving); compare logits and tokens, free-running and with the fused path fed the plain
    path's tokens (teacher-forced: every step compared on the same context; a difference where the plain path's top
    two are within TIE is a near-tie). (fast_path_accuracy.py judges both against FP32.)"""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (37 + 11 * i,), generator=gen).tolist() for i in range(batch)]
    # Prefilled together (each weight dequantised once on the plain NVFP4 path, one batch shape for the fused one),
    # each sequence's logits to the host in turn: the batch's [tokens, 150144] FP32 logits at once did not fit beside
    # the BF16 weights on an 80 GB H100 at 8 sequences (fifty-eighth session). One sequence at a time, NVFP4's
    # prefill logits at 8 sequences took 232-342 s on an H100 (sixty-first session).
    t0 = time.monotonic()

    def progress(what: str) -> None:
        # Each phase as it ends: a call cut short by its time limit still says how far the check got (the plain
        # NVFP4 path dequantises at each use, and at 8 sequences 128 steps did not end within 420 s on an H100).
        print(f"check {batch} sequences: {what} after {time.monotonic() - t0:.1f} s", flush=True)

    lf = torch.cat(fast.forward_sequences(prompts, bs, to_host=True))
    lp = torch.cat(plain.forward_sequences(prompts, bs, to_host=True))
    progress("prefill logits of both paths")
    plain_tokens = greedy(plain, prompts, steps)
    progress(f"the plain path's {steps} greedy steps")
    greedy_cmp = agreement(greedy(fast, prompts, steps), plain_tokens)
    forced_cmp = forced_agreement(forced(fast, prompts, plain_tokens), plain_tokens, TIE)
    progress("the fused path free-running and teacher-forced")
    return {
        "batch": batch,
        "steps": steps,
        "prefill_logits_rel_err": rel_err(lf, lp.float()),
        "prefill_argmax_agreement": (lf.argmax(-1) == lp.argmax(-1)).float().mean().item(),
        "greedy_token_agreement": greedy_cmp["agreement"],
        "first_divergence_step": greedy_cmp["first_divergence"],
        "top2_gap_at_divergences": greedy_cmp["gap_at_divergences"],
        "forced_token_agreement": forced_cmp["agreement"],
        "forced_differ_beyond_tie": forced_cmp["differ_beyond_tie"],
        "forced_widest_gap_at_difference": forced_cmp["widest_gap_at_difference"],
        "tie": TIE,
    }


def run_format(
    fmt: str,
    cfg: FlintConfig,
    args: argparse.Namespace,
    dev: torch.device,
    bw: float,
    rep: Report,
    gen: torch.Generator,
) -> None:
    """Every measurement for one weight format (its tensors are freed when this returns)."""
    bs = 16
    total_mem = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else 1 << 40
    t0 = time.monotonic()
    weights = random_weights(
        cfg,
        torch.bfloat16 if dev.type == "cuda" else torch.float32,
        dev,
        seed=0,
        nvfp4_linears=fmt == "nvfp4",
        gain=args.gain,
    )
    sync(dev)
    wbytes = weights.nbytes()
    rep.data["notes"].append(f"{fmt}: built {wbytes / 1e9:.2f} GB of random weights in {time.monotonic() - t0:.1f} s")
    kernels = select_kernels(dev, weights.dtype, weights.dtype, args.kernels)
    fast = FlintModel(weights, kernels)
    if dev.type == "cuda" and kernels.name != "reference" and not args.no_precompile:
        # The shipped manifest's kernels compiled in parallel, as an engine start does: on a machine with an empty
        # Triton cache the warm-ups below would otherwise compile them one by one (minutes of a device call).
        report = precompile.run(dev, weights.kernel_profile())
        if report is not None:
            rep.data["notes"].append(f"{fmt}: {report.describe()}")
    # The A/B variant: the same weights under another fused-op list and/or tuning table, timed in alternation with
    # the main one.
    variant = None
    if args.ab_ops or args.ab_tuning_file:
        ops = parse_ops(args.ab_ops) if args.ab_ops else None
        variant = FlintModel(weights, fast_kernels(REFERENCE, ops))
    plain = FlintModel(weights, REFERENCE)
    # --- correctness: fused path against the plain path on the same weights
    for b in args.check_batches:
        if kernels.name == "reference" or args.check_steps <= 0 or rep.time_left() < 0:
            break
        rep.add("checks", {"format": fmt, **check_fast_vs_plain(fast, plain, cfg, dev, args.check_steps, b, bs)})
    # --- the KV cache for the largest decode configuration that fits next to the weights
    free = (total_mem - torch.cuda.memory_allocated(dev) - args.reserve_gib * 2**30) if dev.type == "cuda" else 1 << 40
    plans = [(b, c) for c in args.contexts for b in args.batches]
    fits = plans_that_fit(cfg, plans, bs, free)
    for b, c in sorted(set(plans) - set(fits)):
        rep.add("rows", {"format": fmt, "batch": b, "context": c, "skipped": "KV cache would not fit"})
    if fits:
        max_full = max(b * -(-c // bs) for b, c in fits)
        max_slide = max(b for b, _ in fits) * (-(-cfg.sliding_window // bs) + 1)
        cache = KVCache(cfg, max_full, max_slide, bs, weights.dtype, dev)
        cache.full_k.normal_()
        cache.full_v.normal_()
        cache.sliding_k.normal_()
        cache.sliding_v.normal_()
        use_graphs = dev.type == "cuda" and not args.no_graphs and kernels.name != "reference"
        for c in sorted({c for _, c in fits}):
            for b in sorted({b for b, cc in fits if cc == c}):
                if rep.time_left() < 0:
                    rep.data["notes"].append(f"deadline reached at {fmt} b{b} ctx{c}")
                    break
                batch = decode_batch(cfg, b, c, bs, dev, gen)

                def step(model: FlintModel = fast, batch: ForwardBatch = batch) -> torch.Tensor:
                    return model.compute_logits(model.forward(batch, cache)).argmax(-1)

                row: dict[str, Any] = {"format": fmt, "batch": b, "context": c, "kernels": kernels.name}
                graph_error = None
                captured: torch.cuda.CUDAGraph | None = None
                if use_graphs:
                    try:
                        step()
                        sync(dev)
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            step()
                        row["step_ms"] = round(timed(g.replay, dev, args.reps), 4)
                        row["cuda_graph"] = True
                        captured = g
                        if fast.weights_ahead is not None and fast.weights_ahead.last_forks:
                            # Off the step's critical path, and not in the eager step `kernels_per_step` counts.
                            row["side_stream_kernels"] = fast.weights_ahead.last_forks
                        if variant is not None:
                            row.update(ab_rounds(g, step, variant, batch, dev, args.reps, args.ab_tuning_file))
                    except Exception as exc:  # a non-capturable op: measure eagerly and say why
                        graph_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                        torch.cuda.synchronize(dev)
                if not use_graphs or graph_error is not None:
                    row["graph_error"] = graph_error
                    row["step_ms"] = round(timed(step, dev, max(3, args.reps // 5)), 4)
                    row["cuda_graph"] = False
                floor = step_bytes(cfg, weights, b, c) / bw * 1e3
                row["floor_ms"] = round(floor, 4)
                row["floor_fraction"] = round(floor / row["step_ms"], 3)
                row["tokens_per_s"] = round(b / row["step_ms"] * 1e3, 1)
                profiled = args.profile_batches if args.profile_batches is not None else [min(args.batches)]
                if dev.type == "cuda" and b in profiled and c == min(args.contexts):
                    # The graph's replay: its kernels as the step runs them (PDL overlaps, side-stream launches).
                    on_graph = args.profile_graph and captured is not None
                    row["profiled"] = "graph replay" if on_graph else "eager step"
                    row["kernels_per_step"], row["time_by_family_ms"], row["kernels_by_name"] = count_kernels(
                        captured.replay if on_graph and captured is not None else step, dev
                    )
                first = b == min(args.batches) and c == min(args.contexts)
                if dev.type == "cuda" and first and not args.no_plain_timing:
                    plain_ms = timed(lambda batch=batch: step(plain, batch), dev, 3, warmup=1)
                    row["plain_path_step_ms"] = round(plain_ms, 3)
                rep.add("rows", row)
        cache = None  # free the decode cache before the prefill's
    # --- prefill of one long prompt (eager: it is compute-bound), whole and in the engine's chunks
    for chunk in args.prefill_chunks if args.prefill else []:
        if rep.time_left() <= 0:
            break
        ids = torch.randint(0, cfg.vocab_size, (args.prefill,), generator=gen).tolist()
        batches = prefill_batches(ids, bs, dev, chunk)
        pcache = KVCache(cfg, -(-args.prefill // bs), -(-args.prefill // bs), bs, weights.dtype, dev)

        def prefill(batches: list[ForwardBatch] = batches, pcache: KVCache = pcache) -> torch.Tensor:
            for b in batches[:-1]:
                fast.forward(b, pcache)
            return fast.compute_logits(fast.forward(batches[-1], pcache)[-1:])

        ms = timed(prefill, dev, 3, warmup=1)
        flops = 2 * cfg.active_parameter_count() * args.prefill
        row = {
            "format": fmt,
            "prefill_tokens": args.prefill,
            "prefill_chunk": min(chunk, args.prefill) if chunk else args.prefill,
            "prefill_ms": round(ms, 2),
            "kernels": kernels.name,
            "linear_TFLOPs": round(flops / (ms / 1e3) / 1e12, 1),
        }
        if dev.type == "cuda":
            n, families, by_name = count_kernels(prefill, dev)
            row.update(prefill_kernels=n, prefill_time_by_family_ms=families, prefill_kernels_by_name=by_name[:30])
        rep.add("rows", row)
        del batches, pcache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="full")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (quick runs)")
    ap.add_argument("--formats", nargs="+", default=["bf16", "nvfp4"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 32768])
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument(
        "--prefill-chunks",
        type=int,
        nargs="+",
        default=[0],
        help="time the prefill in chunks of these many tokens, each a row (0: the whole prompt in one forward; the"
        " engine's default, --max-num-batched-tokens, is 2048)",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernels", default="auto", choices=["auto", "reference", "fast"])
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument(
        "--no-precompile",
        action="store_true",
        help="leave the kernel manifest's parallel precompile out (the warm-ups then compile every kernel in turn)",
    )
    ap.add_argument("--check-steps", type=int, default=32, help="greedy steps of the fused-vs-plain check (0: none)")
    ap.add_argument("--check-batches", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--gain",
        type=float,
        default=0.5,
        help="random-weight scale; at 1.0 a 49-layer random Flint is chaotic (a 1e-3 input change moves"
        " the logits 12%%), which would hide real errors behind rounding noise in the path check",
    )
    ap.add_argument(
        "--profile-batches",
        type=int,
        nargs="*",
        default=None,
        help="batches whose step is profiled by kernel (at the smallest context; default: the smallest batch)",
    )
    ap.add_argument(
        "--profile-graph",
        action="store_true",
        help="profile the captured graph's replay instead of an eager step (side-stream launches included, each kernel"
        " as long as it runs there)",
    )
    ap.add_argument(
        "--ab-ops",
        default=None,
        help="also time every graphed decode row with this fused-op list ($FLINT_FAST_OPS syntax, e.g."
        " 'all,-qkv_attention'), alternating with the default list",
    )
    ap.add_argument(
        "--ab-tuning-file",
        nargs="+",
        default=None,
        help="also time every graphed decode row with this tuning table (FLINT_TUNING_FILE) in the variant; several"
        " files: one variant each, all in the same alternating rounds",
    )
    ap.add_argument(
        "--no-plain-timing",
        action="store_true",
        help="do not time the plain PyTorch path's step (seconds a step at large batches: A/B runs leave it out)",
    )
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop starting new measurements after this")
    ap.add_argument(
        "--reserve-gib",
        type=float,
        default=6.0,
        help="GPU memory kept free beside the weights and the KV cache (activations, graphs, workspaces); a plan whose"
        " KV cache does not fit in the rest is skipped. BF16 on an 80 GB H100 leaves ~5 GiB beside its weights: 2 runs"
        " batch 1 at 1K there",
    )
    ap.add_argument("--out", default=str(RESULTS / "decode.json"))
    args = ap.parse_args()

    dev = torch.device(args.device)
    cfg = preset(args.preset)
    if args.layers:
        cfg = cfg.replace(num_hidden_layers=args.layers)
    meta = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "preset": args.preset,
        "layers": cfg.num_hidden_layers,
        "command": "python benchmarks/decode.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if v not in (None, False) and k != "out"
        ),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    rep = Report(Path(args.out), meta, time.monotonic() + args.deadline_s)
    bw = copy_bandwidth(dev)
    rep.data["meta"]["copy_bandwidth_TBps"] = round(bw / 1e12, 3)
    gen = torch.Generator().manual_seed(0)
    for fmt in args.formats:
        if rep.time_left() < 0:
            rep.data["notes"].append(f"deadline reached before {fmt}")
            break
        run_format(fmt, cfg, args, dev, bw, rep, gen)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    rows = [r for r in rep.data["rows"] if "step_ms" in r]
    print(
        f"\n{'fmt':>6} {'batch':>5} {'ctx':>6} {'step ms':>8} {'floor ms':>8} {'of floor':>8} {'tok/s':>9}"
        f" {'kernels':>7}"
    )
    for r in rows:
        print(
            f"{r['format']:>6} {r['batch']:>5} {r['context']:>6} {r['step_ms']:>8.3f} {r['floor_ms']:>8.3f}"
            f" {r['floor_fraction']:>8.2f} {r['tokens_per_s']:>9.0f} {r.get('kernels_per_step', ''):>7}"
        )
    for r in rows:
        if "ab_main_ms" in r:
            only = args.ab_tuning_file[0] if args.ab_tuning_file else None
            variants = r.get("ab_variants") or [{"tuning_file": only, "ms": r["ab_variant_ms"]}]
            for v in variants:
                print(
                    f"{r['format']:>6} b{r['batch']} ctx {r['context']} A/B rounds: default {r['ab_main_ms']} ms,"
                    f" variant (--ab-ops {args.ab_ops!r}, --ab-tuning-file {v['tuning_file']!r}) {v['ms']} ms"
                )
    for r in rows:
        if r.get("side_stream_kernels"):
            print(f"{r['format']:>6} b{r['batch']} ctx {r['context']}: the graph also runs {r['side_stream_kernels']}"
                  " kernels on its side stream (weights asked into L2 ahead, op l2_ahead)")  # fmt: skip
    for r in rows:
        if "time_by_family_ms" in r:
            fams = ", ".join(f"{k} {v:.3f}" for k, v in r["time_by_family_ms"].items())
            print(f"{r['format']:>6} b{r['batch']} ctx {r['context']}: GPU ms by kernel family: {fams}")
            for k in r["kernels_by_name"][:12]:
                print(f"    {k['count']:>4} x {k['mean_us']:>7.2f} us = {k['total_ms']:.3f} ms  {k['name']}")
    for r in rep.data["rows"]:
        if "prefill_ms" in r:
            chunks = f" in chunks of {r['prefill_chunk']}" if r["prefill_chunk"] < r["prefill_tokens"] else ""
            print(f"{r['format']:>6} prefill {r['prefill_tokens']} tokens{chunks}: {r['prefill_ms']:.1f} ms")
            if "prefill_time_by_family_ms" in r:
                fams = ", ".join(f"{k} {v:.1f}" for k, v in r["prefill_time_by_family_ms"].items())
                print(f"{'':>6}   {r['prefill_kernels']} kernels; GPU ms by family: {fams}")
                for k in r["prefill_kernels_by_name"][:10]:
                    print(f"    {k['count']:>4} x {k['mean_us']:>9.1f} us = {k['total_ms']:.2f} ms  {k['name']}")
    for c in rep.data["checks"]:
        print(
            f"check {c['format']} b{c['batch']}: logits rel {c['prefill_logits_rel_err']:.2e},"
            f" greedy agreement {c['greedy_token_agreement']:.3f} (first divergence {c['first_divergence_step']});"
            f" teacher-forced {c['forced_token_agreement']:.3f}, {c['forced_differ_beyond_tie']} differences beyond a"
            f" {c['tie']} top-2 gap (widest {c['forced_widest_gap_at_difference']})"
        )
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")


if __name__ == "__main__":
    main()
