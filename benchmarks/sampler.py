"""Sampling cost per decode step over Flint's 150144-token vocabulary, at the default top_k 20 / top_p 0.95: the
full-vocabulary sort-and-mask path, the PyTorch top-k path (one `topk` selection, noise for the candidates only),
the Triton kernels (`flint_kernels.sampling_triton`, on CUDA; every chunk size in --chunks), and the engine's whole
`sample()` call per step with each op (host-side parameter staging and the token read-back included).

    python benchmarks/sampler.py [--device cuda] [--batch 1 8 32 64] [--iters 50] [--chunks 2048 4096 8192]
    python benchmarks/sampler.py --device cuda --chunks 4096 --filter   # each chunk size with and without FILTER
    python benchmarks/sampler.py --device cuda --chunks 4096 --top-k 50 --radix   # the radix kernels (top_k > 32)

Every path draws the same tokens (checked here on every timed batch, and in tests/test_sampler.py and
tests/test_kernels_sampling.py). Times are wall-clock medians with the device synchronised around each call; on CUDA
also the Triton op's GPU time alone (`..._gpu_ms`: 20 calls in a CUDA graph, `kernels_moe_gemv.time_graph`), since a
decode step launches it ahead and only its GPU time is on the step's path. `--filter` times every chunk size with
`sampling_triton.FILTER` off and on (`..._filter_...` columns), `--radix` with `sampling_triton.RADIX` off and on
(`..._radix_...`: the unfiltered kernels as radix selects; `..._first_call_s` includes their compile).
Prints a table and writes benchmarks/results/sampler_<device>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from datetime import date
from functools import partial
from pathlib import Path

import torch
from flint_kernels import sampling_triton
from flint_kernels.sampling import draw_top_k, sample_top_k_ref
from kernels_moe_gemv import time_graph

from flint_engine.sampler import SamplingRow, draw_full, sample

RESULTS = Path(__file__).parent / "results"
VOCAB = 150_144


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, args: tuple, device: torch.device, iters: int) -> float:
    fn(*args)  # warm-up
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn(*args)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _sample_copy(logits: torch.Tensor, rows: list[SamplingRow], op) -> list[int]:
    """`sample` modifies its logits (penalties): give it a fresh copy, as each step has fresh logits."""
    return sample(logits.clone(), rows, op).token_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--chunks", type=int, nargs="+", default=[2048, 4096, 8192], help="Triton chunk sizes to time")
    ap.add_argument("--filter", action="store_true", help="time each chunk size with the filtered chunk kernel too")
    ap.add_argument("--radix", action="store_true", help="time each chunk size with the radix-select kernels too")
    args = ap.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for n in args.batch:
        logits = torch.randn(n, VOCAB, generator=gen, device=device) * 3
        top_k = torch.full((n,), args.top_k, device=device)
        top_p = torch.full((n,), args.top_p, device=device)
        min_p = torch.zeros(n, device=device)
        seeds = torch.arange(n, device=device, dtype=torch.int64) * 7919
        steps = torch.full((n,), 5, device=device, dtype=torch.int64)
        params = (logits, top_k, top_p, min_p, seeds, steps)
        want = draw_full(*params)[0].tolist()
        same = draw_top_k(*params).tolist() == want
        full = median_ms(draw_full, params, device, args.iters)
        fast = median_ms(draw_top_k, params, device, args.iters)
        row = {"batch": n, "full_sort_ms": full, "top_k_ms": fast, "speedup": full / fast, "same_tokens": same}
        temps = torch.ones(n, device=device)
        op_args = (logits, temps, top_k, top_p, min_p, seeds, steps, args.top_k)
        if device.type == "cuda":
            defaults = sampling_triton.CHUNK, sampling_triton.FILTER, sampling_triton.RADIX
            for chunk, filtered, radix in itertools.product(
                args.chunks,
                (False, True) if args.filter else (defaults[1],),
                (False, True) if args.radix else (defaults[2],),
            ):
                sampling_triton.CHUNK, sampling_triton.FILTER, sampling_triton.RADIX = chunk, filtered, radix
                name = f"triton_chunk{chunk}" + ("_filter" if args.filter and filtered else "")
                name += "_radix" if args.radix and radix else ""
                t0 = time.perf_counter()
                row["same_tokens"] &= sampling_triton.sample_top_k(*op_args).tolist() == want
                row[f"{name}_first_call_s"] = round(time.perf_counter() - t0, 3)  # compiles included
                row[f"{name}_ms"] = median_ms(sampling_triton.sample_top_k, op_args, device, args.iters)
                row[f"{name}_gpu_ms"] = time_graph([partial(sampling_triton.sample_top_k, *op_args)], reps=20)
            sampling_triton.CHUNK, sampling_triton.FILTER, sampling_triton.RADIX = defaults
            row["triton_ms"] = row[f"triton_chunk{defaults[0]}_ms"] if defaults[0] in args.chunks else None
        # The engine's call: penalties check, host-side staging of the parameters, the op, the tokens read back.
        sample_rows = [
            SamplingRow(temperature=1.0, top_p=args.top_p, top_k=args.top_k, min_p=0.0, seed=7919 * i, step=5)
            for i in range(n)
        ]
        for name, op in (("reference", sample_top_k_ref), ("triton", sampling_triton.sample_top_k)):
            if name == "triton" and device.type != "cuda":
                continue
            row["same_tokens"] &= sample(logits.clone(), sample_rows, op).token_ids == want
            call_args = (logits, sample_rows, op)
            row[f"sample_call_{name}_ms"] = median_ms(_sample_copy, call_args, device, args.iters)
        rows.append(row)
        print(json.dumps(row), flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    out = {
        "date": date.today().isoformat(),
        "device": name,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "vocab": VOCAB,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"sampler_{device.type}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"sampling over {VOCAB} logits on {name} (top_k {args.top_k}, top_p {args.top_p}), median of {args.iters}")
    cols = [
        "full_sort_ms",
        "top_k_ms",
        *(k for k in rows[0] if k.startswith("triton_chunk") and k.endswith("_ms")),
        "sample_call_reference_ms",
    ]
    cols += [k for k in ("sample_call_triton_ms",) if k in rows[0]]
    print(f"{'batch':>6} " + " ".join(f"{c.removesuffix('_ms'):>22}" for c in cols) + f" {'same':>5}")
    for r in rows:
        print(f"{r['batch']:>6} " + " ".join(f"{r[c]:>22.3f}" for c in cols) + f" {r['same_tokens']!s:>5}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
