"""Triton kernels vs their PyTorch references on CUDA at Flint's shapes: correctness first, then median times.

    python benchmarks/kernels_attention.py [--quick]
    python benchmarks/kernels_attention.py --sweep [--sweep-parts decode]   # launch parameters instead

Covers paged attention (decode at batch 1/8/32/64 x context 1K/32K, full and sliding layers; an 8K prefill chunk),
QK-norm+RoPE+KV-write, RMSNorm, add+RMSNorm, SiLU-and-mul and the router. Times are medians of
`triton.testing.do_bench` (eager launches, CPU launch cost included) and, for the Triton ops, of
`do_bench_cudagraph` (launch cost removed, as the engine's decode graphs see it). Prints a table and writes
benchmarks/results/kernels_attention.json. Needs a CUDA GPU: without one it runs nothing and exits with status 1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
HQ, HKV, D, HIDDEN, BLOCK = 32, 4, 128, 2048, 16
WINDOW = 513
EPS = 1e-6


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def _same_frac(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out == ref).float().mean().item()


class Bench:
    """Collects one row per (op, shape): errors vs the reference and median times."""

    def __init__(self, quick: bool) -> None:
        from triton.testing import do_bench, do_bench_cudagraph

        self.do_bench = do_bench
        self.do_bench_cudagraph = do_bench_cudagraph
        self.quick = quick
        self.rows: list[dict] = []

    def _time(self, fn: Callable[[], object], graph: bool) -> float:
        if graph:
            return float(self.do_bench_cudagraph(fn, rep=50, return_mode="median"))
        return float(self.do_bench(fn, warmup=10, rep=50 if self.quick else 100, return_mode="median"))

    def run(
        self,
        op: str,
        shape: str,
        fast: Callable[[], torch.Tensor],
        ref: Callable[[], torch.Tensor],
        tol: float,
        bytes_moved: float | None = None,
        flops: float | None = None,
        exact: bool = False,
        ref_graph: bool = False,
    ) -> None:
        out, expect = fast(), ref()
        torch.cuda.synchronize()
        err = _rel_err(out, expect)
        row: dict = {"op": op, "shape": shape, "rel_err": err, "ok": bool(err < tol and not out.isnan().any())}
        if exact:
            row["bit_identical"] = _same_frac(out, expect)
            row["ok"] = row["ok"] and row["bit_identical"] >= 0.999
        row["ref_ms"] = self._time(ref, graph=False)
        # Only references without host syncs can be captured (the attention and KV-write ones sync).
        row["ref_graph_ms"] = self._time(ref, graph=True) if ref_graph else None
        row["triton_ms"] = self._time(fast, graph=False)
        try:
            row["triton_graph_ms"] = self._time(fast, graph=True)
        except Exception as e:  # a kernel that cannot be captured is a finding, not a crash of the benchmark
            row["triton_graph_ms"] = None
            row["graph_error"] = repr(e)[:200]
        best = row["triton_graph_ms"] or row["triton_ms"]
        row["speedup_vs_ref"] = row["ref_ms"] / row["triton_ms"]
        if row["ref_graph_ms"] and row["triton_graph_ms"]:
            row["speedup_vs_ref_graph"] = row["ref_graph_ms"] / row["triton_graph_ms"]
        if bytes_moved:
            row["gb_per_s"] = bytes_moved / (best * 1e-3) / 1e9
        if flops:
            row["tflop_per_s"] = flops / (best * 1e-3) / 1e12
        self.rows.append(row)
        extra = f"{row.get('gb_per_s', 0):7.0f} GB/s" if bytes_moved else ""
        extra += f"{row.get('tflop_per_s', 0):7.1f} TF/s" if flops else ""

        def ms(v: float | None) -> str:
            return "   -    " if v is None else f"{v:8.4f}"

        print(
            f"{op:20s} {shape:32s} err {err:7.1e} {'ok ' if row['ok'] else 'BAD'} ref {ms(row['ref_ms'])} "
            f"(graph {ms(row['ref_graph_ms'])}) ms  triton {ms(row['triton_ms'])} (graph {ms(row['triton_graph_ms'])}) "
            f"ms {extra}",
            flush=True,
        )


def _paged_case(
    seq_lens: list[int], n_new: list[int], window: int | None, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    """A shuffled paged cache holding every sequence's live keys; sliding tables carry -1 behind the window."""
    from flint_kernels.attention import AttnMeta

    g = torch.Generator(device="cuda").manual_seed(seed)
    need = [-(-c // BLOCK) for c in seq_lens]
    num_blocks = sum(need)
    k = torch.randn((num_blocks, BLOCK, HKV, D), device="cuda", dtype=dtype, generator=g)
    v = torch.randn((num_blocks, BLOCK, HKV, D), device="cuda", dtype=dtype, generator=g)
    perm = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
    table = torch.full((len(seq_lens), max(need)), -1, dtype=torch.int32, device="cuda")
    used = 0
    for s, (ctx, n) in enumerate(zip(seq_lens, n_new)):
        table[s, : need[s]] = perm[used : used + need[s]]
        used += need[s]
        if window is not None:
            lo = max(0, ctx - n - window + 1)
            table[s, : lo // BLOCK] = -1
    starts = [0]
    for n in n_new:
        starts.append(starts[-1] + n)
    q = torch.randn((starts[-1], HQ, D), device="cuda", dtype=dtype, generator=g)
    sinks = torch.randn(HQ, device="cuda", generator=g)
    meta = AttnMeta.build(starts, seq_lens, "cuda")
    return q, k, v, table, meta, sinks


def bench_attention(b: Bench, dtype: torch.dtype) -> None:
    from flint_kernels import attention_triton as at
    from flint_kernels.attention import paged_attention_ref

    scale = D**-0.5
    batches = [1, 8, 32, 64]
    contexts = [1024, 32768]
    for window in (None, WINDOW):
        for ctx in contexts:
            for batch in batches:
                if b.quick and batch == 64 and ctx == 32768:
                    continue
                q, k, v, table, meta, sinks = _paged_case([ctx] * batch, [1] * batch, window, dtype, seed=batch)
                args = (q, k, v, table, meta, sinks, scale, window)
                keys = min(ctx, window or ctx)
                kv_bytes = batch * keys * HKV * D * 2 * k.element_size()
                splits = at.decode_num_splits(ctx, window, batch, HKV, q.device)
                layer = "full" if window is None else "sliding"
                b.run(
                    "attn_decode",
                    f"{layer} B={batch} ctx={ctx} splits={splits}",
                    lambda args=args: at.paged_attention(*args),
                    lambda args=args: paged_attention_ref(*args),
                    tol=1e-2,
                    bytes_moved=kv_bytes,
                )
                del q, k, v, table, meta, sinks, args
                torch.cuda.empty_cache()
    chunk = 8192
    for window in (None, WINDOW):
        for ctx in (chunk, 2 * chunk):
            if b.quick and ctx > chunk:
                continue
            q, k, v, table, meta, sinks = _paged_case([ctx], [chunk], window, dtype, seed=ctx)
            args = (q, k, v, table, meta, sinks, scale, window)
            # Multiply-adds of QK^T and PV over the causal (windowed) band, 2 FLOPs each.
            if window is None:
                pairs = sum(ctx - chunk + i + 1 for i in range(chunk))
            else:
                pairs = sum(min(window, ctx - chunk + i + 1) for i in range(chunk))
            layer = "full" if window is None else "sliding"
            b.run(
                "attn_prefill",
                f"{layer} chunk={chunk} ctx={ctx}",
                lambda args=args: at.paged_attention(*args),
                lambda args=args: paged_attention_ref(*args),
                tol=1e-2,
                flops=4.0 * pairs * HQ * D,
            )
            del q, k, v, table, meta, sinks, args
            torch.cuda.empty_cache()


def bench_small_ops(b: Bench, dtype: torch.dtype) -> None:
    from flint_kernels.activation import silu_and_mul_ref
    from flint_kernels.activation_triton import silu_and_mul
    from flint_kernels.qk_norm_rope import qk_norm_rope_write_ref
    from flint_kernels.qk_norm_rope_triton import qk_norm_rope_write
    from flint_kernels.rmsnorm import add_rms_norm_ref, rms_norm_ref
    from flint_kernels.rmsnorm_triton import add_rms_norm, rms_norm
    from flint_kernels.rope import rope_cos_sin
    from flint_kernels.router import sigmoid_topk_ref
    from flint_kernels.router_triton import sigmoid_topk

    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(HIDDEN, device="cuda", generator=g) * 0.1 + 1
    for t in (1, 64, 8192):
        x = torch.randn((t, HIDDEN), device="cuda", dtype=dtype, generator=g)
        r = torch.randn((t, HIDDEN), device="cuda", dtype=dtype, generator=g)
        nbytes = 2 * t * HIDDEN * x.element_size()
        b.run(
            "rms_norm",
            f"T={t} H={HIDDEN}",
            lambda x=x: rms_norm(x, w, EPS),
            lambda x=x: rms_norm_ref(x, w, EPS),
            tol=1e-2,
            bytes_moved=nbytes,
            exact=True,
            ref_graph=True,
        )
        b.run(
            "add_rms_norm",
            f"T={t} H={HIDDEN}",
            lambda x=x, r=r: add_rms_norm(x, r, w, EPS)[0],
            lambda x=x, r=r: add_rms_norm_ref(x, r, w, EPS)[0],
            tol=1e-2,
            bytes_moved=2 * nbytes,
            exact=True,
            ref_graph=True,
        )

    q_norm = torch.randn(D, device="cuda", generator=g) * 0.1 + 1
    k_norm = torch.randn(D, device="cuda", generator=g) * 0.1 + 1
    for t in (1, 64, 8192):
        qkv = torch.randn((t, (HQ + 2 * HKV) * D), device="cuda", dtype=dtype, generator=g)
        nb = -(-t // BLOCK) + 1
        kc = torch.zeros((nb, BLOCK, HKV, D), device="cuda", dtype=dtype)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(nb * BLOCK, device="cuda", generator=g)[:t]
        pos = torch.randint(0, 32768, (t,), device="cuda", generator=g)
        for rope in (True, False):
            cs = rope_cos_sin(pos, D, 10000.0, dtype) if rope else None
            args = (qkv, q_norm, k_norm, EPS, cs, kc, vc, slots, HQ, HKV)
            b.run(
                "qk_norm_rope_write",
                f"T={t} rope={rope}",
                lambda args=args: qk_norm_rope_write(*args),
                lambda args=args: qk_norm_rope_write_ref(*args),
                tol=1e-2,
                bytes_moved=2 * qkv.numel() * qkv.element_size(),
                exact=True,
            )

    # MoE experts: T*6 rows of 2x512; the shared expert T rows of 2x1024; dense layers T rows of 2x6144.
    for rows, inter in ((6, 512), (384, 512), (49152, 512), (8192, 1024), (8192, 6144)):
        gu = torch.randn((rows, 2 * inter), device="cuda", dtype=dtype, generator=g)
        b.run(
            "silu_and_mul",
            f"rows={rows} I={inter}",
            lambda gu=gu: silu_and_mul(gu),
            lambda gu=gu: silu_and_mul_ref(gu),
            tol=1e-2,
            bytes_moved=1.5 * gu.numel() * gu.element_size(),
            exact=True,
            ref_graph=True,
        )

    router_w = torch.randn((256, HIDDEN), device="cuda", generator=g) * HIDDEN**-0.5
    # Up to router_triton.SMALL_BATCH the one-launch GEMV kernel, above it the tensor-core tiles (8192: a prefill).
    for t in (1, 8, 16, 32, 64, 512, 8192):
        x = torch.randn((t, HIDDEN), device="cuda", dtype=dtype, generator=g)
        b.run(
            "router_top6",
            f"T={t} E=256",
            lambda x=x: sigmoid_topk(x, router_w, 6)[0],
            lambda x=x: sigmoid_topk_ref(x, router_w, 6)[0],
            tol=1e-4,
            ref_graph=True,
        )


def _timed(b: Bench, found: list[dict], row: dict, fn: Callable[[], torch.Tensor], ref: torch.Tensor) -> None:
    """Check and time one sweep candidate (CUDA-graph median); append its row, with "ms" and "rel_err", to found."""
    label = f"sweep {row['kind']:8s} {row['shape']:26s} {row.get('config', row.get('block_e'))}"
    try:
        err = _rel_err(fn(), ref)
        ms = b._time(fn, graph=True)
    except Exception as e:  # a config that does not compile (shared memory, registers) is skipped
        print(f"{label} failed: {repr(e)[:120]}")
        return
    found.append({**row, "ms": ms, "rel_err": err})
    print(f"{label} {ms:8.4f} ms err {err:.1e}", flush=True)


def sweep_prefill(
    b: Bench,
    dtype: torch.dtype,
    windows: tuple[int | None, ...] = (None, WINDOW),
    orders: tuple[bool, ...] = (False, True),
) -> list[dict]:
    """Time prefill attention (an 8K chunk, full and sliding) over its launch parameters (`orders`: longest_first
    values)."""
    from dataclasses import asdict

    from flint_kernels import attention_triton as at
    from flint_kernels.attention import paged_attention_ref
    from flint_kernels.configs import AttentionPrefillConfig

    found: list[dict] = []
    for window in windows:
        q, k, v, table, meta, sinks = _paged_case([8192], [8192], window, dtype, seed=1)
        args = (q, k, v, table, meta, sinks, D**-0.5, window)
        ref = paged_attention_ref(*args)
        shape = f"{'full' if window is None else 'sliding'} 8K"
        for bm in (64, 128):
            for bn in (64, 128):
                for warps, stages, longest in itertools.product((4, 8), (2, 3), orders):
                    if bm < 128 and warps == 8:
                        continue  # row tiles under 128 always take 4 warps
                    cfg = AttentionPrefillConfig(bn, bm, warps, stages, longest_first=longest)
                    row = {"kind": "prefill", "shape": shape, "sliding": window is not None, "config": asdict(cfg)}
                    _timed(b, found, row, lambda args=args, c=cfg: at.paged_attention_prefill(*args, config=c), ref)
        del q, k, v, table, ref
        torch.cuda.empty_cache()
    return found


def sweep_decode(b: Bench, dtype: torch.dtype) -> list[dict]:
    """Time decode attention over its launch parameters (keys per tile, stages, keys per split) at seven shapes."""
    from dataclasses import asdict, replace

    from flint_kernels import attention_triton as at
    from flint_kernels.attention import paged_attention_ref

    found: list[dict] = []
    # Batch 32-64 at 1K: the whole-step profile has these at 26 us a layer (2026-11-30), ~40% of the KV bytes'
    # copy time, where fewer splits (more keys each) may pay.
    shapes = ((1, 32768, None), (32, 32768, None), (8, 1024, None), (1, 4096, WINDOW), (32, 1024, None),
              (32, 1024, WINDOW), (64, 1024, WINDOW))  # fmt: skip
    for batch, ctx, window in shapes:
        q, k, v, table, meta, sinks = _paged_case([ctx] * batch, [1] * batch, window, dtype, seed=2)
        args = (q, k, v, table, meta, sinks, D**-0.5, window)
        ref = paged_attention_ref(*args)
        base = at.decode_config(ctx, window, batch, q.device)  # what this device runs now
        cands = [replace(base, block_n=bn, num_stages=st) for bn in (32, 64, 128) for st in (2, 3)]
        cands += [replace(base, num_stages=None, min_keys_per_split=mk) for mk in (128, 512)]
        if batch >= 32 and ctx <= 1024:
            cands += [replace(base, min_keys_per_split=mk) for mk in (512, 1024)]
            # 8 warps: at 32-64 sequences a sliding layer has 128-256 programs, about one an SM, each streaming its
            # 262 KB window with 4 warps at ~1.3 TB/s overall (thirty-fifth session: 13.1 us against ~4 us of bytes)
            cands += [replace(base, num_warps=8, block_n=bn, num_stages=st) for bn in (64, 128) for st in (2, 3)]
        # Key tiles requested into L2 before the PDL wait (in a graph of back-to-back launches they overlap the
        # previous launch's tail; the whole-step A/B is the real test).
        cands += [replace(base, prefetch=n) for n in (1, 2)]
        for cfg in cands:
            splits = at.decode_num_splits(ctx, window, batch, HKV, q.device, cfg)
            row = {
                "kind": "decode", "shape": f"B={batch} ctx={ctx} w={window}", "seqs": batch, "context": ctx,
                "sliding": window is not None, "splits": splits, "config": asdict(cfg),
            }  # fmt: skip
            _timed(b, found, row, lambda args=args, c=cfg: at.paged_attention_decode(*args, config=c), ref)
        del q, k, v, table, ref
        torch.cuda.empty_cache()
    return found


def sweep_router(b: Bench, dtype: torch.dtype) -> list[dict]:
    """Time the router kernel over its experts per program (the module constant patched per run)."""
    from flint_kernels import router_triton as rt

    found: list[dict] = []
    saved_e = rt._BLOCK_E
    w = torch.randn((256, HIDDEN), device="cuda") * HIDDEN**-0.5
    for t in (1, 8, 64):
        x = torch.randn((t, HIDDEN), device="cuda", dtype=dtype)
        ref = rt.sigmoid_topk_ref(x, w, 6)[0]
        for be in (1, 2, 4, 8, 16):
            rt._BLOCK_E = be
            row = {"kind": "router", "shape": f"T={t}", "block_e": be}
            _timed(b, found, row, lambda x=x: rt.sigmoid_topk(x, w, 6)[0], ref)
    rt._BLOCK_E = saved_e
    return found


def sweep(b: Bench, dtype: torch.dtype, parts: tuple[str, ...] = ("prefill", "decode", "router")) -> list[dict]:
    """Time the attention and router kernels over their launch parameters (the named parts)."""
    runs = {
        "prefill": sweep_prefill,
        # Every sliding program sees the same number of keys: launch order does not matter (0.333 / 0.336 ms).
        "prefill-sliding": lambda b, dtype: sweep_prefill(b, dtype, (WINDOW,), (True,)),
        "decode": sweep_decode,
        "router": sweep_router,
    }
    return [row for part in parts for row in runs[part](b, dtype)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the largest shapes and shorten the timing loops")
    ap.add_argument("--only", choices=["attention", "small"], default=None)
    ap.add_argument("--sweep", action="store_true", help="time the kernels' launch parameters instead")
    ap.add_argument("--sweep-parts", nargs="+", choices=["prefill", "prefill-sliding", "decode", "router"],
                    default=["prefill", "decode", "router"], help="with --sweep: which kernels")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="the JSON (default: results/kernels_attention[_sweep].json)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernels_attention: no CUDA GPU here; the Triton kernels are only benchmarked on CUDA. Nothing was run.")
        sys.exit(1)
    import triton

    dtype = torch.bfloat16
    b = Bench(args.quick)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  {dtype}")
    if args.sweep:
        RESULTS.mkdir(parents=True, exist_ok=True)
        rows = sweep(b, dtype, tuple(args.sweep_parts))
        (args.out or RESULTS / "kernels_attention_sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
        for kind in sorted({r["kind"] for r in rows}):
            for shape in sorted({r["shape"] for r in rows if r["kind"] == kind}):
                best = min((r for r in rows if r["kind"] == kind and r["shape"] == shape), key=lambda r: r["ms"])
                print("best", best)
        return
    if args.only in (None, "small"):
        bench_small_ops(b, dtype)
    if args.only in (None, "attention"):
        bench_attention(b, dtype)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / "kernels_attention.json"
    report = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "dtype": str(dtype),
        "timing": "median ms; ref and triton: do_bench (eager), triton_graph: do_bench_cudagraph",
        "rows": b.rows,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    bad = [r for r in b.rows if not r["ok"]]
    print(f"wrote {out}; {len(b.rows)} rows, {len(bad)} failing correctness")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
