"""`POST /v1/responses` (OpenAI's Responses API) through the official `openai` client, on the trained demo model:
the same answers as the chat endpoint for the same conversation, items and events as the client reads them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest
from api_fixtures import module_demo_server, named_events, wait_until_idle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from demo_corpus import TOOL_WEATHER  # noqa: E402

# The tool the demo model was trained on, in the Responses API's shape and the chat one.
WEATHER = {"type": "function", **TOOL_WEATHER["function"]}
CHAT_WEATHER = TOOL_WEATHER
ASK_WEATHER = "Weather forecast for Oslo, 3 days."


server = module_demo_server()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def server_url(client: openai.OpenAI) -> str:
    return str(client.base_url).rstrip("/").removesuffix("/v1")


def _texts(response) -> tuple[str | None, str | None]:
    """(reasoning text, output text) of a response's items."""
    reasoning = [c.text for o in response.output if o.type == "reasoning" for c in o.content or []]
    return ("".join(reasoning) or None), (response.output_text or None)


def test_text_answer_equals_the_chat_endpoint(client: openai.OpenAI) -> None:
    r = client.responses.create(model="flint", input="What is 7 + 8?", temperature=0, instructions="Be brief.")
    chat = client.chat.completions.create(
        model="flint",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 + 8?"}],
        temperature=0,
    )
    message = chat.choices[0].message
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert _texts(r) == (message.model_extra["reasoning_content"], message.content)
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    # The sampled tokens before </think>: the rest are </think>, the answer and the end of turn.
    answer = httpx.post(server_url(client) + "/tokenize", json={"model": "flint", "prompt": message.content}).json()
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens - 2 - answer["count"]
    assert r.instructions == "Be brief." and r.store is False


def test_an_assistant_turn_of_text_and_calls_is_one_chat_turn(server) -> None:
    """A message item then function_call items (a turn that said something and called tools) renders as one
    assistant turn with content and tool calls, as the chat endpoint's prompt for it."""
    call = {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    items = [
        {"role": "user", "content": ASK_WEATHER},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        call,
        {**call, "call_id": "call_b", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b", "output": "rain"},
    ]
    chat_calls = [
        {"id": c, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        for c, city in (("call_a", "Oslo"), ("call_b", "Rome"))
    ]
    messages = [
        {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": "Checking.", "tool_calls": chat_calls},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
    ]
    tok = httpx.post(server.base_url + "/tokenize", json={"model": "flint", "messages": messages})
    r = httpx.post(
        server.base_url + "/v1/responses",
        json={"model": "flint", "input": items, "max_output_tokens": 1},
        timeout=60,
    )
    assert r.status_code == 200 and tok.status_code == 200, (r.text, tok.text)
    assert r.json()["usage"]["input_tokens"] == tok.json()["count"]


def test_message_items_and_text_parts_are_the_same_prompt(client: openai.OpenAI) -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "What is 7 + 8?"}]},
    ]
    a = client.responses.create(model="flint", input=items, temperature=0)
    b = client.responses.create(model="flint", input="What is 7 + 8?", instructions="Be brief.", temperature=0)
    assert _texts(a) == _texts(b)  # a developer message and instructions both render as the system turn


def test_function_call_and_its_output(client: openai.OpenAI) -> None:
    r = client.responses.create(model="flint", input=ASK_WEATHER, tools=[WEATHER], temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    assert json.loads(calls[0].arguments) == {"city": "Oslo", "days": 3}
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    result = json.dumps({"forecast": "sunny", "high_c": 21})
    [thought] = [o.model_dump(exclude_none=True) for o in r.output if o.type == "reasoning"]
    follow = [
        {"role": "user", "content": ASK_WEATHER},
        thought,  # sent back as the SDK returned it: the tool loop's thinking stays in the prompt
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": result},
    ]
    answer = client.responses.create(model="flint", input=follow, tools=[WEATHER], temperature=0)
    chat = client.chat.completions.create(
        model="flint",
        tools=[CHAT_WEATHER],
        temperature=0,
        messages=[
            {"role": "user", "content": ASK_WEATHER},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": thought["content"][0]["text"],
                "tool_calls": [
                    {
                        "id": calls[0].call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": calls[0].arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": calls[0].call_id, "content": result},
        ],
    )
    # The same prompt as the chat endpoint's (the demo model's answer after a tool result varies with the call id,
    # so the two are compared, not the text).
    message = chat.choices[0].message
    assert answer.status == "completed" and answer.usage.input_tokens == chat.usage.prompt_tokens
    unthought = [item for item in follow if item is not thought]
    short = client.responses.create(model="flint", input=unthought, tools=[WEATHER], max_output_tokens=1)
    assert short.usage.input_tokens < answer.usage.input_tokens  # the reasoning item reached the prompt
    assert _texts(answer) == (message.model_extra["reasoning_content"], message.content)
    again = [(o.name, o.arguments) for o in answer.output if o.type == "function_call"]
    assert again == [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _events(server, body: dict) -> list[dict]:
    return named_events(server.base_url + "/v1/responses", body)


@pytest.mark.parametrize("tools", [False, True])
def test_stream_rebuilds_the_whole_response(server, client: openai.OpenAI, tools: bool) -> None:
    body = {"model": "flint", "input": ASK_WEATHER if tools else "What is 7 + 8?", "temperature": 0}
    if tools:
        body["tools"] = [WEATHER]
    events = _events(server, {**body, "stream": True})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.completed"
    whole = httpx.post(server.base_url + "/v1/responses", json=body, timeout=120).json()
    final = events[-1]["response"]

    def without_ids(items: list[dict]) -> list[dict]:
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]

    assert without_ids(final["output"]) == without_ids(whole["output"])
    # Everything but ids, times and the prefix cache's hits (the second of the two requests finds the first's).
    skip = ("id", "output", "created_at", "usage")
    assert {k: v for k, v in final.items() if k not in skip} == {k: v for k, v in whole.items() if k not in skip}
    usage = {k: v for k, v in final["usage"].items() if k != "input_tokens_details"}
    assert usage == {k: v for k, v in whole["usage"].items() if k != "input_tokens_details"}
    # Each item: added, its deltas, done; the deltas add up to the done texts and the final output.
    for index, item in enumerate(final["output"]):
        mine = [e for e in events if e.get("output_index") == index]
        assert mine[0]["type"] == "response.output_item.added" and mine[-1]["type"] == "response.output_item.done"
        assert mine[-1]["item"] == item
        deltas = "".join(e["delta"] for e in mine if e["type"].endswith(".delta"))
        if item["type"] in ("reasoning", "message"):
            assert deltas == item["content"][0]["text"]
        else:
            assert deltas == item["arguments"] and json.loads(deltas) == {"city": "Oslo", "days": 3}
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    # The client's own stream helper accumulates the same answer.
    with client.responses.stream(**body) as stream:
        for _ in stream:
            pass
        got = stream.get_final_response()
    texts = [part["text"] for item in whole["output"] if item["type"] == "message" for part in item["content"]]
    assert got.output_text == "".join(texts) and [o.type for o in got.output] == [o["type"] for o in whole["output"]]


def test_reasoning_off_and_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="flint", input="What is 7 + 8?", temperature=0, reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.usage.output_tokens_details.reasoning_tokens == 0
    cut = client.responses.create(model="flint", input="What is 7 + 8?", max_output_tokens=3, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3 and [(o.type, o.status) for o in cut.output] == [("reasoning", "incomplete")]
    assert cut.usage.output_tokens_details.reasoning_tokens == 3  # every sampled token was thinking


@pytest.mark.parametrize("limit", [3, 20, 21])
def test_a_stream_cut_by_the_limit_ends_as_the_whole_response(server, limit: int) -> None:
    """Cut inside the thinking, at its end or inside the answer: the stream's last event and items' statuses are
    the whole response's."""
    body = {"model": "flint", "input": "What is 7 + 8?", "temperature": 0, "max_output_tokens": limit}
    events = _events(server, {**body, "stream": True})
    whole = httpx.post(server.base_url + "/v1/responses", json=body, timeout=120).json()
    assert events[-1]["type"] == f"response.{whole['status']}"
    final = events[-1]["response"]
    assert [(o["type"], o["status"]) for o in final["output"]] == [(o["type"], o["status"]) for o in whole["output"]]
    if limit == 3:
        assert whole["status"] == "incomplete" and final["output"][-1]["status"] == "incomplete"


def test_json_schema_format(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}
    r = client.responses.create(model="flint", input="Pick a color.", text={"format": fmt}, max_output_tokens=300)
    assert r.status == "completed" and json.loads(r.output_text)["color"] in ("red", "green")
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "api.store_responses is off"),
        ({"input": "hi", "conversation": "conv_1"}, "needs stored conversations"),
        ({"input": "hi", "conversation": {"name": "c"}}, "conversation must be a conversation id"),
        ({"input": "hi", "prompt": {"id": "pmpt_1"}}, "keeps no prompt templates"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text only"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "'computer_call_output' are not supported"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
        ({"input": []}, "must not be an empty list"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format type"),
        ({"input": "hi", "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "model": "gpt-9"}, "does not exist"),
        ({"input": "hi", "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_refusals_in_openai_error_shape(server, body: dict, says: str) -> None:
    r = httpx.post(server.base_url + "/v1/responses", json={"model": "flint", **body}, timeout=60)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and says in err["message"], err


def test_codex_style_include_is_accepted(server) -> None:
    """`include: ["reasoning.encrypted_content"]` (sent by stateless agents) asks for nothing this server would
    leave out; no logprobs unless asked."""
    body = {"model": "flint", "input": "What is 7 + 8?", "temperature": 0, "store": False}
    body["include"] = ["reasoning.encrypted_content"]
    r = httpx.post(server.base_url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    [message] = [o for o in r.json()["output"] if o["type"] == "message"]
    assert message["content"][0]["logprobs"] == []


def test_output_text_logprobs(server, client: openai.OpenAI) -> None:
    """`include: ["message.output_text.logprobs"]` with `top_logprobs`: the answer's tokens (not the thinking's,
    not </think> or the end of turn), each with its alternatives, equal to the chat endpoint's last entries; the
    stream's deltas carry them in pieces that add up to the done event's."""
    ask = "What is 7 + 8?"
    r = client.responses.create(
        model="flint", input=ask, temperature=0, include=["message.output_text.logprobs"], top_logprobs=2
    )
    [message] = [o for o in r.output if o.type == "message"]
    part = message.content[0]
    assert part.logprobs and "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.logprob for lp in part.logprobs)
    chat = client.chat.completions.create(
        model="flint", messages=[{"role": "user", "content": ask}], temperature=0, logprobs=True, top_logprobs=2
    )
    entries = chat.choices[0].logprobs.content  # thinking, </think>, the answer, the end of turn
    answer = entries[-1 - len(part.logprobs) : -1]
    assert [(e.token, e.logprob) for e in answer] == [(lp.token, lp.logprob) for lp in part.logprobs]
    body = {"model": "flint", "input": ask, "temperature": 0, "top_logprobs": 1, "stream": True}
    events = named_events(server.base_url + "/v1/responses", body)
    deltas = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert deltas == done["logprobs"] and [d["token"] for d in deltas] == [lp.token for lp in part.logprobs]


def test_nothing_is_stored(server) -> None:
    r = httpx.get(server.base_url + "/v1/responses/resp_123", timeout=10)
    assert r.status_code == 404 and "api.store_responses is off" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/responses",
            {"input": "Count to a thousand.", "max_output_tokens": 2000, "stream": True, "ignore_eos": True},
        ),
        (
            "/v1/messages",
            {
                "messages": [{"role": "user", "content": "Count to a thousand."}],
                "max_tokens": 2000,
                "stream": True,
                "ignore_eos": True,
            },
        ),
    ],
)
def test_leaving_a_stream_aborts_its_request(server, path: str, body: dict) -> None:
    """A client that leaves a Responses or Messages stream frees its sequence, as on the chat endpoint."""
    aborted = server.engine.engine.metrics.snapshot()["request_success_total"].get("abort", 0)
    with httpx.stream("POST", server.base_url + path, json={"model": "flint", **body}, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
        assert server.engine.engine.metrics.snapshot()["num_requests_running"] == 1
    assert wait_until_idle(server)
    assert server.engine.engine.metrics.snapshot()["request_success_total"]["abort"] == aborted + 1


def test_truncation_auto_drops_the_oldest_turns(tmp_path) -> None:
    """A conversation longer than the context: a 400 as with `disabled`, while `auto` drops whole turns from the
    oldest (the instructions kept) until it fits; a last turn that alone does not fit stays a 400."""
    from api_fixtures import tiny_server

    srv = tiny_server(tmp_path, max_model_len=160)
    try:
        turns = []
        for i in range(8):
            turns.append({"role": "user", "content": f"question {i}: " + "tell me more " * 4})
            turns.append({"role": "assistant", "content": f"answer {i}: " + "here is more " * 4})
        turns.append({"role": "user", "content": "and the last one?"})
        body = {"model": "flint", "input": turns, "instructions": "Be brief.", "max_output_tokens": 4}
        url = srv.base_url + "/v1/responses"
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = httpx.post(url, json={**body, "truncation": "auto"}, timeout=60)
        assert r.status_code == 200 and r.json()["truncation"] == "auto", r.text
        kept = r.json()["usage"]["input_tokens"]
        assert 0 < kept < 160
        # The largest suffix of whole turns that fits, with the instructions first: one turn more would not.
        tokenize = srv.base_url + "/tokenize"

        def length(items: list[dict]) -> int:
            msgs = [{"role": "system", "content": "Be brief."}, *items]
            return httpx.post(tokenize, json={"messages": msgs}).json()["count"]

        starts = [i for i, t in enumerate(turns) if t["role"] == "user"]
        fitting = [s for s in starts if length(turns[s:]) < 160]
        assert kept == length(turns[fitting[0] :]) and fitting[0] > 0
        huge = {**body, "input": "word " * 400, "truncation": "auto"}
        r = httpx.post(url, json=huge, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    finally:
        srv.stop()
