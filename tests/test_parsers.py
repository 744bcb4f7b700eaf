"""Tests for flint_engine.parsers: a corpus of GLM-4.7 outputs, each checked against an explicit expected result
and streamed at every two-chunk split, char by char and in seeded random multi-chunk splits."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from flint_engine.parsers import (
    ChatOutputParser,
    MessageDelta,
    ParsedMessage,
    ReasoningParser,
    ToolCallParser,
    convert_value,
    make_tool_call_id,
)

ID_RE = re.compile(r"call_[A-Za-z0-9]{24}")
SEED = 1234


def _tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": properties}},
    }


TOOLS = [
    _tool(
        "get_weather",
        {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
    ),
    _tool("calculator", {"operation": {"type": "string"}, "a": {"type": "number"}, "b": {"type": "number"}}),
    _tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
    _tool(
        "set_config",
        {
            "enabled": {"type": "boolean"},
            "options": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "limit": {"type": ["integer", "null"]},
            "note": {"type": ["string", "null"]},
        },
    ),
    _tool("get_time", {}),
    _tool("search", {"query": {"type": "string"}, "filters": {"anyOf": [{"type": "object"}, {"type": "null"}]}}),
    _tool("set_mode", {"mode": {"enum": ["1", "2"]}, "level": {"enum": [1, 2]}}),
]

CODE_VALUE = " if (a < b && c > \"d\") {\n  return '<x/>';\n}\n</div> </arg x \\n C:\\temp\t"


@dataclass
class Case:
    id: str
    text: str
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    thinking: bool = True
    tools: list[dict[str, Any]] | None = field(default_factory=lambda: TOOLS)
    tool_choice_none: bool = False
    parallel: bool = True
    # Index of a call whose start the streamer sends but which never ends (output cut inside it), else None.
    incomplete: int | None = None

    def parser(self) -> ChatOutputParser:
        return ChatOutputParser(
            self.thinking, self.tools, self.tool_choice_none, parallel_tool_calls=self.parallel, seed=SEED
        )


def _call(name: str, body: str) -> str:
    return f"<tool_call>{name}{body}</tool_call>"


def _args(**kwargs: str) -> str:
    return "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in kwargs.items())


CASES = [
    Case(
        "reasoning_and_content",
        "The user says hi. I should greet them back.</think>Hello! How can I help you today?",
        "The user says hi. I should greet them back.",
        "Hello! How can I help you today?",
    ),
    Case("leading_think_tag", "<think>Short plan.</think>Answer: 42.", "Short plan.", "Answer: 42."),
    Case(
        "leading_ws_think_newlines",
        "\n<think>\nLet me think.\n</think>\n\nThe answer is 7.",
        "\nLet me think.\n",
        "\n\nThe answer is 7.",
    ),
    Case(
        "reasoning_then_call",
        "The user wants the weather in Oslo for 3 days.</think>" + _call("get_weather", _args(city="Oslo", days="3")),
        "The user wants the weather in Oslo for 3 days.",
        None,
        [("get_weather", {"city": "Oslo", "days": 3})],
    ),
    Case(
        "several_calls_back_to_back",
        "Two things to do.</think>"
        + _call("calculator", _args(operation="add", a="15", b="27.5"))
        + _call("get_weather", _args(city="Paris", unit="celsius")),
        "Two things to do.",
        None,
        [
            ("calculator", {"operation": "add", "a": 15, "b": 27.5}),
            ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ],
    ),
    Case(
        "zero_arg_call",
        "I need the time.</think><tool_call>get_time</tool_call>",
        "I need the time.",
        None,
        [("get_time", {})],
    ),
    Case(
        "text_before_between_after_calls",
        "Checking.</think>Let me look that up.<tool_call>get_time</tool_call> Then the weather:"
        + _call("get_weather", _args(city="Rome"))
        + " Done.",
        "Checking.",
        "Let me look that up. Then the weather: Done.",
        [("get_time", {}), ("get_weather", {"city": "Rome"})],
    ),
    Case(
        "unicode",
        "用户想知道天气。</think>好的，我来查一下。" + _call("get_weather", _args(city="Zürich 東京 🌍")),
        "用户想知道天气。",
        "好的，我来查一下。",
        [("get_weather", {"city": "Zürich 東京 🌍"})],
    ),
    Case(
        "json_ish_string_stays_string",
        "Write it.</think>" + _call("write_file", _args(path="config.json", content='{"a": [1, 2], "b": null}')),
        "Write it.",
        None,
        [("write_file", {"path": "config.json", "content": '{"a": [1, 2], "b": null}'})],
    ),
    Case(
        "string_with_markup_quotes_newlines",
        "Save the code.</think>" + _call("write_file", _args(path="/tmp/a.js", content=CODE_VALUE)),
        "Save the code.",
        None,
        [("write_file", {"path": "/tmp/a.js", "content": CODE_VALUE})],
    ),
    Case(
        "typed_json_args",
        "Configure.</think>"
        + _call(
            "set_config",
            _args(
                enabled="true",
                options='{"depth": 2, "mode": "fast", "名": "値"}',
                tags='["a", "b"]',
                limit="10",
                note="null",
            ),
        ),
        "Configure.",
        None,
        [
            (
                "set_config",
                {
                    "enabled": True,
                    "options": {"depth": 2, "mode": "fast", "名": "値"},
                    "tags": ["a", "b"],
                    "limit": 10,
                    "note": None,
                },
            )
        ],
    ),
    Case(
        "python_style_args",
        "Configure.</think>"
        + _call(
            "set_config",
            _args(enabled="True", options="{'x': None, 'y': False}", tags="('a', 'b')", limit="null", note="keep me"),
        ),
        "Configure.",
        None,
        [
            (
                "set_config",
                {
                    "enabled": True,
                    "options": {"x": None, "y": False},
                    "tags": ["a", "b"],
                    "limit": None,
                    "note": "keep me",
                },
            )
        ],
    ),
    Case(
        "glm45_newline_style",
        "Weather in Beijing.\n</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n",
        "Weather in Beijing.\n",
        None,
        [("get_weather", {"city": "Beijing", "days": 2})],
    ),
    Case(
        "missing_first_arg_key",
        "Look up.</think><tool_call>get_weather\ncity</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
        "Look up.",
        None,
        [("get_weather", {"city": "Oslo"})],
    ),
    Case(
        "missing_second_arg_key",
        "Multiply.</think><tool_call>calculator<arg_key>operation</arg_key><arg_value>mul</arg_value>"
        "a</arg_key><arg_value>6</arg_value><arg_key>b</arg_key><arg_value>7</arg_value></tool_call>",
        "Multiply.",
        None,
        [("calculator", {"operation": "mul", "a": 6, "b": 7})],
    ),
    Case(
        "truncated_reasoning",
        "The user asks about prime numbers. First I need to",
        "The user asks about prime numbers. First I need to",
        None,
    ),
    Case("truncated_reasoning_in_tag", "Almost done thinking</thi", "Almost done thinking</thi", None),
    Case(
        "truncated_tool_call",
        "Write the file.</think>Sure.<tool_call>write_file<arg_key>path</arg_key><arg_value>/tmp/x.txt</arg_value>"
        "<arg_key>content</arg_key><arg_value>partial te",
        "Write the file.",
        "Sure.<tool_call>write_file<arg_key>path</arg_key><arg_value>/tmp/x.txt</arg_value>"
        "<arg_key>content</arg_key><arg_value>partial te",
        incomplete=0,
    ),
    Case(
        "truncated_after_complete_call",
        "Time.</think><tool_call>get_time</tool_call><tool_call>get_wea",
        "Time.",
        "<tool_call>get_wea",
        [("get_time", {})],
    ),
    Case(
        "truncated_after_name",
        "Time.</think><tool_call>get_time</tool_call><tool_call>get_weather<arg_k",
        "Time.",
        "<tool_call>get_weather<arg_k",
        [("get_time", {})],
        incomplete=1,
    ),
    Case("truncated_in_open_tag", "Time.</think>Let me check <tool_ca", "Time.", "Let me check <tool_ca"),
    Case(
        "tool_call_inside_thinking",
        "I should check the weather in Oslo." + _call("get_weather", _args(city="Oslo")) + "</think>",
        "I should check the weather in Oslo.",
        None,
        [("get_weather", {"city": "Oslo"})],
    ),
    Case(
        "tool_call_inside_thinking_then_text",
        "Plan first.<tool_call>get_time</tool_call>More thoughts.</think>Here you go.",
        "Plan first.",
        "More thoughts.Here you go.",
        [("get_time", {})],
    ),
    Case(
        "thinking_off_plain", "Hello there, no thinking here.", None, "Hello there, no thinking here.", thinking=False
    ),
    Case("thinking_off_leading_end_tag", "</think>Hi.", None, "Hi.", thinking=False),
    Case(
        "thinking_off_think_block",
        "<think>Sneaky thought.</think>Visible answer.",
        "Sneaky thought.",
        "Visible answer.",
        thinking=False,
    ),
    Case(
        "thinking_off_tool_call",
        "Calling now." + _call("get_weather", _args(city="Lima")),
        None,
        "Calling now.",
        [("get_weather", {"city": "Lima"})],
        thinking=False,
    ),
    Case(
        "unknown_tool_and_args",
        _call("mystery_tool", _args(count="5", label="five", flag="false", items="[1, 'two']")),
        None,
        None,
        [("mystery_tool", {"count": 5, "label": "five", "flag": False, "items": [1, "two"]})],
        thinking=False,
    ),
    Case(
        "string_param_raw_not_stripped",
        "x</think>" + _call("get_weather", _args(city=" 123 ", days=" 4 ")),
        "x",
        None,
        [("get_weather", {"city": " 123 ", "days": 4})],
    ),
    Case(
        "non_string_fallbacks",
        "x</think>" + _call("calculator", _args(operation="pow", a="three", b=" 2e3 ")),
        "x",
        None,
        [("calculator", {"operation": "pow", "a": "three", "b": 2000.0})],
    ),
    Case("empty_reasoning", "</think>Direct answer.", None, "Direct answer."),
    Case(
        "blank_content_around_call",
        "Thinking.</think>\n\n<tool_call>get_time</tool_call>\n",
        "Thinking.",
        None,
        [("get_time", {})],
    ),
    Case(
        "nameless_call_kept_as_content",
        "Hmm.</think><tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>after",
        "Hmm.",
        "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>after",
    ),
    Case(
        "no_tools_tool_text_stays",
        "Thinking <tool_call>get_time</tool_call> still thinking</think>Answer <tool_call>get_time</tool_call>",
        "Thinking <tool_call>get_time</tool_call> still thinking",
        "Answer <tool_call>get_time</tool_call>",
        tools=None,
    ),
    Case(
        "tool_choice_none",
        "</think><tool_call>get_time</tool_call>",
        None,
        "<tool_call>get_time</tool_call>",
        tool_choice_none=True,
    ),
    Case(
        "parallel_false_keeps_first",
        "Two.</think>A<tool_call>get_time</tool_call>B"
        + _call("get_weather", _args(city="Oslo"))
        + "C<tool_call>get_wea",
        "Two.",
        "ABC",
        [("get_time", {})],
        parallel=False,
    ),
    Case(
        "duplicate_key_keeps_first",
        _call("get_weather", _args(city="Oslo") + _args(city="Bergen") + _args(days="1") + _args(days="2")),
        None,
        None,
        [("get_weather", {"city": "Oslo", "days": 1})],
        thinking=False,
    ),
    Case(
        "missing_arg_value_end",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</tool_call>Done",
        None,
        "Done",
        [("get_weather", {"city": "Oslo"})],
        thinking=False,
    ),
    Case(
        "missing_arg_key_end",
        "<tool_call>calculator<arg_key>a<arg_value>3</arg_value></tool_call>",
        None,
        None,
        [("calculator", {"a": 3})],
        thinking=False,
    ),
    Case(
        "tag_lookalikes_in_text",
        "Use <b> and 1 < 2, not <think or </thinking>.</think>x < y <tool_calls> <tool_call_x",
        "Use <b> and 1 < 2, not <think or </thinking>.",
        "x < y <tool_calls> <tool_call_x",
    ),
    Case(
        "tags_inside_string_value",
        "</think>" + _call("write_file", _args(path="t.xml", content="<arg_key>k</arg_key> and <arg_value>")),
        None,
        None,
        [("write_file", {"path": "t.xml", "content": "<arg_key>k</arg_key> and <arg_value>"})],
    ),
    Case("empty_output", "", None, None),
    Case("whitespace_output", "  \n", None, None),
    Case(
        "anyof_object",
        "Search.</think>" + _call("search", _args(query="rust async", filters='{"lang": "en"}')),
        "Search.",
        None,
        [("search", {"query": "rust async", "filters": {"lang": "en"}})],
    ),
    Case("stray_think_end_in_content", "R.</think>Answer</think> more", "R.", "Answer more"),
    Case(
        "enum_without_type",
        "m</think>" + _call("set_mode", _args(mode="1", level="2")),
        "m",
        None,
        [("set_mode", {"mode": "1", "level": 2})],
    ),
]


def _chunkings(text: str) -> Iterator[list[str]]:
    """Whole, every two-chunk split, char by char, and seeded random multi-chunk splits."""
    yield [text]
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)
    rng = random.Random(len(text) * 7919 + 17)
    for _ in range(6):
        if len(text) < 2:
            break
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(2, 12))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@dataclass
class Streamed:
    reasoning: str
    content: str
    calls: list[dict[str, str]]
    incomplete: int | None


def _stream(parser: ChatOutputParser, chunks: list[str]) -> Streamed:
    streamer = parser.stream()
    deltas: list[MessageDelta] = []
    for chunk in chunks:
        deltas.extend(streamer.feed(chunk))
    deltas.extend(streamer.finish())
    reasoning = content = ""
    calls: list[dict[str, str]] = []
    for delta in deltas:
        assert sum(f is not None for f in (delta.reasoning, delta.content, delta.tool_calls)) == 1, delta
        assert delta.reasoning != "" and delta.content != ""
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            if "id" in tc:
                assert set(tc) == {"index", "id", "type", "function"}
                assert tc["index"] == len(calls) and tc["type"] == "function"
                assert ID_RE.fullmatch(tc["id"])
                assert tc["function"]["arguments"] == "" and tc["function"]["name"]
                calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                assert tc["index"] == len(calls) - 1, "fragments belong to the latest call"
                assert tc["function"]["arguments"]
                calls[-1]["arguments"] += tc["function"]["arguments"]
    return Streamed(reasoning, content, calls, streamer.incomplete_tool_call_index)


def _assert_stream_matches(
    parser: ChatOutputParser, expected: ParsedMessage, chunks: list[str], incomplete: int | None
) -> None:
    got = _stream(parser, chunks)
    where = f"chunks={chunks!r}"
    assert got.reasoning == (expected.reasoning or ""), where
    assert got.content == (expected.content or ""), where
    n = len(expected.tool_calls)
    want = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in expected.tool_calls]
    assert got.calls[:n] == want, where
    for call in got.calls[:n]:
        json.loads(call["arguments"])
    if incomplete is None:
        assert len(got.calls) == n and got.incomplete is None, where
    else:
        assert incomplete == n and len(got.calls) == n + 1 and got.incomplete == n, where


def test_corpus_size() -> None:
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parse_expected(case: Case) -> None:
    parsed = case.parser().parse(case.text)
    assert parsed.reasoning == case.reasoning
    assert parsed.content == case.content
    assert [c.name for c in parsed.tool_calls] == [name for name, _ in case.calls]
    for call, (_, args) in zip(parsed.tool_calls, case.calls):
        assert ID_RE.fullmatch(call.id)
        assert call.arguments == json.dumps(args, ensure_ascii=False)
        assert json.loads(call.arguments) == args


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_stream_matches_parse_at_every_split(case: Case) -> None:
    parser = case.parser()
    expected = parser.parse(case.text)
    for chunks in _chunkings(case.text):
        _assert_stream_matches(parser, expected, chunks, case.incomplete)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layers_stream_match_at_every_split(case: Case) -> None:
    """The reasoning and tool-call streamers on their own agree with their non-streaming parses."""
    for ends in (True, False):
        rp = ReasoningParser(case.thinking, tool_call_ends_reasoning=ends)
        want = rp.extract(case.text)
        for chunks in _chunkings(case.text):
            streamer = rp.stream()
            pieces = [p for c in chunks for p in streamer.feed(c)] + streamer.finish()
            got = tuple("".join(t for k, t in pieces if k == kind) or None for kind in ("reasoning", "content"))
            assert got == want, chunks
    tp = ToolCallParser(case.tools, parallel_tool_calls=case.parallel, seed=SEED)
    want_calls = tp.extract(case.text)
    for chunks in _chunkings(case.text):
        streamer = tp.stream()
        events = [e for c in chunks for e in streamer.feed(c)] + streamer.finish()
        assert "".join(e.content for e in events if e.content is not None) == (want_calls.content or "")
        args: dict[int, str] = {}
        for e in events:
            if e.tool_call is not None:
                args[e.tool_call["index"]] = args.get(e.tool_call["index"], "") + e.tool_call["function"]["arguments"]
        assert [args[i] for i in range(len(want_calls.calls))] == [c.arguments for c in want_calls.calls]


# Fuzz: random strings of tags and text bits; streaming must always agree with the non-streaming parse.
_FUZZ_BITS = [
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>", "</think>",
    "get_weather", "calculator", "city", "days", "a", "3", "Oslo", " ", "\n", "<", ">", "/", '"', "\\", "{", "}",
    "é", "true", "[1, 2]", "<tool", "</arg",
]  # fmt: skip


def test_fuzz_stream_matches_parse() -> None:
    rng = random.Random(20261129)
    for trial in range(400):
        text = "".join(rng.choice(_FUZZ_BITS) for _ in range(rng.randint(0, 30)))
        parser = ChatOutputParser(
            thinking=rng.random() < 0.7, tools=TOOLS, parallel_tool_calls=rng.random() < 0.8, seed=SEED
        )
        expected = parser.parse(text)
        chunkings = [[text], list(text)]
        for _ in range(4):
            cuts = sorted({rng.randint(0, len(text)) for _ in range(rng.randint(1, 6))})
            chunkings.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
        for chunks in chunkings:
            got = _stream(parser, chunks)
            assert got.reasoning == (expected.reasoning or ""), (trial, text, chunks)
            assert got.content == (expected.content or ""), (trial, text, chunks)
            n = len(expected.tool_calls)
            assert [(c["name"], c["arguments"]) for c in got.calls[:n]] == [
                (c.name, c.arguments) for c in expected.tool_calls
            ], (trial, text, chunks)
            assert len(got.calls) in (n, n + 1), (trial, text, chunks)
            assert (got.incomplete is not None) == (len(got.calls) == n + 1), (trial, text, chunks)


def test_long_string_argument_streams_incrementally() -> None:
    value = "".join(f'line {i}: <tag attr="v"> a < b\n' for i in range(200))
    text = "Writing.</think>" + _call("write_file", _args(path="big.txt", content=value))
    parser = ChatOutputParser(True, TOOLS, seed=SEED)
    expected = parser.parse(text)
    streamer = parser.stream()
    end = text.index("</arg_value>", text.index("<arg_key>content"))
    fragments_before_end: list[str] = []
    all_args = ""
    for start in range(0, len(text), 64):
        chunk = text[start : start + 64]
        for delta in streamer.feed(chunk):
            for tc in delta.tool_calls or []:
                frag = tc["function"]["arguments"]
                all_args += frag
                if start + 64 <= end:
                    fragments_before_end.append(frag)
        if start + 64 <= end:
            # What was sent so far is a prefix of the final arguments: nothing is taken back.
            assert expected.tool_calls[0].arguments.startswith(all_args)
    for delta in streamer.finish():
        for tc in delta.tool_calls or []:
            all_args += tc["function"]["arguments"]
    assert all_args == expected.tool_calls[0].arguments
    assert len(fragments_before_end) > 20
    streamed_value = "".join(fragments_before_end)
    assert json.dumps(value[:1000], ensure_ascii=False)[1:-1] in streamed_value


def test_partial_tags_are_held_back() -> None:
    parser = ChatOutputParser(False, TOOLS, seed=SEED)
    streamer = parser.stream()
    assert [d.content for d in streamer.feed("Hello <tool_ca")] == ["Hello "]
    deltas = streamer.feed("ll>get_time</tool_call> bye <")
    assert [d.content for d in deltas if d.content] == [" bye "]
    assert [tc["function"].get("name") for d in deltas for tc in d.tool_calls or []] == ["get_time", None]
    assert [d.content for d in streamer.finish()] == ["<"]

    rs = ReasoningParser(True).stream()
    assert rs.feed("thinking </th") == [("reasoning", "thinking ")]
    assert rs.feed("ink>answer</thi") == [("content", "answer")]
    assert rs.finish() == [("content", "</thi")]


def test_reasoning_parser_defaults() -> None:
    rp = ReasoningParser()
    assert rp.extract("a</think>b") == ("a", "b")
    assert rp.extract("a<tool_call>f</tool_call>") == ("a", "<tool_call>f</tool_call>")
    assert ReasoningParser(tool_call_ends_reasoning=False).extract("a<tool_call>f</tool_call>") == (
        "a<tool_call>f</tool_call>",
        None,
    )
    assert ReasoningParser(thinking=False).extract("  <think>x") == ("x", None)
    assert ReasoningParser(thinking=False).extract("plain") == (None, "plain")


def test_tool_call_parser_api() -> None:
    parser = ToolCallParser(TOOLS, seed=7)
    parsed = parser.extract("hi " + _call("get_weather", _args(city="Oslo", days="2")))
    assert parsed.content == "hi "
    assert parsed.tools_called
    call = parsed.calls[0]
    assert call.to_openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'},
    }
    # Seeded ids repeat per parse, so a streamed and a non-streamed parse can be compared.
    assert parser.extract(_call("get_time", "")).calls[0].id == call.id
    assert ToolCallParser(TOOLS).extract("no calls here").calls == []
    assert ToolCallParser(None).extract("  ").content is None

    ids = iter(["call_a", "call_b"])
    factory_parser = ToolCallParser(None, id_factory=lambda: next(ids))
    assert [c.id for c in factory_parser.extract(_call("f", "") + _call("g", "")).calls] == ["call_a", "call_b"]


def test_random_ids() -> None:
    ids = {make_tool_call_id() for _ in range(50)}
    assert len(ids) == 50 and all(ID_RE.fullmatch(i) for i in ids)
    unseeded = ToolCallParser(TOOLS)
    assert unseeded.extract(_call("get_time", "")).calls[0].id != unseeded.extract(_call("get_time", "")).calls[0].id


@pytest.mark.parametrize(
    ("raw", "types", "want"),
    [
        (" x ", frozenset({"string"}), " x "),
        ("5", frozenset({"string"}), "5"),
        ("5", frozenset({"integer"}), 5),
        (" 5 ", None, 5),
        ("abc", None, "abc"),
        (" abc ", frozenset({"integer"}), " abc "),
        ("NaN", frozenset({"number"}), "NaN"),
        ("1e999", frozenset({"number"}), "1e999"),
        ("Infinity", None, "Infinity"),
        ("{1, 2}", frozenset({"array"}), "{1, 2}"),
        ("None", frozenset({"null", "object"}), None),
        ("[True, 'a']", frozenset({"array"}), [True, "a"]),
        ("null", frozenset({"string", "null"}), None),
        ("hello", frozenset({"string", "null"}), "hello"),
        ("7", frozenset({"string", "number"}), 7),
        ('"quoted"', frozenset({"string", "null"}), '"quoted"'),
        ("true", frozenset({"string", "integer"}), "true"),
        ("2.5", frozenset({"object"}), 2.5),
    ],
)
def test_convert_value(raw: str, types: frozenset[str] | None, want: Any) -> None:
    assert convert_value(raw, types) == want
    assert type(convert_value(raw, types)) is type(want)


def test_to_openai_shapes() -> None:
    parser = ChatOutputParser(True, TOOLS, seed=SEED)
    message = parser.parse("why</think>ok" + _call("get_time", ""))
    out = message.to_openai()
    assert out["reasoning"] == out["reasoning_content"] == "why"
    assert out["content"] == "ok" and out["tool_calls"][0]["function"]["name"] == "get_time"
    assert "tool_calls" not in parser.parse("a</think>b").to_openai()
    assert MessageDelta(reasoning="r").to_openai() == {"reasoning": "r", "reasoning_content": "r"}
    assert MessageDelta(content="c").to_openai() == {"content": "c"}


def test_parser_feed_finish_resets() -> None:
    parser = ChatOutputParser(True, TOOLS, seed=SEED)
    for _ in range(2):
        deltas = parser.feed("think</think>an") + parser.feed("swer") + parser.finish()
        assert "".join(d.reasoning or "" for d in deltas) == "think"
        assert "".join(d.content or "" for d in deltas) == "answer"
    streamer = parser.stream()
    streamer.finish()
    with pytest.raises(RuntimeError):
        streamer.feed("x")
