"""What the API needs from whatever runs the model: an in-process AsyncEngine, or Ray Serve replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from ..async_engine import AsyncEngine, ChoiceOutput
from ..sampling_params import SamplingParams


class GenerationBackend(Protocol):
    model_name: str
    tokenizer: Any
    max_model_len: int
    max_context: int
    generation_defaults: dict[str, Any]

    def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[ChoiceOutput]: ...

    async def check_health(self) -> tuple[bool, str]: ...

    async def metrics_snapshots(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """(labels, EngineMetrics.snapshot()) per engine."""
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
        self.wedge_timeout_s = wedge_timeout_s

    def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[ChoiceOutput]:
        return self.engine.generate(prompt_token_ids, params, request_id)

    async def check_health(self) -> tuple[bool, str]:
        return engine_health(self.engine, self.wedge_timeout_s)

    async def metrics_snapshots(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [({"model_name": self.model_name, "replica": "local"}, self.engine.engine.metrics.snapshot())]


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
