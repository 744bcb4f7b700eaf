"""Chat templates: Flint's GLM-4.7-style default template and a sandboxed Jinja renderer for any checkpoint's template.

The renderer matches the environment Hugging Face `transformers` uses for `apply_chat_template` (sandboxed,
`trim_blocks`, `lstrip_blocks`, `loopcontrols`, a `tojson` filter that does not HTML-escape, `raise_exception`),
so a template taken from a checkpoint renders here exactly as it does there.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)


class ChatTemplateError(ValueError):
    """A chat template that does not compile or render, or messages it cannot render."""


# GLM-4.7 layout. Every tag strips the whitespace around it, so the template's own indentation never reaches the
# prompt whatever trim settings a consumer uses; the only newlines in the output are the ones inside the tools
# header and the explicit '\n' expressions.
DEFAULT_CHAT_TEMPLATE = r"""
{#- Flint default chat template (GLM-4.7 style): no newlines between role tokens and content. -#}
{%- macro flint_text(content, where, allow_empty) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is none or content is undefined -%}
        {%- if not allow_empty -%}
            {{- raise_exception(where ~ ' has no content') -}}
        {%- endif -%}
    {%- elif content is sequence and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is mapping and part.type == 'text' and part.text is string -%}
                {{- part.text -}}
            {%- elif part is mapping and part.type is defined -%}
                {{- raise_exception(
                    where ~ " has a content part of type '" ~ part.type ~ "'; only text parts are supported") -}}
            {%- else -%}
                {{- raise_exception(
                    where ~ ' has a content part that is not a {"type": "text", "text": ...} object') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- raise_exception(where ~ ' has content that is neither a string nor a list of text parts') -}}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- set keep_all_reasoning = clear_thinking is defined and clear_thinking is not none and not clear_thinking -%}
[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- '\n' -}}
    {%- for tool in tools -%}
        {%- set spec = tool.function if (tool is mapping and tool.function is defined) else tool -%}
        {{- spec | tojson(ensure_ascii=False) -}}{{- '\n' -}}
    {%- endfor -%}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>
{%- endif -%}
{%- for m in messages -%}
    {%- set where = 'message ' ~ loop.index0 ~ ' (' ~ m.role ~ ')' -%}
    {%- if m.role == 'system' or m.role == 'developer' -%}
        <|system|>{{- flint_text(m.content, where, false) -}}
    {%- elif m.role == 'user' -%}
        <|user|>{{- flint_text(m.content, where, false) -}}
    {%- elif m.role == 'assistant' -%}
        {%- set content = flint_text(m.content, where, true) -%}
        {%- set reasoning = '' -%}
        {%- if m.reasoning_content is string and m.reasoning_content -%}
            {%- set reasoning = m.reasoning_content -%}
        {%- elif m.reasoning is string and m.reasoning -%}
            {%- set reasoning = m.reasoning -%}
        {%- elif '</think>' in content -%}
            {#- A client that echoes the raw output back keeps the reasoning inline. -#}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1] -%}
        {%- endif -%}
        <|assistant|>
        {%- if reasoning.strip() and (keep_all_reasoning or loop.index0 > ns.last_user) -%}
            <think>{{- reasoning.strip() -}}</think>
        {%- else -%}
            </think>
        {%- endif -%}
        {{- content.strip() -}}
        {%- if m.tool_calls -%}
            {%- for tc in m.tool_calls -%}
                {%- set fn = tc.function if tc.function is defined else tc -%}
                {%- set args = fn.arguments if (fn.arguments is defined and fn.arguments is not none) else {} -%}
                {%- if args is not mapping -%}
                    {{- raise_exception(where ~ ' has a tool call whose arguments are not a JSON object') -}}
                {%- endif -%}
                <tool_call>{{- fn.name -}}
                {%- for key, value in args.items() -%}
                    <arg_key>{{- key -}}</arg_key><arg_value>
                    {{- value if value is string else value | tojson(ensure_ascii=False) -}}
                    </arg_value>
                {%- endfor -%}
                </tool_call>
            {%- endfor -%}
        {%- endif -%}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            <|observation|>
        {%- endif -%}
        <tool_response>{{- flint_text(m.content, where, false) -}}</tool_response>
    {%- else -%}
        {{- raise_exception('message ' ~ loop.index0 ~ " has unknown role '" ~ m.role ~ "'") -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>
    {%- if enable_thinking is defined and enable_thinking is not none and not enable_thinking -%}
        </think>
    {%- else -%}
        <think>
    {%- endif -%}
{%- endif -%}
""".strip()


class _RaisedByTemplate(ChatTemplateError):
    """An error the template raised on purpose; its message is passed through unchanged."""


def _raise_exception(message: str) -> NoReturn:
    raise _RaisedByTemplate(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'", which would corrupt tool schemas in the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile (and cache) a chat template; a syntax error becomes a ChatTemplateError with its line number."""
    if not isinstance(template, str) or not template.strip():
        raise ChatTemplateError("chat template is empty")
    try:
        compiled = _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from e
    log.debug("compiled a chat template of %d characters", len(template))
    return compiled


def _prepare_tool_call(tc: Any, where: str) -> dict[str, Any]:
    """Copy one tool call, parsing JSON-string arguments into a dict (OpenAI clients send strings)."""
    if not isinstance(tc, Mapping):
        raise ChatTemplateError(f"{where} is not an object")
    out = dict(tc)
    fn = out.get("function")
    if fn is not None and not isinstance(fn, Mapping):
        raise ChatTemplateError(f"{where}.function is not an object")
    # OpenAI nests name/arguments under "function"; a flat {"name", "arguments"} call is accepted too.
    holder = dict(fn) if fn is not None else out
    name = holder.get("name")
    if not isinstance(name, str) or not name:
        raise ChatTemplateError(f"{where} has no function name")
    args = holder.get("arguments")
    if isinstance(args, str):
        if not args.strip():
            args = {}
        else:
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                raise ChatTemplateError(f"{where} arguments are not valid JSON: {e}") from e
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise ChatTemplateError(f"{where} arguments must be a JSON object, got {type(args).__name__}")
    holder["arguments"] = dict(args)
    if fn is not None:
        out["function"] = holder
    return out


def _prepare_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the structure every template relies on and return shallow copies safe to hand to the template."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of message objects")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"message {i}"
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"{where} is not an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"{where} has no role")
        msg = dict(m)
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list, tuple)):
            raise ChatTemplateError(
                f"{where} ({role}) has content of type {type(content).__name__}; expected a string or a list of parts"
            )
        if isinstance(content, tuple):
            msg["content"] = list(content)
        tool_calls = msg.get("tool_calls")
        if tool_calls is not None:
            if isinstance(tool_calls, (str, bytes, Mapping)) or not isinstance(tool_calls, Sequence):
                raise ChatTemplateError(f"{where} ({role}) has tool_calls that are not a list")
            msg["tool_calls"] = [_prepare_tool_call(tc, f"{where} tool_calls[{j}]") for j, tc in enumerate(tool_calls)]
        out.append(msg)
    return out


def _prepare_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ChatTemplateError("tools must be a list of tool objects")
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping):
            raise ChatTemplateError(f"tool {i} is not an object")
    return [dict(t) for t in tools]


def _final_text(messages: list[dict[str, Any]]) -> str:
    """The final message's text as `continue_final_message` looks for it: its content, or its last text part."""
    content = messages[-1].get("content") if messages else None
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        content = texts[-1] if texts else None
    if not isinstance(content, str):
        raise ChatTemplateError("continue_final_message needs a final message with text content")
    return content


def _cut_after(rendered: str, final: str) -> str:
    """`rendered` up to the end of the final message's text, so the model goes on writing it (as transformers'
    `continue_final_message` cuts it: where the template strips the text's trailing blanks, they stay off)."""
    at = rendered.rfind(final.strip())
    if at < 0:
        raise ChatTemplateError(
            "continue_final_message is set but the final message's text does not appear in the rendered prompt"
        )
    whole = final.lstrip()
    return rendered[: at + (len(whole) if rendered[at : at + len(whole)] == whole else len(final.strip()))]


def render_chat_template(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    **kwargs: Any,
) -> str:
    """Render `messages` (and OpenAI-style `tools`) to a prompt string; with `continue_final_message`, one that
    ends inside the final message (e.g. an assistant turn the model completes) instead of after it.

    `kwargs` reach the template as variables: `enable_thinking`, `clear_thinking`, special-token strings, etc.
    """
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be set")
    compiled = compile_chat_template(template)
    context = dict(kwargs)
    prepared = _prepare_messages(messages)
    context.update(messages=prepared, tools=_prepare_tools(tools), add_generation_prompt=add_generation_prompt)
    try:
        rendered = compiled.render(**context)
        return _cut_after(rendered, _final_text(prepared)) if continue_final_message else rendered
    except _RaisedByTemplate as e:
        raise ChatTemplateError(str(e)) from None
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as e:
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e
