"""Malformed requests against every endpoint: never a 5xx, never a hang, errors in OpenAI's shape."""

from __future__ import annotations

import contextlib
import json
import os

import httpx
import pytest
from api_fixtures import module_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flint_engine.api.settings import APISettings

ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]
VALID = {
    "/v1/chat/completions": {"model": "flint", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/completions": {"model": "flint", "prompt": "hi", "max_tokens": 3},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2, 3]},
}
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "chat_template_kwargs",
    "tokens",
    "echo",
    "min_tokens",
    "stop_token_ids",
    "parallel_tool_calls",
    "ignore_eos",
    "messages.0.role",
    "messages.0.content",
    "tools.0.function.parameters",
]
EXAMPLES = int(os.environ.get("FLINT_FUZZ_EXAMPLES", "300"))

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
)


server = module_server("fuzz", APISettings(default_max_tokens=4, max_tokens_limit=64))


def _set(body: dict, path: str, value: object) -> dict:
    out = json.loads(json.dumps(body))
    cur = out
    parts = path.split(".")
    for p in parts[:-1]:
        key: object = int(p) if p.isdigit() else p
        try:
            cur = cur[key]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return out
    last: object = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    with contextlib.suppress(IndexError, TypeError):
        cur[last] = value  # type: ignore[index]
    return out


def _check(resp: httpx.Response, streamed: bool) -> None:
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code >= 400:
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    mutations=st.lists(st.tuples(st.sampled_from(FIELDS), json_value), min_size=1, max_size=3),
    raw=st.one_of(st.none(), json_value),
)
def test_fuzz_no_5xx(server, endpoint: str, mutations: list, raw: object) -> None:
    if raw is not None and not mutations[0][0].startswith("m"):
        body: object = raw  # sometimes not even an object
    else:
        body = VALID[endpoint]
        for path, value in mutations:
            body = _set(body, path, value)  # type: ignore[arg-type]
    streamed = isinstance(body, dict) and body.get("stream") is True
    with httpx.Client(timeout=30) as c:
        if streamed:
            with c.stream("POST", server.base_url + endpoint, json=body) as r:
                if r.status_code == 200:
                    lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                    assert lines[-1] == "data: [DONE]"
                    return
                r.read()
                _check(r, True)
        else:
            _check(c.post(server.base_url + endpoint, json=body), False)


@pytest.mark.parametrize(
    "payload",
    [b"", b"null", b"[]", b"{", b'"text"', b"\xff\xfe\x00garbage", b'{"messages": "\xc3\x28"}'],
)
def test_raw_bodies(server, payload: bytes) -> None:
    for endpoint in ENDPOINTS:
        r = httpx.post(
            server.base_url + endpoint, content=payload, timeout=30, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, (endpoint, payload[:20], r.status_code, r.text[:200])
        assert r.json()["error"]["message"]


def test_huge_conversation_is_refused_cleanly(server) -> None:
    """200k prompt tokens: the context error comes back fast (tokenize itself may answer 200)."""
    big = {"model": "flint", "messages": [{"role": "user", "content": "x" * 100}] * 2000}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=big, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_server_still_serves(server) -> None:
    r = httpx.post(server.base_url + "/v1/completions", json=VALID["/v1/completions"], timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    assert server.engine.is_running
