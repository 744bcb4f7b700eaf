"""Export a replica's engine metrics through Ray's metrics agent (scraped at each node's metrics port).

Names follow vLLM's with a `flint_` prefix (Ray 2.60 deprecates `:` in metric names); Ray adds `ray_`, so
Prometheus sees `ray_flint_num_requests_running`. The app's own /metrics keeps vLLM's colon style (`flint:...`).
Counters advance by the change since the last export; histogram observations are replayed exactly.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from ray.util import metrics as ray_metrics

from flint_engine.api import api_metrics
from flint_engine.api.prometheus import COUNTERS, GAUGES, HISTOGRAMS
from flint_engine.metrics import FINISH_REASONS, EngineMetrics

PREFIX = "flint_"

log = logging.getLogger("flint_serve.metrics")


class RayMetricsExporter:
    def __init__(
        self, metrics: EngineMetrics, tags: dict[str, str], device: torch.device, period_s: float = 2.0
    ) -> None:
        self.metrics = metrics
        self.tags = tags
        self.device = device
        self.period_s = period_s
        keys = tuple(tags)
        self.gauges = {n: ray_metrics.Gauge(PREFIX + n, doc, tag_keys=keys) for n, doc in GAUGES.items()}
        self.gpu_mem = ray_metrics.Gauge(
            PREFIX + "gpu_memory_used_bytes", "GPU memory held by this replica.", tag_keys=keys
        )
        self.counters = {
            n: ray_metrics.Counter(PREFIX + n + "_total", doc, tag_keys=keys) for n, doc in COUNTERS.items()
        }
        self.success = ray_metrics.Counter(
            PREFIX + "request_success_total", "Finished requests by reason.", tag_keys=(*keys, "finished_reason")
        )
        buckets = {n: list(h.buckets) for n, h in metrics.histograms().items()}
        self.histograms = {
            n: ray_metrics.Histogram(PREFIX + n, doc, boundaries=buckets[n], tag_keys=keys)
            for n, doc in HISTOGRAMS.items()
        }
        self.last: dict[str, Any] = {}
        metrics.drain_observations()  # start the taps

    def export_once(self) -> None:
        snap = self.metrics.snapshot()
        for n, g in self.gauges.items():
            g.set(float(snap[n]), tags=self.tags)
        used = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        self.gpu_mem.set(float(used), tags=self.tags)
        for n, c in self.counters.items():
            value = snap[n + "_total"]
            delta = value - self.last.get(n, 0)
            if delta > 0:
                c.inc(delta, tags=self.tags)
            self.last[n] = value
        for reason in FINISH_REASONS:
            value = snap["request_success_total"].get(reason, 0)
            key = "success:" + reason
            delta = value - self.last.get(key, 0)
            if delta > 0:
                self.success.inc(delta, tags={**self.tags, "finished_reason": reason})
            self.last[key] = value
        for n, values in self.metrics.drain_observations().items():
            h = self.histograms[n]
            for v in values:
                h.observe(v, tags=self.tags)


class RouterMetricsExporter:
    """A router's own work (`api_metrics`: batches by status, batch requests left, background responses running)
    through Ray's metrics agent: `ray_flint_batches{status}` and the others, tagged with the router."""

    def __init__(self, tags: dict[str, str], period_s: float = 5.0) -> None:
        self.tags = tags
        self.period_s = period_s
        keys = tuple(tags)
        self.batches = ray_metrics.Gauge(PREFIX + "batches", api_metrics.BATCHES_DOC, tag_keys=(*keys, "status"))
        self.gauges = {n: ray_metrics.Gauge(PREFIX + n, doc, tag_keys=keys) for n, doc in api_metrics.GAUGES.items()}

    def export_once(self, snapshot: dict[str, Any]) -> None:
        for status, count in snapshot["batches"].items():
            self.batches.set(float(count), tags={**self.tags, "status": status})
        for n, g in self.gauges.items():
            g.set(float(snapshot[n]), tags=self.tags)
