"""A tiny actor where replicas post their metric snapshots, so any router replica can answer /metrics and /health
for the whole application (Prometheus scrapes Ray's own export as well)."""

from __future__ import annotations

import time
from typing import Any

import ray

HUB_NAME = "flint-metrics-hub"
FORGET_AFTER_S = 60.0


@ray.remote(num_cpus=0)
class MetricsHub:
    def __init__(self) -> None:
        self.snapshots: dict[str, tuple[float, dict[str, str], dict[str, Any], bool]] = {}
        self.info: dict[str, dict[str, Any]] = {}

    def push(
        self, labels: dict[str, str], snapshot: dict[str, Any], healthy: bool, info: dict[str, Any] | None = None
    ) -> None:
        self.snapshots[labels["replica"]] = (time.time(), labels, snapshot, healthy)
        if info is not None:
            self.info[labels["replica"]] = info

    def drop(self, replica: str) -> None:
        self.snapshots.pop(replica, None)
        self.info.pop(replica, None)

    def _live(self, max_age_s: float) -> list[str]:
        now = time.time()
        for key in [k for k, v in self.snapshots.items() if now - v[0] > FORGET_AFTER_S]:
            self.drop(key)  # a replica silent this long is gone
        return [k for k, v in self.snapshots.items() if now - v[0] <= max_age_s]

    def replica_info(self, max_age_s: float = 10.0) -> dict[str, dict[str, Any]]:
        """Process id and device of every replica that reported recently (operators and fault tests use it)."""
        return {k: self.info[k] for k in self._live(max_age_s) if k in self.info}

    def recent(self, max_age_s: float = 30.0) -> list[tuple[dict[str, str], dict[str, Any], bool]]:
        """(labels, snapshot, healthy) of every replica that reported within `max_age_s`."""
        return [self.snapshots[k][1:] for k in self._live(max_age_s)]  # type: ignore[misc]


def get_hub(app_name: str) -> ray.actor.ActorHandle:
    """The application's hub, created on first use (detached so it outlives the replica that made it)."""
    return MetricsHub.options(
        name=f"{HUB_NAME}-{app_name}", namespace="flint", get_if_exists=True, lifetime="detached"
    ).remote()
