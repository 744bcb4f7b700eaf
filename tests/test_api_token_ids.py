"""vLLM's token tracing on completions and chat: `return_token_ids` (the prompt's and each choice's token ids beside
the text, streamed or not) and `return_tokens_as_token_ids` (logprobs name tokens "token_id:<id>")."""

from __future__ import annotations

import httpx
import openai
import pytest
from api_fixtures import module_server, stream_chunks

server = module_server("token-ids")

PROMPT = "Count: 1 2 3"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.base_url}{path}", json={"model": "flint", **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(server, **body) -> list[int]:
    return post(server, "/tokenize", body)["tokens"]


def test_completions_return_each_choices_token_ids(server) -> None:
    """Each choice carries its prompt's ids (as /tokenize reads the prompt) and the ids it generated (as many as the
    usage counts; with logprobs, the same tokens, each named by its id); the text offsets still count the text."""
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 2, "n": 2}
    plain = post(server, "/v1/completions", body)
    got = post(server, "/v1/completions", {**body, "return_token_ids": True, "return_tokens_as_token_ids": True})
    prompt_ids = tokenize(server, prompt=PROMPT)
    assert got["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in got["choices"]) == 12
    for c, p in zip(got["choices"], plain["choices"], strict=True):
        assert c["prompt_token_ids"] == prompt_ids
        assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
        assert c["text"] == p["text"] and c["logprobs"]["text_offset"] == p["logprobs"]["text_offset"]
        assert c["logprobs"]["token_logprobs"] == pytest.approx(p["logprobs"]["token_logprobs"])
        for named, texts in zip(c["logprobs"]["top_logprobs"], p["logprobs"]["top_logprobs"], strict=True):
            # named by text, two tokens whose bytes read as the same string (pieces of a character: "\ufffd") share
            # a key; by id each keeps its own
            assert len(named) == 2 and all(k.startswith("token_id:") for k in named)
            assert all(any(v == pytest.approx(w) for w in named.values()) for v in texts.values())
        # the ids name the text: their tokens' own strings are what the plain answer's logprobs show
        assert [int(t.split(":")[1]) for t in c["logprobs"]["tokens"]] == c["token_ids"]
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]


def test_completions_token_ids_through_the_openai_client_with_token_prompts(server) -> None:
    """Token-id prompts come back as given; a request's choices are each traced."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    ids = tokenize(server, prompt=PROMPT)
    out = client.completions.create(
        model="flint",
        prompt=[ids, ids[:3]],
        max_tokens=4,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    assert [c.model_extra["prompt_token_ids"] for c in out.choices] == [ids, ids[:3]]
    assert all(len(c.model_extra["token_ids"]) == 4 for c in out.choices)


def test_streamed_completions_carry_the_same_ids(server) -> None:
    """Streamed, each choice's chunks hold its generated ids in order (tokens without text of their own, such as
    special tokens the text skips, still come), and the prompt's ids once, with the choice's first chunk."""
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "n": 2, "return_token_ids": True}
    whole = post(server, "/v1/completions", body)
    chunks = stream_chunks(server, "/v1/completions", body)
    for i, want in enumerate(whole["choices"]):
        mine = [c for chunk in chunks for c in chunk["choices"] if c["index"] == i]
        assert [t for c in mine for t in c["token_ids"]] == want["token_ids"]
        assert "".join(c["text"] for c in mine) == want["text"]
        assert [c.get("prompt_token_ids") for c in mine] == [want["prompt_token_ids"]] + [None] * (len(mine) - 1)


def test_chat_returns_the_templated_prompts_and_each_choices_ids(server) -> None:
    """Chat: the response holds the templated prompt's ids (as /tokenize templates the messages), each choice the
    ids it generated, thinking included; with logprobs each token is named by its id."""
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "n": 2}
    got = post(server, "/v1/chat/completions", {**body, "return_token_ids": True})
    assert got["prompt_token_ids"] == tokenize(server, messages=MESSAGES)
    assert [len(c["token_ids"]) for c in got["choices"]] == [6, 6]
    assert got["usage"]["completion_tokens"] == 12
    plain = post(server, "/v1/chat/completions", body)
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    traced = {"return_tokens_as_token_ids": True, "return_token_ids": True}
    named = post(server, "/v1/chat/completions", {**body, "n": 1, "logprobs": True, "top_logprobs": 2, **traced})
    [choice] = named["choices"]
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"].startswith("token_id:") for e in content)
    tok = server.engine.engine.tokenizer
    assert [e["bytes"] for e in content] == [list(tok.token_bytes(t)) for t in choice["token_ids"]]


def test_streamed_chat_carries_the_same_ids(server) -> None:
    """Streamed chat: the prompt's ids with each choice's first chunk, every generated id once, in order."""
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    whole = post(server, "/v1/chat/completions", body)
    chunks = stream_chunks(server, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    ids = [t for chunk in chunks for c in chunk["choices"] for t in c["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]


def test_a_forced_tool_call_traces_the_tokens_it_appended(server) -> None:
    """A forced tool call is generated in phases, the call's opening appended between them: the choice's ids are
    every token after the prompt, the appended ones included, so prompt + ids is what the model read."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body = {
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 0,
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "chat_template_kwargs": {"enable_thinking": False},
        "return_token_ids": True,
    }
    got = post(server, "/v1/chat/completions", body)
    [choice] = got["choices"]
    tok = server.engine.engine.tokenizer
    assert tok.decode(choice["token_ids"], skip_special_tokens=False).startswith("<tool_call>get_weather")
    assert got["usage"]["completion_tokens"] == len(choice["token_ids"])
    chunks = stream_chunks(server, "/v1/chat/completions", body)
    assert [t for chunk in chunks for c in chunk["choices"] for t in c["token_ids"]] == choice["token_ids"]
