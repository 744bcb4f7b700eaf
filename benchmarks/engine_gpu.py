"""The engine on a GPU: start-up cost (weights, CUDA-graph capture, prefill and sampler warm-up) and the time per
output token through the whole engine loop (scheduler, graph replay, sampling, detokenisation-free token handling),
greedy and sampled, with the Triton sampling op and with its PyTorch reference swapped in.

    python benchmarks/engine_gpu.py [--model random:full:nvfp4] [--max-tokens 128] [--concurrency 1 8]

Prints a table and writes benchmarks/results/engine_gpu.json (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import re
import time
from datetime import date
from pathlib import Path

import torch
from flint_kernels.sampling import sample_top_k_ref

from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.sampling_params import SamplingParams

RESULTS = Path(__file__).parent / "results"


class _Recorder(logging.Handler):
    """Keeps the engine's start-up log lines that carry a duration."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if re.search(r"in \d+(\.\d+)? s", msg):
            self.lines.append(msg)


def run(engine: LLMEngine, concurrency: int, prompt_len: int, max_tokens: int, temperature: float) -> dict:
    rng = random.Random(concurrency)
    vocab = engine.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(concurrency)]
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True, seed=1)
    start = time.perf_counter()
    reqs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    ttft = max(r.first_token_time - r.arrival_time for r in reqs)
    return {
        "concurrency": concurrency,
        "temperature": temperature,
        "tokens": sum(len(r.output_token_ids) for r in reqs),
        "elapsed_s": round(elapsed, 3),
        "ttft_ms": round(ttft * 1e3, 2),
        # After the first token every step makes one token per request.
        "ms_per_step": round((elapsed - ttft) / (max_tokens - 1) * 1e3, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:full:nvfp4")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-num-seqs", type=int, default=8, help="also the largest decode graph")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=RESULTS / "engine_gpu.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rec = _Recorder()
    logging.getLogger().addHandler(rec)

    t0 = time.perf_counter()
    cfg = EngineConfig(model=args.model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    engine = LLMEngine.from_checkpoint(cfg, progress=False)
    startup = time.perf_counter() - t0
    fast = engine.model.kernels
    rows = []
    for op_name, kernels in (("triton", fast), ("reference", dataclasses.replace(fast, sample_top_k=sample_top_k_ref))):
        engine.model.kernels = kernels
        for c in args.concurrency:
            for temp in (0.0, 1.0):
                run(engine, c, args.prompt_len, 8, temp)  # first-use compiles out of the timing
                row = {"sampling_op": op_name, **run(engine, c, args.prompt_len, args.max_tokens, temp)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    engine.model.kernels = fast
    out = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "command": "python benchmarks/engine_gpu.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "startup_s": round(startup, 1),
        "startup_log": rec.lines,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\nstart-up {startup:.1f} s: " + "; ".join(rec.lines))
    print(f"{'sampling op':>12} {'conc':>5} {'temp':>5} {'ms/step':>8} {'TTFT ms':>8}")
    for r in rows:
        print(
            f"{r['sampling_op']:>12} {r['concurrency']:>5} {r['temperature']:>5} {r['ms_per_step']:>8.3f}"
            f" {r['ttft_ms']:>8.1f}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
