"""Grouping the prefill MoE's (token, slot) pairs by expert: `align_ref` (stable argsort, scatter_add, cumsums,
searchsorted; ~25 PyTorch launches) against `moe_align_triton.align` (three Triton launches and a memset), for
Flint's 256 experts and top-6, at the grouped tiles' block sizes.

    python benchmarks/kernels_moe_align.py [--tokens 65 512 2048 8192] [--out FILE]

Each Triton result is checked first (block table equal to the reference's, each expert's pairs the same set), then
both are timed as the median of CUDA-graph replays. Prints a table and writes benchmarks/results/kernels_moe_align.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from kernels_moe_gemv import time_graph
from results_file import write_results

RESULTS = Path(__file__).parent / "results"
EXPERTS, TOPK = 256, 6


def check(ids: torch.Tensor, block_m: int) -> str:
    """'ok', or what differs from the reference."""
    from flint_kernels.moe_align import align_ref
    from flint_kernels.moe_align_triton import align

    order, meta, _ = align(ids, EXPERTS, block_m)
    ref_order, ref_meta, _ = align_ref(ids, EXPERTS, block_m)
    if not torch.equal(meta, ref_meta):
        return "block table differs"
    flat = ids.reshape(-1)
    if not torch.equal(flat[order], flat[ref_order]):  # both sorted by expert: the same expert at every row
        return "order differs by expert"
    if not torch.equal(torch.sort(order).values, torch.arange(flat.numel(), device=ids.device)):
        return "not a permutation"
    return "ok"


def main() -> None:
    from flint_kernels import moe_triton as mt
    from flint_kernels.moe_align import align_ref
    from flint_kernels.moe_align_triton import align

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[65, 512, 2048, 8192])
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels_moe_align.json")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{'T':>6} {'block_m':>7} {'reference us':>13} {'triton us':>10}  check")
    for t in args.tokens:
        ids = torch.topk(torch.rand(t, EXPERTS, generator=g, device="cuda"), TOPK, dim=-1).indices
        block_m = mt.grouped_config(t * TOPK / EXPERTS, False, ids.device).block_m
        status = check(ids, block_m)
        ref_us = time_graph([lambda ids=ids, b=block_m: align_ref(ids, EXPERTS, b)]) * 1000
        tri_us = time_graph([lambda ids=ids, b=block_m: align(ids, EXPERTS, b)]) * 1000
        rows.append({"tokens": t, "block_m": block_m, "reference_us": round(ref_us, 2), "triton_us": round(tri_us, 2),
                     "check": status})  # fmt: skip
        print(f"{t:>6} {block_m:>7} {ref_us:>13.1f} {tri_us:>10.1f}  {status}")
    write_results(args.out, "python benchmarks/kernels_moe_align.py --tokens " + " ".join(map(str, args.tokens)), rows)


if __name__ == "__main__":
    main()
