"""`POST /v1/messages`: Anthropic's Messages API on the chat path, as vLLM and llama.cpp serve it.

The request becomes a chat request (`anthropic_protocol`), runs as one choice through `ChatHandler`, and its parsed
output (thinking, text, GLM-4.7 tool calls) comes back as content blocks: `thinking`, `text` and `tool_use` (the
call's arguments as its `input` object), with `stop_reason` `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
Streams send Anthropic's events (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
`message_stop`). Errors use Anthropic's shape, `{"type": "error", "error": {"type": ..., "message": ...}}`.
`POST /v1/messages/count_tokens` answers the prompt's length.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from .anthropic_protocol import MessagesRequest
from .backend import GenerationBackend
from .chat import ChatHandler, PreparedChat, chat_request_of, parsed_deltas
from .choices import ChoiceEvent, collect, totals
from .errors import APIError, to_api_error
from .settings import APISettings

# Anthropic's error types by HTTP status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(exc: APIError) -> JSONResponse:
    """An API error in Anthropic's shape (same status and headers)."""
    body = {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.status, "api_error"), "message": exc.message}}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def _stop_reason(finish: str | None, stop: str | int | None, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished choice."""
    if called:
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class PreparedMessages:
    req: MessagesRequest
    chat: PreparedChat
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")

    def message(self, content: list[dict[str, Any]], stop: tuple[str | None, str | None], usage: dict) -> dict:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.chat.model,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": usage,
        }

    def usage(self, output_tokens: int, cached: int) -> dict[str, Any]:
        return {
            "input_tokens": len(self.chat.prompt_ids),
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }


class MessagesHandler:
    def __init__(self, backend: GenerationBackend, settings: APISettings) -> None:
        self.chat = ChatHandler(backend, settings)

    def prepare(self, req: MessagesRequest) -> PreparedMessages:
        return PreparedMessages(req, self.chat.prepare(chat_request_of(req)))

    def count_tokens(self, req: MessagesRequest) -> dict[str, int]:
        return {"input_tokens": len(self.prepare(req).chat.prompt_ids)}

    def events(self, prep: PreparedMessages) -> AsyncIterator[ChoiceEvent]:
        return self.chat.events(prep.chat)

    async def complete(self, prep: PreparedMessages, events: AsyncIterator[ChoiceEvent]) -> dict[str, Any]:
        [done] = await collect(events, 1)
        parsed = prep.chat.parser().parse(done.text)
        content: list[dict[str, Any]] = []
        if parsed.reasoning:
            thinking = "" if prep.req.thinking_omitted() else parsed.reasoning
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        if parsed.content:
            content.append({"type": "text", "text": parsed.content})
        for call in parsed.tool_calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call.arguments)})
        stop = _stop_reason(done.final.finish_reason, done.final.stop_reason, bool(parsed.tool_calls))
        completion, cached = totals([done])
        return prep.message(content, stop, prep.usage(completion, cached))

    async def stream(
        self, prep: PreparedMessages, events: AsyncIterator[ChoiceEvent], include_usage: bool, continuous: bool
    ) -> AsyncIterator[str]:
        """Anthropic's event stream for `events` (primed by the caller); an error after the 200 is an `error` event."""
        blocks = _BlockStream(omit_thinking=prep.req.thinking_omitted())
        start = prep.message([], (None, None), prep.usage(0, 0))
        yield _event("message_start", message=start)
        completion, cached, last = 0, 0, None
        try:
            async for ev, deltas in parsed_deltas(prep.chat, events):
                completion, cached = ev.completion_tokens, max(cached, ev.cached_tokens)
                last = ev if ev.finished else last
                for d in deltas:
                    for line in blocks.delta(d.reasoning, d.content, d.tool_calls):
                        yield line
            for line in blocks.close():
                yield line
            stop_reason, stop_sequence = _stop_reason(
                last.finish_reason if last else None, last.stop_reason if last else None, blocks.called
            )
            yield _event(
                "message_delta",
                delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                usage={"output_tokens": completion, "cache_read_input_tokens": cached},
            )
            yield _event("message_stop")
        except Exception as exc:  # after the 200 went out, an error travels as an event
            api = to_api_error(exc) or APIError(500, "internal server error", code="internal_error")
            error = {"type": _ERROR_TYPES.get(api.status, "api_error"), "message": api.message}
            yield _event("error", error=error)


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"


class _BlockStream:
    """Tracks the content block being written (thinking, text, or one tool_use) and its index."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking  # `display: "omitted"`: thinking blocks open and close, with no text
        self.index = -1
        self.open: str | None = None
        self.call_index: int | None = None
        self.called = False

    def close(self) -> list[str]:
        if self.open is None:
            return []
        lines = []
        if self.open == "thinking":  # Anthropic's clients expect a signature before a thinking block ends
            lines.append(
                _event("content_block_delta", index=self.index, delta={"type": "signature_delta", "signature": ""})
            )
        lines.append(_event("content_block_stop", index=self.index))
        self.open = None
        return lines

    def _start(self, kind: str, block: dict[str, Any]) -> list[str]:
        lines = self.close()
        self.index += 1
        self.open = kind
        lines.append(_event("content_block_start", index=self.index, content_block=block))
        return lines

    def delta(self, reasoning: str | None, content: str | None, tool_calls: list[dict[str, Any]] | None) -> list[str]:
        lines: list[str] = []
        if reasoning:
            if self.open != "thinking":
                lines += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            if not self.omit_thinking:
                delta = {"type": "thinking_delta", "thinking": reasoning}
                lines.append(_event("content_block_delta", index=self.index, delta=delta))
        if content:
            if self.open != "text":
                lines += self._start("text", {"type": "text", "text": ""})
            lines.append(_event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": content}))
        for call in tool_calls or []:
            call_index = call.get("index", 0)
            function = call.get("function") or {}
            if self.open != "tool_use" or self.call_index != call_index:
                block = {
                    "type": "tool_use",
                    "id": call.get("id") or "",
                    "name": function.get("name") or "",
                    "input": {},
                }
                lines += self._start("tool_use", block)
                self.call_index, self.called = call_index, True
            fragment = function.get("arguments") or ""
            if fragment:
                delta = {"type": "input_json_delta", "partial_json": fragment}
                lines.append(_event("content_block_delta", index=self.index, delta=delta))
        return lines
