"""An assistant turn the client began and the model goes on with: vLLM's `continue_final_message` (and `echo`) on
chat and /tokenize, and Anthropic's prefill (a final assistant message) on /v1/messages."""

from __future__ import annotations

import httpx
from api_fixtures import module_server, stream_chunks

server = module_server("continue")

PARTIAL = "The answer is"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": PARTIAL}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "flint", **body}, timeout=120)


def test_chat_goes_on_with_the_final_message(server) -> None:
    """The prompt ends inside the assistant's message (as /tokenize renders it, no new turn opened), and the answer
    is the greedy continuation of that prompt, as the completions API gives it for the same text."""
    tok = server.engine.engine.tokenizer
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = post(server, "/v1/chat/completions", {**body, "continue_final_message": True})
    assert r.status_code == 200, r.text
    got = r.json()
    prompt = tok.decode(got["prompt_token_ids"], skip_special_tokens=False)
    assert prompt.endswith("<|assistant|></think>" + PARTIAL)
    tokenized = post(server, "/tokenize", {"messages": MESSAGES, "continue_final_message": True}).json()["tokens"]
    assert tokenized == got["prompt_token_ids"]
    same = {"prompt": got["prompt_token_ids"], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = post(server, "/v1/completions", {**same, "return_token_ids": True}).json()
    assert plain["choices"][0]["token_ids"] == got["choices"][0]["token_ids"]
    # without it the assistant's message is a finished turn and a new one opens after it
    opened = post(server, "/v1/chat/completions", body).json()
    assert len(opened["prompt_token_ids"]) > len(got["prompt_token_ids"])


def test_echo_puts_the_final_message_before_the_answer(server) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "continue_final_message": True}
    alone = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"] or ""
    echoed = post(server, "/v1/chat/completions", {**body, "echo": True}).json()["choices"][0]["message"]["content"]
    assert echoed == PARTIAL + alone
    chunks = stream_chunks(server, "/v1/chat/completions", {**body, "echo": True})
    content = "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])
    assert content == echoed


def test_both_prompts_asked_for_is_refused(server) -> None:
    r = post(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 2, "continue_final_message": True, "add_generation_prompt": True},
    )
    assert r.status_code == 400 and "continue_final_message" in r.json()["error"]["message"], r.text
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": [*MESSAGES[:1], {"role": "assistant", "content": [{"type": "text", "text": ""}]}],
            "max_tokens": 2,
            "continue_final_message": True,
        },
    )
    assert r.status_code == 200, r.text  # an empty beginning: the answer starts the turn's text


def test_anthropic_prefill_continues_the_assistant_turn(server) -> None:
    """Anthropic's prefill: a final assistant message is the answer's beginning; the reply holds what follows it,
    the same tokens as chat's continue_final_message."""
    body = {"max_tokens": 5, "temperature": 0, "ignore_eos": True}
    chat = post(server, "/v1/chat/completions", {"messages": MESSAGES, **body, "continue_final_message": True})
    msg = post(server, "/v1/messages", {"messages": MESSAGES, **body})
    assert msg.status_code == 200, msg.text
    text = "".join(b.get("text", "") for b in msg.json()["content"] if b["type"] == "text")
    assert text == (chat.json()["choices"][0]["message"]["content"] or "")
    assert msg.json()["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"]
