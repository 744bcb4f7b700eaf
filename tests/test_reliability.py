"""Reliability on a real Ray cluster (CPU, tiny model): disconnect storms, a killed router, an application restart
under load, and 4x overload with recovery. Every accepted request ends with a result or a clear error."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import ray
from serve_fixtures import ServeCluster, serving, wait_for

# `make test` runs the suite on two pytest-xdist workers: the modules that start a Ray cluster share one, in turn.
pytestmark = pytest.mark.xdist_group("ray_cluster")

MSG = [{"role": "user", "content": "Tell me a long story about rivers."}]
BASE = dict(
    device="cpu",
    kv_cache_memory=32 * 2**20,
    replica_num_cpus=1,
    health_check_period_s=2,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=60,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    def deploy(c: ServeCluster) -> None:
        c.deploy(
            model=str(c.checkpoint),
            num_replicas=1,
            max_num_seqs=16,
            max_ongoing_requests=120,
            max_queued_requests=200,
            **BASE,
        )

    yield from serving(tmp_path_factory.mktemp("rel"), deploy)


def idle(c: ServeCluster) -> bool:
    snaps = c.snapshots()
    return bool(snaps) and all(
        s["num_requests_running"] == 0 and s["num_requests_waiting"] == 0 and s["kv_cache_usage_perc"] == 0.0
        for _, s, _ in snaps
    )


def test_hundred_clients_dropping_mid_stream_leave_nothing_behind(cluster: ServeCluster) -> None:
    body = {"model": "flint", "messages": MSG, "max_tokens": 2000, "ignore_eos": True, "stream": True}

    async def client(i: int) -> int:
        async with (
            httpx.AsyncClient(timeout=120) as c,
            c.stream("POST", cluster.base_url + "/v1/chat/completions", json=body) as r,
        ):
            assert r.status_code == 200
            got = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    got += 1
                if got >= 2 + i % 3:
                    return got  # leaving the block closes the connection mid-stream

        return 0

    async def storm() -> list[int]:
        return await asyncio.gather(*(client(i) for i in range(100)))

    def finished(reason: str) -> int:
        return sum(s["request_success_total"][reason] for _, s, _ in cluster.snapshots())

    before = {r: finished(r) for r in ("abort", "length")}
    counts = asyncio.run(storm())
    assert all(n >= 2 for n in counts)
    # Replicas post snapshots every 2 s and a loaded machine can delay one, so an idle-looking snapshot may predate
    # the storm: wait for one that has counted the aborts, then check the exact figures.
    wait_for(
        lambda: idle(cluster) and finished("abort") - before["abort"] >= 100,
        60,
        "every dropped request aborted, no running request and an empty KV cache",
    )
    assert finished("abort") - before["abort"] == 100
    assert finished("length") == before["length"], "a dropped stream kept generating on its replica"


def _router_pid() -> int:
    from ray import serve

    return (
        serve.get_deployment_handle("FlintRouter", app_name="flint").process_info.remote().result(timeout_s=10)["pid"]
    )


def test_killed_router_recovers(cluster: ServeCluster) -> None:
    pid = _router_pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _router_pid() != pid, 90, "a new router replica")
    wait_for(
        lambda: (
            httpx.post(
                cluster.base_url + "/v1/completions", timeout=30, json={"prompt": "back?", "max_tokens": 2}
            ).status_code
            == 200
        ),
        60,
        "serving again",
    )


def test_app_restart_loses_no_accepted_request_silently(cluster: ServeCluster) -> None:
    results: list[int | str] = []

    def call() -> None:
        try:
            r = httpx.post(
                cluster.base_url + "/v1/chat/completions",
                timeout=120,
                json={"model": "flint", "messages": MSG, "max_tokens": 300, "ignore_eos": True},
            )
            if r.status_code == 200:
                assert r.json()["choices"]
            results.append(r.status_code)
        except Exception as exc:  # a hang or a dropped connection is what this test forbids
            results.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    # a new version of the application (new replicas); the old ones drain their requests first
    cluster.deploy(
        model=str(cluster.checkpoint),
        num_replicas=1,
        max_num_seqs=12,
        max_ongoing_requests=100,
        max_queued_requests=200,
        **BASE,
    )
    for t in threads:
        t.join(150)
    assert len(results) == 8, results
    assert all(isinstance(r, int) for r in results), results
    # the old version drains its in-flight requests (graceful_shutdown_timeout_s) before it goes away
    assert results == [200] * 8, results


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_four_times_overload_sheds_fast_and_recovers(cluster: ServeCluster) -> None:
    cluster.deploy(
        model=str(cluster.checkpoint),
        num_replicas=1,
        max_num_seqs=2,
        max_ongoing_requests=2,
        max_queued_requests=2,
        **BASE,
    )
    capacity = 4  # 2 running + 2 queued
    [info] = cluster.replicas().values()
    rss_before = _rss_kb(info["pid"])
    outcomes: list[tuple[int, float]] = []
    bad_refusals: list[str] = []  # checked here, in the test's thread (a failed assert in a worker is only a warning)

    def call() -> None:
        t = time.monotonic()
        r = httpx.post(
            cluster.base_url + "/v1/completions",
            timeout=120,
            json={"prompt": "overload", "max_tokens": 60, "ignore_eos": True},
        )
        outcomes.append((r.status_code, time.monotonic() - t))
        if r.status_code == 503:
            try:
                ok = bool(r.headers.get("retry-after")) and r.json()["error"]["code"] == "server_overloaded"
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                bad_refusals.append(f"{dict(r.headers)} {r.text[:300]}")

    for _ in range(3):  # three waves at 4x capacity
        threads = [threading.Thread(target=call) for _ in range(4 * capacity)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    shed = [d for s, d in outcomes if s == 503]
    served = [d for s, d in outcomes if s == 200]
    assert set(s for s, _ in outcomes) <= {200, 503}
    assert not bad_refusals, bad_refusals[:3]  # every refusal in OpenAI's shape with Retry-After
    assert len(shed) >= len(outcomes) // 2 and served
    assert max(shed) < 5.0  # refused at once, not after waiting in a queue
    served.sort()
    assert served[int(0.99 * (len(served) - 1))] < 60.0  # admitted requests finish in bounded time
    assert _rss_kb(info["pid"]) < rss_before * 1.25 + 50_000  # memory stays bounded
    # load drops: everything is served again
    for _ in range(4):
        r = httpx.post(cluster.base_url + "/v1/completions", json={"prompt": "calm", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
    wait_for(lambda: idle(cluster), 30, "an idle engine after the overload")
    assert ray.is_initialized()
