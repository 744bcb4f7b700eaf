"""The NVFP4 linear and MoE on mma.sync with the decode in PTX (`flint_kernels.nvfp4_mma_triton`,
`nvfp4_mma_moe_triton`) against the engine's path.

CUDA only. For Flint's NVFP4 shapes at 1-8 rows of x (`--ms`; 9-64 rows run the MMA rows kernel): each variant is
checked against `linear_ref` ("ok": within 2 BF16 ulps plus 2**-16 of the sum of |products|), then timed inside a
CUDA graph of calls rotating over enough weight copies that L2 never holds them (`kernels_moe_gemv.time_graph`).
Variants: the engine's `gemv_triton.linear` with the installed tuning table, and the MMA kernel in 4 and 8 warps,
with 8-byte loads and with 16-byte ones ("_v", the VEC kernels), optionally with its loads a K step ahead ("_pf";
split-K chosen by the kernel, or --splits). In the MoE, "_l2N" asks L2 for the gate_up's codes N K steps ahead
(--moe-l2-ahead), "_dN" for the down's (--moe-down-l2: 1 two steps ahead, 2 all before the PDL wait), "_kN" the
gate_up with its warps splitting K in N parts (--moe-warp-k; with each --moe-l2-ahead too), "_wide" both with two
weight tiles a warp sharing the activations' loads (--moe-wide), "_r" any 16-byte variant reading ready scale bytes
(--ready: `nvfp4_mma_scales`, made for every weight first; the E4M3 variants are unchanged by them), "_rc" such a
variant reading ready codes as well (--ready-codes: `nvfp4_mma_codes`, made for every weight after the scales). One
expert's gate_up and down stand for the MoE.

The MoE (`--moe-tokens`, 256 experts of I = 512, H = 2048, top-6 of random scores): the MMA kernels' expert-major
gate_up and down (`nvfp4_mma.moe_gate_up`, `moe_down`) against the engine's gate_up and down launches inside
`moe_triton.fused_moe` with the installed table, each kernel's GPU time from the profiler over 16 routings in turn
(so L2 holds no expert). The engine's down includes the slot sum; the MMA down leaves it to a reduce launch.

    python benchmarks/nvfp4_mma.py                      # table + benchmarks/results/nvfp4_mma.json
    python benchmarks/nvfp4_mma.py --ms 1 8 --shapes expert_gate_up qkv --moe-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from kernels_moe_gemv import time_graph  # noqa: E402

SHAPES = {  # name: (N, K)
    "qkv": (5120, 2048),
    "o_proj": (2048, 4096),
    "expert_gate_up": (1024, 2048),
    "expert_down": (2048, 512),
    "shared_gate_up": (2048, 2048),
    "shared_down": (2048, 1024),
    "lm_head": (150144, 2048),
}


def random_weight(n: int, k: int, seed: int):  # -> NVFP4Weight
    from flint_kernels.linear import NVFP4Weight

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), generator=g, device="cuda", dtype=torch.int32).to(torch.uint8)
    # Scale bytes of ordinary magnitude (E4M3 0.25-4), so sums stay far from overflow.
    s = torch.randint(0x28, 0x48, (n, k // 16), generator=g, device="cuda", dtype=torch.int32).to(torch.uint8)
    return NVFP4Weight(q, s, torch.tensor([0.75], device="cuda"), (n,))


def random_experts(n_exp: int, n: int, k: int, seed: int, gate_up: bool = False):  # -> NVFP4Weight
    """Random NVFP4 experts [n_exp, n, k] (scale bytes as in `random_weight`); gate_up: two segments of n / 2 rows,
    each with its own global scale."""
    from flint_kernels.linear import NVFP4Weight

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(0, 256, (n_exp, n, k // 2), generator=g, device="cuda", dtype=torch.int32).to(torch.uint8)
    s = torch.randint(0x28, 0x48, (n_exp, n, k // 16), generator=g, device="cuda", dtype=torch.int32)
    gs = torch.full((n_exp, 2 if gate_up else 1), 0.75, device="cuda")
    return NVFP4Weight(q, s.to(torch.uint8), gs, (n // 2, n // 2) if gate_up else (n,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument(
        "--prefetch",
        type=int,
        nargs="+",
        default=[0],
        choices=[0, 1],
        help="the MMA kernels with their loads a K step ahead (1) and/or without (0)",
    )
    ap.add_argument(
        "--vec",
        type=int,
        nargs="+",
        default=[0, 1],
        choices=[0, 1],
        help="the MMA kernels with 8-byte loads (0) and/or 16-byte ones (1, the VEC kernels)",
    )
    ap.add_argument(
        "--splits",
        type=int,
        nargs="*",
        default=[],
        help="also the linear in 4 warps, 16-byte loads, with these K splits (else the kernel's own choice); with "
        "--wide also the wide kernel so (with --ready reading ready scale bytes)",
    )
    ap.add_argument(
        "--wide",
        action="store_true",
        help="also each 16-byte linear variant with 32 weight rows a warp (`wide`, 9-32 rows of x)",
    )
    ap.add_argument("--moe-tokens", type=int, nargs="*", default=[1, 2, 8, 16, 32, 64])
    ap.add_argument(
        "--moe-l2-ahead",
        type=int,
        nargs="*",
        default=[],
        help="also each 16-byte MoE variant's gate_up asking L2 for its codes this many K steps ahead (even)",
    )
    ap.add_argument(
        "--moe-down-l2",
        type=int,
        nargs="*",
        default=[],
        choices=[1, 2],
        help="also each 16-byte MoE variant's down asking L2 for its codes (1: two K steps ahead, 2: before the wait)",
    )
    ap.add_argument(
        "--moe-warp-k",
        type=int,
        nargs="*",
        default=[],
        help="also each 16-byte MoE variant's gate_up with its warps splitting K in this many parts (mma_warp_k)",
    )
    ap.add_argument(
        "--moe-wide",
        action="store_true",
        help="also each 16-byte MoE variant (not splitting K) with two weight tiles a warp (mma_wide, mma_down_wide)",
    )
    ap.add_argument(
        "--ready",
        action="store_true",
        help="also each 16-byte variant reading ready scale bytes (`nvfp4_mma_scales`, mma_ready; label _r)",
    )
    ap.add_argument(
        "--ready-codes",
        action="store_true",
        help="also each ready-scale variant reading ready codes (`nvfp4_mma_codes`, mma_ready_codes; label _rc; "
        "implies --ready)",
    )
    ap.add_argument("--out", default=str(ROOT / "results" / "nvfp4_mma.json"))
    args = ap.parse_args()
    args.ready = args.ready or args.ready_codes
    if not torch.cuda.is_available():
        sys.exit("benchmarks/nvfp4_mma.py needs a CUDA GPU")
    from flint_kernels import gemv_triton, nvfp4_mma_codes, nvfp4_mma_scales
    from flint_kernels import nvfp4_mma_triton as nm
    from flint_kernels.linear import linear_ref

    mma = [
        (f"mma_w{nw}{'_pf' if pf else ''}{'_v' if v else ''}", {"num_warps": nw, "prefetch": bool(pf), "vec": bool(v)})
        for v in args.vec
        for pf in args.prefetch
        for nw in args.warps
    ]
    moe_variants = (
        mma
        + [(f"{label}_l2{a}", {**kw, "l2_ahead": a}) for label, kw in mma if kw["vec"] for a in args.moe_l2_ahead]
        + [(f"{label}_d{m}", {**kw, "l2": m}) for label, kw in mma if kw["vec"] for m in args.moe_down_l2]
        + [
            (f"{label}{f'_l2{a}' if a else ''}_k{s}", {**kw, "l2_ahead": a, "warp_k": s})
            for label, kw in mma
            if kw["vec"]
            for a in [0, *args.moe_l2_ahead]
            for s in args.moe_warp_k
            if kw["num_warps"] % s == 0
        ]
    )
    if args.moe_wide:
        moe_variants += [
            (f"{label}_wide", {**kw, "wide": True})
            for label, kw in moe_variants
            if kw["vec"] and kw.get("warp_k", 1) == 1
        ]
    wide = [(f"{label}_wide", {**kw, "wide": True}) for label, kw in mma if kw["vec"] and not kw["prefetch"]]
    wide = wide if args.wide else []
    if args.ready:  # the same kernels reading ready scale bytes (made for every weight below)
        wide += [(f"{label}_r", {**kw, "ready": True}) for label, kw in mma + wide if kw["vec"]]
        moe_variants += [(f"{label}_r", {**kw, "ready": True}) for label, kw in moe_variants if kw["vec"]]
    if args.ready_codes:  # and reading ready codes (made for every weight below, after the ready scales)
        wide += [(f"{label}c", {**kw, "ready_codes": True}) for label, kw in wide if kw.get("ready")]
        moe_variants += [(f"{label}c", {**kw, "ready_codes": True}) for label, kw in moe_variants if kw.get("ready")]
    split_labels = [f"mma_w4_k{sk}" for sk in args.splits]
    split_kw = [dict(num_warps=4, split_k=sk, vec=True) for sk in args.splits]
    if args.wide:
        ready_tag = "_r" if args.ready else ""
        split_labels += [f"mma_w4_wide{ready_tag}_k{sk}" for sk in args.splits]
        split_kw += [dict(num_warps=4, split_k=sk, vec=True, wide=True, ready=args.ready) for sk in args.splits]
    rows = []
    for name in args.shapes:
        n, k = SHAPES[name]
        nbytes = n * k // 2 + n * k // 16
        copies = max(2, min(64, -(-200_000_000 // nbytes)))
        ws = [random_weight(n, k, seed) for seed in range(copies)]
        if args.ready:
            for w in ws:
                nvfp4_mma_scales.prepare(w)
                if args.ready_codes:
                    nvfp4_mma_codes.make_ready(w)
        for m in args.ms:
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            want = linear_ref(x, ws[0]).float()
            # Reordered FP32 sums can move a result that cancels by a little of the sum of |products|.
            l1 = (x.float().abs() @ ws[0].dequantize(torch.float32).abs().T) * ws[0].column_scale()
            variants = {"engine": lambda x, w: gemv_triton.linear(x, w)}
            for label, kw in mma:
                variants[label] = lambda x, w, kw=kw: nm.linear(x, w, **kw)
            for label, kw in zip(split_labels, split_kw, strict=True):
                variants[label] = lambda x, w, kw=kw: nm.linear(x, w, **kw)
            for label, kw in wide:
                variants[label] = lambda x, w, kw=kw: nm.linear(x, w, **kw)
            row = {"shape": name, "n": n, "k": k, "m": m}
            for label, fn in variants.items():
                try:
                    got = fn(x, ws[0]).float()
                    tol = 2.0**-7 * torch.maximum(got.abs(), want.abs()) + 2.0**-16 * l1
                    ok = bool(((got - want).abs() <= tol).all())
                    us = time_graph([lambda fn=fn, x=x, w=w: fn(x, w) for w in ws]) * 1e3
                    row[label] = {"us": round(us, 2), "gbps": round(nbytes / us / 1e3, 1), "ok": ok}
                except Exception as exc:  # a variant that fails to compile or run is reported, not fatal
                    row[label] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    labels = ["engine"] + [label for label, _ in mma] + split_labels
    labels += [label for label, _ in wide]
    print(f"\nNVFP4 linear on {torch.cuda.get_device_name()}, us per call (GB/s), ok = within 2 BF16 ulps")
    print(f"{'shape':>15} {'m':>2} " + " ".join(f"{lb:>20}" for lb in labels))
    for r in rows:
        cells = []
        for lb in labels:
            v = r[lb]
            cells.append("error" if "error" in v else f"{v['us']:.2f} ({v['gbps']:.0f}){'' if v['ok'] else ' BAD'}")
        print(f"{r['shape']:>15} {r['m']:>2} " + " ".join(f"{c:>20}" for c in cells))
    moe_rows = moe_gate_up_rows(args.moe_tokens, moe_variants) if args.moe_tokens else []
    command = "python benchmarks/nvfp4_mma.py " + " ".join(sys.argv[1:])
    out = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "command": command, "rows": rows, "moe": moe_rows}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


def kernel_us(calls: list, match: str, reps: int = 5) -> float:
    """Mean GPU time (us) per call of the kernels whose name contains `match`, from the profiler."""
    for fn in calls:  # compile and warm up outside the profile
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for fn in calls:
                fn()
        torch.cuda.synchronize()
    total = 0.0
    for ev in prof.key_averages():
        if match in ev.key:
            total += getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
    return total / (reps * len(calls))


def moe_gate_up_rows(token_counts: list[int], mma: list[tuple[str, dict]]) -> list[dict]:
    """The MoE gate_up and down at each token count: the MMA kernels' expert-major launches (variants: label,
    the kernels' keyword arguments) vs the engine's launches."""
    from flint_kernels import moe_triton
    from flint_kernels import nvfp4_mma_moe_triton as mm
    from flint_kernels.activation import silu_and_mul_ref
    from flint_kernels.linear import linear_ref

    n_exp, inter, hidden, topk = 256, 512, 2048, 6

    w13, w2 = random_experts(n_exp, 2 * inter, hidden, 1, gate_up=True), random_experts(n_exp, hidden, inter, 2)
    if any(kw.get("ready") for _, kw in mma):
        from flint_kernels import nvfp4_mma_codes, nvfp4_mma_scales

        for w in (w13, w2):
            nvfp4_mma_scales.prepare(w)
            if any(kw.get("ready_codes") for _, kw in mma):
                nvfp4_mma_codes.make_ready(w)
    rows = []
    for t in token_counts:
        routes = []
        for r in range(16):
            scores = torch.rand(t, n_exp, device="cuda", generator=torch.Generator(device="cuda").manual_seed(r))
            weights, ids = torch.topk(scores, topk, dim=1)
            x = (torch.randn(t, hidden, device="cuda") * 0.5).to(torch.bfloat16)
            routes.append((x, weights.float(), ids))
        x, weights, ids = routes[0]
        want = torch.stack([silu_and_mul_ref(linear_ref(x[p // topk][None], w13.select(int(e))))[0]
                            for p, e in enumerate(ids.reshape(-1).tolist())]).float()  # fmt: skip
        row: dict = {"tokens": t, "pairs": t * topk, "experts_used": int(ids.unique().numel())}
        engine = [lambda r=r: moe_triton.fused_moe(r[0], r[1], r[2], w13, w2) for r in routes]
        row["engine_gate_up_us"] = round(kernel_us(engine, "gate_up"), 2)
        row["engine_down_us"] = round(kernel_us(engine, "_moe_down_kernel"), 2)
        h = (torch.randn(t * topk, inter, device="cuda") * 0.5).to(torch.bfloat16)
        want_y = torch.stack([linear_ref(h[p][None], w2.select(int(e)))[0]
                              for p, e in enumerate(ids.reshape(-1).tolist())]).float()  # fmt: skip
        for label, kw in mma:
            # l2_ahead and warp_k: the gate_up's only; l2: the down's only
            gate_kw = {k: v for k, v in kw.items() if k != "l2"}
            kw = {k: v for k, v in kw.items() if k not in ("l2_ahead", "warp_k")}
            try:
                got = mm.moe_gate_up(x, ids, w13, **gate_kw).float()
                ok = bool(((got - want).abs() <= 3 * 2.0**-8 * torch.maximum(got.abs(), want.abs())
                           + 1e-3 * want.abs().max()).all())  # fmt: skip
                us = kernel_us(
                    [lambda r=r, kw=gate_kw: mm.moe_gate_up(r[0], r[2], w13, **kw) for r in routes], "gate_up_mma"
                )
                y = mm.moe_down(h, ids, w2, **kw).float()
                ok_y = bool(((y - want_y).abs() <= 3 * 2.0**-8 * torch.maximum(y.abs(), want_y.abs())
                             + 1e-3 * want_y.abs().max()).all())  # fmt: skip
                down = [lambda r=r, kw=kw, h=h: mm.moe_down(h, r[2], w2, **kw) for r in routes]
                # The MMA down leaves the slot sum to `_moe_reduce_kernel` (one more launch, ~2-3 us).
                row[label] = {"us": round(us, 2), "ok": ok, "down_us": round(kernel_us(down, "down_mma"), 2),
                                     "down_ok": ok_y}  # fmt: skip
            except Exception as exc:  # reported, not fatal
                row[label] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\nMoE gate_up / down (256 experts, I 512, H 2048, top-6), GPU us a call (engine down: with its slot sum)")
    print(f"{'tokens':>6} {'experts':>7} {'engine':>14} " + " ".join(f"{label:>30}" for label, _ in mma))
    for r in rows:
        cells = []
        for label, _ in mma:
            v = r[label]
            bad = "" if v.get("ok") and v.get("down_ok") else " BAD"
            cells.append("error" if "error" in v else f"{v['us']:.1f} / {v['down_us']:.1f}{bad}")
        engine = f"{r['engine_gate_up_us']:.1f} / {r['engine_down_us']:.1f}"
        print(f"{r['tokens']:>6} {r['experts_used']:>7} {engine:>14} " + " ".join(f"{c:>30}" for c in cells))
    return rows


if __name__ == "__main__":
    main()
