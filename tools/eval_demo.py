"""Evaluate the demo model through the official `openai` client on held-out synthetic prompts.

    python tools/eval_demo.py                                  # starts a local server on the shipped BF16 model
    python tools/eval_demo.py --model flint_engine/assets/flint-demo-nvfp4.gguf
    python tools/eval_demo.py --url http://127.0.0.1:8000/v1   # any running Flint Serve

The prompts come from the training corpus's generators with seeds the trainer never uses. Every prompt runs twice
at temperature 0: non-streamed and streamed; the streamed deltas are reassembled and must equal the non-streamed
message (reasoning, content, tool call names and arguments). Checks:

  arith, count   the answer number appears in `content`; `reasoning_content` is present
  tool           exactly one parsed `tool_calls` entry with the right name and arguments
  tool_result    the final answer mentions the tool's result
  greet          a non-empty reply
  no-think/*     thinking off (`enable_thinking: false`): no reasoning at all, and the answer as above

Prints a table and writes JSON (default benchmarks/results/demo_eval.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_demo.py: shared cores

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import openai  # noqa: E402
from demo_corpus import Sample, samples, score  # noqa: E402
from tqdm import tqdm  # noqa: E402

log = logging.getLogger("eval_demo")

DEFAULT_MODEL = ROOT / "flint_engine" / "assets" / "flint-demo.gguf"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "demo_eval.json"
EVAL_SEED = 20_261_129  # held out: training batches use seed * 1_000_003 + step, the trainer's eval 777_001+
TARGETS = {"arith": 0.9, "count": 0.9, "tool": 0.9, "no-think: no reasoning": 1.0, "stream == non-stream": 1.0}


def eval_set(
    seed: int = EVAL_SEED,
    n_arith: int = 60,
    n_count: int = 30,
    n_tool: int = 60,
    n_tool_result: int = 30,
    n_greet: int = 10,
    n_nothink: int = 40,
) -> list[Sample]:
    """Held-out prompts: thinking on per kind, then thinking-off prompts of every kind (mostly arithmetic/tools)."""
    items: list[Sample] = []
    for i, (kind, n) in enumerate(
        (("arith", n_arith), ("count", n_count), ("tool", n_tool), ("tool_result", n_tool_result), ("greet", n_greet))
    ):
        items += samples(seed + i, n, kind=kind, thinking=True)
    split = {"arith": 0.35, "tool": 0.35, "count": 0.1, "tool_result": 0.1, "greet": 0.1}
    for j, (kind, frac) in enumerate(split.items()):
        items += samples(seed + 100 + j, max(1, round(n_nothink * frac)), kind=kind, thinking=False)
    return items


def openai_messages(sample: Sample) -> list[dict[str, Any]]:
    """The prompt messages as an OpenAI client sends them: tool-call arguments as JSON strings, no reasoning echo."""
    out = []
    for m in sample.prompt_messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {
                    "id": tc.get("id", f"call_{i}"),
                    "type": "function",
                    "function": {"name": tc["function"]["name"], "arguments": json.dumps(tc["function"]["arguments"])},
                }
                for i, tc in enumerate(m["tool_calls"])
            ]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _request(sample: Sample, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "flint",
        "messages": openai_messages(sample),
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if sample.tools:
        body["tools"] = sample.tools
    if not sample.thinking:
        body["extra_body"] = {"chat_template_kwargs": {"enable_thinking": False}}
    return body


def _calls(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}} for c in raw]


def _same_calls(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    def norm(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        out = []
        for c in calls:
            try:
                args = json.loads(c["function"]["arguments"])
            except (json.JSONDecodeError, TypeError):
                args = c["function"]["arguments"]
            out.append((c["function"]["name"], args))
        return out

    return norm(a) == norm(b)


def ask(client: openai.OpenAI, sample: Sample, max_tokens: int = 128) -> dict[str, Any]:
    """One prompt, non-streamed then streamed; the parsed messages, the score and whether the two agree."""
    body = _request(sample, max_tokens)
    t0 = time.perf_counter()
    r = client.chat.completions.create(**body)
    msg = r.choices[0].message
    extra = msg.model_extra or {}
    whole = {
        "reasoning": extra.get("reasoning_content"),
        "content": msg.content,
        "tool_calls": _calls([tc.model_dump() for tc in msg.tool_calls or []]),
        "finish_reason": r.choices[0].finish_reason,
    }
    t1 = time.perf_counter()
    reasoning, content, calls = "", "", {}
    finish = None
    for chunk in client.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        d_extra = delta.model_extra or {}
        reasoning += d_extra.get("reasoning_content") or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"function": {"name": "", "arguments": ""}})
            if tc.function is not None:
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    streamed = {
        "reasoning": reasoning or None,
        "content": content or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
    }
    t2 = time.perf_counter()
    same = (
        whole["reasoning"] == streamed["reasoning"]
        and whole["content"] == streamed["content"]
        and _same_calls(whole["tool_calls"], streamed["tool_calls"])
    )
    return {
        "kind": sample.kind,
        "thinking": sample.thinking,
        "prompt": sample.prompt_messages[-1].get("content"),
        "expect": sample.expect,
        "ok": score(sample, whole["reasoning"], whole["content"], whole["tool_calls"]),
        "no_reasoning": not (whole["reasoning"] and whole["reasoning"].strip()),
        "stream_equal": same,
        "whole": whole,
        "streamed": streamed if not same else None,
        "latency_s": [round(t1 - t0, 3), round(t2 - t1, 3)],
    }


def run(
    client: openai.OpenAI, items: list[Sample], concurrency: int = 1, progress: bool = True
) -> list[dict[str, Any]]:
    """Ask every prompt (in order; with `concurrency` > 1 several prompts are in flight at once)."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = [pool.submit(ask, client, s) for s in items]
        return [f.result() for f in tqdm(futures, desc="prompts", disable=not progress, dynamic_ncols=True)]


def categories(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Accuracy rows: per kind with thinking on, thinking-off correctness and no-reasoning, stream agreement."""
    rows: dict[str, list[bool]] = {}
    for r in results:
        key = r["kind"] if r["thinking"] else f"no-think: {r['kind']}"
        rows.setdefault(key, []).append(r["ok"])
    off = [r for r in results if not r["thinking"]]
    if off:
        rows["no-think: no reasoning"] = [r["no_reasoning"] for r in off]
    rows["stream == non-stream"] = [r["stream_equal"] for r in results]
    out = {}
    for key, vals in rows.items():
        target = TARGETS.get(key)
        acc = sum(vals) / len(vals)
        out[key] = {
            "n": len(vals),
            "correct": sum(vals),
            "accuracy": round(acc, 4),
            "target": target,
            "pass": None if target is None else acc >= target,
        }
    return out


def table(cats: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'category':<26} {'n':>4} {'correct':>8} {'accuracy':>9} {'target':>7}  pass", "-" * 64]
    for key, c in cats.items():
        target = f"{c['target']:.0%}" if c["target"] is not None else "-"
        ok = {True: "yes", False: "NO", None: ""}[c["pass"]]
        lines.append(f"{key:<26} {c['n']:>4} {c['correct']:>8} {c['accuracy']:>9.1%} {target:>7}  {ok}")
    return "\n".join(lines)


@contextmanager
def local_server(model: str | os.PathLike[str], threads: int = 2) -> Iterator[str]:
    """Start the project's single-process server (engine + OpenAI API) on `model`; yields the /v1 base URL."""
    import torch

    from flint_engine.api.server import start_local_server
    from flint_engine.api.settings import APISettings
    from flint_engine.engine import LLMEngine
    from flint_engine.engine_config import EngineConfig

    torch.set_num_threads(threads)
    config = EngineConfig(model=str(model), device="cpu", dtype="float32", kv_cache_memory=64 * 2**20)
    engine = LLMEngine.from_checkpoint(config, progress=False)
    server = start_local_server(engine, APISettings())
    try:
        yield server.base_url + "/v1"
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="an OpenAI-compatible base URL (…/v1); default: start a local server")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="GGUF for the local server")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    p.add_argument("--seed", type=int, default=EVAL_SEED)
    p.add_argument("--n-arith", type=int, default=60)
    p.add_argument("--n-count", type=int, default=30)
    p.add_argument("--n-tool", type=int, default=60)
    p.add_argument("--n-tool-result", type=int, default=30)
    p.add_argument("--n-greet", type=int, default=10)
    p.add_argument("--n-nothink", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=1, help="prompts in flight at once")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("flint_engine").setLevel(logging.WARNING)
    logging.getLogger("flint_engine.parsers").setLevel(logging.ERROR)
    for quiet in ("httpx", "httpx2"):
        logging.getLogger(quiet).setLevel(logging.WARNING)

    items = eval_set(
        args.seed, args.n_arith, args.n_count, args.n_tool, args.n_tool_result, args.n_greet, args.n_nothink
    )
    t0 = time.perf_counter()
    if args.url:
        server_cm: Any = _given(args.url)
    else:
        server_cm = local_server(args.model, args.threads)
    with server_cm as base_url:
        client = openai.OpenAI(base_url=base_url, api_key=args.api_key, max_retries=0, timeout=300)
        results = run(client, items, args.concurrency)
    wall = time.perf_counter() - t0
    cats = categories(results)
    print(table(cats))
    report = {
        "model": None if args.url else os.path.relpath(args.model, ROOT),
        "url": args.url,
        "seed": args.seed,
        "prompts": len(items),
        "requests": 2 * len(items),
        "concurrency": args.concurrency,
        "wall_s": round(wall, 1),
        "categories": cats,
        "all_targets_met": all(c["pass"] for c in cats.values() if c["pass"] is not None),
        "failures": [r for r in results if not (r["ok"] and r["stream_equal"])],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    log.info("%d prompts (%d requests) in %.0f s; wrote %s", len(items), 2 * len(items), wall, args.out)
    return 0 if report["all_targets_met"] else 1


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    raise SystemExit(main())
