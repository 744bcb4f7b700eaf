"""Flint's router (FP32 logits, sigmoid, top-6, renormalised; 256 experts x 2048) from decode batches to an 8K
prefill: the PyTorch reference (FP32 GEMM + torch.topk), the one-launch GEMV kernel (up to 16 tokens) and the
tensor-core tile kernel (`router_triton._router_tiles_kernel`) with its FP32 weight split in the kernel or made
once ahead (`split_weight`), over a few tile configurations.

    python benchmarks/kernels_router.py [--tokens 32 64 512 2048 8192]

Each call is checked against the reference (weights within 1e-5, expert ids equal except near-ties) and timed as
the median of CUDA-graph replays over several router weights (so L2 does not hold the weight). Prints a table and
writes benchmarks/results/kernels_router.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from kernels_moe_gemv import time_graph
from results_file import write_results

RESULTS = Path(__file__).parent / "results"
EXPERTS, HIDDEN, TOPK = 256, 2048, 6


def check(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> str:
    """'ok', or what differs from the reference."""
    w_err = (got[0] - ref[0]).abs().max().item()
    ids_differ = (got[1] != ref[1]).float().mean().item()
    if w_err < 1e-5 and ids_differ <= 0.01:
        return "ok"
    return f"weights off by {w_err:.1e}, {ids_differ:.1%} ids differ"


def candidates(tokens: int) -> dict:
    """Tile configurations timed at `tokens` (name -> (TilesConfig or None for the default, pre-split))."""
    from flint_kernels import router_triton as rt

    tc = rt.RouterTilesConfig
    out: dict = {"default": (None, False), "default presplit": (None, True)}
    if tokens >= 1024:
        for bt, be, bk, w, st in ((64, 256, 64, 8, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (64, 64, 64, 4, 4)):
            for pre in (False, True):
                out[f"t{bt} e{be} k{bk} w{w} s{st}{' presplit' if pre else ''}"] = (tc(bt, be, bk, w, st), pre)
    if tokens >= 4096:
        # The installed 128 x 128 x 64 tiles in 3 stages take 192 KB of shared memory: one program an SM, 128 of them
        # at 8K tokens, one wave with nothing to hide each program's latency (84 us a layer in the 8K prefill, the
        # MMAs ~27 us). Fewer stages or K steps fit two programs an SM; all 256 experts a program read x once; K
        # split over programs fills the SMs. Pre-split weights, as the engine runs them.
        for bt, be, bk, w, st, sk in (
            (128, 128, 64, 8, 2, 1), (128, 128, 32, 8, 3, 1), (128, 128, 32, 8, 4, 1), (64, 128, 32, 4, 4, 1),
            (128, 64, 64, 8, 3, 1), (64, 256, 32, 8, 3, 1), (128, 256, 32, 8, 2, 1), (128, 128, 64, 8, 3, 2),
            (128, 128, 32, 8, 3, 2), (64, 128, 64, 4, 3, 2),
        ):  # fmt: skip
            cfg = tc(bt, be, bk, w, st, sk)
            if rt.shared_memory_bytes(cfg, True) <= 232448:  # the H200's limit a program
                out[f"t{bt} e{be} k{bk} w{w} s{st} splitk{sk} presplit"] = (cfg, True)
    else:
        for be, bk, st in ((16, 64, 3), (32, 64, 3), (16, 128, 3), (64, 64, 3)):
            bt = max(16, min(64, 1 << (tokens - 1).bit_length()))
            for pre in (False, True):
                out[f"t{bt} e{be} k{bk} s{st}{' presplit' if pre else ''}"] = (tc(bt, be, bk, 4, st), pre)
        # K split over programs (split_k 1: none, the tiles before 2026-11-30's seventh session; 0: automatic).
        bt = max(16, min(64, 1 << (tokens - 1).bit_length()))
        for be, bk, sk in ((16, 128, 1), (16, 128, 4), (16, 128, 8), (16, 64, 16), (32, 128, 8), (64, 64, 0)):
            out[f"t{bt} e{be} k{bk} splitk{sk} presplit"] = (tc(bt, be, bk, 4, 3, sk), True)
        # 16-token blocks: more programs, and one top-k program per 16 tokens instead of one for the whole batch.
        if bt > 16:
            for sk in (2, 4):
                out[f"t16 e16 k128 splitk{sk} presplit"] = (tc(16, 16, 128, 4, 3, sk), True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 64, 512, 2048, 8192])
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels_router.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernels_router: no CUDA GPU here; nothing was run.")
        return
    from flint_kernels import router_triton as rt
    from flint_kernels.router import sigmoid_topk_ref

    g = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.randn(EXPERTS, HIDDEN, device="cuda", generator=g) * HIDDEN**-0.5 for _ in range(4)]
    splits = [rt.split_weight(w) for w in weights]
    rows = []
    for t in args.tokens:
        x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
        ref = sigmoid_topk_ref(x, weights[0], TOPK)
        ref_ms = time_graph([lambda x=x: sigmoid_topk_ref(x, weights[0], TOPK)], reps=20)
        row: dict = {"tokens": t, "reference_ms": round(ref_ms, 4)}
        for name, (cfg, pre) in candidates(t).items():
            out_w = torch.empty(t, TOPK, device="cuda")
            out_ids = torch.empty(t, TOPK, device="cuda", dtype=torch.int64)
            i = [0]

            def call(x=x, cfg=cfg, pre=pre, out_w=out_w, out_ids=out_ids, i=i) -> None:
                k = i[0] % len(weights)
                i[0] += 1
                rt._tiles(x, weights[k], TOPK, True, 1.0, out_w, out_ids, cfg, splits[k] if pre else None)

            try:
                i[0] = 0
                call()
                verdict = check((out_w.clone(), out_ids.clone()), ref)
                if verdict != "ok":
                    row[name] = verdict
                    continue
                row[name] = round(time_graph([call], reps=20), 4)
            except Exception as e:  # a config that does not compile (shared memory, registers) is reported
                row[name] = f"error: {type(e).__name__}: {str(e)[:100]}"
        rows.append(row)
        best = min((v, k) for k, v in row.items() if k not in ("tokens", "reference_ms") and isinstance(v, float))
        print(f"T={t:>5}: reference {row['reference_ms'] * 1e3:8.1f} us, best {best[0] * 1e3:8.1f} us ({best[1]})")
        for k, v in row.items():
            if k not in ("tokens", "reference_ms"):
                print(f"    {k:34s} {v * 1e3:8.1f} us" if isinstance(v, float) else f"    {k:34s} {v}")
    write_results(args.out, "python benchmarks/kernels_router.py --tokens " + " ".join(map(str, args.tokens)), rows)


if __name__ == "__main__":
    main()
