"""Run the API in one process (no Ray): an AsyncEngine and the FastAPI app under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from ..async_engine import AsyncEngine
from ..engine import LLMEngine
from ..engine_config import EngineConfig
from .app import build_app
from .backend import LocalBackend
from .settings import APISettings

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_open(host: str, settings: APISettings) -> None:
    from .auth import APIKeys

    if not is_loopback(host) and not APIKeys(settings.api_keys, settings.api_key_file).enabled:
        log.warning(
            "\n%s\nSECURITY: listening on %s WITHOUT an API key: anyone who can reach this port can use the model.\n"
            "Set FLINT_API_KEYS or FLINT_API_KEY_FILE (or --api-key-file), or bind to 127.0.0.1.\n%s",
            "!" * 100,
            host,
            "!" * 100,
        )


@dataclass
class LocalServer:
    """A running single-process server (used by tests and `flint serve-local`)."""

    engine: AsyncEngine
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int
    backend: LocalBackend

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()
        self.backend.release()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_local_server(
    engine: LLMEngine, settings: APISettings | None = None, host: str = "127.0.0.1", port: int | None = None
) -> LocalServer:
    """Start engine + API in background threads and wait until the port answers."""
    settings = settings or APISettings()
    async_engine = AsyncEngine(engine)
    async_engine.start()
    backend = LocalBackend(async_engine, settings.model_name)
    app = build_app(backend, settings)
    port = port or free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="flint-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            async_engine.shutdown()
            raise RuntimeError(f"the API server did not start on {host}:{port}")
        time.sleep(0.02)
    warn_if_open(host, settings)
    return LocalServer(async_engine, server, thread, host, port, backend)


def serve_forever(engine_config: EngineConfig, settings: APISettings, host: str, port: int) -> None:
    engine = LLMEngine.from_checkpoint(engine_config)
    async_engine = AsyncEngine(engine)
    async_engine.start()
    backend = LocalBackend(async_engine, settings.model_name)
    app = build_app(backend, settings)
    warn_if_open(host, settings)
    log.info("serving %s at http://%s:%d/v1", settings.model_name, host, port)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=10)
    finally:
        async_engine.shutdown()
        backend.release()
