"""The routed MoE of long prefills: our TMA-fed grouped launches (`flint_kernels.moe_grouped_tma_triton`: gate_up
with SiLU-and-mul in its epilogue, down) against the installed path (BF16: torch's grouped GEMM, CUTLASS on sm_90;
NVFP4: the BF16 copies on whichever path the table picks), both on the same routing. For NVFP4 also the launches'
twins that decode NVFP4 in registers with no copy (the decoded tile the MMA's left operand), each checked against the
copies' result (equal expected); `--twins-only` times only those and the installed paths.

CUDA only (sm_90+). Every variant is checked against `moe_ref` (rel. error) and timed inside CUDA graphs over two
weight stacks (the harness of `kernels_moe_gemv.py`); each launch is also timed alone against CUTLASS's matching
GEMM, so the tiles can be chosen per launch. NVFP4 rows include making the BF16 copies, as the engine does.

    python benchmarks/moe_grouped_tma.py --ts 512 1024 2048 4096 8192 --formats bf16 nvfp4 --out moe_grouped_tma.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_moe_gemv import EXPERTS, HIDDEN, INTER, TOPK, moe_weights, rel_err, routing, time_graph
from results_file import write_results

# (block_m, block_n, block_k, warps, stages, gather): gate_up's block_n is each of gate and up. The twenty-ninth
# session's first sweep also had Triton's warp specialisation (`tl.range(warp_specialize=True)`): it failed to compile
# at 64 rows (Triton 3.6, sm_90) and was no faster at 128.
GATE_UP_TILES = [
    (64, 128, 64, 4, 4, True),
    (64, 128, 64, 4, 5, True),
    (64, 128, 64, 4, 4, False),
    (128, 128, 64, 8, 3, True),
    (128, 128, 64, 8, 4, True),
    (128, 128, 64, 8, 4, False),
    # Deeper K steps, fewer stages: more bytes a TMA request where few rows leave the launch waiting on memory
    # (twenty-ninth session: every launch read the experts at ~2 TB/s below 1,024 tokens). Not yet run.
    (64, 128, 128, 4, 2, True),
    (64, 128, 128, 4, 2, False),
]
DOWN_TILES = [
    (64, 128, 64, 4, 4),
    (64, 256, 64, 4, 3),
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 5),
    (64, 128, 128, 4, 3),
]


def gate_up_cfg(c: tuple):
    from flint_kernels.configs import MoETmaConfig

    return MoETmaConfig(
        block_m=c[0], gate_up_block_n=c[1], gate_up_block_k=c[2], gate_up_warps=c[3], gate_up_stages=c[4], gather=c[5]
    )


def down_cfg(c: tuple, base=None):
    import dataclasses

    from flint_kernels.configs import MoETmaConfig

    return dataclasses.replace(
        base or MoETmaConfig(), block_m=c[0], down_block_n=c[1], down_block_k=c[2], down_warps=c[3], down_stages=c[4]
    )


def cfg_name(c: tuple) -> str:
    return f"m{c[0]} n{c[1]} k{c[2]} w{c[3]} s{c[4]}" + (" gather" if len(c) > 5 and c[5] else "")


def run(
    t: int,
    fmt: str,
    stacks: list,
    gen: torch.Generator,
    only_paths: bool = False,
    twins_only: bool = False,
    decode_path: bool = False,
    nv_block_ms: tuple[int, ...] = (64, 128),
    packings: tuple[bool, ...] = (False, True),
) -> dict:
    from flint_kernels import moe_align_triton, moe_triton
    from flint_kernels import moe_grouped_gemm as mg
    from flint_kernels import moe_grouped_tma_triton as tma
    from flint_kernels.moe import moe_ref

    x = torch.randn(t, HIDDEN, generator=gen, device=gen.device).bfloat16()
    tw, ids = routing(t, gen)
    w13, w2 = stacks[0]
    ref = moe_ref(x, tw, ids, w13, w2)
    flops = 2 * t * TOPK * 3 * HIDDEN * INTER
    row: dict = {"format": fmt, "T": t}

    def copies(a, b):  # NVFP4: the BF16 copies the engine makes for long prefills
        if fmt == "bf16":
            return a, b
        return moe_triton._dequantized(a, torch.bfloat16), moe_triton._dequantized(b, torch.bfloat16)

    def installed(a, b):  # the table as it is
        return moe_triton.fused_moe(x, tw, ids, a, b, decode_max_tokens=0)

    def before(a, b):  # the H200 table before the TMA launches: grouped GEMM (BF16) and copies from 3,072
        return moe_triton.fused_moe(
            x, tw, ids, a, b, decode_max_tokens=0, dequant_min_tokens=3072, tma_min_tokens=0,
            grouped_gemm_min_tokens=3072 if fmt == "bf16" else 0,
        )  # fmt: skip

    def decode(a, b):  # the decode path (no sorting) at this many tokens: where the grouped paths should start
        return moe_triton.fused_moe(x, tw, ids, a, b, decode_max_tokens=t)

    paths = [("installed", installed), ("before", before)] + ([("decode", decode)] if decode_path else [])
    for key, fn in paths:
        row[f"{key}_rel_err"] = rel_err(fn(w13, w2), ref)
        row[f"{key}_ms"] = time_graph([lambda s=s, fn=fn: fn(*s) for s in stacks], reps=4)
        print(f"{fmt} T {t}: {key} {row[f'{key}_ms']:.3f} ms", flush=True)
    if only_paths:
        return row
    # Each launch alone, on block tables made once per block_m.
    tables = {m: moe_align_triton.sort_blocks(ids, EXPERTS, m) for m in {64, 128, *nv_block_ms}}
    if twins_only:
        if fmt == "nvfp4":
            row["nvfp4_in_launches"] = nvfp4_in_launches(x, tw, ids, stacks, tables, ref, flops, nv_block_ms, packings)
        return row
    c13, c2 = copies(w13, w2)
    src, _, offs = moe_align_triton.sort(ids, EXPERTS)
    launches: dict = {}
    if fmt == "bf16":
        xs = x.index_select(0, src)
        gu = mg.GROUPED_MM(xs, c13.transpose(1, 2), offs=offs)
        from flint_kernels import activation_triton

        hh = activation_triton.silu_and_mul(gu)
        launches["cutlass gate_up + silu (us)"] = round(
            time_graph(
                [lambda: activation_triton.silu_and_mul(mg.GROUPED_MM(xs, c13.transpose(1, 2), offs=offs))], reps=8
            )
            * 1000,
            1,
        )
        launches["cutlass gather x (us)"] = round(time_graph([lambda: x.index_select(0, src)], reps=8) * 1000, 1)
        launches["cutlass down (us)"] = round(
            time_graph([lambda: mg.GROUPED_MM(hh, c2.transpose(1, 2), offs=offs)], reps=8) * 1000, 1
        )
    gate_up_us, down_us = {}, {}
    h_ref = {}
    for c in GATE_UP_TILES:
        cfg = gate_up_cfg(c)
        s_, _, meta = tables[cfg.block_m]
        try:
            h = tma.gate_up(x, s_, meta, c13, cfg)
            h_ref.setdefault(cfg.block_m, h)
            gate_up_us[cfg_name(c)] = round(
                time_graph([lambda cfg=cfg, s_=s_, meta=meta: tma.gate_up(x, s_, meta, c13, cfg)], reps=8) * 1000, 1
            )
        except Exception as e:  # report, keep the others
            gate_up_us[cfg_name(c)] = f"{type(e).__name__}: {e}"[:200]
        print(f"  gate_up {cfg_name(c)}: {gate_up_us[cfg_name(c)]}", flush=True)
    for c in DOWN_TILES:
        cfg = down_cfg(c)
        _, _, meta = tables[cfg.block_m]
        h = h_ref.get(cfg.block_m)
        if h is None:
            continue
        try:
            down_us[cfg_name(c)] = round(
                time_graph([lambda cfg=cfg, meta=meta, h=h: tma.down(h, meta, c2, cfg)], reps=8) * 1000, 1
            )
        except Exception as e:
            down_us[cfg_name(c)] = f"{type(e).__name__}: {e}"[:200]
        print(f"  down {cfg_name(c)}: {down_us[cfg_name(c)]}", flush=True)
    row["launches_us"] = launches
    row["gate_up_us"] = gate_up_us
    row["down_us"] = down_us
    # The whole path with the best tiles of each block_m.
    whole = {}
    for m in (64, 128):

        def best(us: dict, m: int = m) -> tuple | None:
            ok = [(v, k) for k, v in us.items() if isinstance(v, float) and k.startswith(f"m{m} ")]
            return min(ok)[1] if ok else None

        g_name, d_name = best(gate_up_us), best(down_us)
        if g_name is None or d_name is None:
            continue
        cfg = down_cfg(
            next(c for c in DOWN_TILES if cfg_name(c) == d_name),
            gate_up_cfg(next(c for c in GATE_UP_TILES if cfg_name(c) == g_name)),
        )

        def call(a, b, cfg=cfg):
            a, b = copies(a, b)
            return tma.routed(x, tw, ids, a, b, cfg)

        key = f"tma m{m} [{g_name} | {d_name}]"
        whole[key] = {
            "config": dataclasses.asdict(cfg),
            "rel_err": rel_err(call(w13, w2), ref),
            "ms": time_graph([lambda s=s, c=call: c(*s) for s in stacks], reps=4),
        }
        whole[key]["TFLOP/s"] = round(flops / whole[key]["ms"] / 1e9, 1)
        print(f"  {key}: {whole[key]}", flush=True)
    row["whole"] = whole
    if fmt == "nvfp4":
        row["nvfp4_in_launches"] = nvfp4_in_launches(x, tw, ids, stacks, tables, ref, flops, nv_block_ms, packings)
    return row


# NVFP4 decoded in the launches (no BF16 copy), as GATE_UP_TILES and DOWN_TILES. The twenty-ninth session's tiles
# also put the decoded tile on the MMA's right operand: Triton 3.6 fails to compile that (TritonGPUOptimizeDotOperands).
NV_GATE_UP_TILES = [
    (64, 128, 64, 4, 4, True),
    (64, 128, 64, 4, 3, True),
    (64, 128, 64, 4, 2, True),
    (64, 64, 64, 4, 3, True),
    (128, 64, 64, 4, 3, True),
    (128, 64, 64, 4, 2, True),
    (128, 128, 64, 8, 3, True),
    # Thirty-fourth session, for 6,144-8,192-token steps (no sweep had run at those sizes; the twins were level with
    # the copies at 8,192, 1.460 against 1.467 ms a layer): deeper K steps and 8 warps on 128 rows.
    (64, 128, 128, 4, 2, True),
    (128, 128, 64, 8, 4, True),
    (128, 64, 128, 4, 2, True),
    # Fifty-first session: 256-row blocks decode each expert's K step once for up to 256 pairs, where 128-row ones
    # decode it twice for the ~192 pairs an expert of an 8K prompt (the decode costs about what the MMAs do); 8 warps
    # hold the two [64, 256] FP32 accumulators (128 registers a thread).
    (256, 64, 64, 8, 2, True),
    (256, 64, 64, 8, 3, True),
    (256, 64, 128, 8, 2, True),
    (256, 64, 64, 8, 3, False),
    # Then (installed: k128 in 2 stages, gathered) deeper pipelines and the sorted copy at 128 deep.
    (256, 64, 128, 8, 3, True),
    (256, 64, 128, 8, 2, False),
    (256, 64, 128, 8, 3, False),
    (256, 64, 64, 8, 4, False),
    (256, 64, 64, 8, 6, True),  # not yet run: as deep in flight as 128 K in 3 stages, in smaller steps
]
NV_DOWN_TILES = [
    (64, 128, 64, 4, 3),
    (64, 128, 64, 4, 2),
    (64, 64, 64, 4, 3),
    (128, 64, 64, 4, 3),
    (128, 64, 64, 4, 2),
    (128, 128, 64, 8, 3),
    (64, 128, 128, 4, 2),  # thirty-fourth session, as the gate_up's
    (128, 128, 64, 8, 4),
    (128, 64, 128, 4, 2),
    # Fifty-first session: 256-row blocks in 128 columns (64 left NaN in y on an H100, so `fits` declines them).
    (256, 128, 64, 8, 2),
    (256, 128, 64, 8, 3),
    (256, 128, 64, 8, 4),
    (256, 128, 128, 8, 2),
    (256, 128, 128, 8, 3),  # not yet run: the gate_up's winning depth
]
# The fields a gate_up tile sets (`gate_up_cfg`); a joined config takes the down's others.
GATE_UP_FIELDS = ("block_m", "gate_up_block_n", "gate_up_block_k", "gate_up_warps", "gate_up_stages", "gather")


def nv_name(c: tuple, packed: bool) -> str:
    return cfg_name(c) + (" packed" if packed else "")


def nvfp4_in_launches(x, tw, ids, stacks, tables, ref, flops, block_ms=(64, 128), packings=(False, True)) -> dict:
    """Each launch alone and the whole routed MoE with NVFP4 decoded in the launches, by byte planes and by packed
    pairs (`packed_decode`), against the copies' path (the same tiles on BF16 copies: equal results expected); only
    the tiles of `block_ms` and the decodes of `packings`."""
    from flint_kernels import moe_grouped_tma_triton as tma
    from flint_kernels import moe_triton

    w13, w2 = stacks[0]
    out: dict = {"gate_up_us": {}, "down_us": {}, "whole": {}}
    h_by_m = {}
    gate_ups = {nv_name(c, p): dataclasses.replace(gate_up_cfg(c), packed_decode=p) for c in NV_GATE_UP_TILES
                for p in packings if c[0] in block_ms}  # fmt: skip
    downs = {nv_name(c, p): dataclasses.replace(down_cfg(c), packed_decode=p) for c in NV_DOWN_TILES
             for p in packings if c[0] in block_ms}  # fmt: skip
    for name, cfg in gate_ups.items():
        s_, _, meta = tables[cfg.block_m]
        try:
            h_by_m.setdefault(cfg.block_m, tma.gate_up(x, s_, meta, w13, cfg))
            us = time_graph([lambda cfg=cfg, s_=s_, meta=meta: tma.gate_up(x, s_, meta, w13, cfg)], reps=8) * 1000
            out["gate_up_us"][name] = round(us, 1)
        except Exception as e:  # report, keep the others
            out["gate_up_us"][name] = f"{type(e).__name__}: {e}"[:200]
        print(f"  nvfp4 in launches gate_up {name}: {out['gate_up_us'][name]}", flush=True)
    for name, cfg in downs.items():
        _, _, meta = tables[cfg.block_m]
        h = h_by_m.get(cfg.block_m)
        if h is None:
            continue
        try:
            us = time_graph([lambda cfg=cfg, meta=meta, h=h: tma.down(h, meta, w2, cfg)], reps=8) * 1000
            out["down_us"][name] = round(us, 1)
        except Exception as e:
            out["down_us"][name] = f"{type(e).__name__}: {e}"[:200]
        print(f"  nvfp4 in launches down {name}: {out['down_us'][name]}", flush=True)
    c13, c2 = (moe_triton._dequantized(w, torch.bfloat16) for w in (w13, w2))
    for m in block_ms:
        for packed in packings:

            def best(us: dict, m: int = m, packed: bool = packed) -> str | None:
                ok = [(v, k) for k, v in us.items() if isinstance(v, float) and k.startswith(f"m{m} ")
                      and k.endswith(" packed") == packed]  # fmt: skip
                return min(ok)[1] if ok else None

            g, d = best(out["gate_up_us"]), best(out["down_us"])
            if g is None or d is None:
                continue
            cfg = dataclasses.replace(downs[d], **{f: getattr(gate_ups[g], f) for f in GATE_UP_FIELDS})
            key = f"nvfp4 in launches m{m} [{g} | {d}]"
            got = tma.routed(x, tw, ids, w13, w2, cfg)
            copies = tma.routed(x, tw, ids, c13, c2, tma.for_copies(cfg))
            ms = time_graph([lambda s=s, cfg=cfg: tma.routed(x, tw, ids, s[0], s[1], cfg) for s in stacks], reps=4)
            out["whole"][key] = {
                "config": dataclasses.asdict(cfg),
                "rel_err": rel_err(got, ref),
                "equal_to_copies": bool(torch.equal(got, copies)),
                "ms": ms,
                "TFLOP/s": round(flops / ms / 1e9, 1),
            }
            print(f"  {key}: {out['whole'][key]}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192], help="tokens")
    ap.add_argument("--formats", nargs="+", default=["bf16", "nvfp4"], choices=("bf16", "nvfp4"))
    ap.add_argument("--paths-only", action="store_true", help="only the installed path against the one before")
    ap.add_argument("--twins-only", action="store_true", help="only the paths and NVFP4 decoded in the launches")
    ap.add_argument("--decode-path", action="store_true", help="also time the decode path at each size")
    ap.add_argument("--nv-block-m", type=int, nargs="+", default=[64, 128], choices=(64, 128, 256),
                    help="the NVFP4 twins' tiles of these block heights only")  # fmt: skip
    ap.add_argument("--packed-only", action="store_true", help="the NVFP4 twins' packed decode only")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/moe_grouped_tma.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("moe_grouped_tma.py needs a CUDA GPU", file=sys.stderr)
        return 1
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for fmt in args.formats:
        stacks = [moe_weights(fmt, gen)[:2] for _ in range(2)]
        for t in args.ts:
            rows.append(
                run(
                    t, fmt, stacks, gen, args.paths_only, args.twins_only, args.decode_path, tuple(args.nv_block_m),
                    (True,) if args.packed_only else (False, True),
                )
            )  # fmt: skip
        del stacks
        torch.cuda.empty_cache()
    print(f"\nRouted MoE on {torch.cuda.get_device_name()} (ms a layer; rel. error against moe_ref)")
    for r in rows:
        print(
            f"{r['format']:>5} T {r['T']:>5}: installed {r['installed_ms']:.3f} ({r['installed_rel_err']:.1e}), "
            f"before {r['before_ms']:.3f}" + (f", decode path {r['decode_ms']:.3f}" if "decode_ms" in r else "")
        )
        for k, v in r.get("whole", {}).items():
            print(f"      {k}: {v['ms']:.3f} ({v['rel_err']:.1e}, {v['TFLOP/s']} TFLOP/s)")
        for k, v in r.get("nvfp4_in_launches", {}).get("whole", {}).items():
            print(f"      {k}: {v['ms']:.3f} ({v['rel_err']:.1e}, equal to the copies' {v['equal_to_copies']})")
        if r.get("launches_us"):
            print("      CUTLASS launches (us): " + ", ".join(f"{k} {v}" for k, v in r["launches_us"].items()))
    write_results(args.out, "python benchmarks/moe_grouped_tma.py " + " ".join(sys.argv[1:]), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
