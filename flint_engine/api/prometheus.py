"""Engine metrics in Prometheus text format, under vLLM-style names with a `flint:` prefix (and the API process's own,
`api_metrics`)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from . import api_metrics

PREFIX = "flint:"
GAUGES = {
    "num_requests_running": "Requests in the running batch.",
    "num_requests_waiting": "Requests waiting to be scheduled.",
    "kv_cache_usage_perc": "Fraction of KV-cache bytes held by live requests (0-1).",
}
COUNTERS = {
    "prompt_tokens": "Prompt tokens processed.",
    "generation_tokens": "Tokens generated.",
    "num_preemptions": "Requests preempted (recomputed later) for lack of KV blocks.",
    "num_priority_preemptions": "Requests preempted (recomputed later) for a waiting request of higher priority.",
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hits": "Prompt tokens found in the prefix cache.",
    "late_kernel_compiles": "Triton kernels compiled after the warm-up (each one stalls a step; see the log).",
    "engine_steps": "Engine steps run (one forward each: prefill, decode or both).",
    "decode_steps_ahead": "Decode steps launched before the previous step's tokens were read (async decode).",
}
HISTOGRAMS = {
    "time_to_first_token_seconds": "Time from arrival to the first generated token.",
    "inter_token_latency_seconds": "Time between consecutive generated tokens.",
    "e2e_request_latency_seconds": "Time from arrival to the end of the request.",
    "request_queue_time_seconds": "Time from arrival to first scheduling.",
    "request_prompt_tokens": "Prompt length of finished requests.",
    "request_generation_tokens": "Generated length of finished requests.",
}


class _Snapshots:
    def __init__(
        self, snapshots: list[tuple[dict[str, str], dict[str, Any]]], api: dict[str, Any] | None = None
    ) -> None:
        self.snapshots = snapshots
        self.api = api  # the API process's own work (`api_metrics.api_snapshot`)

    def collect(self):
        if self.api is not None:
            fam = GaugeMetricFamily(PREFIX + "batches", api_metrics.BATCHES_DOC, labels=["status"])
            for status, count in self.api["batches"].items():
                fam.add_metric([status], float(count))
            yield fam
            for name, doc in api_metrics.GAUGES.items():
                yield GaugeMetricFamily(PREFIX + name, doc, value=float(self.api[name]))
        label_names = sorted({k for labels, _ in self.snapshots for k in labels})
        for name, doc in GAUGES.items():
            fam = GaugeMetricFamily(PREFIX + name, doc, labels=label_names)
            for labels, snap in self.snapshots:
                fam.add_metric([labels.get(k, "") for k in label_names], float(snap[name]))
            yield fam
        for name, doc in COUNTERS.items():
            fam = CounterMetricFamily(PREFIX + name, doc, labels=label_names)
            for labels, snap in self.snapshots:
                fam.add_metric([labels.get(k, "") for k in label_names], float(snap[name + "_total"]))
            yield fam
        fam = CounterMetricFamily(
            PREFIX + "request_success", "Finished requests by reason.", labels=[*label_names, "finished_reason"]
        )
        for labels, snap in self.snapshots:
            for reason, count in snap["request_success_total"].items():
                fam.add_metric([*(labels.get(k, "") for k in label_names), reason], float(count))
        yield fam
        for name, doc in HISTOGRAMS.items():
            fam = HistogramMetricFamily(PREFIX + name, doc, labels=label_names)
            for labels, snap in self.snapshots:
                h = snap[name]
                buckets = [("+Inf" if le == float("inf") else repr(float(le)), float(c)) for le, c in h["buckets"]]
                fam.add_metric([labels.get(k, "") for k in label_names], buckets, float(h["sum"]))
            yield fam


def render(snapshots: list[tuple[dict[str, str], dict[str, Any]]], api: dict[str, Any] | None = None) -> bytes:
    """The engines' snapshots (labelled), and the API process's own gauges if given."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshots(snapshots, api))
    return generate_latest(registry)
