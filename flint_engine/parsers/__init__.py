"""Output parsers for GLM-4.7-style text: reasoning (``</think>``), XML tool calls, and the combined chat message."""

from flint_engine.parsers.chat_output import ChatOutputParser, ChatOutputStreamer, MessageDelta, ParsedMessage
from flint_engine.parsers.reasoning import ReasoningParser, ReasoningStreamer
from flint_engine.parsers.tool_calls import (
    DeltaEvent,
    ParsedToolCalls,
    ToolCall,
    ToolCallParser,
    ToolCallStreamer,
    convert_value,
    make_tool_call_id,
)

__all__ = [
    "ChatOutputParser",
    "ChatOutputStreamer",
    "DeltaEvent",
    "MessageDelta",
    "ParsedMessage",
    "ParsedToolCalls",
    "ReasoningParser",
    "ReasoningStreamer",
    "ToolCall",
    "ToolCallParser",
    "ToolCallStreamer",
    "convert_value",
    "make_tool_call_id",
]
