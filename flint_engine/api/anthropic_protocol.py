"""Anthropic Messages API requests (`POST /v1/messages`), translated into the chat request this server already runs.

`system` becomes the system message; `text` blocks are text, an assistant's `tool_use` blocks its tool calls and its
`thinking` blocks its reasoning (shown by the template in a tool loop's turns), a user's `tool_result` blocks tool
messages; `tools` (`name`, `description`, `input_schema`) and `tool_choice` (`auto`, `any`, `tool`, `none`)
map onto the chat ones, `thinking.type` `disabled` turns the thinking off (absent or `enabled`: the model's default,
on) and `enabled` with `budget_tokens` caps it (the chat request's `thinking_token_budget`); `display: "omitted"`
returns the thinking blocks empty; `output_config.format` (a JSON schema) is the chat request's response_format.
What Flint cannot take (images, documents, server tools such as web search, MCP servers) is refused.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from .protocol import MAX_CACHE_SALT, ChatCompletionRequest, Lenient

# Anthropic's thinking types; None: absent. "adaptive" and "between_tools" run as the model's default (it thinks).
THINKING_TYPES = (None, "enabled", "disabled", "adaptive", "between_tools")


class MessagesRequest(Lenient):
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # `format` (a JSON schema) is honoured; `effort` is accepted
    metadata: dict[str, Any] | None = None
    ignore_eos: bool = False  # vLLM's extension: fixed-length answers for benchmarks
    # vLLM's extension: only requests with the same salt share prefix-cache blocks
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT)
    mcp_servers: Any = None
    container: Any = None
    stream_options: Any = None  # never sent by Anthropic clients; `_generate` reads it

    def thinking_on(self) -> bool | None:
        """False for `{"type": "disabled"}`, else None (the model's default: it thinks before each answer, also
        between tool calls)."""
        kind = (self.thinking or {}).get("type")
        if kind not in THINKING_TYPES:
            raise ValueError(f"thinking.type must be one of {', '.join(THINKING_TYPES[1:])}, got {kind!r}")
        display = (self.thinking or {}).get("display")
        if display not in (None, "summarized", "omitted"):
            raise ValueError(f"thinking.display must be summarized or omitted, got {display!r}")
        return False if kind == "disabled" else None

    def thinking_omitted(self) -> bool:
        """`thinking.display: "omitted"`: thinking blocks come back empty (the model still thinks)."""
        return (self.thinking or {}).get("display") == "omitted"

    def response_format(self) -> dict[str, Any] | None:
        """`output_config.format` as the chat request's response_format."""
        fmt = (self.output_config or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise ValueError('output_config.format must be {"type": "json_schema", "schema": {...}}')
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}

    def thinking_budget(self) -> int | None:
        """`thinking.budget_tokens` of an enabled thinking (Anthropic's minimum of 1,024 is not imposed)."""
        if (self.thinking or {}).get("type") != "enabled" or "budget_tokens" not in (self.thinking or {}):
            return None
        budget = self.thinking["budget_tokens"]  # type: ignore[index]
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"thinking.budget_tokens must be a non-negative integer, got {budget!r}")
        return budget

    def to_chat(self) -> ChatCompletionRequest:
        """The equivalent chat completion request (ValueError naming the block or field that has no equivalent)."""
        for name in ("mcp_servers", "container"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is not supported by this server")
        messages = self._messages()
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k if self.top_k else None,
            "stop": self.stop_sequences or None,
            "stream": self.stream,
            "ignore_eos": self.ignore_eos or None,
            "cache_salt": self.cache_salt,
        }
        if messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
            # Anthropic's prefill: a final assistant turn is the beginning of the answer, which goes on from it
            body["continue_final_message"] = True
        if self.thinking_on() is False:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        body["thinking_token_budget"] = self.thinking_budget()
        body["response_format"] = self.response_format()
        effort = (self.output_config or {}).get("effort")
        body["reasoning_effort"] = effort if isinstance(effort, str) else None
        if self.tools is not None:
            body["tools"] = [_chat_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            choice, parallel = _chat_tool_choice(self.tool_choice)
            body["tool_choice"], body["parallel_tool_calls"] = choice, parallel
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})

    def _messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else _blocks_text(self.system, "system")
            out.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            role, content = message.get("role"), message.get("content")
            where = f"messages[{i}]"
            if role not in ("user", "assistant"):
                raise ValueError(f"{where}: role must be user or assistant, got {role!r}")
            if isinstance(content, str):
                out.append({"role": role, "content": content})
            elif isinstance(content, list):
                out += _assistant_turn(content, where) if role == "assistant" else _user_turn(content, where)
            else:
                raise ValueError(f"{where}: content must be a string or a list of content blocks")
        return out


def _block_kind(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise ValueError(f"{where}: content blocks must be objects with a 'type'")
    return kind


def _blocks_text(blocks: list[Any], where: str) -> str:
    texts = []
    for j, block in enumerate(blocks):
        kind = _block_kind(block, where)
        if kind != "text" or not isinstance(block.get("text"), str):
            raise ValueError(f"{where}[{j}]: content block type {kind!r} is not supported here: Flint reads text only")
        texts.append(block["text"])
    return "".join(texts)


def _user_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages (first, as they answer the last assistant turn), then text."""
    tools, texts = [], []
    for j, block in enumerate(blocks):
        kind = _block_kind(block, f"{where}.content[{j}]")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            result = block.get("content", "")
            if not isinstance(result, str):
                result = _blocks_text(result if isinstance(result, list) else [result], f"{where}.content[{j}]")
            if block.get("is_error"):
                result = f"Error: {result}"
            tools.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result})
        else:
            raise ValueError(
                f"{where}.content[{j}]: content block type {kind!r} is not supported: Flint reads text only"
            )
    return tools + ([{"role": "user", "content": "".join(texts)}] if texts or not tools else [])


def _assistant_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    texts, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        kind = _block_kind(block, f"{where}.content[{j}]")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str):
                raise ValueError(f"{where}.content[{j}]: tool_use blocks need a name")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            call_id = str(block.get("id") or f"toolu_{j}")
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind == "thinking":
            # The template shows the thinking of the turns since the last user message (a tool loop's) and leaves
            # older turns' out.
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        else:
            raise ValueError(f"{where}.content[{j}]: content block type {kind!r} is not supported in assistant turns")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if "".join(thinking):
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return [message]


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise ValueError(f"tools[{i}]: server tools ({tool.get('type')!r}) are not supported: define custom tools")
    function: dict[str, Any] = {"name": tool.get("name")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    if tool.get("input_schema") is not None:
        function["parameters"] = tool["input_schema"]
    if tool.get("strict") is not None:  # Anthropic's strict tool use: the input fits input_schema
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict[str, Any]) -> tuple[str | dict[str, Any], bool]:
    """(chat tool_choice, parallel_tool_calls)."""
    parallel = not choice.get("disable_parallel_tool_use", False)
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise ValueError("tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}")
