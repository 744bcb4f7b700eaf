"""A demo-model server with stored responses and two API keys, and the helpers of the tests that use it (stored and
background responses, conversations)."""

from __future__ import annotations

import time

import openai
import pytest

from flint_engine.api.server import LocalServer, start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"
ASK = {"model": "flint", "temperature": 0, "max_output_tokens": 96}


def start(**settings) -> LocalServer:
    engine = LLMEngine.from_checkpoint(EngineConfig(device="cpu"), progress=False)
    return start_local_server(engine, APISettings(**settings))


def client(server: LocalServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def keyed_server(name: str):
    """A module-scoped pytest fixture: a server storing responses (in a directory of its own) for keys A and B."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory: pytest.TempPathFactory):
        s = start(api_keys=[KEY_A, KEY_B], store_responses=True, responses_dir=str(tmp_path_factory.mktemp(name)))
        yield s
        s.stop()

    return server


def settled(c: openai.OpenAI, response_id: str, seconds: float = 60.0):
    """The response once it is neither queued nor in progress."""
    deadline = time.monotonic() + seconds
    while (r := c.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"response {response_id} still {r.status} after {seconds} s"
        time.sleep(0.05)
    return r
