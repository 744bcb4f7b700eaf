"""How long a large prompt holds up a running server's other requests (its event loop's stall).

    python benchmarks/api_loop_stall.py --url http://127.0.0.1:8000 --sizes 262144 2097152 \
        --out benchmarks/results/api_loop_stall.json

A poller sends `GET /v1/models` back to back while the main thread sends one chat request a size, its user message
that many characters of mixed text (a prompt longer than the model's context is answered 400 after it is templated
and tokenized, so the stall is the same). The poller's latency during each large request is what every other client
of that server waits: its maximum and 99th percentile, beside the large request's own time. Prints a table, writes
JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path

import httpx

WORDS = ["hello", "world", "tokenizer", "flint", "serve", "数据", "123", "!!", "café", "\n"]


def prompt_text(chars: int, seed: int) -> str:
    """Mixed text of about `chars` characters (words, CJK, digits, punctuation, newlines)."""
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        parts.append(w)
        n += len(w) + 1
    return " ".join(parts)[:chars]


class Poller(threading.Thread):
    """GET /v1/models back to back; the latency of each, with when it started."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, headers=headers, timeout=120)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.client.get("/v1/models").raise_for_status()
            self.samples.append((t, time.perf_counter() - t))
            time.sleep(0.002)

    def between(self, start: float, end: float) -> list[float]:
        """Latencies of the polls that overlapped [start, end], once a poll begun after `end` has answered (so the
        one held up with the large request is in)."""
        while not self.samples or self.samples[-1][0] <= end:
            if not self.is_alive():
                raise RuntimeError("the poller stopped (its request failed: is the server up?)")
            time.sleep(0.005)
        return [lat for t, lat in self.samples if t <= end and t + lat >= start]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="flint")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--sizes", type=int, nargs="+", default=[262144, 2097152], help="characters of each prompt")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "api_loop_stall.json"))
    args = ap.parse_args()

    headers = {"Authorization": f"Bearer {args.api_key}"}
    poller = Poller(args.url, headers)
    poller.start()
    time.sleep(1.0)  # a baseline of idle polls
    idle = [lat for _, lat in poller.samples]
    rows = []
    with httpx.Client(base_url=args.url, headers=headers, timeout=600) as client:
        for size in args.sizes:
            for rep in range(args.reps):
                body = {
                    "model": args.model,
                    "messages": [{"role": "user", "content": prompt_text(size, rep)}],
                    "max_tokens": 1,
                }
                start = time.perf_counter()
                r = client.post("/v1/chat/completions", json=body)
                end = time.perf_counter()
                lats = poller.between(start, end)
                rows.append(
                    {
                        "chars": size,
                        "rep": rep,
                        "status": r.status_code,
                        "request_s": round(end - start, 3),
                        "polls": len(lats),
                        "poll_max_ms": round(1e3 * max(lats, default=0.0), 1),
                        "poll_p99_ms": round(1e3 * _quantile(lats, 0.99), 1),
                    }
                )
    poller.stop.set()
    poller.join()
    report = {
        "url": args.url,
        "idle_poll_p50_ms": round(1e3 * statistics.median(idle), 2) if idle else None,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"idle poll p50 {report['idle_poll_p50_ms']} ms")
    print("| chars | status | request s | polls | poll max ms | poll p99 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['chars']} | {row['status']} | {row['request_s']} | {row['polls']} | {row['poll_max_ms']} |"
            f" {row['poll_p99_ms']} |"
        )
    return 0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


if __name__ == "__main__":
    raise SystemExit(main())
