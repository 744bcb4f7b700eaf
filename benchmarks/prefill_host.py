"""Host cost of the eager forward pass (prefill and mixed steps run outside CUDA graphs): for prompts of several
lengths, the wall time of a forward against the GPU's busy time, the time the host takes to queue it, the host
synchronisations inside it, and (for one length) the host functions that take the time; with `--step-graphs` the
same on the step graphs (`flint_engine.step_graphs`: every op but attention on CUDA graphs).

    python benchmarks/prefill_host.py --format nvfp4 --lengths 16 128 512 2048 --profile-length 128 --step-graphs

A forward whose queueing takes longer than its kernels leaves the GPU idle: its wall time is then the host's, which
is what a short prompt's time to first token and a mixed step's inter-token gap pay. CUDA only. Prints a table and
writes JSON (benchmarks/results/prefill_host.json, or --out).
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import count_kernels, prefill_batches, sync  # sibling scripts
from engine_gpu import cprofile_rows
from results_file import write_results

from flint_engine.config import preset
from flint_engine.kv_cache import KVCache
from flint_engine.model import FlintModel
from flint_engine.step_graphs import MAX_TOKENS, StepGraphs
from flint_engine.weights import random_weights

BLOCK = 16


def host_syncs(fn) -> list[str]:
    """Where `fn` makes the host wait for the GPU (torch's sync debug mode: one warning per synchronising op)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def profile_rows(fn, reps: int, top: int = 30) -> list[dict]:
    """cProfile of `reps` calls: the host functions by self time per call (its overhead inflates them)."""
    prof = cProfile.Profile()
    for _ in range(reps):
        prof.enable()
        fn()
        prof.disable()
        torch.cuda.synchronize()
    return cprofile_rows(prof, reps)[:top]


def measure(
    model: FlintModel, cache: KVCache, n: int, reps: int, gen: torch.Generator, graphs: StepGraphs | None = None
) -> tuple[dict, object]:
    """One prompt of `n` tokens: the eager forward, or with `graphs` the step graphs' pieces around eager attention."""
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
    (batch,) = prefill_batches(ids, BLOCK, model.device)
    # prefill_batches puts the prompt in blocks 0.. (one table and one slot tensor for both pools): move it past the
    # scratch block.
    assert batch.full_block_tables is batch.sliding_block_tables and batch.full_slots is batch.sliding_slots
    batch.full_block_tables += 1
    batch.full_slots += BLOCK
    run = graphs.run if graphs is not None else (lambda b: model.forward(b, cache))

    def forward() -> torch.Tensor:
        return model.compute_logits(run(batch)[-1:])

    for _ in range(2):
        forward()
    sync(model.device)
    queued, walls = [], []
    for _ in range(reps):
        sync(model.device)
        t0 = time.perf_counter()
        forward()
        t1 = time.perf_counter()
        sync(model.device)
        queued.append((t1 - t0) * 1e3)
        walls.append((time.perf_counter() - t0) * 1e3)
    kernels, families, _ = count_kernels(forward, model.device)
    syncs = host_syncs(forward)
    row = {
        "tokens": n,
        "path": "step graphs" if graphs is not None else "eager",
        "wall_ms": round(statistics.median(walls), 2),
        "queue_ms": round(statistics.median(queued), 2),
        "gpu_busy_ms": round(sum(families.values()), 2),
        "kernels": kernels,
        "host_syncs": len(syncs),
        "host_sync_sites": sorted(set(syncs)),
    }
    return row, forward


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="nvfp4", choices=("bf16", "nvfp4"))
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 128, 512, 2048])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--profile-length", type=int, default=128, help="cProfile the forward of this many tokens (0: no)")
    ap.add_argument("--step-graphs", action="store_true", help="also time each length on the step graphs")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "prefill_host.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("prefill_host.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from flint_kernels import precompile
    from flint_kernels.dispatch import select_kernels

    dev = torch.device("cuda")
    cfg = preset(args.preset)
    weights = random_weights(cfg, torch.bfloat16, dev, seed=0, nvfp4_linears=args.format == "nvfp4")
    model = FlintModel(weights, select_kernels(dev, weights.dtype, weights.dtype))
    precompile.run(dev, weights.kernel_profile())
    gen = torch.Generator().manual_seed(0)
    longest = max(args.lengths)
    # Block 0 is the step graphs' scratch block; each prompt's blocks follow it.
    cache = KVCache(cfg, 1 + -(-longest // BLOCK), 1 + -(-longest // BLOCK), BLOCK, model.dtype, dev)
    graphs = None
    if args.step_graphs:
        t0 = time.monotonic()
        graphs = StepGraphs(model, cache, max_tokens=max(n for n in args.lengths if n <= MAX_TOKENS))
        graphs.capture()
        took, mib = time.monotonic() - t0, graphs.memory / 2**20
        print(f"step graphs captured in {took:.1f} s ({mib:.0f} MiB); self-check {graphs.self_check():.2e}", flush=True)
    rows, profiled = [], None
    for n in args.lengths:
        for g in (None, graphs) if graphs is not None and graphs.buckets[-1] >= n else (None,):
            row, forward = measure(model, cache, n, args.reps, gen, g)
            row["format"] = args.format
            if n == args.profile_length:
                row["host_profile"] = profile_rows(forward, args.reps)
                profiled = row
            rows.append(row)
            print({k: v for k, v in row.items() if k != "host_profile"}, flush=True)
    print(f"\n{args.format} eager forward on {torch.cuda.get_device_name()} (ms; median of {args.reps})")
    print(f"{'tokens':>7} {'path':>12} {'wall':>8} {'queue':>8} {'GPU busy':>9} {'kernels':>8} {'syncs':>6}")
    for r in rows:
        print(
            f"{r['tokens']:>7} {r['path']:>12} {r['wall_ms']:>8.2f} {r['queue_ms']:>8.2f} {r['gpu_busy_ms']:>9.2f}"
            f" {r['kernels']:>8} {r['host_syncs']:>6}  {' '.join(r['host_sync_sites'][:6])}"
        )
    if profiled is not None:
        print(f"\nhost functions at {profiled['tokens']} tokens (self us a forward, under cProfile):")
        for p in profiled["host_profile"][:25]:
            print(
                f"{p['self_us_per_step']:>9.1f} {p['cumulative_us_per_step']:>9.1f} {p['calls_per_step']:>7}"
                f" {p['function']}"
            )
    write_results(args.out, "python benchmarks/prefill_host.py " + " ".join(sys.argv[1:]), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
