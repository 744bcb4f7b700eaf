"""OpenAI Responses API requests (`POST /v1/responses`), translated into the chat request this server already runs.

A Responses request is a chat completion in other clothes: `instructions` is a system message, `input` is either a
user message or a list of items (messages, the model's earlier `function_call`s and the client's
`function_call_output`s), tools are flat function definitions, `text.format` is the response format and
`reasoning.effort` turns the thinking on or off. A `previous_response_id` puts the stored conversation before `input`
(`response_store`, with `api.store_responses` on), as `conversation` puts a conversation's items
(`conversation_store`), and `background` runs it (`background_responses`); `prompt` is refused (400) rather than
ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from .protocol import MAX_CACHE_SALT, ChatCompletionRequest, Lenient


class ResponsesRequest(Lenient):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # include_obfuscation: nothing to obfuscate here
    store: bool | None = None  # with api.store_responses on, false keeps this response from being stored
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Extensions as in /v1/chat/completions (vLLM's Responses API takes them too).
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    ignore_eos: bool = False  # vLLM's extension: fixed-length answers for benchmarks
    priority: int | None = None  # vLLM's: lower values are scheduled first (checked as on chat)
    service_tier: str | None = None  # OpenAI's: "flex" runs at api.flex_priority unless a priority is named
    # vLLM's: only requests with the same salt share prefix-cache blocks (as on chat)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT)
    previous_response_id: str | None = None  # a stored response this one continues from
    background: bool | None = None  # answered at once as queued, polled with GET (needs stored responses)
    # A conversation (`conversation_store`) this response reads and adds its turn to: its id, or {"id": ...}.
    conversation: str | dict[str, Any] | None = None
    # What this server cannot do: refused rather than silently ignored.
    prompt: Any = None
    # The output text's logprobs: asked for by `include` or by `top_logprobs` (the alternatives a token). Other
    # `include` values name outputs of tools this server does not offer, or encrypted reasoning (the reasoning
    # item's text is what a client sends back here), so there is nothing for them to add.
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    # "auto": an input longer than the context loses its oldest turns (after the instructions) until it fits.
    truncation: Literal["auto", "disabled"] | None = None

    @field_validator("prompt")
    @classmethod
    def _not_kept(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError(
                "prompt is not supported: this server keeps no prompt templates, send the prompt in instructions"
                " and input"
            )
        return v

    @field_validator("conversation")
    @classmethod
    def _conversation_id(cls, v: str | dict[str, Any] | None) -> str | None:
        """The conversation's id, as a string or {"id": ...} names it."""
        if isinstance(v, dict):
            v = v.get("id")
            if not isinstance(v, str):
                raise ValueError("conversation must be a conversation id or {'id': <conversation id>}")
        if v is not None and not v:
            raise ValueError("conversation must not be empty")
        return v

    @field_validator("input")
    @classmethod
    def _some_input(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(v, list) and not v:
            raise ValueError("input must not be an empty list")
        return v

    # ------------------------------------------------------------------ translation
    def input_items(self) -> list[dict[str, Any]]:
        """`input` as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return list(self.input)

    def output_logprobs(self) -> int | None:
        """The alternatives a token of the output text's logprobs (0: the token's own only), or None: none asked."""
        if self.top_logprobs is None and "message.output_text.logprobs" not in (self.include or []):
            return None
        return self.top_logprobs or 0

    def reasoning_effort(self) -> str | None:
        effort = (self.reasoning or {}).get("effort")
        return effort if isinstance(effort, str) else None

    def to_chat(self) -> ChatCompletionRequest:
        """The equivalent chat completion request (ValueError naming the item or field that has no equivalent)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self._messages(),
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning_effort": self.reasoning_effort(),
            "chat_template_kwargs": self.chat_template_kwargs,
            "ignore_eos": self.ignore_eos or None,
            "stream": self.stream,
            "cache_salt": self.cache_salt,
        }
        if self.priority is not None:  # only when named: a chat request without one takes its service tier's
            body["priority"] = self.priority
        if self.service_tier is not None:
            body["service_tier"] = self.service_tier
        if self.output_logprobs() is not None:
            body["logprobs"], body["top_logprobs"] = True, self.output_logprobs()
        if self.tools is not None:
            body["tools"] = [_chat_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(self.tool_choice)
        fmt = (self.text or {}).get("format")
        if fmt is not None:
            body["response_format"] = _chat_response_format(fmt)
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})

    def _messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            out.append({"role": "user", "content": self.input})
            return out
        reasoning: str | None = None  # a reasoning item's text, for the assistant turn that follows it
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "message":
                message = _chat_message(item, i)
                if message["role"] == "assistant" and reasoning:
                    message["reasoning_content"] = reasoning
                reasoning = None
                out.append(message)
            elif kind == "function_call":
                call = {
                    "id": _text_field(item, "call_id", i),
                    "type": "function",
                    "function": {"name": _text_field(item, "name", i), "arguments": item.get("arguments", "{}")},
                }
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant":
                    # The same turn: its text (a message item) or parallel calls came just before.
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                    if reasoning:
                        out[-1]["reasoning_content"] = reasoning
                reasoning = None
            elif kind == "function_call_output":
                output = item.get("output")
                if not isinstance(output, str):
                    output = _parts_text(output, i, ("input_text", "output_text"))
                out.append({"role": "tool", "tool_call_id": _text_field(item, "call_id", i), "content": output})
            elif kind == "reasoning":
                # Kept with the next assistant turn: the template shows the thinking of the turns since the last user
                # message (a tool loop's), and leaves older turns' out.
                reasoning = _reasoning_text(item, i)
            else:
                raise ValueError(f"input[{i}]: items of type {kind!r} are not supported by this server")
        return out


def _reasoning_text(item: dict[str, Any], i: int) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise ValueError(f"input[{i}]: a reasoning item's content must be a list of text parts")
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def _text_field(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"input[{i}]: {item.get('type', 'message')} items need a {key} string")
    return value


def _parts_text(content: Any, i: int, kinds: tuple[str, ...]) -> str:
    if not isinstance(content, list):
        raise ValueError(f"input[{i}]: content must be a string or a list of text parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise ValueError(f"input[{i}]: content part type {kind!r} is not supported: Flint reads text only")
        texts.append(part["text"])
    return "".join(texts)


def _chat_message(item: dict[str, Any], i: int) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("system", "developer", "user", "assistant"):
        raise ValueError(f"input[{i}]: role must be system, developer, user or assistant, got {role!r}")
    content = item.get("content")
    if not isinstance(content, str):
        content = _parts_text(content, i, ("input_text", "output_text", "text"))
    return {"role": role, "content": content}


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise ValueError(f"tools[{i}]: only function tools are supported, got type {tool.get('type')!r}")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    tools = choice.get("tools")
    if choice.get("type") == "allowed_tools" and isinstance(tools, list):
        if not all(isinstance(t, dict) and t.get("type") == "function" for t in tools):
            raise ValueError("tool_choice allowed_tools: only function tools ({'type': 'function', 'name': ...})")
        named = [{"type": "function", "function": {"name": t.get("name")}} for t in tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": named}}
    raise ValueError(
        "tool_choice must be 'none', 'auto', 'required', {'type': 'function', 'name': ...} or"
        " {'type': 'allowed_tools', 'mode': ..., 'tools': [...]}"
    )


def _chat_response_format(fmt: Any) -> dict[str, Any]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise ValueError(f"text.format type must be text, json_object or json_schema, got {kind!r}")
