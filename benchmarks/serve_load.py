"""Load generator for a running flint-serve: fixed concurrency levels and a request-rate sweep, streaming.

    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --concurrency 1 4 16 --rates 2 8 --requests 64
    python benchmarks/serve_load.py --soak-minutes 10            # mixed load, then check memory and cache return

Prompt and output lengths are drawn from log-normal distributions (chat-like: short questions, some long
contexts). Reports TTFT, inter-token latency and end-to-end percentiles, output tokens/s, and errors by HTTP
status; prints a table and writes JSON (benchmarks/results/serve_load.json, or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).parent / "results"
WORDS = (
    "the model answers every question about rivers mountains numbers tools weather code and history with care"
    " while the engine keeps its cache warm and the router spreads the load"
).split()


@dataclass
class Sample:
    status: int
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None


def draw_lengths(
    rng: random.Random, prompt_median: int, output_median: int, cap_prompt: int, cap_output: int
) -> tuple[int, int]:
    p = int(min(cap_prompt, max(4, rng.lognormvariate(math.log(prompt_median), 0.8))))
    o = int(min(cap_output, max(1, rng.lognormvariate(math.log(output_median), 0.6))))
    return p, o


def make_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int, headers: dict[str, str]
) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.perf_counter()
    last = start
    s = Sample(status=0)
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            s.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                s.error = r.text[:200]
                s.e2e = time.perf_counter() - start
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    s.status, s.error = 599, chunk["error"]["message"][:200]  # failed after the 200 went out
                    continue
                now = time.perf_counter()
                if chunk.get("usage"):
                    s.output_tokens = chunk["usage"]["completion_tokens"]
                    s.prompt_tokens = chunk["usage"]["prompt_tokens"]
                for ch in chunk.get("choices", []):
                    d = ch.get("delta", {})
                    if d.get("content") or d.get("reasoning") or d.get("tool_calls"):
                        if s.ttft is None:
                            s.ttft = now - start
                        else:
                            s.itls.append(now - last)
                        last = now
    except httpx.HTTPError as exc:
        s.status, s.error = -1, f"{type(exc).__name__}: {exc}"[:200]
    s.e2e = time.perf_counter() - start
    return s


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarise(name: str, samples: list[Sample], wall: float) -> dict[str, Any]:
    ok = [s for s in samples if s.status == 200]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [x for s in ok for x in s.itls]
    e2e = [s.e2e for s in ok]
    errors: dict[str, int] = {}
    for s in samples:
        if s.status != 200:
            errors[str(s.status)] = errors.get(str(s.status), 0) + 1
    out_tokens = sum(s.output_tokens for s in ok)
    return {
        "load": name,
        "requests": len(samples),
        "ok": len(ok),
        "errors_by_status": errors,
        "wall_s": round(wall, 2),
        "output_tokens_per_s": round(out_tokens / wall, 1) if wall else 0.0,
        "requests_per_s": round(len(ok) / wall, 2) if wall else 0.0,
        **{f"ttft_p{int(q * 100)}_s": _r(pct(ttft, q)) for q in (0.5, 0.9, 0.99)},
        **{f"itl_p{int(q * 100)}_s": _r(pct(itl, q)) for q in (0.5, 0.9, 0.99)},
        **{f"e2e_p{int(q * 100)}_s": _r(pct(e2e, q)) for q in (0.5, 0.9, 0.99)},
        "mean_itl_s": _r(statistics.fmean(itl)) if itl else None,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


async def run_concurrency(args: argparse.Namespace, level: int, headers: dict[str, str]) -> dict[str, Any]:
    rng = random.Random(level)
    queue = list(range(args.requests))
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=level + 4)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:

        async def worker() -> None:
            while queue:
                queue.pop()
                p, o = draw_lengths(rng, args.prompt_median, args.output_median, args.max_prompt, args.max_output)
                samples.append(await one_request(client, args.url, args.model, make_prompt(rng, p), o, headers))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(level)))
        wall = time.perf_counter() - start
    return summarise(f"concurrency {level}", samples, wall)


async def run_rate(args: argparse.Namespace, rate: float, headers: dict[str, str]) -> dict[str, Any]:
    """Poisson arrivals at `rate` requests/s, however slowly the server answers (open loop)."""
    rng = random.Random(int(rate * 1000))
    async with httpx.AsyncClient(timeout=args.timeout, limits=httpx.Limits(max_connections=1000)) as client:
        tasks = []
        start = time.perf_counter()
        for _ in range(args.requests):
            p, o = draw_lengths(rng, args.prompt_median, args.output_median, args.max_prompt, args.max_output)
            tasks.append(
                asyncio.ensure_future(one_request(client, args.url, args.model, make_prompt(rng, p), o, headers))
            )
            await asyncio.sleep(rng.expovariate(rate))
        samples = await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    return summarise(f"rate {rate}/s", list(samples), wall)


def scrape(url: str, headers: dict[str, str]) -> dict[str, float]:
    """A few gauges from the app's /metrics (summed over replicas)."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("flint:num_requests_running", "flint:kv_cache_usage_perc", "flint:num_requests_waiting")):
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def soak(args: argparse.Namespace, headers: dict[str, str]) -> dict[str, Any]:
    before = scrape(args.url, headers)
    end = time.monotonic() + args.soak_minutes * 60
    rounds = []
    while time.monotonic() < end:
        rounds.append(await run_concurrency(args, args.concurrency[-1], headers))
        rounds.append(await run_rate(args, args.rates[-1] if args.rates else 4.0, headers))
    await asyncio.sleep(5)  # metrics are posted every couple of seconds
    after = scrape(args.url, headers)
    back = all(
        after.get(k, 0.0) <= max(before.get(k, 0.0), 0.0) + 1e-9
        for k in ("flint:num_requests_running", "flint:kv_cache_usage_perc")
    )
    return {
        "soak_minutes": args.soak_minutes,
        "rounds": rounds,
        "gauges_before": before,
        "gauges_after": after,
        "returned_to_baseline": back,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    r = httpx.get(args.url + "/health", timeout=10)
    if r.status_code != 200:
        raise SystemExit(f"{args.url} is not healthy: {r.status_code} {r.text[:200]}")
    await run_concurrency(argparse.Namespace(**{**vars(args), "requests": 2}), 1, headers)  # warm-up
    result: dict[str, Any] = {
        "date": date.today().isoformat(),
        "url": args.url,
        "settings": {k: v for k, v in vars(args).items() if k not in ("api_key", "out")},
        "results": [],
    }
    if args.soak_minutes:
        result["soak"] = await soak(args, headers)
        return result
    for level in args.concurrency:
        result["results"].append(await run_concurrency(args, level, headers))
    for rate in args.rates:
        result["results"].append(await run_rate(args, rate, headers))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="flint")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16])
    ap.add_argument("--rates", type=float, nargs="*", default=[2.0, 8.0])
    ap.add_argument("--requests", type=int, default=48, help="per load level")
    ap.add_argument("--prompt-median", type=int, default=48, help="words")
    ap.add_argument("--output-median", type=int, default=32, help="tokens")
    ap.add_argument("--max-prompt", type=int, default=1500)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--soak-minutes", type=float, default=0.0)
    ap.add_argument("--out", default=str(RESULTS / "serve_load.json"))
    args = ap.parse_args()
    result = asyncio.run(main_async(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    rows = result["results"] or result.get("soak", {}).get("rounds", [])
    print(
        f"{'load':>16} {'ok':>5} {'err':>10} {'out tok/s':>10} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7}"
        f" {'e2e p50':>8} {'p99':>7}"
    )
    for r in rows:
        err = ",".join(f"{k}:{v}" for k, v in r["errors_by_status"].items()) or "-"
        print(
            f"{r['load']:>16} {r['ok']:>5} {err:>10} {r['output_tokens_per_s']:>10} {r['ttft_p50_s']!s:>9}"
            f" {r['ttft_p99_s']!s:>7} {r['itl_p50_s']!s:>8} {r['itl_p99_s']!s:>7} {r['e2e_p50_s']!s:>8}"
            f" {r['e2e_p99_s']!s:>7}"
        )
    if "soak" in result:
        print("returned to baseline:", result["soak"]["returned_to_baseline"], result["soak"]["gauges_after"])


if __name__ == "__main__":
    main()
