"""The OpenAI-compatible API through the official `openai` client, against a real engine (tiny random model)."""

from __future__ import annotations

import json
import os
import re
import time

import httpx
import openai
import pytest
from api_fixtures import module_server, tiny_server, wait_until_idle
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from flint_engine.api.settings import APISettings

MSG = [{"role": "user", "content": "Hello there, how are you?"}]


server = module_server("api", APISettings(max_tokens_limit=4000))


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def raw_post(server, path: str, body: object, **kw) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60, **kw)


def sse_events(server, path: str, body: dict) -> list[str]:
    with httpx.stream("POST", server.base_url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def test_chat_completion_shape_and_usage(server, client) -> None:
    r = client.chat.completions.create(model="flint", messages=MSG, max_tokens=12, temperature=0, n=2)
    raw = raw_post(
        server, "/v1/chat/completions", {"model": "flint", "messages": MSG, "max_tokens": 12, "temperature": 0}
    ).json()
    ChatCompletion.model_validate(raw)
    assert raw["object"] == "chat.completion" and raw["id"].startswith("chatcmpl-")
    assert len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.finish_reason in ("stop", "length")
        assert c.message.role == "assistant"
        # thinking is on by default: the prompt ends with <think>, so output before </think> is reasoning
        assert c.message.model_extra["reasoning"] == c.message.model_extra["reasoning_content"]
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens <= 24
    # greedy n=2: both choices equal
    assert r.choices[0].message.model_extra["reasoning"] == r.choices[1].message.model_extra["reasoning"]


def _message_text(m: dict) -> tuple[str, str]:
    return m.get("reasoning") or "", m.get("content") or ""


def test_streaming_equals_non_streaming(server, client) -> None:
    body = {"model": "flint", "messages": MSG, "max_tokens": 24, "temperature": 0, "seed": 3}
    whole = raw_post(server, "/v1/chat/completions", body).json()["choices"][0]
    events = sse_events(
        server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in chunks[:-1])
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert (reasoning, content) == _message_text(whole["message"])
    finals = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert finals == [whole["finish_reason"]]


def test_streaming_with_the_client_and_n(client) -> None:
    stream = client.chat.completions.create(
        model="flint", messages=MSG, max_tokens=6, stream=True, n=3, seed=1, stream_options={"include_usage": True}
    )
    finished = set()
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1, 2}
    assert usage is not None and usage.completion_tokens <= 18


def test_thinking_off_gives_content_only(client) -> None:
    r = client.chat.completions.create(
        model="flint",
        messages=MSG,
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.model_extra.get("reasoning") is None


def test_logprobs(client) -> None:
    r = client.chat.completions.create(
        model="flint", messages=MSG, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert 1 <= len(content) <= 5
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert t.token == t.top_logprobs[0].token  # greedy takes the top token
        assert bytes(t.bytes).decode("utf-8", errors="replace") == t.token


def test_logprobs_without_top_logprobs(client) -> None:
    """`logprobs: true` alone returns each token's log-probability with no alternatives, as OpenAI does."""
    kw = {"model": "flint", "messages": MSG, "max_tokens": 5, "temperature": 0, "logprobs": True}
    with_top = client.chat.completions.create(**kw, top_logprobs=2).choices[0].logprobs.content
    alone = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert [t.token for t in alone] == [t.token for t in with_top]
    assert [t.logprob for t in alone] == pytest.approx([t.logprob for t in with_top], abs=1e-5)
    assert all(t.top_logprobs == [] for t in alone)
    streamed = [
        t
        for chunk in client.chat.completions.create(**kw, stream=True)
        if chunk.choices and chunk.choices[0].logprobs is not None
        for t in chunk.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in alone]


def test_logit_bias(server, client) -> None:
    """+100 on a token makes every greedy step take it; -100 on the greedy tokens makes the model write others."""
    plain = client.completions.create(model="flint", prompt=[5, 6, 7], max_tokens=4, temperature=0, logprobs=0)
    forced = client.completions.create(
        model="flint", prompt=[5, 6, 7], max_tokens=4, temperature=0, logit_bias={"42": 100}
    )
    want = raw_post(server, "/detokenize", {"tokens": [42] * 4}).json()["prompt"]
    assert forced.choices[0].text == want != plain.choices[0].text
    firsts = raw_post(server, "/tokenize", {"prompt": plain.choices[0].logprobs.tokens[0]}).json()["tokens"]
    avoided = client.completions.create(
        model="flint", prompt=[5, 6, 7], max_tokens=1, temperature=0, logit_bias={str(firsts[0]): -100}
    )
    assert avoided.choices[0].text != plain.choices[0].logprobs.tokens[0]
    chat = client.chat.completions.create(
        model="flint", messages=MSG, max_tokens=3, temperature=0, logprobs=True, logit_bias={"42": 100}
    )
    assert [t.token for t in chat.choices[0].logprobs.content] == [want[: len(want) // 4]] * 3


def test_allowed_token_ids(server, client) -> None:
    """vLLM's allowed_token_ids: every sampled token is one of them, on both endpoints, greedy and sampled."""
    allowed = [40, 41, 42]
    texts = {raw_post(server, "/detokenize", {"tokens": [t]}).json()["prompt"] for t in allowed}
    assert len(texts) == len(allowed)
    for temperature in (0.0, 1.0):
        r = client.completions.create(
            model="flint",
            prompt=[5, 6, 7],
            max_tokens=6,
            temperature=temperature,
            seed=3,
            logprobs=0,
            extra_body={"allowed_token_ids": allowed},
        )
        assert len(r.choices[0].logprobs.tokens) == 6 and set(r.choices[0].logprobs.tokens) <= texts
        chat = client.chat.completions.create(
            model="flint",
            messages=MSG,
            max_tokens=4,
            temperature=temperature,
            seed=3,
            logprobs=True,
            extra_body={"allowed_token_ids": allowed},
        )
        assert {t.token for t in chat.choices[0].logprobs.content} <= texts


def test_truncate_prompt_tokens(server, client) -> None:
    """vLLM's truncate_prompt_tokens keeps the prompt's last k tokens: the answer is the shorter prompt's."""
    ids = list(range(100, 120))
    cut = client.completions.create(
        model="flint", prompt=ids, max_tokens=6, temperature=0, echo=True, extra_body={"truncate_prompt_tokens": 5}
    )
    short = client.completions.create(model="flint", prompt=ids[-5:], max_tokens=6, temperature=0, echo=True)
    assert cut.usage.prompt_tokens == 5 and cut.choices[0].text == short.choices[0].text
    whole = client.completions.create(
        model="flint", prompt=ids, max_tokens=1, temperature=0, extra_body={"truncate_prompt_tokens": -1}
    )
    assert whole.usage.prompt_tokens == len(ids)  # shorter than the context: kept whole
    chat = client.chat.completions.create(
        model="flint", messages=MSG, max_tokens=2, temperature=0, extra_body={"truncate_prompt_tokens": 3}
    )
    assert chat.usage.prompt_tokens == 3


def test_completions_text_tokens_echo_stop(server, client) -> None:
    r = client.completions.create(
        model="flint", prompt="The quick brown fox", max_tokens=10, temperature=0, echo=True, logprobs=2
    )
    assert r.choices[0].text.startswith("The quick brown fox")
    # As OpenAI's echo: the prompt's tokens first, the very first without a logprob (null, which the SDK's type
    # leaves out), then the completion's.
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    plain = client.completions.create(model="flint", prompt="The quick brown fox", max_tokens=10, logprobs=2)
    Completion.model_validate(plain.model_dump())
    assert len(plain.choices[0].logprobs.tokens) == plain.usage.completion_tokens
    ids = raw_post(server, "/tokenize", {"prompt": "The quick brown fox"}).json()["tokens"]
    r2 = client.completions.create(model="flint", prompt=ids, max_tokens=10, temperature=0)
    assert r2.choices[0].text == r.choices[0].text[len("The quick brown fox") :]
    batch = client.completions.create(model="flint", prompt=["a b c", "d e f"], max_tokens=3, n=2, temperature=0)
    assert len(batch.choices) == 4
    full = r2.choices[0].text
    if len(full) > 4:
        stop = full[2:4]
        r3 = client.completions.create(model="flint", prompt=ids, max_tokens=10, temperature=0, stop=[stop])
        assert r3.choices[0].text == full[: full.index(stop)] and r3.choices[0].finish_reason == "stop"


def test_completion_streaming(server) -> None:
    events = sse_events(
        server,
        "/v1/completions",
        {"prompt": "abc", "max_tokens": 5, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    whole = raw_post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "temperature": 0}).json()
    assert text == whole["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MSG, "temperature": "hot"}, "temperature"),
        ({"messages": MSG, "temperature": 3}, "temperature"),
        ({"messages": MSG, "n": 0}, "n"),
        ({"messages": MSG, "n": 1000}, "n"),
        ({"messages": MSG, "max_tokens": -1}, "max_tokens"),
        ({"messages": MSG, "max_tokens": 10**6}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"messages": MSG, "top_logprobs": 3}, None),
        ({"messages": MSG, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {}}}, None),
        ({"messages": MSG, "tools": []}, None),
        (
            {
                "messages": MSG,
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            None,
        ),
        ({"messages": MSG, "stream_options": {"include_usage": True}}, None),
        ({"messages": MSG, "stop": ["x"] * 100}, "stop"),
        ({"messages": MSG, "seed": 2**70}, "seed"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, None),
        ({"messages": MSG, "logit_bias": {"five": 10}}, "logit_bias"),
        ({"messages": MSG, "logit_bias": {"5": 101}}, "logit_bias"),
        ({"messages": MSG, "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"messages": MSG, "logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"messages": MSG, "allowed_token_ids": [99999999]}, "allowed_token_ids"),
        ({"messages": MSG, "allowed_token_ids": []}, "allowed_token_ids"),
        ({"messages": MSG, "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"messages": MSG, "prompt_logprobs": 1, "stream": True}, None),
        ({"messages": MSG, "guided_grammar": "root ::= x"}, "guided_grammar"),
        ({"messages": MSG, "guided_grammar": 'root ::= "a'}, "guided_grammar"),
        ({"messages": MSG, "structured_outputs": {"grammar": "root ::= x"}}, None),
        ({"messages": MSG, "structured_outputs": {"grammar": 'root ::= "a"'}, "guided_regex": "a"}, None),
        ({"messages": MSG, "structured_outputs": {"lark": "start: x"}}, None),
        ({"messages": MSG, "guided_regex": "(abc"}, None),
        ({"messages": MSG, "guided_regex": "a" * 5000}, None),
        ({"messages": MSG, "guided_choice": []}, None),
        ({"messages": MSG, "guided_choice": ["a", ""]}, None),
        ({"messages": MSG, "guided_choice": ["a", 3]}, "guided_choice.1"),
        ({"messages": MSG, "guided_choice": [str(i) for i in range(1025)]}, None),
        ({"messages": MSG, "structured_outputs": {"choice": "yes"}}, None),
        ({"messages": MSG, "guided_choice": ["a"], "guided_regex": "a"}, None),
        ({"messages": MSG, "guided_choice": ["a"], "response_format": {"type": "json_object"}}, None),
        ({"messages": MSG, "guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, None),
        ({"messages": MSG, "guided_json": "{not json"}, None),
        ({"messages": MSG, "guided_json": {"type": "string", "pattern": "x"}}, None),
        ({"messages": MSG, "bad_words": ["  "]}, "bad_words"),
        ({"messages": MSG, "bad_words": "x"}, "bad_words"),
        ({"messages": MSG, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"messages": MSG, "truncate_prompt_tokens": 10**9}, "truncate_prompt_tokens"),
        (
            {
                "messages": MSG,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            },
            None,
        ),
        (
            {"messages": MSG, "tools": [{"type": "function", "function": {"name": "get weather"}}]},
            "tools.0.function.name",
        ),
        ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f<x>"}}]}, "tools.0.function.name"),
    ],
)
def test_invalid_requests_are_400_in_openai_shape(server, body: dict, param: str | None) -> None:
    r = raw_post(server, "/v1/chat/completions", {"model": "flint", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content",
            "content part type 'image_url' is not supported",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
            "Field required",
        ),
        ("/v1/chat/completions", {"messages": MSG, "tool_choice": "any"}, "tool_choice", "got 'any'"),
        ("/v1/chat/completions", {"messages": MSG, "tool_choice": {"type": "function"}}, "tool_choice.function", ""),
        ("/v1/chat/completions", {"messages": MSG, "functions": [{"name": "f g"}]}, "functions.0.name", "whitespace"),
        ("/v1/chat/completions", {"messages": MSG, "function_call": "always"}, "function_call", ""),
        ("/v1/chat/completions", {"messages": MSG, "audio": {"voice": "x"}}, "audio", "not supported"),
        ("/v1/chat/completions", {"messages": MSG, "modalities": ["text", "audio"]}, "modalities", "'text'"),
        ("/v1/chat/completions", {"messages": MSG, "web_search_options": {}}, "web_search_options", "not supported"),
        ("/v1/chat/completions", {"messages": MSG, "stop_token_ids": [10**9]}, "stop_token_ids", "vocabulary"),
        ("/v1/completions", {"prompt": [5, -1]}, "prompt", "token id -1 is outside the vocabulary"),
        ("/v1/completions", {"prompt": [[5], [2**40]]}, "prompt", "outside the vocabulary"),
        ("/v1/completions", {"prompt": "x", "suffix": "y"}, None, "suffix is not supported"),
        ("/v1/completions", {"prompt": "x", "logits_processors": ["m.P"]}, "logits_processors", "not supported"),
        ("/v1/chat/completions", {"messages": MSG, "logprob_token_ids": [5]}, "logprob_token_ids", "not supported"),
        ("/v1/completions", {"prompt": "x", "prompt_embeds": "AAAA"}, "prompt_embeds", "not supported"),
        ("/v1/chat/completions", {"messages": MSG, "repetition_detection": {}}, "repetition_detection", "supported"),
        ("/v1/completions", {"prompt": "x", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not"),
    ],
)
def test_refusals_name_the_problem(server, path: str, body: dict, param: str | None, says: str) -> None:
    """Each refusal names the request's field as the client spelled it (no union-branch tags, no pydantic prefix)."""
    r = raw_post(server, path, {"model": "flint", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    assert "Value error" not in err["message"] and "literal[" not in err["message"]


def test_text_only_modality_and_text_parts_are_served(server) -> None:
    body = {"model": "flint", "max_tokens": 2, "modalities": ["text"]}
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = raw_post(server, "/v1/chat/completions", {**body, "messages": parts})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_other_errors(server, client) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=MSG)
    assert e.value.body["code"] == "model_not_found"
    r = httpx.get(server.base_url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        content=b"{not json",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.base_url + "/v1/chat/completions", content=b"x" * (9 * 2**20), timeout=30)
    assert r.status_code == 413
    long_prompt = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="flint", messages=long_prompt, max_tokens=5)
    assert (
        "maximum context length is 4096" in e.value.body["message"]
        and e.value.body["code"] == "context_length_exceeded"
    )
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="flint", prompt=[5] * 5000, max_tokens=5)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    assert "your prompt resulted in 5000 tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="flint", prompt=[5] * 4000, max_tokens=200)
    assert "requested 4200 tokens (4000 in the messages, 200 in the completion)" in e.value.body["message"]


def test_unknown_fields_are_ignored(server) -> None:
    r = raw_post(
        server,
        "/v1/chat/completions",
        {"model": "flint", "messages": MSG, "max_tokens": 2, "frobnicate": True, "metadata": {"a": 1}},
    )
    assert r.status_code == 200


def test_tokenize_detokenize_models_version_health_metrics(server, client) -> None:
    t = raw_post(server, "/tokenize", {"prompt": "héllo wörld", "return_token_strs": True}).json()
    assert t["count"] == len(t["tokens"]) == len(t["token_strs"]) and t["max_model_len"] == 4096
    assert raw_post(server, "/detokenize", {"tokens": t["tokens"]}).json()["prompt"] == "héllo wörld"
    assert raw_post(server, "/detokenize", {"tokens": [10**9]}).status_code == 400
    chat = raw_post(server, "/tokenize", {"messages": MSG}).json()
    assert chat["count"] > t["count"]
    assert [m.id for m in client.models.list().data] == ["flint"]
    assert client.models.retrieve("flint").id == "flint"
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.base_url + "/version").json()["version"]
    client.completions.create(model="flint", prompt="count", max_tokens=2)
    [replica] = httpx.get(server.base_url + "/replicas").json()["data"]
    assert replica["id"] == "local" and replica["healthy"] and replica["pid"] == os.getpid()
    assert replica["device"] == "cpu" and replica["generation_tokens_total"] > 0
    text = httpx.get(server.base_url + "/metrics").text
    for name in (
        "flint:num_requests_running",
        "flint:kv_cache_usage_perc",
        "flint:prompt_tokens_total",
        "flint:time_to_first_token_seconds_bucket",
        'flint:request_success_total{finished_reason="length"',
    ):
        assert name in text


def test_disconnecting_stream_frees_the_cache(server) -> None:
    body = {"model": "flint", "messages": MSG, "max_tokens": 500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert server.engine.engine.metrics.snapshot()["num_requests_running"] == 1
    assert wait_until_idle(server)
    assert server.engine.engine.metrics.snapshot()["request_success_total"]["abort"] >= 1


def test_disconnecting_non_streaming_client_aborts(server) -> None:
    before = server.engine.engine.metrics.snapshot()["request_success_total"]["abort"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + "/v1/chat/completions",
            timeout=0.5,
            json={"model": "flint", "messages": MSG, "max_tokens": 4000, "ignore_eos": True},
        )
    assert wait_until_idle(server)
    assert server.engine.engine.metrics.snapshot()["request_success_total"]["abort"] == before + 1


def test_overload_returns_503_with_retry_after(tmp_path) -> None:
    srv = tiny_server(tmp_path, max_waiting_requests=2)
    try:
        srv.engine.paused.set()  # a stalled engine: requests pile up in the queue
        import threading

        results: list[int] = []

        def call() -> None:
            r = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
            results.append(r.status_code)

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        r = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_overloaded"
        srv.engine.paused.clear()
        for t in threads:
            t.join()
        assert results == [200, 200]
    finally:
        srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_format(client, stream: bool) -> None:
    """Structured outputs: even a random model answers with an instance of the schema (constrained sampling)."""
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green"]},
            "size": {"type": "integer", "minimum": 3, "maximum": 40},
            "code": {"type": "string", "pattern": "^[a-f]{2,4}$"},
        },
        "required": ["color", "size", "code"],
        "additionalProperties": False,
    }
    for seed in range(2):
        kw = {
            "model": "flint",
            "messages": MSG,
            "max_tokens": 400,
            "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}},
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 5},
        }
        if stream:
            text = "".join(
                c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True) if c.choices
            )
        else:
            r = client.chat.completions.create(**kw)
            assert r.choices[0].finish_reason == "stop", r
            text = r.choices[0].message.content
        value = json.loads(text)
        assert set(value) == {"color", "size", "code"} and value["color"] in ("red", "green")
        assert isinstance(value["size"], int) and 3 <= value["size"] <= 40 and re.fullmatch("[a-f]{2,4}", value["code"])
    with pytest.raises(openai.BadRequestError, match="'multipleOf' is not supported"):
        client.chat.completions.create(
            model="flint",
            messages=MSG,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": {"type": "object", "properties": {"a": {"multipleOf": 2}}}},
            },
        )


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
        {"guided_json": json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})},
        {"structured_outputs": {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}},
        {"structured_outputs": {"json_object": True}},
    ],
)
def test_vllm_json_constraints_are_response_formats(server, extra: dict) -> None:
    """vLLM's guided_json / structured_outputs (json, json_object) constrain the answer as response_format does."""
    body = {
        "model": "flint",
        "messages": MSG,
        "max_tokens": 400,
        "seed": 1,
        "top_k": 5,
        "chat_template_kwargs": {"enable_thinking": False},
        **extra,
    }
    r = raw_post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["message"]["content"]
    if "json_object" in json.dumps(extra):  # any object: a random model may run out of tokens inside a string
        assert content.lstrip().startswith("{")
        assert choice["finish_reason"] == "length" or isinstance(json.loads(content), dict)
    else:  # the schema's only key: the object closes
        assert choice["finish_reason"] == "stop" and set(json.loads(content)) <= {"ok"}
        assert all(isinstance(v, bool) for v in json.loads(content).values())
    # On text completions (as vLLM's) the constraint holds from the first token.
    r = raw_post(server, "/v1/completions", {"model": "flint", "prompt": "x", "max_tokens": 400, "seed": 1, **extra})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"].lstrip().startswith("{")
    assert choice["finish_reason"] == "length" or isinstance(json.loads(choice["text"]), dict)


@pytest.mark.parametrize("thinking", [True, False])
def test_json_object_mode_gives_a_json_object(client, thinking: bool) -> None:
    """Even a random model answers with one parseable JSON object in JSON mode (constrained sampling)."""
    for seed in range(3):
        r = client.chat.completions.create(
            model="flint",
            messages=MSG,
            max_tokens=200,
            seed=seed,
            response_format={"type": "json_object"},
            extra_body={"chat_template_kwargs": {"enable_thinking": thinking}, "top_k": 5},
        )
        choice = r.choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:  # out of tokens: still a valid prefix of one object, begun (blank runs are capped)
            assert choice.message.content is not None and choice.message.content.lstrip().startswith("{")


def test_a_stopped_server_lets_go_of_its_engine(tmp_path) -> None:
    """FastAPI caches every route's function for the life of the process; a stopped server's engine (its model and
    KV cache) must still be freed, or each server a process starts and stops keeps its memory."""
    import gc
    import weakref

    from api_fixtures import tiny_checkpoint, tiny_engine

    from flint_engine.api.server import start_local_server

    engine = tiny_engine(tiny_checkpoint(tmp_path))
    server = start_local_server(engine, APISettings())
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    server.stop()
    gone = weakref.ref(engine)
    del engine, server
    gc.collect()
    assert gone() is None
