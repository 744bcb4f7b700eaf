"""What a dependency between two decode kernels costs: a kernel boundary (with and without programmatic dependent
launch) against a counter handoff inside one launch.

A batch-1 decode step is a chain of small kernels, each reading the whole output of the one before (a GEMV reads
all of x). This models that chain: L phases of G programs; every program of phase p reads its own weight chunk
(never written, so it may stream before the dependency is met), then the whole output vector of phase p - 1, and
writes one value of phase p's output. Three ways to run it:

- `launches`: one kernel launch a phase, in a CUDA graph (what the engine does now with PDL off);
- `launches+pdl`: the same with programmatic dependent launch (weights loaded before `gdc_wait`; the engine's way);
- `one launch`: all L * G programs in one launch. Each takes a ticket from a counter, so programs run their phases
  in the order they started (a program waits only on programs that started before it: no deadlock whatever the
  residency); a program of phase p loads its weights, spins until phase p - 1's counter reaches G, reads, writes and
  arrives on phase p's counter. The last program to finish resets the counters for the next replay.

    python benchmarks/handoff.py [--phases 196] [--programs 132 528] [--chunk-kib 8 32]

Prints microseconds a phase for each and writes benchmarks/results/handoff.json. Checks that the three give the same
output (the chain's last vector) before timing.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from flint_kernels.pdl import HAVE_GDC, enabled
from results_file import write_results

if HAVE_GDC:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

RESULTS = Path(__file__).parent / "results"
VARIANTS = ("launches", "launches+pdl", "one launch")


@triton.jit
def _phase_weights(w_ptr, p, c, G, CHUNK: tl.constexpr, PDL: tl.constexpr):
    """Program c of phase p: its weight chunk, loaded before waiting for the previous grid (PDL)."""
    offs = tl.arange(0, CHUNK)
    w = tl.load(w_ptr + (p * G + c).to(tl.int64) * CHUNK + offs)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    return w


@triton.jit
def _finish(w, x_ptr, y_ptr, c, G, XB: tl.constexpr):
    """y[c] = sum(w) * 1e-4 + mean(x) / 2 + 1 (x: the previous phase's G values)."""
    xo = tl.arange(0, XB)
    x = tl.load(x_ptr + xo, mask=xo < G, other=0.0, cache_modifier=".cg")
    tl.store(y_ptr + c, tl.sum(w.to(tl.float32), axis=0) * 1e-4 + tl.sum(x, axis=0) / G * 0.5 + 1.0)


@triton.jit
def _launch_kernel(w_ptr, x_ptr, y_ptr, p, G, CHUNK: tl.constexpr, XB: tl.constexpr, PDL: tl.constexpr):
    c = tl.program_id(0)
    w = _phase_weights(w_ptr, p, c, G, CHUNK, PDL)
    _finish(w, x_ptr, y_ptr, c, G, XB)


@triton.jit
def _one_launch_kernel(w_ptr, buf_ptr, cnt_ptr, L, G, CHUNK: tl.constexpr, XB: tl.constexpr, LB: tl.constexpr):
    # cnt: [0] tickets, [1] finished programs, [2 + p] programs of phase p done.
    t = tl.atomic_add(cnt_ptr, 1, sem="relaxed")
    p = t // G
    c = t % G
    w = _phase_weights(w_ptr, p, c, G, CHUNK, False)
    seen = G
    if p > 0:
        while tl.load(cnt_ptr + 1 + p, volatile=True) < G:
            pass
        seen = tl.atomic_add(cnt_ptr + 1 + p, 0, sem="acquire")
    # Using the acquiring read's value (always >= G here) makes every thread's loads below wait for it.
    x_ptr = buf_ptr + (p % 2) * XB + (seen < G).to(tl.int32)
    y_ptr = buf_ptr + ((p + 1) % 2) * XB
    _finish(w, x_ptr, y_ptr, c, G, XB)
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr + 2 + p, 1, sem="release")
    done = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel")
    if done == L * G - 1:
        lo = tl.arange(0, LB)
        tl.store(cnt_ptr + 2 + lo, tl.zeros((LB,), tl.int32), mask=lo < L)
        tl.atomic_xchg(cnt_ptr + 1, 0)
        tl.atomic_xchg(cnt_ptr, 0)


def chain_launches(w: torch.Tensor, bufs: torch.Tensor, L: int, G: int, chunk: int, pdl: bool) -> None:
    xb = bufs.shape[1]
    opts = {"launch_pdl": True} if pdl else {}
    for p in range(L):
        _launch_kernel[(G,)](w, bufs[p % 2], bufs[(p + 1) % 2], p, G, CHUNK=chunk, XB=xb, PDL=pdl, num_warps=4, **opts)


def chain_one_launch(w: torch.Tensor, bufs: torch.Tensor, cnt: torch.Tensor, L: int, G: int, chunk: int) -> None:
    xb = bufs.shape[1]
    _one_launch_kernel[(L * G,)](w, bufs, cnt, L, G, CHUNK=chunk, XB=xb, LB=triton.next_power_of_2(L), num_warps=4)


def graph_time(fn, reps: int = 30) -> float:
    """Median microseconds of one replay of `fn` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", type=int, default=196)
    ap.add_argument("--programs", type=int, nargs="+", default=[132, 528])
    ap.add_argument("--chunk-kib", type=int, nargs="+", default=[8, 32])
    args = ap.parse_args()
    dev = torch.device("cuda")
    L = args.phases
    rows = []
    for G in args.programs:
        for kib in args.chunk_kib:
            chunk = kib * 1024 // 2
            w = torch.randn(L * G * chunk, device=dev, dtype=torch.bfloat16)
            xb = triton.next_power_of_2(G)
            outs = {}
            times = {}
            for name in VARIANTS:
                if name == "launches+pdl" and not enabled(dev):
                    continue
                bufs = torch.zeros(2, xb, device=dev, dtype=torch.float32)
                bufs[0, :G] = 1.0
                if name == "one launch":
                    cnt = torch.zeros(2 + L, device=dev, dtype=torch.int32)
                    fn = functools.partial(chain_one_launch, w, bufs, cnt, L, G, chunk)
                else:
                    fn = functools.partial(chain_launches, w, bufs, L, G, chunk, name.endswith("pdl"))
                fn()
                torch.cuda.synchronize()
                outs[name] = bufs[L % 2, :G].clone()
                times[name] = graph_time(fn) / L
            ref = outs["launches"]
            differ = [k for k, o in outs.items() if not torch.allclose(o, ref, rtol=1e-5, atol=1e-5)]
            floor_us = G * kib * 1024 / 4.0e12 * 1e6
            row = {"programs": G, "chunk_kib": kib, "phases": L, "differ_from_launches": differ}
            row["floor_us"] = round(floor_us, 2)
            row.update({f"{k}_us": round(v, 2) for k, v in times.items()})
            rows.append(row)
            print(row, flush=True)
    print(f"\n{'G':>5} {'KiB':>4} {'floor':>6} " + " ".join(f"{k:>13}" for k in VARIANTS))
    for r in rows:
        vals = " ".join(f"{r.get(k + '_us', float('nan')):13.2f}" for k in VARIANTS)
        differ = ", ".join(r["differ_from_launches"]) or "-"
        print(f"{r['programs']:5d} {r['chunk_kib']:4d} {r['floor_us']:6.2f} {vals}   differ: {differ}")
    write_results(RESULTS / "handoff.json", " ".join(sys.argv), rows)


if __name__ == "__main__":
    main()
