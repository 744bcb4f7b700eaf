"""What the API needs from whatever runs the model: an in-process AsyncEngine, or Ray Serve replicas."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any, Protocol

import torch

from ..async_engine import AsyncEngine, ChoiceOutput
from ..sampling_params import SamplingParams


class GenerationBackend(Protocol):
    model_name: str
    tokenizer: Any
    max_model_len: int
    max_context: int
    generation_defaults: dict[str, Any]
    eos_token_ids: frozenset[int]  # the tokens that end an answer (beam search ends its beams on them)

    def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[ChoiceOutput]: ...

    async def check_health(self) -> tuple[bool, str]: ...

    async def metrics_snapshots(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """(labels, EngineMetrics.snapshot()) per engine."""
        ...

    async def replicas(self) -> list[dict[str, Any]]:
        """One entry per engine: id, process, device, health and load (the `/replicas` route)."""
        ...


class LocalBackend:
    """One engine in this process."""

    def __init__(self, engine: AsyncEngine, model_name: str = "flint", wedge_timeout_s: float = 120.0) -> None:
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.max_model_len
        self.max_context = engine.engine.max_context
        self.generation_defaults = engine.engine.generation_defaults
        self.eos_token_ids = engine.engine.eos_token_ids
        self.wedge_timeout_s = wedge_timeout_s

    def release(self) -> None:
        """Let go of the engine once it is shut down. FastAPI keeps every route's function in a module-level cache
        (its callable classification), so an app's routes, and through them this backend, outlive the app: without
        this, each app built in a process would hold its model and KV cache until the process exits."""
        self.engine = None  # type: ignore[assignment]

    def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[ChoiceOutput]:
        return self.engine.generate(prompt_token_ids, params, request_id)

    async def check_health(self) -> tuple[bool, str]:
        return engine_health(self.engine, self.wedge_timeout_s)

    async def metrics_snapshots(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [({"model_name": self.model_name, "replica": "local"}, self.engine.engine.metrics.snapshot())]

    async def replicas(self) -> list[dict[str, Any]]:
        ok, _ = engine_health(self.engine, self.wedge_timeout_s)
        info = {"pid": os.getpid(), **device_info(self.engine.engine.model.device)}
        return [replica_entry("local", info, self.engine.engine.metrics.snapshot(), ok)]


def device_info(device: torch.device) -> dict[str, str]:
    """The device an engine runs on, with the GPU's name and the CUDA devices its process may see."""
    name = "cpu"
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        name = f"{torch.cuda.get_device_name(idx)} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})"
    return {"device": str(device), "device_name": name}


def replica_entry(replica: str, info: dict[str, Any], snapshot: dict[str, Any], healthy: bool) -> dict[str, Any]:
    return {
        "id": replica,
        "healthy": healthy,
        **info,
        "num_requests_running": snapshot.get("num_requests_running"),
        "num_requests_waiting": snapshot.get("num_requests_waiting"),
        "kv_cache_usage_perc": snapshot.get("kv_cache_usage_perc"),
        "generation_tokens_total": snapshot.get("generation_tokens_total"),
    }


def engine_health(engine: AsyncEngine, wedge_timeout_s: float) -> tuple[bool, str]:
    """Healthy while the engine loop is alive and comes round; a loop stuck for `wedge_timeout_s` is wedged."""
    if engine.dead is not None:
        return False, f"engine loop died: {engine.dead!r}"
    if not engine.is_running:
        return False, "engine loop is not running"
    lag = engine.loop_lag()
    if lag > wedge_timeout_s:
        return False, f"engine loop has not come round for {lag:.0f} s"
    return True, "ok"
