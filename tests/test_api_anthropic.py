"""`POST /v1/messages` (Anthropic's Messages API, as vLLM and llama.cpp serve it) on the trained demo model: the same
answers as the chat endpoint for the same conversation, as content blocks and Anthropic's events and errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from api_fixtures import module_demo_server, named_events

from flint_engine.api.settings import APISettings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from demo_corpus import TOOL_WEATHER  # noqa: E402

KEY = "sk-anthropic-style-key"
# The tool the demo model was trained on, in Anthropic's shape and the chat one.
WEATHER = {
    "name": TOOL_WEATHER["function"]["name"],
    "description": TOOL_WEATHER["function"]["description"],
    "input_schema": TOOL_WEATHER["function"]["parameters"],
}
CHAT_WEATHER = TOOL_WEATHER
ASK_WEATHER = "Weather forecast for Oslo, 3 days."
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


server = module_demo_server(APISettings(api_keys=[KEY]))


def messages(server, body: dict, path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": "flint", **body}, headers=HEADERS, timeout=120)


def chat(server, body: dict) -> dict:
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "flint", **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def blocks(message: dict, kind: str) -> list[dict]:
    return [b for b in message["content"] if b["type"] == kind]


def test_text_answer_equals_the_chat_endpoint(server) -> None:
    body = {"max_tokens": 64, "temperature": 0, "system": "Be brief."}
    m = messages(server, {**body, "messages": [{"role": "user", "content": "What is 7 + 8?"}]}).json()
    c = chat(
        server,
        {**{k: v for k, v in body.items() if k != "system"}, "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 + 8?"}
        ]},
    )  # fmt: skip
    message = c["choices"][0]["message"]
    assert m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_")
    assert [b["type"] for b in m["content"]] == ["thinking", "text"]
    assert blocks(m, "thinking")[0]["thinking"] == message["reasoning_content"]
    assert blocks(m, "text")[0]["text"] == message["content"] and m["stop_reason"] == "end_turn"
    assert m["usage"]["input_tokens"] == c["usage"]["prompt_tokens"]
    assert m["usage"]["output_tokens"] == c["usage"]["completion_tokens"]
    counted = messages(server, {"system": "Be brief.", "messages": [{"role": "user", "content": "What is 7 + 8?"}]},
                       "/v1/messages/count_tokens")  # fmt: skip
    assert counted.json() == {"input_tokens": m["usage"]["input_tokens"]}


def test_tool_use_and_its_result(server) -> None:
    ask = [{"role": "user", "content": ASK_WEATHER}]
    m = messages(server, {"max_tokens": 96, "temperature": 0, "tools": [WEATHER], "messages": ask}).json()
    [use] = blocks(m, "tool_use")
    assert use["name"] == "get_weather" and use["input"] == {"city": "Oslo", "days": 3}
    assert m["stop_reason"] == "tool_use"
    result = json.dumps({"forecast": "sunny", "high_c": 21})
    [thought] = blocks(m, "thinking")  # sent back as returned: the tool loop's thinking stays in the prompt
    turn = {"role": "assistant", "content": [thought, {"type": "text", "text": "Let me check."}, use]}
    reply = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": result}]}
    answer = messages(server, {"max_tokens": 96, "temperature": 0, "tools": [WEATHER], "messages": [*ask, turn, reply]})
    answer = answer.json()
    call = {
        "id": use["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(use["input"])},
    }
    chat_turn = {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": thought["thinking"],
        "tool_calls": [call],
    }
    chat_reply = {"role": "tool", "tool_call_id": use["id"], "content": result}
    body = {"max_tokens": 96, "temperature": 0, "tools": [CHAT_WEATHER], "messages": [*ask, chat_turn, chat_reply]}
    c = chat(server, body)
    message = c["choices"][0]["message"]
    assert answer["usage"]["input_tokens"] == c["usage"]["prompt_tokens"]
    bare = {**turn, "content": [b for b in turn["content"] if b["type"] != "thinking"]}
    counted = messages(server, {"tools": [WEATHER], "messages": [*ask, bare, reply]}, "/v1/messages/count_tokens")
    assert counted.json()["input_tokens"] < answer["usage"]["input_tokens"]  # the thinking reached the prompt
    assert [b.get("text") for b in blocks(answer, "text")] == ([message["content"]] if message["content"] else [])
    again = [(b["name"], b["input"]) for b in blocks(answer, "tool_use")]
    assert again == [
        (t["function"]["name"], json.loads(t["function"]["arguments"])) for t in message.get("tool_calls") or []
    ]


def _events(server, body: dict) -> list[tuple[str, dict]]:
    events = named_events(server.base_url + "/v1/messages", {"model": "flint", **body, "stream": True}, HEADERS)
    return [(e["type"], e) for e in events]


@pytest.mark.parametrize("tools", [False, True])
def test_stream_rebuilds_the_whole_message(server, tools: bool) -> None:
    body = {
        "max_tokens": 96,
        "temperature": 0,
        "messages": [{"role": "user", "content": ASK_WEATHER if tools else "What is 7 + 8?"}],
    }
    if tools:
        body["tools"] = [WEATHER]
    whole = messages(server, body).json()
    events = _events(server, body)
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    rebuilt: list[dict] = []
    for kind, data in events:
        if kind == "content_block_start":
            assert data["index"] == len(rebuilt)
            rebuilt.append(dict(data["content_block"]) | {"partial_json": ""})
        elif kind == "content_block_delta":
            block, delta = rebuilt[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                block["partial_json"] += delta["partial_json"]
    for block in rebuilt:
        partial = block.pop("partial_json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(partial)
    strip = [{k: v for k, v in b.items() if k != "id"} for b in whole["content"]]
    assert [{k: v for k, v in b.items() if k != "id"} for b in rebuilt] == strip
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == whole["stop_reason"]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_thinking_off_stop_sequences_and_max_tokens(server) -> None:
    ask = [{"role": "user", "content": "What is 7 + 8?"}]
    off = messages(server, {"max_tokens": 32, "temperature": 0, "messages": ask, "thinking": {"type": "disabled"}})
    assert [b["type"] for b in off.json()["content"]] == ["text"]
    stop = messages(server, {"max_tokens": 64, "temperature": 0, "messages": ask, "stop_sequences": ["="]}).json()
    assert stop["stop_reason"] == "stop_sequence" and stop["stop_sequence"] == "="
    assert "=" not in json.dumps(stop["content"])
    cut = messages(server, {"max_tokens": 3, "temperature": 0, "messages": ask}).json()
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 3


@pytest.mark.parametrize(
    ("body", "status", "kind", "says"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "invalid_request_error",
            "'image' is not supported",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "w"}],
            },
            400,
            "invalid_request_error",
            "server tools",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "mcp_servers": [{}]},
            400,
            "invalid_request_error",
            "mcp_servers",
        ),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}, 400, "invalid_request_error", "role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "all"}},
            400,
            "invalid_request_error",
            "tool_choice",
        ),
        (
            {"max_tokens": 5, "model": "claude-9", "messages": [{"role": "user", "content": "hi"}]},
            404,
            "not_found_error",
            "claude-9",
        ),
    ],
)
def test_errors_in_anthropic_shape(server, body: dict, status: int, kind: str, says: str) -> None:
    r = messages(server, body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind and says in err["error"]["message"], err


def test_forced_tools_and_the_key_header(server) -> None:
    ask = [{"role": "user", "content": ASK_WEATHER}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = messages(
            server, {"max_tokens": 96, "temperature": 0, "tools": [WEATHER], "messages": ask, "tool_choice": choice}
        )
        assert m.json()["stop_reason"] == "tool_use" and blocks(m.json(), "tool_use")[0]["name"] == "get_weather"
    r = httpx.post(
        server.base_url + "/v1/messages", json={"model": "flint", "max_tokens": 2, "messages": ask}, timeout=60
    )
    # No key: the gate refuses before any route, in Anthropic's shape here, with its header.
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
    }
    assert "x-api-key" in r.json()["error"]["message"]
    big = httpx.post(
        server.base_url + "/v1/messages", content=b"{" + b" " * (9 * 2**20) + b"}", headers=HEADERS, timeout=60
    )
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "flint", "messages": ask})
    assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape there


def test_the_anthropic_sdk_reads_messages_streams_tools_and_errors(server) -> None:
    """Anthropic's own client against this server: a message, a tool loop, a thinking budget, omitted thinking, a
    JSON output format, the stream helper's accumulated message (built from our events alone) equal to the whole
    one, token counting and typed errors. (The SDK no longer sends temperature: greedy goes in extra_body.)"""
    import anthropic

    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    greedy = {"temperature": 0}
    ask = [{"role": "user", "content": "What is 7 + 8?"}]
    whole = client.messages.create(model="flint", max_tokens=64, messages=ask, extra_body=greedy)
    assert whole.type == "message" and whole.stop_reason == "end_turn"
    assert [b.type for b in whole.content] == ["thinking", "text"] and "15" in whole.content[1].text
    with client.messages.stream(model="flint", max_tokens=64, messages=ask, extra_body=greedy) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert "".join(texts) == whole.content[1].text
    assert streamed.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})

    weather = [{"role": "user", "content": ASK_WEATHER}]
    call = client.messages.create(model="flint", max_tokens=96, messages=weather, tools=[WEATHER], extra_body=greedy)
    [use] = [b for b in call.content if b.type == "tool_use"]
    assert call.stop_reason == "tool_use" and use.name == "get_weather" and use.input == {"city": "Oslo", "days": 3}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}
    turns = [*weather, {"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    after = client.messages.create(model="flint", max_tokens=96, messages=turns, tools=[WEATHER], extra_body=greedy)
    assert after.stop_reason in ("end_turn", "tool_use", "max_tokens") and after.content

    capped = client.messages.create(
        model="flint", max_tokens=64, messages=ask, thinking={"type": "enabled", "budget_tokens": 3}, extra_body=greedy
    )
    assert whole.content[0].thinking.startswith(capped.content[0].thinking)
    assert len(capped.content[0].thinking) < len(whole.content[0].thinking)
    for kind in ("adaptive", "between_tools"):
        same = client.messages.create(
            model="flint", max_tokens=64, messages=ask, thinking={"type": kind}, extra_body=greedy
        )
        assert same.content == whole.content
    hidden = {"type": "adaptive", "display": "omitted"}
    omitted = client.messages.create(model="flint", max_tokens=64, messages=ask, thinking=hidden, extra_body=greedy)
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == ""
    assert omitted.content[1:] == whole.content[1:]
    with client.messages.stream(
        model="flint", max_tokens=64, messages=ask, thinking=hidden, extra_body=greedy
    ) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in final.content] == [
        (b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in omitted.content
    ]

    schema = {"type": "object", "properties": {"even": {"type": "boolean"}}, "required": ["even"]}
    shaped = client.messages.create(
        model="flint",
        max_tokens=200,
        messages=ask,
        output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
        extra_body=greedy,
    )
    [text] = [b for b in shaped.content if b.type == "text"]
    assert shaped.stop_reason == "end_turn" and isinstance(json.loads(text.text)["even"], bool)

    counted = client.messages.count_tokens(model="flint", messages=ask)
    assert counted.input_tokens == whole.usage.input_tokens
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="flint", max_tokens=8, messages=[{"role": "robot", "content": "x"}])
    assert info.value.body["type"] == "error" and "role" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="flint", max_tokens=8, messages=ask, output_config={"format": {"type": "xml"}})
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model="flint", max_tokens=8, messages=ask
        )
