"""Whole-prompt prefill A/B in one process: `decode.py`'s 8K prefill with the engine as it is against a variant,
alternating rounds, so clocks and the machine's state weigh on both alike.

Variants (each a patch applied for its rounds only):
- `scale_pass`: NVFP4 projections at prefill size with FP32 cuBLAS output and a separate global-scale pass
  (`gemv_triton.dequant_matmul(alpha=False)`), as before the twenty-first session's alpha epilogue.
- `fresh_only`: full layers' chunks after a cached prefix on the Triton kernel (`attention_cudnn.SEGMENT = 0`), as
  before the twenty-sixth session; fresh prompts stay on cuDNN. With `--tokens 32768 --chunk 8192`.
- `one_row_glue`: SiLU-and-mul one row a program at every row count, as before the twenty-seventh session.
- `attention_before`: the prefill attention of an older `kernels/attention_triton.py`, the file named by
  FLINT_AB_ATTENTION_BEFORE (e.g. `git show e9437d1:kernels/attention_triton.py`, before the edge masks).

    python benchmarks/prefill_ab.py --variant scale_pass --rounds 3 --out benchmarks/results/prefill_ab.json
    python benchmarks/prefill_ab.py --variant-tuning-file T.json --chunk 2048 --rounds 3

`--variant-tuning-file` runs the variant's rounds with another tuning table as well (e.g. `moe.paths`'
`dequant_min_tokens` lowered, from `benchmarks/tuning_variant.py`), and `--chunk` times the prompt in the engine's
steps of that many tokens.

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


def _fresh_only() -> Callable[[], None]:
    from flint_kernels import attention_cudnn as ac

    original = ac.SEGMENT
    ac.SEGMENT = 0

    def undo() -> None:
        ac.SEGMENT = original

    return undo


def _one_row_glue() -> Callable[[], None]:
    from flint_kernels import activation_triton as act

    before = act.ROWS_MIN
    act.ROWS_MIN = 1 << 62

    def undo() -> None:
        act.ROWS_MIN = before

    return undo


def _attention_before() -> Callable[[], None]:
    from flint_kernels import attention_triton as at
    from prefill_attention_ab import load_before  # a sibling script: benchmarks/ is on the path as for any run

    before = load_before(Path(os.environ["FLINT_AB_ATTENTION_BEFORE"]))
    original = at.paged_attention_prefill
    at.paged_attention_prefill = before.paged_attention_prefill  # what `paged_attention` calls for prefills

    def undo() -> None:
        at.paged_attention_prefill = original

    return undo


VARIANTS: dict[str, Callable[[], Callable[[], None]]] = {
    "scale_pass": _scale_pass,
    "fresh_only": _fresh_only,
    "one_row_glue": _one_row_glue,
    "attention_before": _attention_before,
}


def _tuning_file(path: Path) -> Callable[[], None]:
    """A tuning table in place of the shipped one (FLINT_TUNING_FILE, read per launch)."""
    from flint_kernels import tuning

    before = os.environ.get(tuning.ENV)
    os.environ[tuning.ENV] = str(path)

    def undo() -> None:
        if before is None:
            os.environ.pop(tuning.ENV, None)
        else:
            os.environ[tuning.ENV] = before

    return undo


def prefill_once(args: argparse.Namespace, out: Path) -> dict:
    """One `decode.py` run that times only the prefill (and a short batch-1 decode row it always takes)."""
    sys.argv = [
        "decode.py", "--preset", args.preset, "--device", args.device, "--formats", args.format, "--batches", "1",
        "--contexts", str(min(1024, args.tokens)), "--prefill", str(args.tokens), "--prefill-chunks", str(args.chunk),
        "--check-steps", "0", "--check-batches", "--no-plain-timing", "--reps", "5", "--profile-batches",
        "--out", str(out),
    ]  # fmt: skip
    runpy.run_path(str(HERE / "decode.py"), run_name="__main__")
    row = next(r for r in json.loads(out.read_text())["rows"] if "prefill_ms" in r)
    return {"wall_ms": row["prefill_ms"], "gpu_ms": round(sum(row.get("prefill_time_by_family_ms", {}).values()), 2)}


def _apply(args: argparse.Namespace) -> list[Callable[[], None]]:
    """The variant's patches, applied now; their undos, to run in reverse."""
    undos = [VARIANTS[args.variant]()] if args.variant else []
    if args.variant_tuning_file:
        undos.append(_tuning_file(args.variant_tuning_file))
    return undos


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--variant-tuning-file", type=Path, help="the variant's rounds also run with this tuning table")
    ap.add_argument("--format", default="nvfp4", choices=("bf16", "nvfp4"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=0, help="prefill in steps of this many tokens (0: one step)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "prefill_ab.json")
    args = ap.parse_args(argv)
    if not args.variant and not args.variant_tuning_file:
        ap.error("name a --variant, a --variant-tuning-file, or both")
    sys.path.insert(0, str(HERE))
    name = "+".join(filter(None, [args.variant, args.variant_tuning_file and args.variant_tuning_file.stem]))
    runs: dict[str, list[dict]] = {"engine": [], name: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in runs:
                undos = _apply(args) if side != "engine" else []
                try:
                    runs[side].append(prefill_once(args, Path(tmp) / f"{side}_{r}.json"))
                finally:
                    for undo in reversed(undos):
                        undo()
                print(f"round {r} {side}: {runs[side][-1]}", flush=True)
    medians = {side: statistics.median(x["wall_ms"] for x in rs) for side, rs in runs.items()}
    steps = f" in steps of {args.chunk}" if args.chunk else ""
    for side, ms in medians.items():
        print(f"{args.format} prefill {args.tokens} tokens{steps}, {side}: {ms:.1f} ms (median of {args.rounds})")
    result = {
        "date": date.today().isoformat(), "format": args.format, "tokens": args.tokens, "chunk": args.chunk,
        "variant": args.variant, "variant_tuning_file": str(args.variant_tuning_file or ""), "runs": runs,
        "median_wall_ms": medians,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
