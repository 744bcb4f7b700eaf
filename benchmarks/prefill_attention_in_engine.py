"""Each prefill attention call's GPU time inside `decode.py`'s chunked prefill (CUDA events around
`paged_attention_prefill`), by layer kind and context: the kernels as the engine's cache and model feed them, which
`prefill_attention_sdpa.py --chunks` (the same shapes on a cache of its own) does not show.

    python benchmarks/prefill_attention_in_engine.py --segment 8192   # chunks after a prefix on cuDNN
    python benchmarks/prefill_attention_in_engine.py --segment 0      # ... on the Triton kernel

Prints one line per (layer kind, context) with the median over the calls and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
from datetime import date
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segment", type=int, default=8192, help="attention_cudnn.SEGMENT for the run (0: Triton)")
    ap.add_argument("--format", default="bf16", choices=("bf16", "nvfp4"))
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=6, help="model layers (the attention calls do not depend on them)")
    ap.add_argument(
        "--gather", action="store_true",
        help="full layers' calls on the Triton kernel read their keys from a fresh contiguous copy (an experiment)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=HERE / "results" / "prefill_attention_in_engine.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    from flint_kernels import attention_cudnn, attention_triton

    attention_cudnn.SEGMENT = args.segment
    original = attention_triton.paged_attention_prefill
    calls: list[tuple[bool, int, int, torch.cuda.Event, torch.cuda.Event]] = []

    def timed(q, k_cache, v_cache, tables, meta, sinks, scale, window, *rest, **kw):  # type: ignore[no-untyped-def]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if args.gather and window is None and len(meta.seq_lens) == 1:
            # The sequence's blocks copied in order into a pool of their own (timed with the call).
            blocks = tables[0, : -(-meta.seq_lens[0] // k_cache.shape[1])].long()
            k_cache, v_cache = k_cache[blocks], v_cache[blocks]
            tables = torch.arange(blocks.numel(), dtype=tables.dtype, device=tables.device)[None]
        out = original(q, k_cache, v_cache, tables, meta, sinks, scale, window, *rest, **kw)
        end.record()
        ctx = meta.seq_lens[0] if len(meta.seq_lens) == 1 else -1
        calls.append((bool(window), q.shape[0], ctx, start, end))
        return out

    attention_triton.paged_attention_prefill = timed
    sys.argv = [
        "decode.py", "--formats", args.format, "--layers", str(args.layers), "--batches", "1", "--contexts", "1024",
        "--prefill", str(args.tokens), "--prefill-chunks", str(args.chunk), "--check-steps", "0", "--check-batches",
        "--no-plain-timing", "--reps", "3", "--profile-batches", "--out", "/tmp/prefill_attention_in_engine.json",
    ]  # fmt: skip
    sys.path.insert(0, str(HERE))
    runpy.run_path(str(HERE / "decode.py"), run_name="__main__")
    torch.cuda.synchronize()
    by: dict[tuple[str, int], list[float]] = {}
    for sliding, t, ctx, start, end in calls:
        if t == args.chunk:
            by.setdefault(("sliding" if sliding else "full", ctx), []).append(start.elapsed_time(end))
    rows = []
    for (kind, ctx), ms in sorted(by.items()):
        rows.append({"layer": kind, "context": ctx, "calls": len(ms), "median_ms": round(statistics.median(ms), 3)})
        median = rows[-1]["median_ms"]
        print(f"segment {args.segment}: {kind:7s} context {ctx:6d}: {len(ms):3d} calls, median {median} ms")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date.today().isoformat()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
