"""Reasoning and tool-call parsing through the HTTP API, streamed and whole, with a scripted model.

The backend here replays a fixed GLM-4.7 output token by token (real tokenizer, real detokenizer, real stop
handling), so the API's templating, parsing, forced tool calls and SSE shapes are checked on known text.
The engine itself is covered by the other API tests.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from api_fixtures import tiny_checkpoint

from flint_engine.api.app import build_app
from flint_engine.api.server import free_port
from flint_engine.async_engine import ChoiceOutput
from flint_engine.detokenizer import IncrementalDetokenizer
from flint_engine.engine import RequestOutput
from flint_engine.sampling_params import SamplingParams
from flint_engine.stop_strings import StopStringText
from flint_engine.tokenizer import FlintTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}


class ScriptedBackend:
    """Answers with `scripts[last user message]`, continuing from whatever the prompt already holds of it."""

    model_name = "flint"
    max_model_len = 4096
    max_context = 4096
    generation_defaults: dict[str, Any] = {}

    def __init__(self, tokenizer: FlintTokenizer, scripts: dict[str, str]) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.prompts: list[str] = []
        self.params: list[SamplingParams] = []

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[ChoiceOutput]:
        prompt = self.tokenizer.decode(prompt_ids)
        self.prompts.append(prompt)
        self.params.append(params)
        user_turn = prompt.rsplit("<|user|>", 1)[1]
        question = user_turn.split("<|assistant|>", 1)[0]
        script = self.scripts[question]
        generated = user_turn.split("<|assistant|>", 1)[1]
        generated = generated.removeprefix("<think>").removeprefix("</think>")
        assert script.startswith(generated), (script, generated)
        ids = [*self.tokenizer.encode(script[len(generated) :]), min(self.tokenizer.eos_token_ids)]
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        stops = StopStringText(params.stop, params.include_stop_str_in_output)
        for n, tid in enumerate(ids[: params.max_tokens], 1):
            if tid in self.tokenizer.eos_token_ids:
                yield ChoiceOutput(
                    0, RequestOutput(request_id, [tid], stops.flush(), True, "stop", tid, len(prompt_ids), n)
                )
                return
            text = stops.add(detok.add(tid))
            if stops.stopped is not None:
                yield ChoiceOutput(
                    0, RequestOutput(request_id, [tid], text, True, "stop", stops.stopped, len(prompt_ids), n)
                )
                return
            last = n == params.max_tokens
            if last:
                text += stops.add(detok.flush()) + stops.flush()
            yield ChoiceOutput(
                0, RequestOutput(request_id, [tid], text, last, "length" if last else None, None, len(prompt_ids), n)
            )

    async def check_health(self) -> tuple[bool, str]:
        return True, "ok"

    async def metrics_snapshots(self) -> list:
        return []

    async def replicas(self) -> list:
        return []


SCRIPTS = {
    "hi": "The user greets me. Reply briefly.</think>Hello! How can I help?",
    "weather": "Need the weather tool.</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key>"
    '<arg_value>Oslo, "NO"</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>',
    "two": "Two calls.</think><tool_call>calc<arg_key>a</arg_key><arg_value>1.5</arg_value><arg_key>b</arg_key>"
    "<arg_value>2</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome"
    "</arg_value></tool_call>",
    "forced": "I should use a tool.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
    "</arg_value></tool_call>",
    "inside": "Let me call it right away <tool_call>calc<arg_key>a</arg_key><arg_value>2</arg_value>"
    "<arg_key>b</arg_key><arg_value>3</arg_value></tool_call>",
    "long": "x " * 400 + "</think>done",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    import threading
    import time

    from flint_engine.checkpoint import open_source

    src = open_source(tiny_checkpoint(tmp_path_factory.mktemp("scripted")))
    tok = FlintTokenizer.from_gguf_metadata(src.meta)
    backend = ScriptedBackend(tok, SCRIPTS)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(backend), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", backend
    srv.should_exit = True
    t.join(5)


def ask(base: str, question: str, stream: bool, **extra: Any) -> dict:
    """The assistant message, accumulated from the stream or taken whole (a deprecated `function_call` too)."""
    body = {"model": "flint", "messages": [{"role": "user", "content": question}], "max_tokens": 1000, **extra}
    if not stream:
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        return {**ch["message"], "finish_reason": ch["finish_reason"]}
    msg: dict[str, Any] = {"reasoning": None, "content": None, "tool_calls": {}, "function_call": None}
    with httpx.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])["choices"][0]
            d = ch["delta"]
            for field in ("reasoning", "content"):
                if d.get(field):
                    msg[field] = (msg[field] or "") + d[field]
            if d.get("function_call"):
                fc = msg["function_call"] = msg["function_call"] or {"name": None, "arguments": ""}
                if "name" in d["function_call"]:
                    assert fc["name"] is None  # the name comes once
                    fc["name"] = d["function_call"]["name"]
                fc["arguments"] += d["function_call"]["arguments"]
            for tc in d.get("tool_calls") or []:
                slot = msg["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if tc.get("id"):
                    assert slot["id"] is None  # the id and name come once
                    slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
                slot["arguments"] += tc["function"].get("arguments") or ""
            if ch["finish_reason"]:
                msg["finish_reason"] = ch["finish_reason"]
    calls = [msg["tool_calls"][i] for i in sorted(msg["tool_calls"])]
    msg["tool_calls"] = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
    ] or None
    return msg


def calls_of(msg: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_and_content(server, stream: bool) -> None:
    m = ask(server[0], "hi", stream)
    assert m["reasoning"] == "The user greets me. Reply briefly."
    assert m["content"] == "Hello! How can I help?"
    assert m["finish_reason"] == "stop"
    if not stream:
        assert m["reasoning_content"] == m["reasoning"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_typed_by_schema(server, stream: bool) -> None:
    m = ask(server[0], "weather", stream, tools=[WEATHER])
    assert m["content"] == "Let me check."
    assert calls_of(m) == [("get_weather", {"city": 'Oslo, "NO"', "days": 3})]
    assert m["tool_calls"][0]["id"].startswith("call_")
    assert m["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_several_calls(server, stream: bool) -> None:
    m = ask(server[0], "two", stream, tools=[WEATHER, CALC])
    assert calls_of(m) == [("calc", {"a": 1.5, "b": 2}), ("get_weather", {"city": "Rome"})]
    one = ask(server[0], "two", stream, tools=[WEATHER, CALC], parallel_tool_calls=False)
    assert calls_of(one) == [("calc", {"a": 1.5, "b": 2})]


def test_streamed_and_whole_agree_for_every_script(server) -> None:
    for q in SCRIPTS:
        for extra in ({}, {"tools": [WEATHER, CALC]}):
            whole, streamed = ask(server[0], q, False, **extra), ask(server[0], q, True, **extra)
            for k in ("reasoning", "content", "finish_reason"):
                assert whole.get(k) == streamed.get(k), (q, k)
            assert calls_of(whole) == calls_of(streamed)


def test_tool_choice_none_keeps_the_text(server) -> None:
    m = ask(server[0], "weather", False, tools=[WEATHER], tool_choice="none")
    assert m.get("tool_calls") is None and "<tool_call>get_weather" in m["content"]
    assert "# Tools" not in server[1].prompts[-1]  # tools are not offered to the model at all


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls(server, stream: bool) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    # required: the model names the tool, constrained to the offered ones (one offered: it is named for the model)
    for tools, choice, opened, names in (
        ([WEATHER, CALC], "required", "<tool_call>", ("get_weather", "calc")),
        ([WEATHER], "required", "<tool_call>get_weather", None),
        ([WEATHER, CALC], named, "<tool_call>get_weather", None),
    ):
        m = ask(server[0], "forced", stream, tools=tools, tool_choice=choice)
        assert calls_of(m) == [("get_weather", {"city": "Paris"})]
        assert m["reasoning"] == "I should use a tool."
        assert m["finish_reason"] == "tool_calls"
        assert server[1].prompts[-1].endswith("</think>" + opened)  # the second phase's prompt
        assert server[1].params[-1].tool_names == names and server[1].params[-2].tool_names is None


def test_tool_call_inside_thinking_is_surfaced(server) -> None:
    m = ask(server[0], "inside", False, tools=[CALC])
    assert calls_of(m) == [("calc", {"a": 2, "b": 3})]
    assert m["reasoning"] == "Let me call it right away "


def test_truncated_thinking_stays_reasoning(server) -> None:
    for stream in (False, True):
        m = ask(server[0], "long", stream, max_tokens=20)
        assert m["finish_reason"] == "length" and m.get("content") is None and m["reasoning"].startswith("x x")


def test_thinking_off_prompt(server) -> None:
    ask(server[0], "hi", False, chat_template_kwargs={"enable_thinking": False})
    assert server[1].prompts[-1].endswith("<|assistant|></think>")


def test_openai_client_reads_tool_calls(server) -> None:
    c = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model="flint", messages=[{"role": "user", "content": "weather"}], tools=[WEATHER])
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["days"] == 3
    follow = c.chat.completions.create(
        model="flint",
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "weather"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            {"role": "user", "content": "hi"},
        ],
    )
    assert follow.choices[0].message.content == "Hello! How can I help?"
    prompt = server[1].prompts[-1]
    assert "<|observation|><tool_response>sunny</tool_response>" in prompt
    assert '<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo, "NO"</arg_value>' in prompt


@pytest.mark.parametrize("stream", [False, True])
def test_deprecated_functions_answer_with_function_call(server, stream: bool) -> None:
    """OpenAI's deprecated `functions` / `function_call`: offered as tools, the answer's call as `function_call`
    (one, finish_reason "function_call"); "none" keeps the text; a named one forces the call."""
    functions = [WEATHER["function"], CALC["function"]]
    m = ask(server[0], "weather", stream, functions=functions)
    assert m["content"] == "Let me check." and m.get("tool_calls") is None
    assert m["function_call"]["name"] == "get_weather"
    assert json.loads(m["function_call"]["arguments"]) == {"city": 'Oslo, "NO"', "days": 3}
    assert m["finish_reason"] == "function_call"
    two = ask(server[0], "two", stream, functions=functions)  # one call only, the first
    assert two["function_call"]["name"] == "calc" and json.loads(two["function_call"]["arguments"]) == {
        "a": 1.5,
        "b": 2,
    }
    none = ask(server[0], "weather", stream, functions=functions, function_call="none")
    assert none.get("function_call") is None and "<tool_call>get_weather" in none["content"]
    forced = ask(server[0], "forced", stream, functions=functions, function_call={"name": "get_weather"})
    assert forced["function_call"]["name"] == "get_weather" and forced["finish_reason"] == "function_call"
    assert server[1].prompts[-1].endswith("</think><tool_call>get_weather")


def test_deprecated_function_messages_render_as_tool_turns(server) -> None:
    """An assistant turn's `function_call` and the `function` message answering it reach the template as a tool call
    and its result, as the tools spelling of the same turns does; mixing the two spellings is refused."""
    c = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0)
    call = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    legacy = [
        {"role": "user", "content": "weather"},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "sunny"},
        {"role": "user", "content": "hi"},
    ]
    r = c.chat.completions.create(model="flint", messages=legacy, functions=[WEATHER["function"]])
    assert r.choices[0].message.content == "Hello! How can I help?"
    legacy_prompt = server[1].prompts[-1]
    tools = [
        legacy[0],
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        legacy[3],
    ]
    c.chat.completions.create(model="flint", messages=tools, tools=[WEATHER])
    assert server[1].prompts[-1] == legacy_prompt
    assert "<tool_response>sunny</tool_response>" in legacy_prompt
    mixed = httpx.post(
        server[0] + "/v1/chat/completions",
        json={"model": "flint", "messages": legacy[:1], "functions": [WEATHER["function"]], "tools": [WEATHER]},
    )
    assert mixed.status_code == 400 and "functions" in mixed.json()["error"]["message"]
    alone = httpx.post(
        server[0] + "/v1/chat/completions", json={"model": "flint", "messages": legacy[:1], "function_call": "auto"}
    )
    assert alone.status_code == 400 and "function_call needs functions" in alone.json()["error"]["message"]
