"""`FlintRouter`: the OpenAI API as Ray Serve's ingress, streaming from `FlintReplica`s through a handle.

Tokenisation, chat templating and output parsing run here; replicas only see token ids. The prompt's block hashes
travel with each request so the request router can send it to the replica whose prefix cache holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, TaskCancelledError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flint_engine.api.api_metrics import api_snapshot
from flint_engine.api.app import build_app
from flint_engine.api.backend import replica_entry
from flint_engine.async_engine import ChoiceOutput, EngineDeadError
from flint_engine.engine import EngineOverloaded
from flint_engine.sampling_params import SamplingParams
from flint_engine.tokenizer import FlintTokenizer

from .metrics_hub import get_hub
from .ray_metrics import RouterMetricsExporter
from .request_router import prefix_hashes
from .settings import ServeSettings

log = logging.getLogger("flint_serve.router")


class RayBackend:
    """The API's generation backend over a deployment handle to the replicas."""

    def __init__(self, handle: DeploymentHandle, settings: ServeSettings, app_name: str) -> None:
        self.handle = handle
        self.settings = settings
        self.model_name = settings.model_name
        self.app_name = app_name
        self.tokenizer: FlintTokenizer | None = None
        self.max_model_len = 0
        self.max_context = 0
        self.generation_defaults: dict[str, Any] = {}
        self.eos_token_ids: frozenset[int] = frozenset()
        self._hub = get_hub(app_name)

    async def fetch_spec(self) -> None:
        """Tokenizer and limits come from a replica, so the router needs no access to the weights' files."""
        spec = await self.handle.tokenizer_spec.remote()
        self.tokenizer = FlintTokenizer.from_gguf_metadata(spec["tokenizer"]) if spec["tokenizer"] else None
        self.max_model_len, self.max_context = spec["max_model_len"], spec["max_context"]
        self.generation_defaults = spec["generation_defaults"]
        self.eos_token_ids = frozenset(spec["eos_token_ids"])

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[ChoiceOutput]:
        received = False
        try:
            # Serve may refuse at call time (the replicas' queues are full), so the call is inside the try.
            stream = self.handle.options(stream=True).generate.remote(
                prompt_token_ids,
                dataclasses.asdict(params),
                request_id,
                prefix_hashes=prefix_hashes(prompt_token_ids, params.cache_salt),
            )
            async for item in stream:
                received = True
                yield item
        except BackPressureError as exc:
            raise EngineOverloaded(f"every replica's queue is full ({exc})") from None
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise EngineDeadError(f"the replica serving this request failed: {type(exc).__name__}") from None
        except (GeneratorExit, asyncio.CancelledError):
            # The consumer left (client gone). Closing this generator does not cancel the replica's call by itself:
            # without an explicit cancel an abandoned request can run to max_tokens on the replica. Only once an
            # item has arrived: the call is then assigned, so `cancel()` does not block on the assignment.
            if received:
                with contextlib.suppress(Exception):
                    stream.cancel()
            raise

    async def check_health(self) -> tuple[bool, str]:
        replicas = await self._hub.recent.remote(3 * self.settings.health_check_period_s + 10)
        healthy = [labels["replica"] for labels, _, ok in replicas if ok]
        if not healthy:
            return False, "no healthy Flint replica has reported in"
        return True, f"{len(healthy)} healthy replicas"

    async def metrics_snapshots(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [(labels, snap) for labels, snap, _ in await self._hub.recent.remote()]

    async def replicas(self) -> list[dict[str, Any]]:
        max_age = 3 * self.settings.health_check_period_s + 10
        info = await self._hub.replica_info.remote(max_age)
        return [
            replica_entry(labels["replica"], info.get(labels["replica"], {}), snap, ok)
            for labels, snap, ok in await self._hub.recent.remote(max_age)
        ]


class DisconnectOnCancel:
    """ASGI middleware: Serve cancels the router's receive task when the HTTP client goes away; the app sees that as
    the plain ASGI `http.disconnect` (its streams stop and the replica call is cancelled) instead of an error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def guarded() -> Message:
            try:
                return await receive()
            except TaskCancelledError:
                return {"type": "http.disconnect"}

        await self.app(scope, guarded if scope["type"] == "http" else receive, send)


@serve.deployment
@serve.ingress()
class FlintRouter:
    """Ready only once a replica has answered with the tokenizer, i.e. once a model is loaded."""

    async def __init__(self, replica: DeploymentHandle, settings: dict[str, Any]) -> None:
        self.settings = ServeSettings(**settings)
        ctx = serve.get_replica_context()
        self.backend = RayBackend(replica, self.settings, ctx.app_name if ctx is not None else "flint")
        await self.backend.fetch_spec()
        router_id = ctx.replica_tag if ctx is not None else f"pid{os.getpid()}"
        self.exporter = RouterMetricsExporter({"model_name": self.settings.model_name, "router": router_id})
        self._app: FastAPI | None = None  # (`app` is serve.ingress's own)
        self._export_task = asyncio.get_running_loop().create_task(self._export())

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = build_app(self.backend, self.settings.api)
        app.add_middleware(DisconnectOnCancel)
        self._app = app
        return app

    async def _export(self) -> None:
        """The router's own gauges (batches, background responses) to Ray's metrics, every few seconds."""
        while True:
            try:
                if self._app is not None:
                    self.exporter.export_once(api_snapshot(self._app.state))
            except Exception:  # metrics must never take a router down
                log.exception("router metrics export failed")
            await asyncio.sleep(self.exporter.period_s)

    def process_info(self) -> dict[str, Any]:
        """The router's process (operators and the fault tests use it)."""
        return {"pid": os.getpid()}
