"""The Ray Serve application on a real local Ray cluster (CPU, tiny model): routing, faults, overload, metrics."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import require
from serve_fixtures import ServeCluster, serving, wait_for

# `make test` runs the suite on two pytest-xdist workers: the modules that start a Ray cluster share one, in turn.
pytestmark = pytest.mark.xdist_group("ray_cluster")

MSG = [{"role": "user", "content": "Hello, who are you?"}]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory.mktemp("serve"), _deploy_default)


def _deploy_default(c: ServeCluster) -> None:
    c.deploy(
        model=str(c.checkpoint),
        device="cpu",
        num_replicas=2,
        max_num_seqs=8,
        kv_cache_memory=32 * 2**20,
        replica_num_cpus=1,
        health_check_period_s=2,
        health_check_timeout_s=10,
        wedge_timeout_s=4,
        graceful_shutdown_timeout_s=2,
    )


@pytest.fixture(scope="module")
def client(cluster: ServeCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0)


def test_chat_and_streaming_through_the_router(cluster: ServeCluster, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="flint", messages=MSG, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    chunks = list(
        client.chat.completions.create(
            model="flint",
            messages=MSG,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    text = "".join((c.choices[0].delta.model_extra.get("reasoning") or "") for c in chunks if c.choices)
    assert text == r.choices[0].message.model_extra["reasoning"]
    assert client.models.list().data[0].id == "flint"
    assert httpx.get(cluster.base_url + "/health").json()["status"] == "ok"
    # The Responses API rides the same router: the same greedy tokens as the chat call, streamed or not.
    resp = client.responses.create(model="flint", input=MSG, max_output_tokens=8, temperature=0)
    assert resp.usage.output_tokens == r.usage.completion_tokens
    events = list(client.responses.create(model="flint", input=MSG, max_output_tokens=8, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type == f"response.{resp.status}"
    assert events[-1].response.usage.output_tokens == r.usage.completion_tokens
    # So does Anthropic's Messages API.
    body = {"model": "flint", "max_tokens": 8, "temperature": 0, "messages": MSG}
    anthropic = httpx.post(cluster.base_url + "/v1/messages", json=body, timeout=60).json()
    assert anthropic["type"] == "message" and anthropic["usage"]["output_tokens"] == r.usage.completion_tokens
    # vLLM's constraints and thinking budget pass through the router to the replica's engine.
    extra = {"guided_choice": ["yes", "no"], "thinking_token_budget": 2}
    picked = client.chat.completions.create(model="flint", messages=MSG, max_tokens=40, seed=1, extra_body=extra)
    assert picked.choices[0].message.content in ("yes", "no"), picked
    # Beam search runs in the router, a step at a time on the replicas, ending beams on the replicas' end tokens.
    ask = {"model": "flint", "prompt": "The sky", "max_tokens": 4}
    greedy = client.completions.create(**ask, temperature=0, extra_body={"ignore_eos": True})
    one = client.completions.create(**ask, extra_body={"use_beam_search": True, "ignore_eos": True})
    beams = client.completions.create(**ask, n=2, extra_body={"use_beam_search": True})
    assert one.choices[0].text == greedy.choices[0].text and len({c.text for c in beams.choices}) == 2


def test_a_batch_runs_in_the_router(cluster: ServeCluster, client: openai.OpenAI) -> None:
    """OpenAI's Batch API on the Ray app: the router keeps the files and sends the batch's requests to the
    replicas as it sends any request; each record is the chat endpoint's answer."""
    bodies = {f"q{i}": {"messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 6, "temperature": 0}
              for i in range(3)}  # fmt: skip
    text = "\n".join(
        json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
        for cid, body in bodies.items()
    )
    uploaded = client.files.create(file=("in.jsonl", text.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", 60, "the batch to complete")
    batch = client.batches.retrieve(batch.id)
    assert batch.request_counts.completed == 3 and batch.error_file_id is None
    records = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in records) == sorted(bodies)
    for r in records:
        direct = client.chat.completions.create(model="flint", **bodies[r["custom_id"]])
        message = r["response"]["body"]["choices"][0]["message"]
        assert (message["content"], message.get("reasoning")) == (
            direct.choices[0].message.content,
            direct.choices[0].message.model_extra.get("reasoning"),
        )


def test_two_replicas_both_take_traffic(cluster: ServeCluster, client: openai.OpenAI) -> None:
    def one(i: int) -> None:
        client.completions.create(model="flint", prompt=f"prompt number {i} " * 3, max_tokens=4)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def busy() -> set[str]:
        return {labels["replica"] for labels, snap, _ in cluster.snapshots() if snap["generation_tokens_total"] > 0}

    wait_for(lambda: len(busy()) == 2, 30, "both replicas reporting generated tokens")  # they post every 2 s
    # Operators see the same through the API: each replica, its process and device, healthy and having generated.
    listed = httpx.get(cluster.base_url + "/replicas").json()["data"]
    assert sorted(r["id"] for r in listed) == sorted(busy())
    assert len({r["pid"] for r in listed}) == 2
    for r in listed:
        assert r["healthy"] and r["device"] == "cpu" and r["device_name"] == "cpu" and r["generation_tokens_total"] > 0


def test_prefix_affinity_keeps_a_conversation_on_one_replica(cluster: ServeCluster, client: openai.OpenAI) -> None:
    history = [{"role": "system", "content": "You are a careful assistant. " * 12}]
    cached = []
    for turn in range(5):
        history.append({"role": "user", "content": f"Question {turn}: what is {turn} plus {turn}?"})
        r = client.chat.completions.create(
            model="flint",
            messages=history,
            max_tokens=3,
            temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        history.append({"role": "assistant", "content": r.choices[0].message.content or "ok"})
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    # from the second turn on, the conversation so far is found in the serving replica's prefix cache
    assert all(c >= 16 for c in cached[1:]), cached


def test_salted_prefixes_and_token_ids_through_ray(cluster: ServeCluster, client: openai.OpenAI) -> None:
    """vLLM's `cache_salt` and `return_token_ids` cross the router and the replica: a salted repeat of a cached
    prompt finds nothing until its own salt's first request has run; the prompt's ids are what /tokenize reads."""
    messages = [{"role": "user", "content": "Salted question: " + "what is one plus one? " * 8}]

    def ask(**extra) -> tuple[int, dict]:
        r = client.chat.completions.create(
            model="flint",
            messages=messages,
            max_tokens=2,
            temperature=0,
            extra_body={"return_token_ids": True, **extra},
        )
        return r.usage.prompt_tokens_details.cached_tokens, r.model_extra

    ask()
    assert ask()[0] >= 16  # unsalted, the second time: cached
    first, extra = ask(cache_salt="tenant-x")
    assert first == 0 and ask(cache_salt="tenant-x")[0] >= 16
    tokens = httpx.post(cluster.base_url + "/tokenize", json={"messages": messages}).json()["tokens"]
    assert extra["prompt_token_ids"] == tokens


def test_strict_tool_calls_held_through_ray(client: openai.OpenAI) -> None:
    """A strict tool's schema crosses the router to the replica's engine: the random model's forced calls fit it."""
    schema = {
        "type": "object",
        "properties": {"unit": {"enum": ["c", "f"]}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["unit", "n"],
        "additionalProperties": False,
    }
    tool = {"type": "function", "function": {"name": "probe", "parameters": schema, "strict": True}}
    r = client.chat.completions.create(
        model="flint",
        messages=MSG,
        tools=[tool],
        tool_choice="required",
        max_tokens=48,
        n=3,
        seed=7,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},  # (the random model thinks without end)
    )
    for choice in r.choices:
        call = choice.message.tool_calls[0]
        args = json.loads(call.function.arguments)
        assert call.function.name == "probe" and args["unit"] in ("c", "f") and 1 <= args["n"] <= 9, args


def _fresh_snapshots(cluster: ServeCluster, since: float) -> list[tuple[dict, dict, bool]]:
    """The replicas' metric snapshots pushed after `since` (time.time()): a replica pushes every couple of seconds,
    so its latest snapshot may still show a request of an earlier test as running."""
    import ray

    return ray.get(cluster.hub().recent.remote(max(0.0, time.time() - since)))


def _replica_serving(cluster: ServeCluster, since: float) -> tuple[str, int]:
    for labels, snap, _ in _fresh_snapshots(cluster, since):
        if snap["num_requests_running"] > 0:
            return labels["replica"], cluster.replicas()[labels["replica"]]["pid"]
    raise AssertionError("no replica is running the request")


def test_killing_a_replica_fails_only_its_stream(cluster: ServeCluster, client: openai.OpenAI) -> None:
    before = cluster.replicas()
    body = {"model": "flint", "messages": MSG, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    events: list[str] = []
    started = time.time()
    with httpx.stream("POST", cluster.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(line[6:])
            if len(events) >= 3:
                break
        wait_for(
            lambda: any(s["num_requests_running"] for _, s, _ in _fresh_snapshots(cluster, started)),
            10,
            "a snapshot showing the running request",
        )
        victim, pid = _replica_serving(cluster, started)
        os.kill(pid, signal.SIGKILL)
        for line in lines:
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "service_unavailable_error" and "replica" in err["message"]
    # new requests keep working on the survivor at once
    for _ in range(3):
        assert client.completions.create(model="flint", prompt="still there?", max_tokens=2).choices
    # and Serve brings the dead replica back
    wait_for(
        lambda: len(cluster.replicas()) == 2 and victim not in cluster.replicas(),
        90,
        f"replacement replica (victim {victim}, now {cluster.replicas()})",
    )
    assert set(before) != set(cluster.replicas())


def test_wedged_engine_is_detected_and_replaced(cluster: ServeCluster) -> None:
    from ray import serve

    before = cluster.replicas()
    handle = serve.get_deployment_handle("FlintReplica", app_name="flint")
    handle.wedge_for_test.remote(600).result()  # one replica's engine loop stops coming round
    wait_for(lambda: set(cluster.replicas()) - set(before), 120, "the wedged replica to be replaced")
    wait_for(lambda: httpx.get(cluster.base_url + "/health").status_code == 200, 60, "health")


PROM_CONFIG = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: ray
    static_configs: [{{targets: ["127.0.0.1:{metrics}"]}}]
  - job_name: flint-api
    metrics_path: /metrics
    static_configs: [{{targets: ["127.0.0.1:{http}"]}}]
"""


def test_prometheus_scrapes_flint_and_serve_metrics(
    cluster: ServeCluster, client: openai.OpenAI, tmp_path: Path
) -> None:
    from shutil import which

    from flint_engine.api.server import free_port

    require(which("prometheus") is not None, "Debian's prometheus package is not installed")
    for _ in range(3):
        client.chat.completions.create(model="flint", messages=MSG, max_tokens=4)
    port = free_port()
    (tmp_path / "prom.yml").write_text(PROM_CONFIG.format(metrics=cluster.metrics_port, http=cluster.http_port))
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prom.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def query(q: str) -> list:
            r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": q}, timeout=5)
            return r.json()["data"]["result"]

        wait_for(
            lambda: (
                query("ray_flint_generation_tokens_total")
                and query("flint:generation_tokens_total")
                and query("ray_serve_num_http_requests_total")
                and query('ray_flint_batches{status="completed"}')  # the router's own gauges
                and query("flint:batch_requests_remaining")
            ),
            90,
            "series in Prometheus",
            period=1,
        )
        gen = sum(float(s["value"][1]) for s in query("ray_flint_generation_tokens_total"))
        assert gen > 0
        assert {s["metric"]["replica"] for s in query("flint:generation_tokens_total")}  # labelled by replica
        for s in query("ray_flint_kv_cache_usage_perc") + query("flint:kv_cache_usage_perc"):
            assert 0.0 <= float(s["value"][1]) <= 1.0
        assert query("sum(rate(ray_flint_time_to_first_token_seconds_count[1m]))") is not None
        assert query('ray_serve_deployment_status{deployment="FlintReplica"}')  # FlintServeMetricsAbsent's series
        # Ray exports a replica's health gauge only in the report after the controller re-sets it (every 10 s), so
        # the series is missing from most scrapes: read it as the dashboard and the alerts do, over a minute.
        healthy = 'sum(last_over_time(ray_serve_deployment_replica_healthy{deployment="FlintReplica"}[1m]))'
        wait_for(
            lambda: [float(s["value"][1]) for s in query(healthy)] == [2.0],
            60,
            "both FlintReplica replicas reported healthy",
            period=1,
        )
        # every query of the Grafana dashboard parses and returns data
        spec = importlib.util.spec_from_file_location("dash_queries", ROOT / "k8s" / "grafana" / "queries.py")
        dash = importlib.util.module_from_spec(spec)
        sys.modules["dash_queries"] = dash
        spec.loader.exec_module(dash)
        queries = dash.extract_queries(values={"__rate_interval": "5m", "model_name": "flint"})
        empty: list[str] = []

        def all_have_data() -> bool:
            empty.clear()
            for q in queries:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": q.expr}, timeout=5).json()
                assert r["status"] == "success", (q.panel, q.expr, r)
                if not r["data"]["result"]:
                    empty.append(f"{q.panel}: {q.expr}")
            return not empty

        # Name the panels still empty if one never gets data.
        try:
            wait_for(all_have_data, 120, "data for every dashboard query", period=2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still empty: {empty}") from None
    finally:
        proc.terminate()
        proc.wait(10)


def test_overload_sheds_with_503(cluster: ServeCluster) -> None:
    cluster.deploy(
        model=str(cluster.checkpoint),
        device="cpu",
        num_replicas=1,  # type: ignore[attr-defined]
        max_num_seqs=2,
        max_ongoing_requests=2,
        max_queued_requests=2,
        kv_cache_memory=32 * 2**20,
        replica_num_cpus=1,
    )
    codes: list[int] = []
    elapsed: list[float] = []
    refusals: list[tuple[str | None, str]] = []  # checked in the test's thread below

    def call() -> None:
        t = time.monotonic()
        r = httpx.post(
            cluster.base_url + "/v1/completions",
            timeout=120,
            json={"prompt": "x y z", "max_tokens": 200, "ignore_eos": True},
        )
        codes.append(r.status_code)
        elapsed.append(time.monotonic() - t)
        if r.status_code == 503:
            refusals.append((r.headers.get("retry-after"), r.text))

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes.count(503) >= 8 and codes.count(200) >= 2, codes
    for retry_after, body in refusals:  # OpenAI's error shape with Retry-After, never Serve's plain-text refusal
        assert retry_after == "1", body
        assert json.loads(body)["error"]["code"] == "server_overloaded", body
    fast = [e for c, e in zip(codes, elapsed) if c == 503]
    assert max(fast) < 5.0  # shed at once, not after queueing
    assert set(codes) <= {200, 503}


# Serve awaits the async __del__ itself; when this bare object is collected, Python calls it once more and drops the
# coroutine it returns.
@pytest.mark.filterwarnings("ignore:coroutine 'FlintReplica.__del__' was never awaited:RuntimeWarning")
def test_replica_teardown_after_a_failed_start() -> None:
    """A replica whose __init__ failed before its metrics task existed tears down quietly (Ray calls __del__), so
    the start failure's traceback is not followed by an unrelated AttributeError."""
    import asyncio

    from flint_serve.replica import FlintReplica

    replica = object.__new__(FlintReplica)
    replica.replica_id = "r"
    asyncio.run(replica.__del__())
    assert not hasattr(replica, "_export_task")
