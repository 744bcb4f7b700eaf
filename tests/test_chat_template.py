"""The GLM-4.7-style default chat template and the sandboxed renderer: exact prompt strings and errors."""

from __future__ import annotations

import copy
import json

import pytest

from flint_engine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, render_chat_template

TOOLS_HEADER = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city <now> & 'later'",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _fn(name: str, arguments: object) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def render(messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
    return render_chat_template(DEFAULT_CHAT_TEMPLATE, messages, tools, add_generation_prompt, **kwargs)


def test_plain_chat_thinking_on_by_default() -> None:
    msgs = [{"role": "user", "content": "Hello"}]
    assert render(msgs) == "[gMASK]<sop><|user|>Hello<|assistant|><think>"


def test_thinking_off_generation_prompt() -> None:
    msgs = [{"role": "user", "content": "Hello"}]
    assert render(msgs, enable_thinking=False) == "[gMASK]<sop><|user|>Hello<|assistant|></think>"
    # Explicit True and None both mean the default (thinking on).
    assert render(msgs, enable_thinking=True).endswith("<|assistant|><think>")
    assert render(msgs, enable_thinking=None).endswith("<|assistant|><think>")


def test_no_generation_prompt() -> None:
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert render(msgs, add_generation_prompt=False) == "[gMASK]<sop><|system|>Be terse.<|user|>Hi"


def test_multi_turn_exact() -> None:
    msgs = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "  Hello!\n"},
        {"role": "user", "content": "Bye"},
    ]
    assert render(msgs) == (
        "[gMASK]<sop><|system|>Be terse.<|user|>Hi<|assistant|></think>Hello!<|user|>Bye<|assistant|><think>"
    )


def test_system_and_tools_block_exact() -> None:
    other = {"name": "now", "description": "Current time", "parameters": {"type": "object", "properties": {}}}
    tools = [{"type": "function", "function": WEATHER}, {"type": "function", "function": other}]
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Oslo?"}]
    expected = (
        "[gMASK]<sop>"
        + TOOLS_HEADER
        + '{"name": "get_weather", "description": "Weather for a city <now> & \'later\'", "parameters": '
        '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}\n'
        '{"name": "now", "description": "Current time", "parameters": {"type": "object", "properties": {}}}\n'
        + TOOLS_FOOTER
        + "<|system|>You are helpful.<|user|>Weather in Oslo?<|assistant|><think>"
    )
    assert render(msgs, tools) == expected


def test_tool_without_function_key_renders_whole_dict_and_keeps_unicode() -> None:
    tool = {"name": "translate", "description": "Übersetzen → 中文"}
    out = render([{"role": "user", "content": "x"}], [tool])
    assert '\n{"name": "translate", "description": "Übersetzen → 中文"}\n</tools>' in out


def test_empty_tools_list_renders_no_block() -> None:
    assert render([{"role": "user", "content": "x"}], []) == "[gMASK]<sop><|user|>x<|assistant|><think>"


def test_assistant_tool_calls_string_and_non_string_args() -> None:
    args = {
        "city": "Paris",
        "days": 3,
        "metric": True,
        "ratio": 0.5,
        "tags": ["a", "é"],
        "opts": {"k": None},
        "note": 'say "hi" <b>',
    }
    msgs = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}},
                {"id": "c2", "type": "function", "function": {"name": "now", "arguments": {}}},
                {"name": "flat", "arguments": {"x": "1"}},
            ],
        },
    ]
    expected = (
        "[gMASK]<sop><|user|>Weather?<|assistant|></think>"
        "<tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value>"
        "<arg_key>metric</arg_key><arg_value>true</arg_value>"
        "<arg_key>ratio</arg_key><arg_value>0.5</arg_value>"
        '<arg_key>tags</arg_key><arg_value>["a", "é"]</arg_value>'
        '<arg_key>opts</arg_key><arg_value>{"k": null}</arg_value>'
        '<arg_key>note</arg_key><arg_value>say "hi" <b></arg_value>'
        "</tool_call>"
        "<tool_call>now</tool_call>"
        "<tool_call>flat<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
        "<|assistant|><think>"
    )
    assert render(msgs) == expected


def test_tool_call_arguments_empty_string_and_content_before_calls() -> None:
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Let me check. ", "tool_calls": [_fn("f", "")]},
    ]
    out = render(msgs, add_generation_prompt=False)
    assert out == "[gMASK]<sop><|user|>go<|assistant|></think>Let me check.<tool_call>f</tool_call>"


def test_tool_results_share_one_observation_per_run() -> None:
    msgs = [
        {"role": "user", "content": "two calls"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "A-result"},
        {"role": "tool", "tool_call_id": "2", "content": [_text("B-"), _text("result")]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "c", "arguments": {}}}]},
        {"role": "tool", "content": "C-result"},
    ]
    expected = (
        "[gMASK]<sop><|user|>two calls<|assistant|></think><tool_call>a</tool_call><tool_call>b</tool_call>"
        "<|observation|><tool_response>A-result</tool_response><tool_response>B-result</tool_response>"
        "<|assistant|></think><tool_call>c</tool_call>"
        "<|observation|><tool_response>C-result</tool_response>"
        "<|assistant|><think>"
    )
    assert render(msgs) == expected


CHAIN = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "", "reasoning": " R2 ", "tool_calls": [_fn("t", {})]},
    {"role": "tool", "content": "out"},
    {"role": "assistant", "content": "A2", "reasoning_content": "R3"},
]


def test_reasoning_cleared_before_last_user_by_default() -> None:
    assert render(CHAIN, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2"
        "<|assistant|><think>R2</think><tool_call>t</tool_call>"
        "<|observation|><tool_response>out</tool_response><|assistant|><think>R3</think>A2"
    )
    assert render(CHAIN, add_generation_prompt=False, clear_thinking=True) == render(CHAIN, add_generation_prompt=False)


def test_reasoning_kept_when_clear_thinking_false() -> None:
    assert render(CHAIN, add_generation_prompt=False, clear_thinking=False) == (
        "[gMASK]<sop><|user|>Q1<|assistant|><think>R1</think>A1<|user|>Q2"
        "<|assistant|><think>R2</think><tool_call>t</tool_call>"
        "<|observation|><tool_response>out</tool_response><|assistant|><think>R3</think>A2"
    )


def test_reasoning_inline_in_content_is_split_out() -> None:
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>mull</think>\nAnswer"}]
    assert render(msgs, add_generation_prompt=False) == "[gMASK]<sop><|user|>Q<|assistant|><think>mull</think>Answer"


def test_empty_reasoning_renders_closed_think() -> None:
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "  "}]
    assert render(msgs, add_generation_prompt=False) == "[gMASK]<sop><|user|>Q<|assistant|></think>A"


def test_text_part_content_and_developer_role() -> None:
    msgs = [
        {"role": "developer", "content": [{"type": "text", "text": "Rules."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "世界 🌍"}]},
    ]
    assert render(msgs) == "[gMASK]<sop><|system|>Rules.<|user|>Hello, 世界 🌍<|assistant|><think>"


def test_messages_are_not_mutated() -> None:
    msgs = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}]},
    ]
    before = copy.deepcopy(msgs)
    render(msgs)
    assert msgs == before


def _call(function: dict) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([{"role": "robot", "content": "x"}], "message 0 has unknown role 'robot'"),
        ([{"role": "user", "content": "x"}, {"role": "user"}], "message 1 (user) has no content"),
        ([{"role": "system", "content": None}], "message 0 (system) has no content"),
        ([{"role": "tool"}], "message 0 (tool) has no content"),
        ([{"content": "x"}], "message 0 has no role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "content part of type 'image_url'"),
        ([{"role": "user", "content": ["plain"]}], "content part that is not"),
        ([{"role": "user", "content": 5}], "has content of type int"),
        (["hello"], "message 0 is not an object"),
        ([_call({"name": "f", "arguments": "{oops"})], "arguments are not valid JSON"),
        ([_call({"name": "f", "arguments": "[1]"})], "arguments must be a JSON object"),
        ([_call({"arguments": {}})], "message 0 tool_calls[0] has no function name"),
        ([{"role": "assistant", "content": "", "tool_calls": "f()"}], "tool_calls that are not a list"),
    ],
)
def test_bad_messages_raise_clear_errors(messages, needle: str) -> None:
    with pytest.raises(ChatTemplateError) as exc:
        render(messages)
    assert needle in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_messages_must_be_a_list() -> None:
    with pytest.raises(ChatTemplateError, match="messages must be a list"):
        render({"role": "user", "content": "x"})  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError, match="tools must be a list"):
        render([{"role": "user", "content": "x"}], tools={"name": "f"})  # type: ignore[arg-type]


def test_template_syntax_and_runtime_errors() -> None:
    with pytest.raises(ChatTemplateError, match="syntax error at line 2"):
        render_chat_template("ok\n{% if x %}", [])
    with pytest.raises(ChatTemplateError, match=r"^custom failure$"):
        render_chat_template("{{ raise_exception('custom failure') }}", [])
    with pytest.raises(ChatTemplateError, match="empty"):
        render_chat_template("", [])
    # The sandbox refuses attribute games; that surfaces as a ChatTemplateError too.
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__ }}", [])
    with pytest.raises(ChatTemplateError):
        render_chat_template("{% set _ = messages.append(1) %}", [])


def test_tojson_filter_options_and_no_html_escaping() -> None:
    tpl = "{{ x | tojson }}|{{ x | tojson(ensure_ascii=True) }}|{{ x | tojson(indent=2) }}"
    out = render_chat_template(tpl, [], x={"k": "<é>&"})
    assert out == '{"k": "<é>&"}|{"k": "<\\u00e9>&"}|{\n  "k": "<é>&"\n}'


def test_custom_template_sees_kwargs_and_loop_controls() -> None:
    tpl = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role }}:{{ m.content }};"
        "{% endfor %}{{ bos_token }}{{ add_generation_prompt }}"
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert render_chat_template(tpl, msgs, bos_token="<s>") == "user:a;assistant:b;<s>True"
