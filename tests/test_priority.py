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


def _run_to_end(engine) -> None:
    while engine.has_unfinished():
        engine.step()


def test_a_lower_value_takes_a_seat_from_a_running_higher_value(window7) -> None:  # noqa: F811
    """One seat: a priority-1 request decoding is preempted for a priority-0 one that arrives, which finishes first;
    the preempted request then resumes where it was, its output equal to an uninterrupted run's."""
    gen = random.Random(5)
    prompts = [[gen.randrange(window7.config.vocab_size) for _ in range(12)] for _ in range(2)]
    engine = make_engine(window7, max_num_seqs=1)
    low = engine.add_request("low", prompts[0], SamplingParams(max_tokens=30, priority=1, **GREEDY))
    for _ in range(6):
        engine.step()
    assert engine.scheduler.running == [low] and 0 < len(low.output_token_ids) < 30
    high = engine.add_request("high", prompts[1], SamplingParams(max_tokens=8, priority=0, **GREEDY))
    engine.step()
    assert engine.scheduler.running == [high] and low.num_preemptions == 1
    assert (engine.scheduler.num_priority_preemptions, engine.scheduler.num_preemptions) == (1, 0)  # counted apart
    finished: list[str] = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["high", "low"]
    alone = make_engine(window7)
    want = [alone.add_request(f"r{i}", p, SamplingParams(max_tokens=n, **GREEDY)) for i, (p, n) in
            enumerate(zip(prompts, (30, 8)))]  # fmt: skip
    _run_to_end(alone)
    assert [low.output_token_ids, high.output_token_ids] == [r.output_token_ids for r in want]
    assert engine.kv.all_free()


def test_equal_priorities_never_preempt_for_a_seat(window7) -> None:  # noqa: F811
    engine = make_engine(window7, max_num_seqs=1)
    first = engine.add_request("first", [5, 6, 7], SamplingParams(max_tokens=10, priority=2, **GREEDY))
    engine.step()
    engine.add_request("second", [8, 9], SamplingParams(max_tokens=3, priority=2, **GREEDY))
    finished: list[str] = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["first", "second"] and first.num_preemptions == 0
    assert engine.scheduler.num_preemptions == engine.scheduler.num_priority_preemptions == 0


def test_a_lower_value_takes_blocks_from_running_higher_values(window7) -> None:  # noqa: F811
    """Seats free but blocks short: the priority-0 request preempts the priority-3 ones holding them, not the
    priority-0 one running beside them, and every output equals a roomy engine's."""
    gen = random.Random(9)
    prompts = [[gen.randrange(window7.config.vocab_size) for _ in range(40)] for _ in range(4)]
    # Three 40-token prompts fill the nine 16-token blocks (with room for their four tokens each).
    tight = make_engine(window7, full_blocks=9, max_num_seqs=8, max_num_batched_tokens=256, block_size=16)
    roomy = make_engine(window7)
    order = [("a", 0), ("b", 3), ("c", 3)]
    got, want = {}, {}
    for (rid, priority), prompt in zip(order, prompts):
        got[rid] = tight.add_request(rid, prompt, SamplingParams(max_tokens=4, priority=priority, **GREEDY))
        want[rid] = roomy.add_request(rid, prompt, SamplingParams(max_tokens=4, **GREEDY))
    tight.step()
    assert {r.request_id for r in tight.scheduler.running} == {"a", "b", "c"}
    got["d"] = tight.add_request("d", prompts[3], SamplingParams(max_tokens=4, priority=0, **GREEDY))
    want["d"] = roomy.add_request("d", prompts[3], SamplingParams(max_tokens=4, **GREEDY))
    tight.step()
    assert "d" in {r.request_id for r in tight.scheduler.running}
    assert got["a"].num_preemptions == 0 and got["b"].num_preemptions + got["c"].num_preemptions > 0
    _run_to_end(tight)
    _run_to_end(roomy)
    assert {k: r.output_token_ids for k, r in got.items()} == {k: r.output_token_ids for k, r in want.items()}
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
        # The answer names the tier it ran at (OpenAI's), on every chunk of a stream too; nothing when none was asked.
        c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        ask = {"model": "flint", "messages": chat["messages"], "max_tokens": 2}
        assert c.chat.completions.create(**ask, service_tier="flex").service_tier == "flex"
        assert c.chat.completions.create(**ask, service_tier="auto").service_tier == "default"
        assert c.chat.completions.create(**ask).service_tier is None
        chunks = list(c.chat.completions.create(**ask, service_tier="flex", stream=True))
        assert chunks and {k.service_tier for k in chunks} == {"flex"}
        assert (
            c.responses.create(model="flint", input="hi", max_output_tokens=2, service_tier="flex").service_tier
            == "flex"
        )
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


def test_an_interactive_request_overtakes_a_running_batch_request_over_http(tmp_path: Path) -> None:
    """One seat taken by a long priority-1 stream: a priority-0 request answers while that stream still runs, and
    the stream, preempted and resumed, says the same as without the interruption."""
    server = start_local_server(tiny_engine(tiny_checkpoint(tmp_path), max_num_seqs=1), APISettings())
    try:
        url = f"{server.base_url}/v1/completions"
        long = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "temperature": 0, "priority": 1}
        alone = httpx.post(url, json=long, timeout=120).json()["choices"][0]["text"]
        parts: list[str] = []
        unfinished: list = []
        with httpx.stream("POST", url, json={**long, "stream": True}, timeout=120) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data: {"):
                    continue
                parts.append(json.loads(line[6:])["choices"][0]["text"])
                if len(parts) == 5:
                    short = {"prompt": [4, 5], "max_tokens": 3, "temperature": 0, "priority": 0}
                    r = httpx.post(url, json=short, timeout=60)
                    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
                    sched = server.engine.engine.scheduler
                    # Answered while the long request still waits to go on (without preemption it would be done).
                    unfinished = [q for q in (*sched.waiting, *sched.running) if q.params.priority == 1]
        assert len(unfinished) == 1 and len(parts) > 5
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        assert 'flint:num_priority_preemptions_total{model_name="flint"' in metrics
        assert server.engine.engine.scheduler.num_priority_preemptions >= 1
        assert "".join(parts) == alone
    finally:
        server.stop()
