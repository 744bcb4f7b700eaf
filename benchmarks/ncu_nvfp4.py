"""Launch the NVFP4 decode kernels once each, warmed up, for Nsight Compute (`benchmarks/gpu_ncu.sh` runs it under
`ncu --profile-from-start off`).

CUDA only. Everything is compiled and run twice first; then, between cudaProfilerStart and Stop, each call below runs
once, so ncu sees one launch of each:

- the qkv projection (5120 x 2048) at each of --rows: the engine's `gemv_triton.linear` (the installed table) and,
  up to 8 rows, `nvfp4_mma_triton.linear` with 8- and then 16-byte loads (its VEC kernel);
- the MoE (256 experts, I 512, H 2048, top-6 of random scores) at each of --tokens: the engine's `fused_moe` (the
  table's launches) and the MMA gate_up and down alone (`nvfp4_mma_moe_triton.moe_gate_up`, `moe_down`), 8- then
  16-byte.

    ncu --profile-from-start off --clock-control none python benchmarks/ncu_nvfp4.py --rows 1 8 --tokens 32
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvfp4_mma import random_experts, random_weight


def calls(rows: list[int], tokens: list[int]) -> list:
    """The calls to profile, in order (each a no-argument function)."""
    from flint_kernels import gemv_triton, moe_triton
    from flint_kernels import nvfp4_mma_moe_triton as mm
    from flint_kernels import nvfp4_mma_triton as nm

    out = []
    w = random_weight(5120, 2048, 0)
    for m in rows:
        x = (torch.randn(m, 2048, device="cuda") * 0.5).to(torch.bfloat16)
        out.append(lambda x=x: gemv_triton.linear(x, w))
        if m <= nm.MAX_M:
            out += [lambda x=x, v=v: nm.linear(x, w, vec=v) for v in (False, True)]
    n_exp, inter, hidden, topk = 256, 512, 2048, 6
    w13, w2 = random_experts(n_exp, 2 * inter, hidden, 1, gate_up=True), random_experts(n_exp, hidden, inter, 2)
    for t in tokens:
        scores = torch.rand(t, n_exp, device="cuda")
        weights, ids = torch.topk(scores, topk, dim=1)
        x = (torch.randn(t, hidden, device="cuda") * 0.5).to(torch.bfloat16)
        h = (torch.randn(t * topk, inter, device="cuda") * 0.5).to(torch.bfloat16)
        out.append(lambda x=x, w=weights, i=ids: moe_triton.fused_moe(x, w, i, w13, w2))
        out += [lambda x=x, i=ids, v=v: mm.moe_gate_up(x, i, w13, vec=v) for v in (False, True)]
        out += [lambda h=h, i=ids, v=v: mm.moe_down(h, i, w2, vec=v) for v in (False, True)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, nargs="*", default=[32])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/ncu_nvfp4.py needs a CUDA GPU")
    todo = calls(args.rows, args.tokens)
    for _ in range(2):  # compile, then run warm
        for fn in todo:
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in todo:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {len(todo)} calls: rows {args.rows}, tokens {args.tokens}")


if __name__ == "__main__":
    main()
