"""Where a one-sequence prefill's time goes on each path (fused and plain), on a shallow full-width Flint.

Times `FlintModel.forward_sequences` for prompts of a few lengths, each twice (the first call of a length includes
any compile), and prints the plain path's heaviest ops by host time from the torch profiler: the plain NVFP4 path
dequantises every weight at each use, and its cost decides how long `decode.py`'s fused-vs-plain check takes.
Run: `python benchmarks/prefill_probe.py --layers 6 --formats nvfp4`; writes JSON with --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time

import torch
from flint_kernels.dispatch import REFERENCE, select_kernels

from flint_engine.config import default_layer_types, preset
from flint_engine.model import FlintModel
from flint_engine.weights import random_weights


def timed_call(fn, dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--preset", default="full")
    ap.add_argument("--formats", nargs="+", default=["nvfp4"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[37, 48])
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    full = preset(args.preset)
    cfg = dataclasses.replace(
        full, num_hidden_layers=args.layers, layer_types=default_layer_types(args.layers), rope_layers=None
    )
    gen = torch.Generator().manual_seed(0)
    result: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "layers": args.layers}
    for fmt in args.formats:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        t0 = time.perf_counter()
        weights = random_weights(cfg, dtype, dev, seed=0, nvfp4_linears=fmt == "nvfp4")
        built = time.perf_counter() - t0
        models = {
            "fused": FlintModel(weights, select_kernels(dev, weights.dtype, weights.dtype, "auto")),
            "plain": FlintModel(weights, REFERENCE),
        }
        rows = []
        for path, model in models.items():
            for n in args.lengths:
                prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
                call = functools.partial(model.forward_sequences, [prompt], 16)
                first, again = timed_call(call, dev), timed_call(call, dev)
                rows.append({"format": fmt, "path": path, "tokens": n, "first_s": first, "again_s": again})
                print(f"{fmt} {path:5s} {n:4d} tokens: first {first:8.3f} s, again {again:8.3f} s", flush=True)
        prompt = torch.randint(0, cfg.vocab_size, (args.lengths[0],), generator=gen).tolist()
        with torch.profiler.profile() as prof:
            models["plain"].forward_sequences([prompt], 16)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
        print(table, flush=True)
        if dev.type == "cuda":
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top), flush=True)
        result[fmt] = {"built_s": built, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
