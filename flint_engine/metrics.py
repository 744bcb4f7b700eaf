"""Engine metrics kept in one place; the serving layer exports them (Prometheus, Ray)."""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass, field

# Buckets follow vLLM's so dashboards built for it read ours the same way.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 262144)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), plus +Inf last
    sum: float = 0.0
    count: int = 0
    # Raw observations since an exporter last drained them (None until an exporter asks for them).
    tap: deque[float] | None = None

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1
        if self.tap is not None:
            self.tap.append(value)

    def cumulative(self) -> list[tuple[float, int]]:
        out, acc = [], 0
        for le, c in zip((*self.buckets, float("inf")), self.counts):
            acc += c
            out.append((le, acc))
        return out


FINISH_REASONS = ("stop", "length", "abort", "error")


class EngineMetrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.num_running = 0
        self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_preemptions = 0
        self.num_priority_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.late_kernel_compiles = 0
        self.decode_steps_ahead = 0
        self.finished: dict[str, int] = {r: 0 for r in FINISH_REASONS}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(E2E_BUCKETS)
        self.prompt_len = Histogram(TOKEN_BUCKETS)
        self.generation_len = Histogram(TOKEN_BUCKETS)
        self.steps = 0
        self.computed_tokens = 0  # tokens run through the model (prefill and decode), for prefix-cache accounting
        self.last_step_time = 0.0

    def histograms(self) -> dict[str, Histogram]:
        return {
            "time_to_first_token_seconds": self.ttft,
            "inter_token_latency_seconds": self.itl,
            "e2e_request_latency_seconds": self.e2e,
            "request_queue_time_seconds": self.queue_time,
            "request_prompt_tokens": self.prompt_len,
            "request_generation_tokens": self.generation_len,
        }

    def drain_observations(self) -> dict[str, list[float]]:
        """Raw observations since the last call, per histogram (an exporter replays them exactly)."""
        out = {}
        with self.lock:
            for name, h in self.histograms().items():
                if h.tap is None:
                    h.tap = deque(maxlen=100_000)  # bounded: a stalled exporter cannot grow memory
                out[name] = list(h.tap)
                h.tap.clear()
        return out

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "num_requests_running": self.num_running,
                "num_requests_waiting": self.num_waiting,
                "kv_cache_usage_perc": self.kv_cache_usage,
                "prompt_tokens_total": self.prompt_tokens,
                "generation_tokens_total": self.generation_tokens,
                "num_preemptions_total": self.num_preemptions,
                "num_priority_preemptions_total": self.num_priority_preemptions,
                "prefix_cache_queries_total": self.prefix_cache_queries,
                "prefix_cache_hits_total": self.prefix_cache_hits,
                "late_kernel_compiles_total": self.late_kernel_compiles,
                "decode_steps_ahead_total": self.decode_steps_ahead,
                "request_success_total": dict(self.finished),
                "time_to_first_token_seconds": _hist(self.ttft),
                "inter_token_latency_seconds": _hist(self.itl),
                "e2e_request_latency_seconds": _hist(self.e2e),
                "request_queue_time_seconds": _hist(self.queue_time),
                "request_prompt_tokens": _hist(self.prompt_len),
                "request_generation_tokens": _hist(self.generation_len),
                "engine_steps_total": self.steps,
                "computed_tokens_total": self.computed_tokens,
            }


def _hist(h: Histogram) -> dict:
    return {"buckets": h.cumulative(), "sum": h.sum, "count": h.count}
