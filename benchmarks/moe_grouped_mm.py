"""The BF16 MoE at prefill sizes: the Triton grouped kernels of `moe_triton` against the grouped-GEMM path
(`flint_kernels.moe_grouped_gemm`: torch's grouped GEMM, CUTLASS on sm_90), both through `fused_moe`.

CUDA only. Both are checked against `moe_ref` (rel. error), timed inside CUDA graphs over weight copies (the harness
of `kernels_moe_gemv.py`) and their peak memory taken; each step of the grouped-GEMM path is also timed alone, to
see where its time goes. The table's `moe.paths` field `grouped_gemm_min_tokens` comes from these figures.

    python benchmarks/moe_grouped_mm.py --ts 2048 4096 8192 --formats bf16 nvfp4 --out moe_grouped_mm.json
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


def gemm_steps(x: torch.Tensor, tw: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> dict:
    """Each step of `moe_grouped_gemm.routed` as a zero-argument callable, on its own inputs made here."""
    from flint_kernels import activation_triton, moe_align_triton
    from flint_kernels import moe_grouped_gemm as mg

    src, pos, offs = moe_align_triton.sort(ids, w13.shape[0])
    xs = x.index_select(0, src)
    gu = mg.GROUPED_MM(xs, w13.transpose(1, 2), offs=offs)
    h = activation_triton.silu_and_mul(gu)
    y = mg.GROUPED_MM(h, w2.transpose(1, 2), offs=offs)
    out = torch.empty_like(x)
    return {
        "sort pairs": lambda: moe_align_triton.sort(ids, w13.shape[0]),
        "gather x": lambda: x.index_select(0, src),
        "gate_up grouped_mm": lambda: mg.GROUPED_MM(xs, w13.transpose(1, 2), offs=offs),
        "silu_and_mul": lambda: activation_triton.silu_and_mul(gu),
        "down grouped_mm": lambda: mg.GROUPED_MM(h, w2.transpose(1, 2), offs=offs),
        "sorted reduce": lambda: mg.reduce_sorted(y, pos, tw, out, None),
    }


def peak_mib(fn: Callable[[], object]) -> float:
    """MiB allocated at the peak of one call over what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)


def run(t: int, stacks: list, gen: torch.Generator, fmt: str = "bf16") -> dict:
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe import moe_ref

    w13, w2 = stacks[0]
    x = torch.randn(t, HIDDEN, generator=gen, device="cuda").bfloat16()
    tw, ids = routing(t, gen)
    ref = moe_ref(x, tw, ids, w13, w2)
    flops = 2 * t * TOPK * 3 * HIDDEN * INTER
    paths = {"ours": 0, "grouped_gemm": 1}  # fused_moe's grouped_gemm_min_tokens: 0 never, 1 always
    row: dict = {"format": fmt, "T": t, "pairs_per_expert": t * TOPK / EXPERTS}
    for key, min_tokens in paths.items():

        def call(a: torch.Tensor, b: torch.Tensor, m: int = min_tokens) -> torch.Tensor:
            # NVFP4: both from the call's BF16 copies, as the engine runs long prefills.
            return mt.fused_moe(x, tw, ids, a, b, decode_max_tokens=0, grouped_gemm_min_tokens=m, dequant_min_tokens=1)

        try:
            row[f"{key}_rel_err"] = rel_err(call(w13, w2), ref)
            row[f"{key}_ms"] = time_graph([lambda s=s, c=call: c(s[0], s[1]) for s in stacks], reps=4)
            row[f"{key}_TFLOP/s"] = round(flops / row[f"{key}_ms"] / 1e9, 1)
            row[f"{key}_peak_MiB"] = peak_mib(lambda c=call: c(w13, w2))
        except Exception as e:  # report, keep the other sizes
            row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
    if "grouped_gemm_ms" in row and fmt == "bf16":
        steps = gemm_steps(x, tw, ids, w13, w2)
        row["steps_us"] = {name: round(time_graph([fn], reps=8) * 1000, 1) for name, fn in steps.items()}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ts", type=int, nargs="+", default=[2048, 4096, 8192], help="tokens")
    ap.add_argument("--formats", nargs="+", default=["bf16"], choices=("bf16", "nvfp4"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/moe_grouped_mm.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("moe_grouped_mm.py needs a CUDA GPU", file=sys.stderr)
        return 1
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for fmt in args.formats:
        stacks = [moe_weights(fmt, gen)[:2] for _ in range(2)]
        for t in args.ts:
            row = run(t, stacks, gen, fmt)
            rows.append(row)
            print(json.dumps(row))
        del stacks
        torch.cuda.empty_cache()
    print(f"\nMoE on {torch.cuda.get_device_name()}: Triton grouped kernels vs grouped GEMM (ms a layer, rel. err.,")
    print("peak MiB over the inputs; NVFP4 both from the call's BF16 copies)")
    nan = float("nan")
    for r in rows:
        print(f"{r['format']:>5} T {r['T']:>6}:", end="")
        for key in ("ours", "grouped_gemm"):
            print(
                f" {key} {r.get(key + '_ms', nan):.3f} ({r.get(key + '_rel_err', nan):.1e}, "
                f"{r.get(key + '_peak_MiB', nan)} MiB) {r.get(key + '_error', '')}",
                end="",
            )
        print()
        if "steps_us" in r:
            print("   steps (us): " + ", ".join(f"{k} {v}" for k, v in r["steps_us"].items()))
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
