"""Turn one chat completion's raw output text into an assistant message: reasoning, content and tool calls.

The reasoning parser runs first and the tool-call parser runs on its content, both whole (:meth:`ChatOutputParser.
parse`) and streamed (:meth:`ChatOutputParser.feed` / :meth:`ChatOutputParser.finish`, or a fresh
:class:`ChatOutputStreamer` per request from :meth:`ChatOutputParser.stream`). Tool parsing is active only when
the request has tools and ``tool_choice`` is not ``"none"``; otherwise tool-call text stays content, and a
``<tool_call>`` inside the thinking stays reasoning too (it no longer ends the reasoning). See
:mod:`flint_engine.parsers.reasoning` and :mod:`flint_engine.parsers.tool_calls` for the rules.

Both ``reasoning`` and ``reasoning_content`` are written by the ``to_openai`` helpers (project decision 6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flint_engine.parsers.reasoning import CONTENT, REASONING, Piece, ReasoningParser
from flint_engine.parsers.tool_calls import DeltaEvent, ToolCall, ToolCallParser, ToolCallStreamer

logger = logging.getLogger(__name__)


@dataclass
class ParsedMessage:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``choices[i].message`` dict (``tool_calls`` left out when empty)."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content,
            "reasoning": self.reasoning,
            "reasoning_content": self.reasoning,
        }
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


@dataclass
class MessageDelta:
    """One streamed change; normally exactly one field is set."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``choices[i].delta`` dict, without unset fields."""
        delta: dict[str, Any] = {}
        if self.reasoning is not None:
            delta["reasoning"] = self.reasoning
            delta["reasoning_content"] = self.reasoning
        if self.content is not None:
            delta["content"] = self.content
        if self.tool_calls:
            delta["tool_calls"] = self.tool_calls
        return delta


class ChatOutputParser:
    """Parses model output for one request's settings; ``parse`` is stateless, ``feed``/``finish`` stream."""

    def __init__(
        self,
        thinking: bool = True,
        tools: list[dict[str, Any]] | None = None,
        tool_choice_none: bool = False,
        *,
        parallel_tool_calls: bool = True,
        seed: int | None = None,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.tools_active = bool(tools) and not tool_choice_none
        self.reasoning_parser = ReasoningParser(thinking, tool_call_ends_reasoning=self.tools_active)
        self.tool_parser: ToolCallParser | None = (
            ToolCallParser(tools, parallel_tool_calls=parallel_tool_calls, seed=seed, id_factory=id_factory)
            if self.tools_active
            else None
        )
        self._streamer: ChatOutputStreamer | None = None

    def parse(self, text: str) -> ParsedMessage:
        """Parse the complete output text."""
        reasoning, content = self.reasoning_parser.extract(text)
        if self.tool_parser is None:
            return ParsedMessage(reasoning=reasoning, content=content)
        parsed = self.tool_parser.extract(content or "")
        return ParsedMessage(reasoning=reasoning, content=parsed.content, tool_calls=parsed.calls)

    def stream(self) -> ChatOutputStreamer:
        """A fresh streamer for one output."""
        return ChatOutputStreamer(self)

    def feed(self, delta: str) -> list[MessageDelta]:
        """Stream one output through an internal streamer (reset by :meth:`finish`)."""
        if self._streamer is None:
            self._streamer = self.stream()
        return self._streamer.feed(delta)

    def finish(self) -> list[MessageDelta]:
        """End the output fed so far; the next :meth:`feed` starts a new one."""
        streamer, self._streamer = self._streamer, None
        return streamer.finish() if streamer is not None else []


class ChatOutputStreamer:
    """Streaming counterpart of :meth:`ChatOutputParser.parse` for one output."""

    def __init__(self, parser: ChatOutputParser) -> None:
        self._reasoning = parser.reasoning_parser.stream()
        self._tools: ToolCallStreamer | None = parser.tool_parser.stream() if parser.tool_parser else None

    @property
    def incomplete_tool_call_index(self) -> int | None:
        """After :meth:`finish`: index of a call whose start was streamed but whose ``</tool_call>`` never came."""
        return self._tools.incomplete_call_index if self._tools is not None else None

    def feed(self, delta: str) -> list[MessageDelta]:
        """Consume one text delta; return the message deltas that are now certain."""
        out: list[MessageDelta] = []
        self._route(self._reasoning.feed(delta), out)
        return out

    def finish(self) -> list[MessageDelta]:
        """Flush everything held back at the end of the output."""
        out: list[MessageDelta] = []
        self._route(self._reasoning.finish(), out)
        if self._tools is not None:
            self._add_events(self._tools.finish(), out)
        return out

    def _route(self, pieces: list[Piece], out: list[MessageDelta]) -> None:
        for kind, text in pieces:
            if kind == REASONING:
                _append(out, MessageDelta(reasoning=text))
            elif kind == CONTENT and self._tools is not None:
                self._add_events(self._tools.feed(text), out)
            else:
                _append(out, MessageDelta(content=text))

    @staticmethod
    def _add_events(events: list[DeltaEvent], out: list[MessageDelta]) -> None:
        for event in events:
            if event.content is not None:
                _append(out, MessageDelta(content=event.content))
            elif event.tool_call is not None:
                _append(out, MessageDelta(tool_calls=[event.tool_call]))


def _append(out: list[MessageDelta], delta: MessageDelta) -> None:
    """Append, merging into the previous delta when both carry only the same kind of field."""
    last = out[-1] if out else None
    if last is not None:
        if delta.reasoning is not None and last.reasoning is not None:
            last.reasoning += delta.reasoning
            return
        if delta.content is not None and last.content is not None:
            last.content += delta.content
            return
        if delta.tool_calls and last.tool_calls:
            for call in delta.tool_calls:
                prev = last.tool_calls[-1]
                if "id" not in call and "id" not in prev and prev["index"] == call["index"]:
                    prev["function"]["arguments"] += call["function"]["arguments"]
                else:
                    last.tool_calls.append(call)
            return
    out.append(delta)
