"""Prefix-cache affinity routing against power-of-two on a multi-turn chat workload (2 CPU replicas, tiny model).

    python benchmarks/routing_affinity.py [--conversations 4] [--turns 8]

Each conversation resends its whole history every turn (as agents do). Reports the fraction of prompt tokens
served from a replica's prefix cache under each policy; writes benchmarks/results/routing_affinity.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import date
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from api_fixtures import tiny_checkpoint
from serve_fixtures import start_cluster, stop_cluster


def run_policy(cluster, checkpoint: Path, policy: str, conversations: int, turns: int) -> dict:
    cluster.deploy(
        model=str(checkpoint),
        device="cpu",
        num_replicas=2,
        max_num_seqs=8,
        kv_cache_memory=64 * 2**20,
        replica_num_cpus=1,
        routing=policy,
    )
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="x", max_retries=0)
    prompt = cached = 0
    for c in range(conversations):
        history = [{"role": "system", "content": f"Conversation {c}. You are a careful assistant. " * 8}]
        for t in range(turns):
            history.append({"role": "user", "content": f"Turn {t}: what is {t} times {c}?"})
            r = client.chat.completions.create(
                model="flint",
                messages=history,
                max_tokens=4,
                temperature=0,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            history.append({"role": "assistant", "content": r.choices[0].message.content or "ok"})
            prompt += r.usage.prompt_tokens
            cached += r.usage.prompt_tokens_details.cached_tokens
    return {"policy": policy, "prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": round(cached / prompt, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    cluster = start_cluster(tmp)
    try:
        ck = tiny_checkpoint(tmp)
        rows = [run_policy(cluster, ck, p, args.conversations, args.turns) for p in ("power_of_two", "prefix_affinity")]
    finally:
        stop_cluster()
    for r in rows:
        share = f"{r['cached_tokens']:>6} of {r['prompt_tokens']:>6} prompt tokens cached ({r['hit_rate']:.0%})"
        print(f"{r['policy']:>16}: {share}")
    out = Path(__file__).parent / "results" / "routing_affinity.json"
    out.write_text(json.dumps({"date": date.today().isoformat(), "settings": vars(args), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
