"""A real local Ray cluster running the Flint Serve application on CPU (tiny model), for the serving tests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
from flint_serve.app import build_app
from flint_serve.metrics_hub import get_hub
from flint_serve.settings import ServeSettings
from ray import serve

from flint_engine.api.server import free_port

APP = "flint"


@dataclass
class ServeCluster:
    http_port: int
    metrics_port: int
    checkpoint: Path | None = None  # the tiny model the tests deploy

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def hub(self) -> Any:
        return get_hub(APP)

    def replicas(self) -> dict[str, dict[str, Any]]:
        return ray.get(self.hub().replica_info.remote())

    def snapshots(self) -> list[tuple[dict, dict, bool]]:
        return ray.get(self.hub().recent.remote(15))

    def deploy(self, **settings: Any) -> None:
        serve.run(build_app(ServeSettings(**settings)), name=APP, route_prefix="/")
        wait_for(lambda: httpx.get(self.base_url + "/health", timeout=5).status_code == 200, 120, "healthy app")
        wait_for(lambda: len(self.replicas()) >= (settings.get("num_replicas") or 1), 60, "replicas reporting")


def wait_for(cond: Callable[[], bool], timeout: float, what: str, period: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception as exc:  # the service may not answer yet
            last = exc
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last!r})")


def start_cluster(tmp: Path) -> ServeCluster:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # A loaded 2-core CI machine can starve the HTTP proxy's health check; do not let Serve kill it for that.
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ["RAY_metrics_report_interval_ms"] = "1000"  # noqa: SIM112 (Ray's own spelling)
    if ray.is_initialized():  # a module that failed during set-up may have left its cluster behind
        stop_cluster()
    metrics_port = free_port()
    ray.init(
        num_cpus=6,
        include_dashboard=False,
        _metrics_export_port=metrics_port,
        runtime_env={"env_vars": {"FLINT_CACHE_DIR": str(tmp)}},
    )
    http_port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    return ServeCluster(http_port, metrics_port)


def serving(tmp: Path, deploy: Callable[[ServeCluster], None]) -> Iterator[ServeCluster]:
    """A module fixture's body: a cluster with the tiny checkpoint, deployed by `deploy`, stopped afterwards (also
    when the deployment fails, so no cluster is left behind for the next module)."""
    from api_fixtures import tiny_checkpoint

    c = start_cluster(tmp)
    c.checkpoint = tiny_checkpoint(tmp)
    try:
        deploy(c)
    except BaseException:
        stop_cluster()
        raise
    yield c
    stop_cluster()


def stop_cluster() -> None:
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
