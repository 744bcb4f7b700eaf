"""The prefill MoE's memory-bound launches around torch's grouped GEMM, at Flint's shapes: the gather of x's rows in
expert order (torch's index_select), SiLU-and-mul of the BF16 gate_up (`activation_triton.silu_and_mul`, one row a
program against several), of the FP32 accumulators of NVFP4 copies (`moe_grouped_gemm.scaled_silu_and_mul`) and the
sorted slot reduce.

    python benchmarks/kernels_moe_glue.py [--tokens 2048 8192] [--out FILE]

The SiLU variants are checked against each other first (bit for bit), then each launch is timed as the median of
CUDA-graph replays; the table gives us and the bytes moved a second. Variants are the module constants of the
launches (rows and columns a program), so the rows picked here are what the engine runs. Writes
benchmarks/results/kernels_moe_glue.json. (The twenty-seventh session's first run, `kernels_moe_glue_h200.json`,
also timed a Triton gather, 68-74 us alone at 8K against index_select's 90, but 89.9 us inside the engine: removed.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from kernels_moe_gemv import time_graph
from results_file import write_results

RESULTS = Path(__file__).parent / "results"
HIDDEN, INTER, EXPERTS, TOPK = 2048, 512, 256, 6


def with_constants(module: object, values: dict[str, int], fn: Callable[[], torch.Tensor]) -> Callable[[], object]:
    """`fn` run with `module`'s constants set to `values` (restored after each call)."""

    def run() -> torch.Tensor:
        before = {k: getattr(module, k) for k in values}
        for k, v in values.items():
            setattr(module, k, v)
        try:
            return fn()
        finally:
            for k, v in before.items():
                setattr(module, k, v)

    return run


def case_rows(t: int) -> list[dict]:
    from flint_kernels import activation_triton as act
    from flint_kernels import moe_align_triton as mat
    from flint_kernels import moe_grouped_gemm as mg

    g = torch.Generator(device="cuda").manual_seed(t)
    ids = torch.topk(torch.rand(t, EXPERTS, generator=g, device="cuda"), TOPK, dim=-1).indices
    src, pos, offs = mat.sort(ids, EXPERTS)
    p = src.numel()
    x = torch.randn(t, HIDDEN, generator=g, device="cuda").bfloat16()
    gate_up = (torch.randn(p, 2 * INTER, generator=g, device="cuda") * 2).bfloat16()
    acc = torch.randn(p, 2 * INTER, generator=g, device="cuda") * 2
    scales = torch.rand(EXPERTS, 2, generator=g, device="cuda") + 0.5
    y = torch.randn(p, HIDDEN, generator=g, device="cuda").bfloat16()
    tw = torch.rand(t, TOPK, generator=g, device="cuda")
    out = torch.empty(t, HIDDEN, dtype=torch.bfloat16, device="cuda")

    gather_bytes = p * HIDDEN * 2 * 2  # each row read (mostly from L2: x is 32 MB) and written
    silu_bytes = p * 3 * INTER * 2
    scaled_bytes = p * (2 * INTER * 4 + INTER * 2)
    cases: list[tuple[str, str, int, Callable[[], object], Callable[[], torch.Tensor] | None]] = [
        ("gather", "torch index_select", gather_bytes, lambda: x.index_select(0, src), None),
    ]
    one_row = with_constants(act, {"ROWS_MIN": 1 << 62}, lambda: act.silu_and_mul(gate_up))
    want_silu = one_row()
    cases.append(("silu_and_mul bf16", "one row a program", silu_bytes, one_row, lambda: want_silu))
    for rows, block in ((4, 512), (8, 512), (16, 512), (8, 256), (16, 256)):
        fn = with_constants(act, {"ROWS_MIN": 1, "ROWS": rows, "ROWS_BLOCK": block}, lambda: act.silu_and_mul(gate_up))
        cases.append(("silu_and_mul bf16", f"{rows} x {block}", silu_bytes, fn, lambda: want_silu))
    scaled = lambda: mg.scaled_silu_and_mul(acc, offs, scales, torch.bfloat16)  # noqa: E731
    cases.append(("silu_and_mul fp32 scaled", "one row a program", scaled_bytes, scaled, None))
    reduce_bytes = p * HIDDEN * 2 + t * HIDDEN * 2
    cases.append(("reduce_sorted", "installed", reduce_bytes, lambda: mg.reduce_sorted(y, pos, tw, out, None), None))

    found = []
    for op, variant, nbytes, fn, want in cases:
        row: dict = {"tokens": t, "pairs": p, "op": op, "variant": variant}
        got = fn()
        if want is not None:
            row["check"] = "ok" if torch.equal(got, want()) else "differs"
        us = time_graph([fn]) * 1000
        row |= {"us": round(us, 2), "TB/s": round(nbytes / us / 1e6, 2)}
        print(f"{t:6d} {op:26s} {variant:20s} {us:9.2f} us {row['TB/s']:6.2f} TB/s  {row.get('check', '')}", flush=True)
        found.append(row)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels_moe_glue.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    rows = [r for t in args.tokens for r in case_rows(t)]
    write_results(args.out, " ".join(["python", *sys.argv]), rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
