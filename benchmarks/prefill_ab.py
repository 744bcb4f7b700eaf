"""Whole-prompt prefill A/B in one process: `decode.py`'s 8K prefill with the engine as it is against a variant,
alternating rounds, so clocks and the machine's state weigh on both alike.

Variants (each a patch applied for its rounds only):
- `scale_pass`: NVFP4 projections at prefill size with FP32 cuBLAS output and a separate global-scale pass
  (`gemv_triton.dequant_matmul(alpha=False)`), as before the twenty-first session's alpha epilogue.
- `experts_ahead`: the experimental op that begins each MoE layer's NVFP4 expert copies on a side stream at the
  layer's start (`flint_kernels.expert_copies`; FLINT_FAST_OPS=all,experts_ahead).

    python benchmarks/prefill_ab.py --variant scale_pass --rounds 3 --out benchmarks/results/prefill_ab.json

Prints each round's wall ms and profiled GPU ms, then the medians; writes them as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import runpy
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _scale_pass() -> Callable[[], None]:
    from flint_kernels import gemv_triton as gt

    original = gt.dequant_matmul
    gt.dequant_matmul = functools.partial(original, alpha=False)

    def undo() -> None:
        gt.dequant_matmul = original

    return undo


def _experts_ahead() -> Callable[[], None]:
    """The experimental op that begins each MoE layer's expert copies on a side stream (`expert_copies`)."""
    before = os.environ.get("FLINT_FAST_OPS")
    os.environ["FLINT_FAST_OPS"] = f"{before or 'all'},experts_ahead"

    def undo() -> None:
        if before is None:
            os.environ.pop("FLINT_FAST_OPS", None)
        else:
            os.environ["FLINT_FAST_OPS"] = before

    return undo


VARIANTS: dict[str, Callable[[], Callable[[], None]]] = {"scale_pass": _scale_pass, "experts_ahead": _experts_ahead}


def prefill_once(args: argparse.Namespace, out: Path) -> dict:
    """One `decode.py` run that times only the prefill (and a short batch-1 decode row it always takes)."""
    sys.argv = [
        "decode.py", "--preset", args.preset, "--device", args.device, "--formats", args.format, "--batches", "1",
        "--contexts", str(min(1024, args.tokens)), "--prefill", str(args.tokens), "--check-steps", "0",
        "--check-batches", "--no-plain-timing", "--reps", "5", "--profile-batches", "--out", str(out),
    ]  # fmt: skip
    runpy.run_path(str(HERE / "decode.py"), run_name="__main__")
    row = next(r for r in json.loads(out.read_text())["rows"] if "prefill_ms" in r)
    return {"wall_ms": row["prefill_ms"], "gpu_ms": round(sum(row.get("prefill_time_by_family_ms", {}).values()), 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--format", default="nvfp4", choices=("bf16", "nvfp4"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "prefill_ab.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    runs: dict[str, list[dict]] = {"engine": [], args.variant: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in runs:
                undo = VARIANTS[name]() if name != "engine" else None
                try:
                    runs[name].append(prefill_once(args, Path(tmp) / f"{name}_{r}.json"))
                finally:
                    if undo is not None:
                        undo()
                print(f"round {r} {name}: {runs[name][-1]}", flush=True)
    medians = {name: statistics.median(x["wall_ms"] for x in rs) for name, rs in runs.items()}
    for name, ms in medians.items():
        print(f"{args.format} prefill {args.tokens} tokens, {name}: {ms:.1f} ms (median of {args.rounds})")
    result = {"date": date.today().isoformat(), "format": args.format, "tokens": args.tokens, "runs": runs}
    result["median_wall_ms"] = medians
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
