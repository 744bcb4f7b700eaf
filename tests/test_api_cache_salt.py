"""Prefix-cache salts: vLLM's per-request `cache_salt` and `api.isolate_prefix_cache` (a salt per API key), so a
request shares cached blocks only with requests under the same salt; what a client sees of it is
`usage.prompt_tokens_details.cached_tokens`."""

from __future__ import annotations

import httpx
import pytest
from api_fixtures import tiny_checkpoint, tiny_engine

from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.config import preset
from flint_engine.kv_cache_manager import KVCacheManager, block_hashes, chain_root

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"
PROMPT = list(range(40, 140))  # token ids: several whole blocks


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("salt")
    srv = start_local_server(
        tiny_engine(tiny_checkpoint(tmp)), APISettings(api_keys=[KEY_A, KEY_B], isolate_prefix_cache=True)
    )
    yield srv
    srv.stop()


def cached(server, key: str, prompt: list[int], **extra) -> int:
    """The prompt tokens the request found in the prefix cache."""
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": "flint", "prompt": prompt, "max_tokens": 1, "temperature": 0, **extra},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_salt_shares_blocks_only_with_its_own(server) -> None:
    prompt = [7, *PROMPT]
    assert cached(server, KEY_A, prompt) == 0
    assert cached(server, KEY_A, prompt) >= 64  # the same key, no salt: its blocks are found
    assert cached(server, KEY_A, prompt, cache_salt="s1") == 0
    assert cached(server, KEY_A, prompt, cache_salt="s1") >= 64
    assert cached(server, KEY_A, prompt, cache_salt="s2") == 0
    assert cached(server, KEY_A, prompt) >= 64  # the unsalted blocks are still there


def test_keys_do_not_share_blocks_when_isolated(server) -> None:
    """With `api.isolate_prefix_cache`, another key's identical prompt (and identical salt) finds nothing."""
    prompt = [8, *PROMPT]
    assert cached(server, KEY_A, prompt, cache_salt="same") == 0
    assert cached(server, KEY_B, prompt, cache_salt="same") == 0
    assert cached(server, KEY_B, prompt) == 0
    assert cached(server, KEY_B, prompt) >= 64 and cached(server, KEY_A, prompt, cache_salt="same") >= 64


def cached_of(usage: dict) -> int:
    """Cached prompt tokens as chat (`prompt_tokens_details`), Responses (`input_tokens_details`) or Messages
    (`cache_read_input_tokens`) report them."""
    for details in ("prompt_tokens_details", "input_tokens_details"):
        if details in usage:
            return usage[details]["cached_tokens"]
    return usage["cache_read_input_tokens"]


def test_chat_responses_and_messages_take_a_salt(server) -> None:
    """Every generation API carries it: the chat, Responses and Messages requests of one conversation, each under
    its own salt, find nothing of each other's and everything of their own second time."""
    headers = {"Authorization": f"Bearer {KEY_A}"}
    text = "Tell me about the number " + " ".join(map(str, range(60)))
    bodies = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": text}]},
        "/v1/responses": {"input": text},
        "/v1/messages": {"messages": [{"role": "user", "content": text}]},
    }
    for path, body in bodies.items():
        seen = []
        for _ in range(2):
            r = httpx.post(
                f"{server.base_url}{path}",
                json={"model": "flint", "max_tokens": 1, "max_output_tokens": 1, "cache_salt": path, **body},
                headers=headers,
                timeout=60,
            )
            assert r.status_code == 200, r.text
            seen.append(cached_of(r.json()["usage"]))
        assert seen[0] == 0 and seen[1] >= 16, (path, seen)


def test_an_empty_salt_is_refused(server) -> None:
    """On every API, also where the key's own salt is joined to it."""
    for path, body in (
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        r = httpx.post(
            f"{server.base_url}{path}",
            json={"model": "flint", "max_tokens": 1, "cache_salt": "", **body},
            headers={"Authorization": f"Bearer {KEY_A}"},
            timeout=60,
        )
        assert r.status_code == 400 and "cache_salt" in r.text, (path, r.text)


def test_the_ray_router_hashes_blocks_as_the_engine_does() -> None:
    """The Ray router's replica affinity keys a prompt's blocks as the replica's prefix cache does, salt included."""
    from flint_serve.request_router import prefix_hashes

    kv = KVCacheManager(preset("tiny"), num_full_blocks=64, num_sliding_blocks=64, block_size=16)
    tokens = [*PROMPT, 1]
    for salt in (None, "tenant-1"):
        root = chain_root(salt)
        assert prefix_hashes(tokens, salt) == block_hashes(tokens, len(tokens) // 16, 16, root)
    assert prefix_hashes(tokens, "tenant-1")[0] != prefix_hashes(tokens)[0]
    assert kv.find_prefix(tokens, chain_root("tenant-1")) == (0, [])
