"""`FlintReplica`: one engine on one GPU (or the CPU), streamed to the router through a deployment handle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from flint_engine.api.backend import device_info, engine_health
from flint_engine.async_engine import AsyncEngine, ChoiceOutput
from flint_engine.engine import LLMEngine
from flint_engine.sampling_params import SamplingParams

from .metrics_hub import get_hub
from .ray_metrics import RayMetricsExporter
from .settings import ServeSettings

log = logging.getLogger("flint_serve.replica")


class FlintReplica:
    """Ready (and so routable) only once the model is loaded: Serve awaits this async constructor."""

    async def __init__(self, settings: dict[str, Any], gpu: bool) -> None:
        self.settings = ServeSettings(**settings)
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_tag if ctx is not None else f"pid{os.getpid()}"
        if not gpu:
            import ray
            import torch

            # The CPUs Ray gave this replica, not the node's core count (a pod may see a 64-core host).
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
            torch.set_num_threads(max(1, int(cpus)))
        ec = self.settings.engine_config(gpu)
        start = time.monotonic()
        engine = await asyncio.get_running_loop().run_in_executor(
            None, lambda: LLMEngine.from_checkpoint(ec, progress=False)
        )
        self.engine = AsyncEngine(engine)
        self.engine.start()
        where = device_info(engine.model.device)
        self.device, self.device_name = where["device"], where["device_name"]
        log.info(
            "replica %s ready on %s (%s) in %.1f s",
            self.replica_id,
            self.device,
            self.device_name,
            time.monotonic() - start,
        )
        labels = {"model_name": self.settings.model_name, "replica": self.replica_id}
        self.exporter = RayMetricsExporter(engine.metrics, labels, engine.model.device)
        self.hub = get_hub(ctx.app_name if ctx is not None else "flint")
        self._export_task = asyncio.get_running_loop().create_task(self._export(labels))

    async def _export(self, labels: dict[str, str]) -> None:
        """Ray metrics and the application's metrics hub, every couple of seconds."""
        while True:
            try:
                self.exporter.export_once()
                ok, _ = engine_health(self.engine, self.settings.wedge_timeout_s)
                self.hub.push.remote(
                    labels,
                    self.engine.engine.metrics.snapshot(),
                    ok,
                    {"pid": os.getpid(), "device": self.device, "device_name": self.device_name},
                )
            except Exception:  # metrics must never take a replica down
                log.exception("metrics export failed")
            await asyncio.sleep(self.exporter.period_s)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: dict[str, Any],
        request_id: str,
        prefix_hashes: list[int] | None = None,
    ) -> AsyncIterator[ChoiceOutput]:
        """Stream one request's outputs. Cancellation (client gone) aborts it inside the engine."""
        del prefix_hashes  # consumed by the request router, not here
        async for item in self.engine.generate(prompt_token_ids, SamplingParams(**params), request_id):
            yield item

    async def check_health(self) -> None:
        """Called by Serve: a dead or wedged engine loop fails the check and Serve replaces the replica."""
        ok, why = engine_health(self.engine, self.settings.wedge_timeout_s)
        if not ok:
            raise RuntimeError(why)

    def tokenizer_spec(self) -> dict[str, Any]:
        """What the router needs to tokenise, template and validate without touching the weights."""
        e = self.engine.engine
        return {
            "tokenizer": e.tokenizer.to_gguf_metadata() if e.tokenizer is not None else None,
            "max_model_len": e.max_model_len,
            "max_context": e.max_context,
            "generation_defaults": e.generation_defaults,
            "eos_token_ids": sorted(e.eos_token_ids),
        }

    def info(self) -> dict[str, Any]:
        e = self.engine.engine
        return {
            "replica": self.replica_id,
            "pid": os.getpid(),
            "device": self.device,
            "device_name": self.device_name,
            "model_name": self.settings.model_name,
            "max_model_len": e.max_model_len,
            "max_context": e.max_context,
            "kv_cache": e.plan.describe(),
            "generation_defaults": e.generation_defaults,
        }

    def metrics_snapshot(self) -> tuple[dict[str, str], dict[str, Any]]:
        return (
            {"model_name": self.settings.model_name, "replica": self.replica_id},
            self.engine.engine.metrics.snapshot(),
        )

    def record_routing_stats(self) -> dict[str, Any]:
        """Load facts the request router reads every few seconds."""
        snap = self.engine.engine.metrics.snapshot()
        return {
            "kv_cache_usage": snap["kv_cache_usage_perc"],
            "num_waiting": snap["num_requests_waiting"],
            "num_running": snap["num_requests_running"],
        }

    async def wedge_for_test(self, seconds: float) -> None:
        """Test hook: stall the engine loop (the fault tests use it to prove health checks catch a wedge)."""
        self.engine.paused.set()
        asyncio.get_running_loop().call_later(seconds, self.engine.paused.clear)

    async def __del__(self) -> None:
        # Also after a failed __init__ (a missing module, a bad checkpoint): whatever was set up is torn down, and
        # the failure's own traceback stays the last word in the log.
        task = getattr(self, "_export_task", None)
        if task is not None:
            task.cancel()
        with contextlib.suppress(Exception):
            self.hub.drop.remote(self.replica_id)
        with contextlib.suppress(Exception):
            self.engine.shutdown(timeout=5)
