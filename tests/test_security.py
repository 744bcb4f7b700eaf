"""API keys on every route, limits at their boundaries, per-key concurrency, no prompt text in logs, CORS."""

from __future__ import annotations

import hmac
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from api_fixtures import tiny_server
from fastapi.routing import APIRoute

from flint_engine.api.auth import APIKeys
from flint_engine.api.server import warn_if_open
from flint_engine.api.settings import APISettings

KEY, OTHER = "sk-flint-test-1", "sk-flint-test-2"
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("sec")
    key_file = tmp / "keys"
    key_file.write_text(f"# rotated by ops\n{OTHER}\n")
    settings = APISettings(
        api_keys=[KEY],
        api_key_file=str(key_file),
        protect_metrics=True,
        max_concurrent_per_key=1,
        max_n=4,
        max_top_logprobs=5,
        max_stop_sequences=2,
        max_stop_length=8,
        max_tools=2,
        max_tool_schema_bytes=600,
        max_tokens_limit=32,
        max_prompt_tokens=400,
        max_request_bytes=64 * 1024,
        default_max_tokens=4,
    )
    srv = tiny_server(tmp, settings)
    srv.key_file = key_file  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_every_route_needs_a_key_except_health(server) -> None:
    app = server.server.config.app
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert len(routes) >= 9
    for r in routes:
        path = r.path.replace("{model_id:path}", "flint")
        for method in r.methods:
            for headers in ({}, auth("wrong-key"), {"Authorization": KEY}, {"x-api-key": "wrong-key"}):
                resp = httpx.request(method, server.base_url + path, headers=headers, json={}, timeout=10)
                if path == "/health":
                    assert resp.status_code == 200
                elif path.startswith("/v1/messages"):  # Anthropic's clients get Anthropic's shape
                    assert resp.status_code == 401, (method, path, headers)
                    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "authentication_error"
                else:
                    assert resp.status_code == 401, (method, path, headers)
                    err = resp.json()["error"]
                    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    assert httpx.get(server.base_url + "/v1/models", headers=auth(KEY)).status_code == 200
    assert httpx.get(server.base_url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(server.base_url + "/metrics", headers=auth(KEY)).status_code == 200


def test_key_file_rotation_without_restart(server) -> None:
    assert httpx.get(server.base_url + "/v1/models", headers=auth(OTHER)).status_code == 200
    time.sleep(0.02)
    server.key_file.write_text("sk-rotated\n")
    assert httpx.get(server.base_url + "/v1/models", headers=auth(OTHER)).status_code == 401
    assert httpx.get(server.base_url + "/v1/models", headers=auth("sk-rotated")).status_code == 200
    assert httpx.get(server.base_url + "/v1/models", headers=auth(KEY)).status_code == 200  # static key stays


def test_key_comparison_is_constant_time(monkeypatch) -> None:
    calls = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = APIKeys(["a" * 20, "b" * 20, "c" * 20])
    assert keys.check("a" * 20) == "a" * 20
    assert len(calls) == 3  # every key is compared even after the first matched
    assert keys.check("zzz") is None and len(calls) == 6


def post(server, body: dict, path: str = "/v1/chat/completions", **kw) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=auth(KEY), timeout=30, **kw)


@pytest.mark.parametrize(
    ("field", "ok", "bad"),
    [
        ("n", 4, 5),
        ("top_logprobs", 5, 6),
        ("stop", ["a", "b"], ["a", "b", "c"]),
        ("stop", ["12345678"], ["123456789"]),
        ("max_tokens", 32, 33),
    ],
)
def test_limits_at_the_boundary(server, field: str, ok: object, bad: object) -> None:
    base = {"messages": MSG, "max_tokens": 2}
    if field == "top_logprobs":
        base["logprobs"] = True
    assert post(server, {**base, field: ok}).status_code == 200
    r = post(server, {**base, field: bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_tool_limits(server) -> None:
    def tool(i: int, pad: int = 0) -> dict:
        return {
            "type": "function",
            "function": {"name": f"t{i}", "description": "x" * pad, "parameters": {"type": "object", "properties": {}}},
        }

    assert post(server, {"messages": MSG, "max_tokens": 2, "tools": [tool(0), tool(1)]}).status_code == 200
    r = post(server, {"messages": MSG, "max_tokens": 2, "tools": [tool(0), tool(1), tool(2)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = post(server, {"messages": MSG, "max_tokens": 2, "tools": [tool(0, pad=600)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.0"


def test_prompt_and_body_limits(server) -> None:
    r = post(server, {"prompt": [7] * 400, "max_tokens": 1}, "/v1/completions")
    assert r.status_code == 200
    r = post(server, {"prompt": [7] * 401, "max_tokens": 1}, "/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long"
    r = httpx.post(server.base_url + "/v1/chat/completions", content=b" " * (64 * 1024 + 1), headers=auth(KEY))
    assert r.status_code == 413
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        headers=auth(KEY),
        content=b'{"messages": []}' + b" " * (64 * 1024 - 16),
    )  # exactly at the cap: parsed, then 400
    assert r.status_code == 400


def test_per_key_concurrency_limit(server) -> None:
    server.engine.paused.set()  # hold the first request in flight
    results: list[int] = []
    t = threading.Thread(target=lambda: results.append(post(server, {"messages": MSG, "max_tokens": 2}).status_code))
    t.start()
    try:
        time.sleep(0.5)
        r = post(server, {"messages": MSG, "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        server.key_file.write_text(f"{OTHER}\n")
        time.sleep(0.05)
        assert httpx.get(server.base_url + "/v1/models", headers=auth(OTHER)).status_code == 200  # GETs not limited
    finally:
        server.engine.paused.clear()
        t.join()
    assert results == [200]


def test_no_prompt_text_in_logs(server, caplog) -> None:
    secret = "my-secret-prompt-3f7a9c"
    with caplog.at_level(logging.DEBUG):
        assert post(server, {"messages": [{"role": "user", "content": secret}], "max_tokens": 2}).status_code == 200
        time.sleep(0.2)
    assert secret not in caplog.text
    assert "request " in caplog.text and "/v1/chat/completions -> 200" in caplog.text  # the request id line is there


def test_log_prompts_opt_in(tmp_path, caplog) -> None:
    srv = tiny_server(tmp_path, APISettings(log_prompts=True, default_max_tokens=2))
    try:
        with caplog.at_level(logging.INFO):
            httpx.post(
                srv.base_url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "opt-in"}]}
            )
        assert "opt-in" in caplog.text
    finally:
        srv.stop()


def test_cors_off_by_default_and_configurable(server, tmp_path) -> None:
    pre = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(server.base_url + "/v1/chat/completions", headers=pre)
    assert "access-control-allow-origin" not in r.headers
    srv = tiny_server(tmp_path, APISettings(cors_origins=["https://app.example"]))
    try:
        ok = httpx.options(srv.base_url + "/v1/chat/completions", headers={**pre, "Origin": "https://app.example"})
        assert ok.headers.get("access-control-allow-origin") == "https://app.example"
        bad = httpx.options(srv.base_url + "/v1/chat/completions", headers=pre)
        assert "access-control-allow-origin" not in bad.headers
    finally:
        srv.stop()


def test_loud_warning_when_open_without_keys(caplog, monkeypatch) -> None:
    monkeypatch.delenv("FLINT_API_KEYS", raising=False)
    monkeypatch.delenv("FLINT_API_KEY_FILE", raising=False)
    with caplog.at_level(logging.WARNING):
        warn_if_open("0.0.0.0", APISettings())
    assert "WITHOUT an API key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_if_open("127.0.0.1", APISettings())
        warn_if_open("0.0.0.0", APISettings(api_keys=["k"]))
    assert "WITHOUT" not in caplog.text


def test_missing_key_file_refuses_everything(tmp_path: Path) -> None:
    keys = APIKeys(key_file=str(tmp_path / "absent"))
    assert keys.enabled and keys.check("anything") is None
