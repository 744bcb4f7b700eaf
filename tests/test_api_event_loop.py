"""A long prompt's templating and tokenizing run off the server's event loop: while one request's prompt is being
tokenized, other requests are answered (before, a 2 MB prompt held every client up ~1.5 s; see
benchmarks/api_loop_stall.py)."""

from __future__ import annotations

import threading

import httpx
import pytest
from api_fixtures import module_server

server = module_server("event_loop")

MARK = "HOLD-THE-TOKENIZER"
MESSAGES = [{"role": "user", "content": f"{MARK} hello"}]
BODIES = {
    "/v1/chat/completions": {"model": "flint", "messages": MESSAGES, "max_tokens": 2},
    "/v1/completions": {"model": "flint", "prompt": f"{MARK} hello", "max_tokens": 2},
    "/v1/responses": {"model": "flint", "input": f"{MARK} hello", "max_output_tokens": 2},
    "/v1/messages": {"model": "flint", "messages": MESSAGES, "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": "flint", "messages": MESSAGES},
    "/tokenize": {"model": "flint", "prompt": f"{MARK} hello"},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_other_requests_answered_while_a_prompt_is_tokenized(server, monkeypatch: pytest.MonkeyPatch, path: str):
    tok = server.backend.tokenizer
    entered, release = threading.Event(), threading.Event()
    released_in_time: list[bool] = []
    encode = tok.encode

    def held_encode(text: str, *args, **kwargs) -> list[int]:
        if MARK in text:  # the request under test: held until another request has been answered
            entered.set()
            released_in_time.append(release.wait(timeout=30))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", held_encode)
    answer: dict[str, httpx.Response] = {}
    held = threading.Thread(
        target=lambda: answer.setdefault("r", httpx.post(server.base_url + path, json=BODIES[path], timeout=60))
    )
    held.start()
    try:
        assert entered.wait(timeout=30), "the request never reached the tokenizer"
        # The loop is free while that request's prompt is tokenized: another request is answered meanwhile.
        other = httpx.get(server.base_url + "/v1/models", timeout=10)
        assert other.status_code == 200
        models = other.json()
        small = httpx.post(server.base_url + "/tokenize", json={"prompt": "abc"}, timeout=10)
        assert small.status_code == 200 and small.json()["count"] >= 1
    finally:
        release.set()
        held.join(timeout=60)
    assert released_in_time == [True]  # the held request was let go by the test, not by its timeout
    r = answer["r"]
    assert r.status_code == 200, r.text
    assert models["data"][0]["id"] == "flint"
