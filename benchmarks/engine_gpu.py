"""The engine on a GPU: start-up cost (weights, CUDA-graph capture, prefill and sampler warm-up) and the time per
output token through the whole engine loop (scheduler, graph replay, sampling, detokenisation-free token handling),
greedy and sampled, with the Triton sampling op and with its PyTorch reference swapped in.

    python benchmarks/engine_gpu.py [--model random:full:nvfp4] [--max-tokens 128] [--concurrency 1 8]
    python benchmarks/engine_gpu.py --long-prompt 8192 --no-sampling-rows [--idle-prefill-tokens 2048]

The long-prompt row: an 8K prompt's time to first token alone (prefill-only steps take `idle_prefill_tokens`) and
beside a decoding request, whose inter-token gaps meanwhile show what `max_num_batched_tokens` costs it.

Prints a table and writes benchmarks/results/engine_gpu.json (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import random
import re
import statistics
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


def long_prompt(engine: LLMEngine, prompt_len: int) -> dict:
    """A long prompt's time to first token alone (prefill-only steps, `idle_prefill_tokens`), then beside a request
    that is decoding: that request's gaps between tokens while the prompt is prefilled (`max_num_batched_tokens`)."""
    rng = random.Random(prompt_len)
    vocab = engine.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.generate([prompt], greedy)  # first-use compiles out of the timing
    [alone] = engine.generate([prompt[::-1]], greedy)
    endless = SamplingParams(max_tokens=engine.max_context - 64, ignore_eos=True)
    decoding = engine.add_request("decoding", prompt[:64], endless)
    while len(decoding.output_token_ids) < 4:
        engine.step()
    beside = engine.add_request("long", prompt[1:] + prompt[:1], greedy)
    stamps = [time.perf_counter()]
    while not beside.output_token_ids:
        n = len(decoding.output_token_ids)
        engine.step()
        if len(decoding.output_token_ids) > n:
            stamps.append(time.perf_counter())
    engine.abort("decoding")
    while engine.has_unfinished():
        engine.step()
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]
    return {
        "prompt_len": prompt_len,
        "max_num_batched_tokens": engine.engine_config.max_num_batched_tokens,
        "prefill_tokens": engine.prefill_tokens,
        "ttft_alone_ms": round((alone.first_token_time - alone.arrival_time) * 1e3, 1),
        "ttft_beside_decoding_ms": round((beside.first_token_time - beside.arrival_time) * 1e3, 1),
        "decoding_gap_max_ms": round(max(gaps), 1) if gaps else None,
        "decoding_gap_median_ms": round(statistics.median(gaps), 1) if gaps else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:full:nvfp4")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-num-seqs", type=int, default=8, help="also the largest decode graph")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--idle-prefill-tokens", type=int, default=None, help="default: the engine's")
    ap.add_argument(
        "--long-prompt", type=int, default=0, help="also time a prompt this long alone and beside a decoding request"
    )
    ap.add_argument("--no-sampling-rows", action="store_true", help="only the start-up and the long prompt")
    ap.add_argument("--out", type=Path, default=RESULTS / "engine_gpu.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rec = _Recorder()
    logging.getLogger().addHandler(rec)

    t0 = time.perf_counter()
    cfg = EngineConfig(
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        idle_prefill_tokens=args.idle_prefill_tokens,
    )
    engine = LLMEngine.from_checkpoint(cfg, progress=False)
    startup = time.perf_counter() - t0
    fast = engine.model.kernels
    rows = []
    long_row = long_prompt(engine, args.long_prompt) if args.long_prompt else None
    if long_row:
        print(json.dumps(long_row), flush=True)
    for op_name, kernels in (("triton", fast), ("reference", dataclasses.replace(fast, sample_top_k=sample_top_k_ref))):
        engine.model.kernels = kernels
        for c in [] if args.no_sampling_rows else args.concurrency:
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
        "long_prompt": long_row,
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
    if long_row:
        print(
            f"{long_row['prompt_len']}-token prompt, steps of {long_row['max_num_batched_tokens']} /"
            f" {long_row['prefill_tokens']} prefill-only: TTFT alone {long_row['ttft_alone_ms']} ms, beside a"
            f" decoding request {long_row['ttft_beside_decoding_ms']} ms; its gaps meanwhile max"
            f" {long_row['decoding_gap_max_ms']} ms, median {long_row['decoding_gap_median_ms']} ms"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
