"""Sampling cost per decode step over Flint's 150144-token vocabulary: the top-k path (one `topk` selection, noise
for the candidates only) against the full-vocabulary sort-and-mask path, at the default top_k 20 / top_p 0.95.

    python benchmarks/sampler.py [--device cuda] [--batch 1 8 32 64] [--iters 50]

Both paths draw the same tokens (checked here on every timed batch, and in tests/test_sampler.py).
Prints a table and writes benchmarks/results/sampler_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from flint_engine.sampler import draw_full, draw_top_k

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--top-p", type=float, default=0.95)
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
        same = draw_top_k(*params).tolist() == draw_full(*params)[0].tolist()
        full = median_ms(draw_full, params, device, args.iters)
        fast = median_ms(draw_top_k, params, device, args.iters)
        rows.append({"batch": n, "full_sort_ms": full, "top_k_ms": fast, "speedup": full / fast, "same_tokens": same})
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
    print(f"{'batch':>6} {'full sort ms':>13} {'top-k ms':>9} {'speedup':>8} {'same':>5}")
    for r in rows:
        times = f"{r['full_sort_ms']:>13.3f} {r['top_k_ms']:>9.3f}"
        print(f"{r['batch']:>6} {times} {r['speedup']:>8.1f} {r['same_tokens']!s:>5}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
