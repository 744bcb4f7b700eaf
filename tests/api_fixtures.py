"""A real single-process server over a tiny random Flint, shared by the API tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch

from flint_engine.api.server import LocalServer, start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.checkpoint import load_checkpoint
from flint_engine.checkpoint.gguf_writer import write_gguf
from flint_engine.checkpoint.random_tensors import random_provider
from flint_engine.config import preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.tokenizer import build_default_tokenizer


def tiny_checkpoint(tmp: Path, seed: int = 1) -> Path:
    cfg = preset("tiny")
    tok = build_default_tokenizer(cfg.vocab_size)
    cfg = cfg.replace(
        bos_token_id=tok.bos_token_id, eos_token_id=tuple(tok.eos_token_ids), pad_token_id=tok.pad_token_id
    )
    path = tmp / f"tiny-{seed}.gguf"
    if not path.exists():
        write_gguf(
            path,
            cfg,
            random_provider(cfg, seed),
            fmt="bf16",
            tokenizer=tok,
            generation={"temperature": 1.0, "top_p": 0.95, "top_k": 20},
            progress=False,
        )
    return path


def tiny_engine(path: Path, **engine_kw) -> LLMEngine:
    ck = load_checkpoint(path, torch.float32, progress=False)
    ec = EngineConfig(**{"kv_cache_memory": 32 * 2**20, **engine_kw})
    return LLMEngine(FlintModel(ck.weights), ck.tokenizer, ec, ck.generation_defaults)


def tiny_server(tmp: Path, settings: APISettings | None = None, **engine_kw) -> LocalServer:
    return start_local_server(tiny_engine(tiny_checkpoint(tmp), **engine_kw), settings)


DEMO = Path(__file__).resolve().parents[1] / "flint_engine" / "assets" / "flint-demo.gguf"
# A strict get_weather the demo model (trained on any city and 1-7 days) must be held to.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Lisbon"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


def module_demo_server(settings: APISettings | None = None):
    """A module-scoped pytest fixture: a server over the trained demo model (CPU, FP32), stopped after the tests."""

    @pytest.fixture(scope="module")
    def server():
        config = EngineConfig(model=str(DEMO), device="cpu", dtype="float32", kv_cache_memory=32 * 2**20)
        srv = start_local_server(LLMEngine.from_checkpoint(config, progress=False), settings)
        yield srv
        srv.stop()

    return server


def module_server(name: str, settings: APISettings | None = None, **engine_kw):
    """A module-scoped pytest fixture: a tiny server (`tiny_server`) for the module's tests, stopped after them."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory: pytest.TempPathFactory):
        srv = tiny_server(tmp_path_factory.mktemp(name), settings, **engine_kw)
        yield srv
        srv.stop()

    return server


def named_events(url: str, body: dict, headers: dict | None = None) -> list[dict]:
    """The data of each event of a stream whose events are named (`event:` lines, as the Responses and Messages APIs
    send them), each checked to carry its name as its `type`."""
    events = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == kind
                events.append(data)
    return events


def engine_idle(server: LocalServer) -> bool:
    """No request running and every KV block free."""
    snap = server.engine.engine.metrics.snapshot()
    return (
        snap["num_requests_running"] == 0 and snap["kv_cache_usage_perc"] == 0.0 and server.engine.engine.kv.all_free()
    )


def wait_until_idle(server: LocalServer, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not engine_idle(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine_idle(server)


def stream_chunks(server, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed chat or completions answer (`stream` set here; the [DONE] line left out),
    checked to be a 200 event stream with no error chunk."""
    chunks = []
    with httpx.stream(
        "POST", f"{server.base_url}{path}", json={"model": "flint", **body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks and all("error" not in c for c in chunks), chunks
    return chunks
