"""vLLM's chat fields that change the prompt or the answer, each honoured rather than silently ignored:
`include_reasoning`, `truncation_side`, `add_special_tokens`, `documents` and a request's own `chat_template` (only
where the operator trusts them)."""

from __future__ import annotations

import httpx
from api_fixtures import module_server, stream_chunks

from flint_engine.api.settings import APISettings

server = module_server("chat-fields")
trusting = module_server("chat-fields-trust", APISettings(trust_request_chat_template=True))

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
# A template of the caller's own: the documents, then each message as "role: text" lines.
TEMPLATE = (
    "{% for d in documents or [] %}[doc {{ d.title }}] {{ d.text }}\n{% endfor %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:"
    "{% endif %}"
)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "flint", **body}, timeout=120)


def test_include_reasoning_false_leaves_the_thinking_out(server) -> None:
    """The model still thinks (the same tokens, the same usage); the answer carries no reasoning, streamed or not."""
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    forced = {**body, "thinking_token_budget": 4}  # a short thinking, so an answer follows it
    full = post(server, "/v1/chat/completions", forced).json()
    bare = post(server, "/v1/chat/completions", {**forced, "include_reasoning": False}).json()
    assert full["choices"][0]["message"].get("reasoning_content")
    assert "reasoning_content" not in bare["choices"][0]["message"] and "reasoning" not in bare["choices"][0]["message"]
    assert bare["choices"][0]["token_ids"] == full["choices"][0]["token_ids"]
    assert bare["choices"][0]["message"].get("content") == full["choices"][0]["message"].get("content")
    chunks = stream_chunks(server, "/v1/chat/completions", {**forced, "include_reasoning": False})
    deltas = [c["delta"] for chunk in chunks for c in chunk["choices"]]
    ids = [t for chunk in chunks for c in chunk["choices"] for t in c["token_ids"]]
    assert not any("reasoning_content" in d or "reasoning" in d for d in deltas)
    assert ids == full["choices"][0]["token_ids"]  # the thinking's ids still come, with the next delta sent


def test_truncation_side_right_keeps_the_first_tokens(server) -> None:
    prompt = list(range(100, 140))
    for side, want in (("left", prompt[-8:]), ("right", prompt[:8]), (None, prompt[-8:])):
        body = {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 8, "return_token_ids": True}
        r = post(server, "/v1/completions", {**body, "truncation_side": side} if side else body)
        assert r.status_code == 200 and r.json()["choices"][0]["prompt_token_ids"] == want, (side, r.text)
    chat = {"messages": MESSAGES, "max_tokens": 1, "truncate_prompt_tokens": 4, "return_token_ids": True}
    whole = httpx.post(f"{server.base_url}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    got = post(server, "/v1/chat/completions", {**chat, "truncation_side": "right"}).json()["prompt_token_ids"]
    assert got == whole[:4]
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "truncation_side": "middle"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation_side"


def test_add_special_tokens_encodes_as_the_tokenizer_does_with_them(server) -> None:
    """The templated prompt encoded with the tokenizer's own special tokens (Flint's tokenizer adds none: its
    template writes [gMASK]<sop> itself), as /tokenize encodes it."""
    body = {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True}
    special = post(server, "/v1/chat/completions", {**body, "add_special_tokens": True}).json()["prompt_token_ids"]
    tokenized = httpx.post(
        f"{server.base_url}/tokenize", json={"messages": MESSAGES, "add_special_tokens": True}
    ).json()["tokens"]
    tok = server.engine.engine.tokenizer
    text = tok.apply_chat_template(MESSAGES)
    assert special == tokenized == tok.encode(text, add_special_tokens=True)


def test_a_requests_chat_template_needs_the_operators_trust(server, trusting) -> None:
    body = {"messages": MESSAGES, "max_tokens": 1, "chat_template": TEMPLATE, "return_token_ids": True}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template", r.text
    docs = [{"title": "T1", "text": "Two and two make four."}]
    r = post(trusting, "/v1/chat/completions", {**body, "documents": docs})
    assert r.status_code == 200, r.text
    tok = trusting.engine.engine.tokenizer
    assert tok.decode(r.json()["prompt_token_ids"], skip_special_tokens=False) == (
        "[doc T1] Two and two make four.\nuser: What is 2 + 2?\nassistant:"
    )
    r = post(trusting, "/v1/chat/completions", {**body, "chat_template": "{% for m in messages %}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template", r.text
