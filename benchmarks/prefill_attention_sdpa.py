"""Prefill attention with sinks: our Triton kernel against torch's fused attention kernels (FlashAttention-2, cuDNN,
memory-efficient), each given the sinks afterwards from its log-sum-exp.

A sink is one extra logit in the softmax's denominator, so with L the log-sum-exp of a row's scores the output with the
sink is out * sigmoid(L - sink): one elementwise pass after a kernel that returns L. This probe measures whether one of
torch's kernels plus that pass beats `paged_attention_prefill` for prompts that start at position 0 (the keys are the
prompt's own, gathered from the paged cache), at Flint's shapes (32 query / 4 KV heads of 128, BF16), for full
layers (causal) and, where the kernel takes a window, sliding ones (513 keys). CUDA only; each variant's error against
`paged_attention_ref` (FP32 scores) is printed beside its time.

    python benchmarks/prefill_attention_sdpa.py --ts 2048 8192 --out prefill_attention_sdpa.json

`--chunks PREFIX:N ...` also times a full layer's chunk of N queries after PREFIX cached keys (a long prompt's later
chunks): ours against the engine's cuDNN path (its own keys causally, the prefix in `attention_cudnn.SEGMENT`-key
segments, merged), e.g. `--ts --chunks 8192:8192 24576:8192 57344:8192 8192:5000`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flint_kernels.attention_cudnn import add_sinks
from flint_kernels.configs import AttentionPrefillConfig
from kernels_attention import HKV, HQ, WINDOW, D, _paged_case, _rel_err

ATEN = torch.ops.aten


def variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, window: int | None) -> dict:
    """name -> zero-argument callable giving the [T, Hq, D] output; k, v are the sequence's [T, Hkv, D] keys."""
    t = q.shape[0]
    scale = D**-0.5
    cu = torch.tensor([0, t], dtype=torch.int32, device=q.device)
    found: dict[str, Callable[[], torch.Tensor]] = {}

    def flash_varlen() -> torch.Tensor:
        left = -1 if window is None else window - 1
        out, lse = ATEN._flash_attention_forward(q, k, v, cu, cu, t, t, 0.0, True, False, scale=scale,
                                                 window_size_left=left, window_size_right=0)[:2]  # fmt: skip
        return add_sinks(out, lse.view(HQ, -1)[:, :t], sinks)

    found["flash varlen"] = flash_varlen
    if window is None and hasattr(ATEN, "_cudnn_attention_forward"):

        def cudnn_varlen() -> torch.Tensor:
            out, lse = ATEN._cudnn_attention_forward(q, k, v, None, cu, cu, t, t, True, 0.0, True, False,
                                                     scale=scale)[:2]  # fmt: skip
            return add_sinks(out, lse.reshape(-1, HQ).transpose(0, 1) if lse.shape[0] == t else lse.view(HQ, -1),
                              sinks)  # fmt: skip

        found["cudnn varlen"] = cudnn_varlen
    if window is not None:
        return found

    def batched(fn: Callable, expand: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            q4 = q.transpose(0, 1).unsqueeze(0)
            kk, vv = (x.repeat_interleave(HQ // HKV, dim=1) if expand else x for x in (k, v))
            k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (kk, vv))
            out, lse = fn(q4, k4, v4)[:2]
            return add_sinks(out[0].transpose(0, 1), lse.reshape(HQ, -1)[:, :t], sinks)

        return run

    for expand in (False, True):
        tag = " (K/V expanded)" if expand else ""
        found["flash" + tag] = batched(lambda a, b, c: ATEN._scaled_dot_product_flash_attention(
            a, b, c, 0.0, True, False, scale=scale), expand)  # fmt: skip
        found["cudnn" + tag] = batched(lambda a, b, c: ATEN._scaled_dot_product_cudnn_attention(
            a, b, c, None, True, 0.0, True, False, scale=scale), expand)  # fmt: skip
        found["efficient" + tag] = batched(lambda a, b, c: ATEN._scaled_dot_product_efficient_attention(
            a, b, c, None, True, 0.0, True, scale=scale), expand)  # fmt: skip
    return found


def first_calls(ts: list[int]) -> list[dict]:
    """Wall time of cuDNN's first call at each new prompt length (its plan is built per shape), then its median."""
    import time

    from flint_kernels.attention import gather_kv
    from triton.testing import do_bench

    found = []
    for t in ts:
        q, kc, vc, table, _, sinks = _paged_case([t], [t], None, torch.bfloat16, seed=t)
        k, v = (gather_kv(c, table[0], 0, t) for c in (kc, vc))
        for name, fn in variants(q, k, v, sinks, None).items():
            if not name.startswith("cudnn") or "expanded" in name:
                continue
            row: dict = {"T": t, "variant": name}
            try:
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                row["first_ms"] = (time.perf_counter() - start) * 1e3
                row["ms"] = float(do_bench(fn, warmup=5, rep=30, return_mode="median"))
            except Exception as e:  # a variant this torch lacks is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            found.append(row)
    return found


def triton_only(tokens: int, device: torch.device, window: int | None = None) -> AttentionPrefillConfig:
    """The table's launch parameters for `tokens` with cuDNN turned off: without this the table's `cudnn_min_tokens`
    sends a long prompt, or a chunk after whole prefix segments, to `attention_cudnn`, and "ours" times cuDNN."""
    from flint_kernels import attention_triton as at

    return dataclasses.replace(at.prefill_config(tokens, window, device), cudnn_min_tokens=0)


def measured(row: dict, fn: Callable[[], torch.Tensor], judge: Callable, flops: float, rep: int) -> dict:
    """`row` with the variant's error (`judge` of its output), median ms and TFLOP/s, or what it raised; printed."""
    from triton.testing import do_bench

    try:
        out = fn()
        torch.cuda.synchronize()
        row["rel_err"] = judge(out)
        row["ms"] = float(do_bench(fn, warmup=5, rep=rep, return_mode="median"))
        row["TFLOP/s"] = round(flops / row["ms"] / 1e9, 1)
    except Exception as e:  # a variant this torch lacks is a row, not the end of the run
        row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    print(json.dumps(row), flush=True)
    return row


def chunk_rows(chunks: list[str]) -> list[dict]:
    """A full layer's chunk after a cached prefix: ours (also with q a strided view, as the engine's slice of the QKV
    projection) against the engine's cuDNN path, each judged on its first and last 512 queries against the FP32
    reference of those queries alone."""
    from flint_kernels import attention_triton as at
    from flint_kernels.attention import AttnMeta, paged_attention_ref

    found = []
    for spec in chunks:
        prefix, n = (int(x) for x in spec.split(":"))
        ctx = prefix + n
        q, kc, vc, table, meta, sinks = _paged_case([ctx], [n], None, torch.bfloat16, seed=ctx)
        wide = torch.empty((n, (HQ + 2 * HKV) * D), dtype=q.dtype, device=q.device)
        wide[:, : HQ * D] = q.reshape(n, -1)
        q_view = wide[:, : HQ * D].view(n, HQ, D)
        flops = 4.0 * (n * prefix + n * (n + 1) / 2) * HQ * D
        engine = dataclasses.replace(at.prefill_config(n, None, q.device), cudnn_min_tokens=1)
        ours = triton_only(n, q.device)
        rest = (kc, vc, table, meta, sinks, D**-0.5, None)
        cases = {
            "ours (Triton)": lambda q=q, rest=rest, c=ours: at.paged_attention_prefill(q, *rest, config=c),
            "ours, q strided": lambda q=q_view, rest=rest, c=ours: at.paged_attention_prefill(q, *rest, config=c),
            "attention_cudnn (engine)": lambda q=q, rest=rest, c=engine: at.paged_attention_prefill(q, *rest, config=c),
        }
        edge = min(512, n)
        refs = {}
        for name, lo, hi in (("first", 0, edge), ("last", n - edge, n)):
            sub = AttnMeta.build([0, hi - lo], [prefix + hi], q.device)
            refs[name] = (lo, hi, paged_attention_ref(q[lo:hi], kc, vc, table, sub, sinks, D**-0.5, None))
        for name, fn in cases.items():
            row: dict = {"layer": "full", "prefix": prefix, "T": n, "variant": name}
            judge = lambda out, refs=refs: max(_rel_err(out[lo:hi], ref) for lo, hi, ref in refs.values())  # noqa: E731
            found.append(measured(row, fn, judge, flops, 40))
        del q, kc, vc, table, meta, sinks, refs, cases, wide, q_view
        torch.cuda.empty_cache()
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ts", type=int, nargs="*", default=[2048, 4096, 8192])
    ap.add_argument("--chunks", nargs="*", default=[], help="PREFIX:N chunks after a cached prefix (full layers)")
    first_help = "prompt lengths whose first cuDNN call (a new shape: cuDNN builds its plan) is timed"
    ap.add_argument("--first-calls", type=int, nargs="*", default=[], help=first_help)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "prefill_attention_sdpa.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    from flint_kernels import attention_triton as at
    from flint_kernels.attention import gather_kv, paged_attention_ref

    rows = []
    for window in (None, WINDOW):
        for t in args.ts:
            # Every block of the prompt stays in the table (the window only limits what each query reads).
            q, kc, vc, table, meta, sinks = _paged_case([t], [t], None, torch.bfloat16, seed=t)
            pargs = (q, kc, vc, table, meta, sinks, D**-0.5, window)
            ref = paged_attention_ref(*pargs)
            k, v = (gather_kv(c, table[0], 0, t) for c in (kc, vc))
            pairs = sum(min(window or t, i + 1) for i in range(t))
            flops = 4.0 * pairs * HQ * D
            ours = triton_only(t, q.device, window)
            cases = {"ours (Triton)": lambda pargs=pargs, c=ours: at.paged_attention_prefill(*pargs, config=c)}
            if window is None:  # the engine's cuDNN path: gather, padding, cuDNN, the sinks' Triton launch
                engine = dataclasses.replace(at.prefill_config(t, None, q.device), cudnn_min_tokens=1)
                cases["attention_cudnn (engine)"] = lambda pargs=pargs, c=engine: at.paged_attention_prefill(
                    *pargs, config=c
                )
            cases.update(variants(q, k, v, sinks, window))
            layer = "full" if window is None else "sliding"
            for name, fn in cases.items():
                row: dict = {"layer": layer, "T": t, "variant": name}
                rows.append(measured(row, fn, lambda out, ref=ref: _rel_err(out, ref), flops, 60))
            del q, kc, vc, table, meta, sinks, ref, k, v, cases
            torch.cuda.empty_cache()
    chunks = chunk_rows(args.chunks)
    first = first_calls(args.first_calls)
    print(f"\nPrefill attention with sinks on {torch.cuda.get_device_name()} (torch {torch.__version__}), one prompt:")
    print(f"{'layer':8s} {'T':>6s} {'variant':28s} {'ms':>8s} {'TFLOP/s':>8s} {'rel err':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['layer']:8s} {r['T']:6d} {r['variant']:28s} {r['error']}")
        else:
            figures = f"{r['ms']:8.3f} {r['TFLOP/s']:8.1f} {r['rel_err']:9.1e}"
            print(f"{r['layer']:8s} {r['T']:6d} {r['variant']:28s} {figures}")
    for r in chunks:
        label = f"full after {r['prefix']}"
        if "error" in r:
            print(f"{label:17s} {r['T']:6d} {r['variant']:28s} {r['error']}")
        else:
            print(f"{label:17s} {r['T']:6d} {r['variant']:28s} {r['ms']:8.3f} {r['TFLOP/s']:8.1f} {r['rel_err']:9.1e}")
    for r in first:
        if "error" in r:
            print(f"{r['variant']}, T {r['T']}: {r['error']}")
        else:
            print(f"{r['variant']} full layer, T {r['T']}: first call {r['first_ms']:.1f} ms, then {r['ms']:.3f} ms")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date.today().isoformat()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "chunks": chunks, "first_calls": first}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
