"""Prefill attention, this checkout's kernel against an older version of `kernels/attention_triton.py`, in one
process: the same inputs, bit-equality of the two outputs, and alternating timed rounds.

    git show REV:kernels/attention_triton.py > /tmp/attention_before.py
    python benchmarks/prefill_attention_ab.py --before /tmp/attention_before.py

Cases: a small mixed batch against the FP32 reference (full, Flint's window, a window of 7), then an 8K prompt on a
sliding layer, a full layer's 8K chunk after 8K cached keys, and 2K chunks after 6K (both kinds), every one on the
Triton kernel (cuDNN off). Prints a line a case and writes benchmarks/results/prefill_attention_ab.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def load_before(path: Path) -> ModuleType:
    """`path` (a copy of kernels/attention_triton.py) as a module of flint_kernels, so its relative imports resolve to
    this checkout's other modules."""
    import flint_kernels

    name = "flint_kernels._attention_triton_before"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = flint_kernels.__name__
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def triton_call(mod: ModuleType, args: tuple, window: int | None, tokens: int) -> Callable[[], torch.Tensor]:
    """`mod.paged_attention_prefill` on `args` with its table's launch parameters for `tokens`, cuDNN off."""
    cfg = dataclasses.replace(mod.prefill_config(tokens, window, args[0].device), cudnn_min_tokens=0)
    return lambda: mod.paged_attention_prefill(*args, window, config=cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="an older kernels/attention_triton.py")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "prefill_attention_ab.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    from flint_kernels import attention_triton as now
    from flint_kernels.attention import paged_attention_ref
    from kernels_attention import WINDOW, D, _paged_case
    from triton.testing import do_bench

    versions = {"before": load_before(args.before), "now": now}
    found: dict = {"small": [], "cases": []}
    q, kc, vc, table, meta, sinks = _paged_case([700, 300], [200, 300], None, torch.bfloat16, seed=3)
    for window in (None, WINDOW, 7):
        ref = paged_attention_ref(q, kc, vc, table, meta, sinks, D**-0.5, window).float()
        for name, mod in versions.items():
            out = triton_call(mod, (q, kc, vc, table, meta, sinks, D**-0.5), window, 500)().float()
            err = ((out - ref).norm() / ref.norm()).item()
            found["small"].append({"window": window, "version": name, "rel_err": err})
            print(f"small batch, window {window}, {name}: rel err {err:.2e}", flush=True)
    cases = [("sliding 8K", [8192], [8192], WINDOW), ("full 8K after 8K", [16384], [8192], None),
             ("full 2K after 6K", [8192], [2048], None), ("sliding 2K after 6K", [8192], [2048], WINDOW)]  # fmt: skip
    for label, ctx, n, window in cases:
        q, kc, vc, table, meta, sinks = _paged_case(ctx, n, window, torch.bfloat16, seed=1)
        fns = {k: triton_call(m, (q, kc, vc, table, meta, sinks, D**-0.5), window, n[0]) for k, m in versions.items()}
        a, b = fns["before"](), fns["now"]()
        ms: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, f in fns.items():
                ms[k].append(float(do_bench(f, warmup=5, rep=40, return_mode="median")))
        med = {k: sorted(v)[len(v) // 2] for k, v in ms.items()}
        row = {"case": label, "ms": med, "rounds": ms, "bit_equal": bool(torch.equal(a, b)),
               "change_pct": round((med["now"] / med["before"] - 1) * 100, 1)}  # fmt: skip
        found["cases"].append(row)
        print(f"{label:20s} before {med['before']:.4f} ms  now {med['now']:.4f} ms  ({row['change_pct']:+.1f}%)  "
              f"bit-equal {row['bit_equal']}", flush=True)  # fmt: skip
        del q, kc, vc, table, meta, sinks, a, b
        torch.cuda.empty_cache()
    meta_info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date.today().isoformat()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta_info, "before": str(args.before), **found}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
