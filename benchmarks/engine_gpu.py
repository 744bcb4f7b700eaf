"""The engine on a GPU: start-up cost (weights, CUDA-graph capture, prefill and sampler warm-up) and the time per
output token through the whole engine loop (scheduler, graph replay, sampling, detokenisation-free token handling),
greedy and sampled, with the Triton sampling op and with its PyTorch reference swapped in.

    python benchmarks/engine_gpu.py [--model random:full:nvfp4] [--max-tokens 128] [--concurrency 1 8]
    python benchmarks/engine_gpu.py --long-prompt 8192 --no-sampling-rows [--idle-prefill-tokens 2048]
    python benchmarks/engine_gpu.py --host-profile 1 8 --no-sampling-rows

The host-profile rows: decode steps under cProfile (greedy and sampled), the wall time of a step against the GPU time
of its graph replay and sampling (CUDA events), and the host functions that take the difference.

The long-prompt row: an 8K prompt's time to first token alone (prefill-only steps take `idle_prefill_tokens`) and
beside a decoding request, whose inter-token gaps meanwhile show what `max_num_batched_tokens` costs it.

Prints a table and writes benchmarks/results/engine_gpu.json (or --out).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import itertools
import json
import logging
import pstats
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
from flint_engine.late_compiles import WATCH as LATE_COMPILES
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


def _steps_until_first_token(engine: LLMEngine, req, decoding=None) -> tuple[list[float], list[float]]:
    """Step until `req` has its first token: each step's wall ms, and `decoding`'s token times meanwhile."""
    step_ms, stamps = [], [time.perf_counter()]
    while not req.output_token_ids:
        n = len(decoding.output_token_ids) if decoding is not None else 0
        t = time.perf_counter()
        engine.step()  # returns once the step's tokens are on the host
        step_ms.append(round((time.perf_counter() - t) * 1e3, 2))
        if decoding is not None and len(decoding.output_token_ids) > n:
            stamps.append(time.perf_counter())
    return step_ms, stamps


def long_prompt(engine: LLMEngine, prompt_len: int, profile: bool = False) -> dict:
    """A long prompt's time to first token alone (prefill-only steps, `idle_prefill_tokens`), then beside a request
    that is decoding: that request's gaps between tokens while the prompt is prefilled (`max_num_batched_tokens`).
    Each phase lists its steps' wall times and the Triton kernels first compiled in it (a stall the warm-up missed).
    Every prompt is a fresh permutation, so the prefix cache serves none of it."""
    rng = random.Random(prompt_len)
    vocab = engine.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    compiles = LATE_COMPILES.count
    engine.generate([prompt], greedy)  # first use of the prompt's shapes
    warm_compiles = [e.kernel for e in LATE_COMPILES.since(compiles)]
    compiles = LATE_COMPILES.count
    alone = engine.add_request("alone", prompt[::-1], greedy)
    alone_steps, _ = _steps_until_first_token(engine, alone)
    while engine.has_unfinished():
        engine.step()
    alone_compiles = [e.kernel for e in LATE_COMPILES.since(compiles)]
    endless = SamplingParams(max_tokens=engine.max_context - 64, ignore_eos=True)
    decoding = engine.add_request("decoding", prompt[:64], endless)
    while len(decoding.output_token_ids) < 4:
        engine.step()
    compiles = LATE_COMPILES.count
    beside = engine.add_request("long", prompt[1:] + prompt[:1], greedy)
    beside_steps, stamps = _steps_until_first_token(engine, beside, decoding)
    beside_compiles = [e.kernel for e in LATE_COMPILES.since(compiles)]
    engine.abort("decoding")
    while engine.has_unfinished():
        engine.step()
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]
    row = {
        "prompt_len": prompt_len,
        "max_num_batched_tokens": engine.engine_config.max_num_batched_tokens,
        "prefill_tokens": engine.prefill_tokens,
        "ttft_alone_ms": round((alone.first_token_time - alone.arrival_time) * 1e3, 1),
        "alone_step_ms": alone_steps,
        "ttft_beside_decoding_ms": round((beside.first_token_time - beside.arrival_time) * 1e3, 1),
        "beside_step_ms": beside_steps,
        "decoding_gap_max_ms": round(max(gaps), 1) if gaps else None,
        "decoding_gap_median_ms": round(statistics.median(gaps), 1) if gaps else None,
        "late_compiles": {"first_prompt": warm_compiles, "alone": alone_compiles, "beside": beside_compiles},
    }
    if profile and torch.cuda.is_available():
        from decode import count_kernels  # a sibling script: benchmarks/ is on sys.path

        shift = iter(range(2, prompt_len))

        def one_prompt() -> None:
            k = next(shift)
            engine.generate([prompt[k:] + prompt[:k]], greedy)

        n, families, by_name = count_kernels(one_prompt, torch.device("cuda"))
        row.update(alone_kernels=n, alone_time_by_family_ms=families, alone_kernels_by_name=by_name[:20])
    return row


def cprofile_rows(prof: cProfile.Profile, steps: int) -> list[dict]:
    """A profile's functions per step (calls, self and cumulative us), by self time, most first."""
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        rows.append({
            "function": f"{Path(file).name}:{line}:{name}",
            "calls_per_step": round(calls / steps, 2),
            "self_us_per_step": round(tottime / steps * 1e6, 1),
            "cumulative_us_per_step": round(cumtime / steps * 1e6, 1),
        })  # fmt: skip
    return sorted(rows, key=lambda r: -r["self_us_per_step"])


def host_profile(
    engine: LLMEngine, concurrency: int, temperature: float, prompt_len: int = 64, steps: int = 200, top: int = 25
) -> dict:
    """Decode steps of `concurrency` requests: wall ms per step, the GPU time of its decode graph alone, and the host
    functions by time (cProfile, on further steps; its own overhead inflates the host times)."""

    rng = random.Random(concurrency)
    vocab = engine.config.vocab_size
    params = SamplingParams(max_tokens=2 * steps + 40, temperature=temperature, ignore_eos=True, seed=1)
    for i in range(concurrency):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        engine.add_request(f"host-{concurrency}-{temperature}-{i}", prompt, params)
    while any(not r.output_token_ids for r in engine.requests.values()):
        engine.step()  # prefill, out of the timing
    for _ in range(10):
        engine.step()
    walls, ahead0 = [], engine.steps_ahead
    for _ in range(steps):  # wall time per step, nothing profiled
        t = time.perf_counter()
        engine.step()
        walls.append((time.perf_counter() - t) * 1e3)
    ahead = engine.steps_ahead - ahead0
    prof = cProfile.Profile()
    for _ in range(steps):
        prof.enable()
        engine.step()
        prof.disable()
    # The GPU time of the step's forward alone: its decode graph replayed back to back.
    graphs, replay_ms = engine.runner.graphs, None
    if graphs is not None:
        b = min(x for x in graphs.batch_buckets if x >= concurrency)
        ctx = min(x for x in graphs.context_buckets if x >= prompt_len + 2 * steps + 11)
        g = graphs.graphs[(b, ctx)].graph
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        g.replay()
        start.record()
        for _ in range(50):
            g.replay()
        end.record()
        end.synchronize()
        replay_ms = start.elapsed_time(end) / 50
    for rid in list(engine.requests):
        engine.abort(rid)
    rows = cprofile_rows(prof, steps)
    return {
        "concurrency": concurrency,
        "temperature": temperature,
        "prompt_len": prompt_len,
        "steps": steps,
        "wall_ms_per_step_median": round(statistics.median(walls), 3),
        "steps_launched_ahead": ahead,  # of the timed steps (EngineConfig.async_decode)
        "graph_replay_gpu_ms": None if replay_ms is None else round(replay_ms, 3),
        "profiled_us_per_step": round(sum(r["self_us_per_step"] for r in rows), 1),
        "top_self": rows[:top],
        "top_cumulative": sorted(rows, key=lambda r: -r["cumulative_us_per_step"])[:top],
    }


def _host_line(h: dict) -> str:
    return (
        f"host profile, {h['concurrency']} requests of {h['prompt_len']} prompt tokens, temperature"
        f" {h['temperature']}: wall {h['wall_ms_per_step_median']} ms a step ({h['steps_launched_ahead']} of"
        f" {h['steps']} launched ahead), its decode graph alone {h['graph_replay_gpu_ms']} ms on the GPU; host time"
        f" under cProfile {h['profiled_us_per_step']} us a step"
    )


def _percentile(values: list[float], q: float) -> float | None:
    return round(sorted(values)[int(q * (len(values) - 1))], 2) if values else None


def churn(engine: LLMEngine, n_requests: int, seed: int = 0) -> dict:
    """Serving-like traffic in one process: requests of mixed prompt lengths (mostly short, some up to a few
    thousand tokens), lengths and sampling settings arrive while others decode, so steps mix prefill chunks of any
    size with decode rows of any count. Reports the slowest steps and every Triton kernel first compiled meanwhile
    (each such compile stalls every running request; the warm-up should leave none)."""
    rng = random.Random(seed)
    vocab = engine.config.vocab_size
    cap = engine.engine_config.max_num_seqs
    longest = max(1, engine.max_context - 48)  # room for the longest output below
    compiles = LATE_COMPILES.count
    step_ms: list[float] = []
    arrivals: dict[str, float] = {}
    token_times: dict[str, list[float]] = {}  # when each request's tokens reached the host
    added = 0
    while added < n_requests or engine.has_unfinished():
        if added < n_requests and len(engine.scheduler.running) + len(engine.scheduler.waiting) < cap:
            for _ in range(rng.choice((0, 0, 1, 1, 2, 5))):
                if added == n_requests:
                    break
                plen = rng.randint(1, 64) if rng.random() < 0.6 else rng.randint(65, 3000)
                plen = min(plen, longest)
                greedy = rng.random() < 0.3
                params = SamplingParams(
                    max_tokens=rng.randint(1, 48),
                    temperature=0.0 if greedy else rng.choice((0.7, 1.0)),
                    top_k=rng.choice((20, 20, 50, 1)),
                    ignore_eos=True,
                    seed=added,
                )
                rid = f"churn-{added}"
                engine.add_request(rid, [rng.randrange(vocab) for _ in range(plen)], params)
                arrivals[rid] = time.perf_counter()
                added += 1
        t = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        step_ms.append((now - t) * 1e3)
        for out in outputs:
            if out.new_token_ids:
                token_times.setdefault(out.request_id, []).append(now)
    late = LATE_COMPILES.since(compiles)
    ttft = [(times[0] - arrivals[rid]) * 1e3 for rid, times in token_times.items()]
    itl = [(b - a) * 1e3 for times in token_times.values() for a, b in itertools.pairwise(times)]
    return {
        "requests": n_requests,
        "steps": len(step_ms),
        "step_ms_median": round(statistics.median(step_ms), 2),
        "step_ms_p99": _percentile(step_ms, 0.99),
        "step_ms_max": round(max(step_ms), 2),
        "ttft_ms_p50_p99": [_percentile(ttft, 0.5), _percentile(ttft, 0.99)],
        "itl_ms_p50_p99": [_percentile(itl, 0.5), _percentile(itl, 0.99)],
        "late_compiles": [{"kernel": e.kernel, "key": e.key[:1500]} for e in late],
    }


def command_line(args: argparse.Namespace) -> str:
    """The command that repeats this run (flags as typed: lists spaced, switches bare, unset options left out)."""
    parts = ["python benchmarks/engine_gpu.py"]
    for k, v in vars(args).items():
        flag = "--" + k.replace("_", "-")
        if k in ("async_decode", "step_graphs") and v is False:
            parts.append(f"--no-{k.replace('_', '-')}")
            continue
        if k == "out" or v is None or v is False or v == []:
            continue
        parts.append(flag if v is True else f"{flag} {' '.join(map(str, v)) if isinstance(v, list) else v}")
    return " ".join(parts)


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
    ap.add_argument("--churn", type=int, default=0, help="also run this many requests of serving-like mixed traffic")
    ap.add_argument("--profile-long", action="store_true", help="kernels of the long prompt alone, by family (GPU)")
    ap.add_argument("--no-sampling-rows", action="store_true", help="only the start-up and the long prompt")
    ap.add_argument(
        "--async-decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="EngineConfig.async_decode (next step launched ahead; the default)",
    )
    ap.add_argument(
        "--step-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="EngineConfig.step_graphs (prefill and mixed steps on CUDA graphs; the default)",
    )
    ap.add_argument("--host-profile", type=int, nargs="*", default=[], help="profile decode steps at these batches")
    ap.add_argument("--host-profile-prompt", type=int, nargs="+", default=[64], help="the host-profile prompt lengths")
    ap.add_argument("--host-profile-steps", type=int, default=200, help="steps timed (and as many profiled) per case")
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
        async_decode=args.async_decode,
        step_graphs=args.step_graphs,
    )
    engine = LLMEngine.from_checkpoint(cfg, progress=False)
    startup = time.perf_counter() - t0
    fast = engine.model.kernels
    rows = []
    long_row = long_prompt(engine, args.long_prompt, args.profile_long) if args.long_prompt else None
    if long_row:
        print(json.dumps(long_row), flush=True)
    churn_row = churn(engine, args.churn) if args.churn else None
    host_rows = []
    for p in args.host_profile_prompt:
        for c in args.host_profile:
            for temp in (0.0, 1.0):
                h = host_profile(engine, c, temp, p, steps=args.host_profile_steps)
                host_rows.append(h)
                print(_host_line(h), flush=True)  # as each case ends: a run cut short still reports its cases
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
        "command": command_line(args),
        "startup_s": round(startup, 1),
        "startup_log": rec.lines,
        "rows": rows,
        "long_prompt": long_row,
        "churn": churn_row,
        "host_profile": host_rows,
        "late_compiles": [{"kernel": e.kernel, "specialisation": e.specialisation} for e in LATE_COMPILES.events],
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
        print(f"  steps alone (ms): {long_row['alone_step_ms']}; beside: {long_row['beside_step_ms']}")
        if "alone_time_by_family_ms" in long_row:
            fams = ", ".join(f"{k} {v:.1f}" for k, v in long_row["alone_time_by_family_ms"].items())
            print(f"  alone, GPU ms by family ({long_row['alone_kernels']} kernels): {fams}")
    if churn_row:
        c = churn_row
        ttft, itl = c["ttft_ms_p50_p99"], c["itl_ms_p50_p99"]
        print(
            f"churn: {c['requests']} requests in {c['steps']} steps, step ms median {c['step_ms_median']}, p99"
            f" {c['step_ms_p99']}, max {c['step_ms_max']}; TTFT ms p50/p99 {ttft[0]}/{ttft[1]}, ITL ms p50/p99"
            f" {itl[0]}/{itl[1]}; {len(c['late_compiles'])} kernels compiled meanwhile"
        )
    for h in host_rows:
        print(_host_line(h) + ", top self:")
        for r in h["top_self"][:14]:
            print(f"  {r['self_us_per_step']:>8} us  {r['calls_per_step']:>6}x  {r['function']}")
    late = [e.kernel for e in LATE_COMPILES.events]
    print(f"Triton kernels compiled after the warm-up: {len(late)} {sorted(set(late))}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
