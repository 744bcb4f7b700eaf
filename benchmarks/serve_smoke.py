"""Smoke check of a running flint-serve through its router with the official `openai` client.

    python benchmarks/serve_smoke.py --url http://127.0.0.1:8000 --out benchmarks/results/serve_smoke.json

One chat completion, the same request streamed, a completion, and `/replicas` (each replica's process and device:
on a GPU machine a replica must report `cuda:N` and the GPU's name). Prints a short report and writes JSON; exits 1
if any check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
import openai


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="flint")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--expect-device", default=None, help="e.g. cuda: every replica's device must start with this")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_smoke.json"))
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.url + "/v1", api_key=args.api_key, max_retries=0, timeout=300)
    msg = [{"role": "user", "content": "What is 12 + 30?"}]
    report: dict = {"url": args.url, "checks": {}}

    t = time.perf_counter()
    chat = client.chat.completions.create(model=args.model, messages=msg, max_tokens=32, temperature=0)
    report["chat_s"] = round(time.perf_counter() - t, 3)
    report["chat"] = {"finish_reason": chat.choices[0].finish_reason, "usage": chat.usage.model_dump()}

    t = time.perf_counter()
    first = None
    chunks = []
    for c in client.chat.completions.create(
        model=args.model,
        messages=msg,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        first = first or time.perf_counter() - t
        chunks.append(c)
    report["stream_ttft_s"] = round(first or 0.0, 3)
    report["stream_s"] = round(time.perf_counter() - t, 3)
    streamed = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    report["checks"]["stream_equals_chat"] = streamed == (chat.choices[0].message.content or "") and (
        chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    )

    comp = client.completions.create(model=args.model, prompt="Once upon a time", max_tokens=16, temperature=0)
    report["checks"]["completion"] = comp.usage.completion_tokens >= 1

    replicas = httpx.get(args.url + "/replicas", headers={"Authorization": f"Bearer {args.api_key}"}).json()["data"]
    report["replicas"] = replicas
    report["checks"]["replicas_healthy"] = bool(replicas) and all(r["healthy"] for r in replicas)
    if args.expect_device:
        report["checks"]["replicas_on_device"] = all(r["device"].startswith(args.expect_device) for r in replicas)

    for r in replicas:
        print(f"replica {r['id']}: pid {r['pid']} on {r['device']} ({r['device_name']}), healthy {r['healthy']}")
    print(f"chat {report['chat_s']} s, stream TTFT {report['stream_ttft_s']} s, checks: {report['checks']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
