"""Request priorities (vLLM's `priority`, lower first; OpenAI's service_tier "flex"): the queue's order, the
preemption victims, the API's floor, and the Batch API's requests queued behind interactive ones."""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path

import httpx
import openai
import pytest
from api_fixtures import tiny_checkpoint, tiny_engine
from test_engine import GREEDY, make_engine, window7  # noqa: F401  (window7 is a fixture)

from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.sampling_params import SamplingParams, SamplingParamsError


def test_lower_priority_values_are_admitted_first(window7) -> None:  # noqa: F811
    engine = make_engine(window7, max_num_seqs=1)
    order = [("a", 2), ("b", 0), ("c", 2), ("d", 0), ("e", 1)]
    for rid, priority in order:
        engine.add_request(rid, [5, 6, 7], SamplingParams(max_tokens=2, priority=priority, **GREEDY))
    admitted: list[str] = []
    while engine.has_unfinished():
        engine.step()
        for req in engine.scheduler.running:
            if req.request_id not in admitted:
                admitted.append(req.request_id)
    assert admitted == ["b", "d", "e", "a", "c"]  # by priority, then arrival


def test_memory_pressure_preempts_the_highest_priority_value_first(window7) -> None:  # noqa: F811
    """Six prompts in a cache too small for all: the three of priority 0 arrive last (the victims without
    priorities), yet only the priority-5 ones are preempted, and every output equals a roomy engine's."""
    gen = random.Random(3)
    prompts = [[gen.randrange(window7.config.vocab_size) for _ in range(30)] for _ in range(6)]
    tight = make_engine(window7, full_blocks=20, max_num_seqs=6)
    roomy = make_engine(window7)
    reqs: dict[str, list] = {"tight": [], "roomy": []}
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=40, priority=5 if i < 3 else 0, **GREEDY)
        reqs["tight"].append(tight.add_request(f"r{i}", prompt, params))
        reqs["roomy"].append(roomy.add_request(f"r{i}", prompt, params))
    for engine in (tight, roomy):
        while engine.has_unfinished():
            engine.step()
    assert tight.scheduler.num_preemptions > 0
    preempted = {r.request_id for r in reqs["tight"] if r.num_preemptions}
    assert preempted and preempted <= {"r0", "r1", "r2"}
    assert [r.output_token_ids for r in reqs["tight"]] == [r.output_token_ids for r in reqs["roomy"]]
    assert tight.kv.all_free()


def test_priority_is_checked() -> None:
    with pytest.raises(SamplingParamsError, match="priority"):
        SamplingParams(priority=2**40)
    with pytest.raises(SamplingParamsError, match="priority"):
        SamplingParams(priority=1.5)  # type: ignore[arg-type]


def test_the_api_takes_priorities_within_the_servers_floor(tmp_path: Path) -> None:
    ck = tiny_checkpoint(tmp_path)
    server = start_local_server(tiny_engine(ck), APISettings())
    free = start_local_server(tiny_engine(ck), APISettings(min_request_priority=None))
    try:
        seen: list[int] = []
        add = server.engine.engine.add_request

        def recording(rid, prompt, params):  # the engine thread adds each choice through here
            seen.append(params.priority)
            return add(rid, prompt, params)

        server.engine.engine.add_request = recording  # type: ignore[method-assign]
        body = {"prompt": [1, 2, 3], "max_tokens": 2, "priority": 3}
        assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": 2}
        assert httpx.post(f"{server.base_url}/v1/chat/completions", json=chat, timeout=60).status_code == 200
        resp = {"input": "hi", "max_output_tokens": 2, "priority": 4}
        assert httpx.post(f"{server.base_url}/v1/responses", json=resp, timeout=60).status_code == 200
        assert seen == [3, 2, 4]
        # OpenAI's service_tier: "flex" waits behind the default tier (api.flex_priority), unless a priority is named.
        for extra, want in (({"service_tier": "flex"}, 1), ({"service_tier": "flex", "priority": 0}, 0),
                            ({"service_tier": "default"}, 0), ({"service_tier": "priority"}, 0)):  # fmt: skip
            seen.clear()
            for url, b in (("/v1/completions", body), ("/v1/chat/completions", chat), ("/v1/responses", resp)):
                b = {k: v for k, v in b.items() if k != "priority"}
                assert httpx.post(f"{server.base_url}{url}", json={**b, **extra}, timeout=60).status_code == 200
            assert seen == [want] * 3, extra
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json={**chat, "service_tier": "gold"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "service_tier"
        r = httpx.post(f"{server.base_url}/v1/completions", json={**body, "priority": -1}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
        assert "api.min_request_priority" in r.json()["error"]["message"]
        r = httpx.post(f"{free.base_url}/v1/completions", json={**body, "priority": -5}, timeout=60)
        assert r.status_code == 200
    finally:
        server.stop()
        free.stop()


def test_batch_requests_run_at_the_batch_priority(tmp_path: Path) -> None:
    ck = tiny_checkpoint(tmp_path)
    server = start_local_server(tiny_engine(ck), APISettings(batch_dir=str(tmp_path / "b"), batch_priority=7))
    try:
        seen: dict[str, int] = {}
        add = server.engine.engine.add_request

        def recording(rid, prompt, params):
            seen[rid] = params.priority
            return add(rid, prompt, params)

        server.engine.engine.add_request = recording  # type: ignore[method-assign]
        bodies = {"plain": {"prompt": "a", "max_tokens": 2}, "own": {"prompt": "b", "max_tokens": 2, "priority": 2}}
        lines = [{"custom_id": k, "method": "POST", "url": "/v1/completions", "body": b} for k, b in bodies.items()]
        c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        text = "\n".join(json.dumps(line) for line in lines).encode()
        uploaded = c.files.create(file=("in.jsonl", io.BytesIO(text)), purpose="batch")
        batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 60
        while c.batches.retrieve(batch.id).status != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.batches.retrieve(batch.id).request_counts.completed == 2
        assert sorted(seen.values()) == [2, 7]  # the batch's priority, unless the line names its own
    finally:
        server.stop()
