"""Engine throughput on CPU: the small Flint at 1 and 16 concurrent requests (greedy, fixed lengths).

    python benchmarks/engine_cpu.py [--model PATH] [--prompt-len 128] [--max-tokens 64]

Prints a table and writes benchmarks/results/engine_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from datetime import date
from pathlib import Path

import torch

from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.sampling_params import SamplingParams

RESULTS = Path(__file__).parent / "results"


def run(engine: LLMEngine, concurrency: int, prompt_len: int, max_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    vocab = engine.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(concurrency)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    reqs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    generated = sum(len(r.output_token_ids) for r in reqs)
    ttft = [r.first_token_time - r.arrival_time for r in reqs]
    return {
        "concurrency": concurrency,
        "prompt_len": prompt_len,
        "max_tokens": max_tokens,
        "elapsed_s": elapsed,
        "generated_tokens": generated,
        "output_tokens_per_s": generated / elapsed,
        "total_tokens_per_s": (generated + prompt_len * concurrency) / elapsed,
        "mean_ttft_s": sum(ttft) / len(ttft),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded default model)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_checkpoint(EngineConfig(model=args.model, device="cpu"), progress=False)
    run(engine, 1, 16, 4, seed=99)  # warm-up
    rows = [run(engine, c, args.prompt_len, args.max_tokens, seed=c) for c in args.concurrency]
    print(f"{'concurrency':>11} {'out tok/s':>10} {'total tok/s':>12} {'mean TTFT s':>12} {'elapsed s':>10}")
    for r in rows:
        print(
            f"{r['concurrency']:>11} {r['output_tokens_per_s']:>10.1f} {r['total_tokens_per_s']:>12.1f}"
            f" {r['mean_ttft_s']:>12.3f} {r['elapsed_s']:>10.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = {
        "date": date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "model": engine.config.to_hf_dict() | {"path": args.model or "embedded default"},
        "dtype": str(engine.model.dtype),
        "results": rows,
    }
    (RESULTS / "engine_cpu.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
