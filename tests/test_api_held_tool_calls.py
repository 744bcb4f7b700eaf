"""Tool calls held to the request's rules through the API, on the trained demo model: every call names an offered
tool, strict or not; OpenAI's strict function calling (`strict: true`: a strict tool's calls parse to arguments that
fit its schema, in `auto` and forced calls, streamed or not, on chat, the Responses and the Messages APIs; a strict
schema that cannot be enforced is a 400 naming it) and OpenAI's `allowed_tools` tool choice (every tool in the
prompt, only the allowed ones called)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest
from api_fixtures import module_demo_server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from demo_corpus import TOOL_CALCULATOR, TOOL_SEARCH, TOOL_WEATHER  # noqa: E402

# The demo model was trained on get_weather(city, days) for any city and 1-7 days; held to these, it must choose.
CITIES = ["Oslo", "Lisbon"]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": CITIES},
        "days": {"type": "integer", "minimum": 1, "maximum": 2},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
QUESTIONS = ["What's the weather in Tokyo for 5 days?", "Weather forecast for Paris, 4 days."]


def weather(strict: bool) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA, "strict": strict}}


def fits(arguments: str) -> bool:
    args = json.loads(arguments)
    return set(args) == {"city", "days"} and args["city"] in CITIES and args["days"] in (1, 2)


server = module_demo_server()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client: openai.OpenAI, question: str, strict: bool, **extra):
    return client.chat.completions.create(
        model="flint",
        messages=[{"role": "user", "content": question}],
        tools=[weather(strict)],
        temperature=0,
        max_tokens=96,
        **extra,
    )


@pytest.mark.parametrize("tool_choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_strict_calls_fit_their_schema(client: openai.OpenAI, tool_choice) -> None:
    for question in QUESTIONS:
        free = ask(client, question, strict=False, tool_choice=tool_choice).choices[0]
        held = ask(client, question, strict=True, tool_choice=tool_choice).choices[0]
        (free_call,) = free.message.tool_calls
        (held_call,) = held.message.tool_calls
        assert held.finish_reason == "tool_calls" and held_call.function.name == "get_weather"
        assert fits(held_call.function.arguments), held_call.function.arguments
        assert not fits(free_call.function.arguments), free_call.function.arguments  # the city asked for, unheld


def test_calls_name_only_offered_tools_under_auto(client: openai.OpenAI) -> None:
    """Strict or not, a call the model opens names an offered tool: the demo model, asked about a topic with only
    get_weather offered, reasons that it will call `search` (a tool it was trained on), and calls get_weather."""
    for strict in (False, True):
        for stream in (False, True):
            out = ask(client, "Tell me about Paris", strict=strict, stream=stream)
            if stream:
                names, reasoning = [], ""
                for chunk in out:
                    delta = chunk.choices[0].delta if chunk.choices else None
                    reasoning += getattr(delta, "reasoning_content", None) or "" if delta else ""
                    for tc in (delta.tool_calls or []) if delta else []:
                        names += [tc.function.name] if tc.function.name else []
            else:
                message = out.choices[0].message
                names = [tc.function.name for tc in message.tool_calls or []]
                reasoning = getattr(message, "reasoning_content", None) or ""
            assert "call search" in reasoning, reasoning
            assert names == ["get_weather"], (strict, stream, names)


def test_streamed_strict_call_fits(client: openai.OpenAI) -> None:
    stream = ask(client, QUESTIONS[0], strict=True, tool_choice="required", stream=True)
    pieces, names = [], []
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            names += [tc.function.name] if tc.function.name else []
            pieces.append(tc.function.arguments or "")
    assert names == ["get_weather"] and fits("".join(pieces)), pieces


def test_strict_function_tool_on_the_responses_api(client: openai.OpenAI) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True}
    response = client.responses.create(model="flint", input=QUESTIONS[1], tools=[tool], temperature=0)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and fits(calls[0].arguments), response.output


@pytest.mark.parametrize(
    ("parameters", "why"),
    [
        ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "string or integer"),
        ({"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 3}}}, "multipleOf"),
    ],
)
def test_a_strict_schema_that_cannot_be_enforced_is_a_400(server, parameters: dict, why: str) -> None:
    tools = [
        {"type": "function", "function": {"name": "ok", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": True}},
    ]
    body = {"model": "flint", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 4}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (
        error["param"] == "tools.1.function.parameters" and why in error["message"] and "tool 1 (f)" in error["message"]
    )
    flat = [{"type": "function", **t["function"]} for t in tools]  # the Responses API's tools, flat
    r = httpx.post(server.base_url + "/v1/responses", json={"model": "flint", "input": "hi", "tools": flat}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.1.parameters", r.text
    # Not strict, the same schema is only described to the model: the request runs.
    tools[1]["function"]["strict"] = False
    assert httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_strict_tool_on_the_messages_api(server) -> None:
    """Anthropic's strict tool use: the tool_use block's input fits the input_schema."""
    tool = {"name": "get_weather", "input_schema": SCHEMA, "strict": True}
    body = {
        "model": "flint",
        "max_tokens": 96,
        "temperature": 0,
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    r = httpx.post(server.base_url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (use,) = [block for block in r.json()["content"] if block["type"] == "tool_use"]
    assert fits(json.dumps(use["input"])), use


ALL_TOOLS = [TOOL_WEATHER, TOOL_CALCULATOR, TOOL_SEARCH]
ASK_WEATHER = "Weather forecast for Oslo, 3 days."


def allowed(mode: str, *names: str) -> dict:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def answer(client: openai.OpenAI, question: str, tool_choice):
    return client.chat.completions.create(
        model="flint",
        messages=[{"role": "user", "content": question}],
        tools=ALL_TOOLS,
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=96,
    )


def test_allowed_tools_keep_every_tool_in_the_prompt_and_call_only_the_allowed(client: openai.OpenAI) -> None:
    free = answer(client, ASK_WEATHER, "auto")
    assert [c.function.name for c in free.choices[0].message.tool_calls] == ["get_weather"]  # what the model calls
    for tool_choice, names in (
        (allowed("auto", "search"), {"search"}),
        (allowed("auto", "calculator", "search"), {"calculator", "search"}),
        (allowed("required", "search"), {"search"}),
    ):
        held = answer(client, ASK_WEATHER, tool_choice)
        assert held.usage.prompt_tokens == free.usage.prompt_tokens  # the same prompt: every tool described
        calls = held.choices[0].message.tool_calls or []
        assert {c.function.name for c in calls} <= names, calls
    # `required` makes a call where the model would answer in text; `auto` leaves it the text.
    assert answer(client, "What is 12 + 30?", allowed("auto", "search")).choices[0].message.tool_calls is None
    (call,) = answer(client, "What is 12 + 30?", allowed("required", "search")).choices[0].message.tool_calls
    assert call.function.name == "search"


def test_allowed_tools_on_the_responses_api_and_bad_choices(client: openai.OpenAI, server) -> None:
    flat = [{"type": "function", **t["function"]} for t in ALL_TOOLS]
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "calculator"}]}
    response = client.responses.create(model="flint", input=ASK_WEATHER, tools=flat, tool_choice=choice)
    assert [i.name for i in response.output if i.type == "function_call"] == ["calculator"]
    url = server.base_url + "/v1/chat/completions"
    base = {"model": "flint", "messages": [{"role": "user", "content": "hi"}], "tools": ALL_TOOLS}
    for bad, says in (
        (allowed("auto", "get_time"), "not in tools"),
        (allowed("sometimes", "search"), "mode"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "tools"),
        ({"type": "custom", "custom": {"name": "x"}}, "allowed_tools"),
    ):
        r = httpx.post(url, json={**base, "tool_choice": bad}, timeout=60)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
