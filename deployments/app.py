"""The Ray Serve application: `FlintRouter` (OpenAI API ingress) -> `FlintReplica` x N (one engine per GPU).

serve run flint_serve.app:build_app model=/models/flint.gguf       # or: serve run deployments/serve_config.yaml
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve import Application

from .replica import FlintReplica
from .router import FlintRouter
from .settings import ServeSettings

log = logging.getLogger("flint_serve")


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Build from `serve run`/config args (every field of `ServeSettings`; `api` holds the API settings)."""
    settings = args if isinstance(args, ServeSettings) else ServeSettings(**(args or {}))
    gpu = settings.uses_gpu()
    replica = serve.deployment(FlintReplica).options(name="FlintReplica", **settings.replica_options(gpu))
    router = FlintRouter.options(name="FlintRouter", **settings.router_options())
    log.info(
        "building Flint app: %s (as %r), %s replicas on %s",
        settings.model or "the embedded default model",
        settings.model_name,
        settings.num_replicas or "autoscaled",
        "GPU" if gpu else "CPU",
    )
    if settings.router_replicas > 1 and settings.api.batch_dir is None:
        log.warning(
            "router_replicas is %d but api.batch_dir is unset: each router keeps the Batch API's files and batches in "
            "a directory of its own, so a batch made through one is not found through another; set api.batch_dir to "
            "a directory they share",
            settings.router_replicas,
        )
    if settings.router_replicas > 1 and settings.api.store_responses and settings.api.responses_dir is None:
        log.warning(
            "router_replicas is %d with api.store_responses but api.responses_dir is unset: each router keeps its "
            "stored responses and conversations in a directory of its own, so previous_response_id, conversation "
            "and background responses fail through another; set api.responses_dir to a directory they share",
            settings.router_replicas,
        )
    return router.bind(replica.bind(settings.model_dump(), gpu), settings.model_dump())
