"""The BF16 MoE at prefill sizes on torch's grouped GEMM (`torch._grouped_mm`, CUTLASS on sm_90) against ours.

CUDA only. The grouped-GEMM MoE: the pairs sorted by expert, x's rows gathered in that order, one grouped GEMM for
gate_up, SiLU-and-mul, one for down, each pair's row scattered back, then the slot reduce of `moe_triton`. Both are
checked against `moe_ref` (rel. error < 1e-2), then timed inside CUDA graphs over weight copies (the harness of
`kernels_moe_gemv.py`); each step of the grouped-GEMM MoE is also timed alone, to see where its time goes.

    python benchmarks/moe_grouped_mm.py --ts 2048 8192 --out benchmarks/results/moe_grouped_mm.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_moe_gemv import EXPERTS, HIDDEN, INTER, TOPK, moe_weights, rel_err, routing, time_graph


def grouped_mm_moe(x: torch.Tensor, tw: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor):
    """The routed MoE through two grouped GEMMs; returns (out, the steps as zero-argument callables)."""
    from flint_kernels import activation_triton, moe_triton

    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(w13.shape[0], dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    src = order // k
    xs = x.index_select(0, src)
    gu = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
    h = activation_triton.silu_and_mul(gu)
    ys = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)
    y = torch.empty_like(ys)
    y.index_copy_(0, order, ys)
    out = torch.empty_like(x)
    moe_triton._reduce_slots_launch(y, tw, out, None)
    steps: dict[str, Callable[[], object]] = {
        "gather x": lambda: x.index_select(0, src),
        "gate_up grouped_mm": lambda: torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs),
        "silu_and_mul": lambda: activation_triton.silu_and_mul(gu),
        "down grouped_mm": lambda: torch._grouped_mm(h, w2.transpose(1, 2), offs=offs),
        "scatter y": lambda: y.index_copy_(0, order, ys),
        "slot reduce": lambda: moe_triton._reduce_slots_launch(y, tw, out, None),
    }
    return out, steps


def run(t: int, stacks: list, gen: torch.Generator) -> dict:
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe import moe_ref

    w13, w2 = stacks[0]
    x = torch.randn(t, HIDDEN, generator=gen, device="cuda").bfloat16()
    tw, ids = routing(t, gen)
    ref = moe_ref(x, tw, ids, w13, w2)
    flops = 2 * t * TOPK * 3 * HIDDEN * INTER
    row: dict = {"T": t, "pairs_per_expert": t * TOPK / EXPERTS}
    row["ours_rel_err"] = rel_err(mt.moe(x, tw, ids, w13, w2), ref)
    row["ours_ms"] = time_graph([lambda s=s: mt.moe(x, tw, ids, s[0], s[1]) for s in stacks], reps=4)
    try:
        out, steps = grouped_mm_moe(x, tw, ids, w13, w2)
        row["grouped_mm_rel_err"] = rel_err(out, ref)
        row["grouped_mm_ms"] = time_graph([lambda s=s: grouped_mm_moe(x, tw, ids, s[0], s[1]) for s in stacks], reps=4)
        row["steps_us"] = {name: round(time_graph([fn], reps=8) * 1000, 1) for name, fn in steps.items()}
    except Exception as e:  # report, keep the other sizes
        row["grouped_mm_error"] = f"{type(e).__name__}: {e}"[:300]
    for key in ("ours", "grouped_mm"):
        if f"{key}_ms" in row:
            row[f"{key}_TFLOP/s"] = round(flops / row[f"{key}_ms"] / 1e9, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ts", type=int, nargs="+", default=[2048, 8192], help="tokens")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/moe_grouped_mm.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("moe_grouped_mm.py needs a CUDA GPU", file=sys.stderr)
        return 1
    gen = torch.Generator(device="cuda").manual_seed(1)
    stacks = [moe_weights("bf16", gen)[:2] for _ in range(2)]
    rows = []
    for t in args.ts:
        row = run(t, stacks, gen)
        rows.append(row)
        print(json.dumps(row))
    print(f"\nBF16 MoE on {torch.cuda.get_device_name()}: ours vs torch._grouped_mm (ms a layer, rel. err.)")
    for r in rows:
        gm = r.get("grouped_mm_ms", float("nan"))
        print(
            f"T {r['T']:>6}: ours {r['ours_ms']:.3f} ({r['ours_rel_err']:.1e}), grouped_mm {gm:.3f} "
            f"({r.get('grouped_mm_rel_err', float('nan')):.1e}) {r.get('grouped_mm_error', '')}"
        )
        if "steps_us" in r:
            print("   steps (us): " + ", ".join(f"{k} {v}" for k, v in r["steps_us"].items()))
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
