"""Parse GLM-4.7 XML-style tool calls into OpenAI tool calls, whole or streamed.

Format: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>``; string values are raw,
everything else is JSON (the chat template writes ``v | tojson`` for non-strings). Several calls may follow each
other, with text before, between and after them.

Choices (the non-streaming :meth:`ToolCallParser.extract` and :class:`ToolCallStreamer` agree for any chunking):

* Tolerance: whitespace/newlines between tags (GLM-4.5 style) are skipped; a missing opening ``<arg_key>`` is
  tolerated; so is a missing ``</arg_key>`` (the key ends at ``<arg_value>``) and a missing ``</arg_value>``
  (the value ends at ``</tool_call>``). The name is the first run of non-whitespace characters other than ``<``;
  keys are stripped. Stray text between ``</arg_key>`` and ``<arg_value>``, and a key with no value, are dropped
  with a warning. A repeated key keeps its first value (streaming cannot take back what it already sent).
* Content is all text outside calls, concatenated verbatim; blank content is ``None``.
* A ``<tool_call>`` region with no name is not a call: its raw text stays in the content.
* A call without ``</tool_call>`` (output cut by max_tokens) is not returned as a call: its raw text, from
  ``<tool_call>`` to the end, is appended to the content so nothing is lost. Calls completed before it are kept.
  The streamer may already have sent that call's name and part of its arguments; :meth:`ToolCallStreamer.finish`
  then also emits the raw text as content (so streamed content equals the non-streaming content) and
  :attr:`ToolCallStreamer.incomplete_call_index` names the partial call (its arguments are not valid JSON).
* Argument typing by the tool's JSON schema (``type``, or the types of ``anyOf``/``oneOf`` members, or of
  ``enum``/``const`` values): exactly ``"string"`` keeps the raw value unchanged (not stripped). A union that
  includes ``"string"`` takes the stripped value as JSON only if it parses to one of the *other* listed types
  (``"null"`` -> None for ``["string", "null"]``), else keeps the raw string. Anything else (other types, unknown
  tools, unknown arguments, no schema) tries ``json.loads`` on the stripped value, then ``ast.literal_eval``
  (Python-style ``True``/``None``/quotes), keeping only JSON-representable results (no NaN/Infinity), and
  falls back to the raw string. Parsed values are not checked against the schema.
* ``arguments`` is ``json.dumps(args, ensure_ascii=False)``. Streaming emits the header
  ``{"index", "id", "type", "function": {"name", "arguments": ""}}`` once the name is complete, then argument
  fragments: a value of a plain ``"string"`` parameter streams piece by piece as it arrives (JSON-escaped),
  other values when complete, and the closing ``}`` (or ``{}`` for no arguments) at ``</tool_call>``.
* ``parallel_tool_calls=False`` keeps only the first call: every later ``<tool_call>`` region (complete or not)
  is dropped entirely, neither call nor content; text outside the regions stays content.
* Ids are ``call_`` + 24 random alphanumerics. With ``seed`` every extract/stream draws ids from a fresh
  ``random.Random(seed)``, so a streamed and a non-streamed parse of the same text get the same ids; an
  ``id_factory`` is called as is.
"""

from __future__ import annotations

import ast
import json
import logging
import random
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flint_engine.parsers.reasoning import BlankGate, find_first, none_if_blank, partial_tag_len

logger = logging.getLogger(__name__)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ARG_KEY_START = "<arg_key>"
ARG_KEY_END = "</arg_key>"
ARG_VALUE_START = "<arg_value>"
ARG_VALUE_END = "</arg_value>"

_ID_ALPHABET = string.ascii_letters + string.digits
_ID_LEN = 24
# ast.literal_eval on huge text is slow and memory hungry; such values are never Python literals in practice.
_LITERAL_EVAL_MAX_CHARS = 100_000

_MISSING = object()


def make_tool_call_id(rng: random.Random | None = None) -> str:
    """``call_`` + 24 alphanumerics, from ``rng`` or a cryptographic source."""
    if rng is None:
        return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LEN))
    return "call_" + "".join(rng.choices(_ID_ALPHABET, k=_ID_LEN))


@dataclass
class ToolCall:
    """One parsed call; ``arguments`` is a JSON object string."""

    id: str
    name: str
    arguments: str
    type: str = "function"

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``message.tool_calls[i]`` dict."""
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedToolCalls:
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def tools_called(self) -> bool:
        return bool(self.calls)


@dataclass
class DeltaEvent:
    """One streamed event: either ``content`` text or an OpenAI-shaped ``tool_call`` delta dict."""

    content: str | None = None
    tool_call: dict[str, Any] | None = None


# Argument typing.


def schema_types(schema: Any) -> frozenset[str] | None:
    """The JSON types a property schema allows, or ``None`` when it does not say."""
    if not isinstance(schema, dict):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list) and declared and all(isinstance(t, str) for t in declared):
        return frozenset(declared)
    for combinator in ("anyOf", "oneOf"):
        members = schema.get(combinator)
        if isinstance(members, list) and members:
            types: set[str] = set()
            for member in members:
                member_types = schema_types(member)
                if member_types is None:
                    return None
                types |= member_types
            return frozenset(types)
    values = schema.get("enum")
    if "const" in schema:
        values = [schema["const"]]
    if isinstance(values, list) and values:
        return frozenset(_json_type(v) for v in values)
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "unknown"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-JSON constant {name}")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _loads_or_missing(text: str) -> Any:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _MISSING
    # "1e999" parses to inf without going through parse_constant.
    return value if _jsonable(value) else _MISSING


def _literal_or_missing(text: str) -> Any:
    if len(text) > _LITERAL_EVAL_MAX_CHARS:
        return _MISSING
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _MISSING
    return value if _jsonable(value) else _MISSING


def convert_value(raw: str, types: frozenset[str] | None) -> Any:
    """Type one raw argument value by the schema types it may take (see the module docstring)."""
    if types == frozenset({"string"}):
        return raw
    stripped = raw.strip()
    if types is not None and "string" in types:
        value = _loads_or_missing(stripped)
        other = types - {"string"}
        if value is not _MISSING and (
            _json_type(value) in other or (_json_type(value) == "integer" and "number" in other)
        ):
            return value
        return raw
    value = _loads_or_missing(stripped)
    if value is _MISSING:
        value = _literal_or_missing(stripped)
    return raw if value is _MISSING else value


def _arg_fragment(first: bool, key: str) -> str:
    """The JSON text before an argument's value, exactly as ``json.dumps(dict)`` lays it out."""
    return ("{" if first else ", ") + json.dumps(key, ensure_ascii=False) + ": "


def _escape(text: str) -> str:
    """JSON-escape string content without quotes; per character, so pieces concatenate correctly."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


# Non-streaming body parse.


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _parse_body(body: str) -> tuple[str, list[tuple[str, str]]] | None:
    """Parse the text between ``<tool_call>`` and ``</tool_call>``: (name, [(key, raw value)]), or None."""
    pos = _skip_ws(body, 0)
    end = pos
    while end < len(body) and not body[end].isspace() and body[end] != "<":
        end += 1
    if end == pos:
        return None
    name = body[pos:end]
    args: list[tuple[str, str]] = []
    pos = end
    while True:
        pos = _skip_ws(body, pos)
        if pos >= len(body):
            break
        if body.startswith(ARG_KEY_START, pos):
            pos += len(ARG_KEY_START)
        idx, tag = find_first(body, (ARG_KEY_END, ARG_VALUE_START), pos)
        if idx < 0:
            logger.warning("tool call %r: dropping argument key without a value: %r", name, body[pos:][:80])
            break
        key = body[pos:idx].strip()
        pos = idx + len(tag)
        if tag == ARG_KEY_END:
            idx = body.find(ARG_VALUE_START, pos)
            if idx < 0:
                logger.warning("tool call %r: dropping argument %r without a value", name, key)
                break
            if body[pos:idx].strip():
                logger.warning("tool call %r: ignoring text before the value of %r", name, key)
            pos = idx + len(ARG_VALUE_START)
        idx = body.find(ARG_VALUE_END, pos)
        if idx < 0:
            args.append((key, body[pos:]))
            break
        args.append((key, body[pos:idx]))
        pos = idx + len(ARG_VALUE_END)
    return name, args


class ToolCallParser:
    """Parses GLM-4.7 tool calls out of content text, typed by the request's OpenAI ``tools``."""

    def __init__(
        self,
        tools: list[dict[str, Any]] | None = None,
        *,
        parallel_tool_calls: bool = True,
        seed: int | None = None,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.parallel_tool_calls = parallel_tool_calls
        self._seed = seed
        self._id_factory = id_factory
        # tool name -> property name -> allowed JSON types (None: schema does not say)
        self._param_types: dict[str, dict[str, frozenset[str] | None]] = {}
        for tool in tools or []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if not isinstance(properties, dict):
                properties = {}
            self._param_types[function["name"]] = {k: schema_types(v) for k, v in properties.items()}

    def param_types(self, tool: str, key: str) -> frozenset[str] | None:
        """Allowed JSON types of ``tool``'s argument ``key``; ``None`` if the tool or argument is unknown."""
        return self._param_types.get(tool, {}).get(key)

    def is_plain_string(self, tool: str, key: str) -> bool:
        """Whether the argument is raw text, so it can be streamed before its value is complete."""
        return self.param_types(tool, key) == frozenset({"string"})

    def convert(self, tool: str, key: str, raw: str) -> Any:
        return convert_value(raw, self.param_types(tool, key))

    def new_id_source(self) -> Callable[[], str]:
        """The id generator for one parse (fresh per parse when seeded, so parses are comparable)."""
        if self._id_factory is not None:
            return self._id_factory
        rng = random.Random(self._seed) if self._seed is not None else None
        return lambda: make_tool_call_id(rng)

    def extract(self, text: str) -> ParsedToolCalls:
        """Parse complete content text into content and calls."""
        new_id = self.new_id_source()
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            start = text.find(TOOL_CALL_START, pos)
            if start < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            suppressed = bool(calls) and not self.parallel_tool_calls
            end = text.find(TOOL_CALL_END, start + len(TOOL_CALL_START))
            if end < 0:
                if suppressed:
                    logger.info("parallel_tool_calls=False: dropping a further (unterminated) tool call")
                else:
                    logger.warning("unterminated tool call kept as content: %r", text[start:][:120])
                    content.append(text[start:])
                break
            pos = end + len(TOOL_CALL_END)
            if suppressed:
                logger.info("parallel_tool_calls=False: dropping a further tool call")
                continue
            parsed = _parse_body(text[start + len(TOOL_CALL_START) : end])
            if parsed is None:
                logger.warning("tool call without a name kept as content: %r", text[start:pos][:120])
                content.append(text[start:pos])
                continue
            name, raw_args = parsed
            args: dict[str, Any] = {}
            for key, raw in raw_args:
                if key in args:
                    logger.warning("tool call %r: repeated argument %r, keeping the first value", name, key)
                    continue
                args[key] = self.convert(name, key, raw)
            calls.append(ToolCall(id=new_id(), name=name, arguments=json.dumps(args, ensure_ascii=False)))
        return ParsedToolCalls(content=none_if_blank("".join(content)), calls=calls)

    def stream(self) -> ToolCallStreamer:
        """A fresh streamer with this parser's settings."""
        return ToolCallStreamer(self)


# Streamer states.
_TEXT = "text"  # outside calls
_NAME = "name"  # after <tool_call>, reading the function name
_NAMELESS = "nameless"  # a region with no name: collect its raw text for the content
_SKIP = "skip"  # a further call under parallel_tool_calls=False
_ARGS = "args"  # between arguments
_KEY = "key"
_AFTER_KEY = "after_key"  # between </arg_key> and <arg_value>
_VALUE = "value"

_TEXT_TAGS = (TOOL_CALL_START,)
_ARGS_TAGS = (TOOL_CALL_END, ARG_KEY_START)
_KEY_TAGS = (ARG_KEY_END, ARG_VALUE_START, TOOL_CALL_END)
_AFTER_KEY_TAGS = (ARG_VALUE_START, TOOL_CALL_END)
_VALUE_TAGS = (ARG_VALUE_END, TOOL_CALL_END)
_END_TAGS = (TOOL_CALL_END,)


class ToolCallStreamer:
    """Incremental counterpart of :meth:`ToolCallParser.extract`: ``feed`` content deltas, then ``finish``."""

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self._new_id = parser.new_id_source()
        self._state = _TEXT
        self._buf = ""
        self._gate = BlankGate()
        self._finished = False
        self.calls_completed = 0
        self.incomplete_call_index: int | None = None
        self._reset_call()

    def _reset_call(self) -> None:
        self._raw = ""  # raw text of the current call region, for the content if it never completes
        self._name = ""
        self._header_sent = False
        self._key = ""
        self._junk = False  # non-blank text seen between </arg_key> and <arg_value>
        self._seen_keys: set[str] = set()
        self._args_started = False
        self._value = ""
        self._value_mode = ""  # "stream" (plain string), "buffer" (typed at the end) or "drop" (repeated key)

    def feed(self, delta: str) -> list[DeltaEvent]:
        """Consume a content delta; return the events that are now certain."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += delta
        events: list[DeltaEvent] = []
        self._drain(events)
        return events

    def finish(self) -> list[DeltaEvent]:
        """Flush at the end of the output; an unterminated call's raw text becomes content."""
        if self._finished:
            return []
        self._finished = True
        events: list[DeltaEvent] = []
        if self._state == _TEXT:
            self._emit_content(events, self._buf)
        elif self._state == _SKIP:
            logger.info("parallel_tool_calls=False: dropping a further (unterminated) tool call")
        else:
            raw = self._raw + self._buf
            logger.warning("unterminated tool call kept as content: %r", raw[:120])
            if self._header_sent:
                self.incomplete_call_index = self.calls_completed
            self._emit_content(events, raw)
        self._buf = ""
        self._gate.finish()
        return events

    @property
    def index(self) -> int:
        """Index of the call being parsed (or the next one)."""
        return self.calls_completed

    # Emitting.

    def _emit_content(self, events: list[DeltaEvent], text: str) -> None:
        text = self._gate.push(text)
        if not text:
            return
        if events and events[-1].content is not None:
            events[-1].content += text
        else:
            events.append(DeltaEvent(content=text))

    def _emit_args(self, events: list[DeltaEvent], fragment: str) -> None:
        if not fragment:
            return
        last = events[-1].tool_call if events else None
        if last is not None and last.get("index") == self.index and "id" not in last:
            last["function"]["arguments"] += fragment
        else:
            events.append(DeltaEvent(tool_call={"index": self.index, "function": {"arguments": fragment}}))

    def _take(self, n: int) -> str:
        """Consume ``n`` characters of the buffer into the current call's raw text."""
        taken, self._buf = self._buf[:n], self._buf[n:]
        self._raw += taken
        return taken

    def _take_until_tags(self, tags: tuple[str, ...]) -> tuple[str, str]:
        """Consume up to and including the first of ``tags``: (text before it, tag). With no tag in the buffer,
        consume what cannot start one and return (that text, "")."""
        idx, tag = find_first(self._buf, tags)
        if idx < 0:
            return self._take(len(self._buf) - partial_tag_len(self._buf, tags)), ""
        before = self._take(idx)
        self._take(len(tag))
        return before, tag

    # The state machine.

    def _drain(self, events: list[DeltaEvent]) -> None:
        while self._buf:
            state = self._state
            if state == _TEXT:
                idx = self._buf.find(TOOL_CALL_START)
                if idx < 0:
                    keep = partial_tag_len(self._buf, _TEXT_TAGS)
                    self._emit_content(events, self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    return
                self._emit_content(events, self._buf[:idx])
                self._buf = self._buf[idx:]
                self._reset_call()
                self._take(len(TOOL_CALL_START))
                self._state = _SKIP if self.calls_completed and not self._parser.parallel_tool_calls else _NAME
            elif state == _SKIP:
                if not self._take_until_tags(_END_TAGS)[1]:
                    return
                logger.info("parallel_tool_calls=False: dropping a further tool call")
                self._state = _TEXT
            elif state == _NAMELESS:
                if not self._take_until_tags(_END_TAGS)[1]:
                    return
                logger.warning("tool call without a name kept as content: %r", self._raw[:120])
                self._emit_content(events, self._raw)
                self._state = _TEXT
            elif state == _NAME:
                if not self._name:
                    self._take(len(self._buf) - len(self._buf.lstrip()))
                    if not self._buf:
                        return
                    if self._buf[0] == "<":
                        self._state = _NAMELESS
                        continue
                end = 0
                while end < len(self._buf) and not self._buf[end].isspace() and self._buf[end] != "<":
                    end += 1
                self._name += self._take(end)
                if not self._buf:
                    return  # the name may go on in the next delta
                events.append(
                    DeltaEvent(
                        tool_call={
                            "index": self.index,
                            "id": self._new_id(),
                            "type": "function",
                            "function": {"name": self._name, "arguments": ""},
                        }
                    )
                )
                self._header_sent = True
                self._state = _ARGS
            elif state == _ARGS:
                self._take(len(self._buf) - len(self._buf.lstrip()))
                if not self._buf:
                    return
                if self._buf.startswith(TOOL_CALL_END):
                    self._take(len(TOOL_CALL_END))
                    self._close_call(events)
                    continue
                if self._buf.startswith(ARG_KEY_START):
                    self._take(len(ARG_KEY_START))
                elif any(tag.startswith(self._buf) for tag in _ARGS_TAGS):
                    return  # a partial tag: undecided
                # Otherwise the opening <arg_key> is missing and the key starts here.
                self._key = ""
                self._state = _KEY
            elif state == _KEY:
                before, tag = self._take_until_tags(_KEY_TAGS)
                if not tag:
                    self._key += before
                    return
                self._key = (self._key + before).strip()
                if tag == TOOL_CALL_END:
                    logger.warning("tool call %r: dropping argument key without a value", self._name)
                    self._close_call(events)
                elif tag == ARG_KEY_END:
                    self._state = _AFTER_KEY
                else:
                    self._start_value(events)
            elif state == _AFTER_KEY:
                before, tag = self._take_until_tags(_AFTER_KEY_TAGS)
                self._junk = self._junk or bool(before.strip())
                if not tag:
                    return
                if self._junk:
                    logger.warning("tool call %r: ignoring text before the value of %r", self._name, self._key)
                    self._junk = False
                if tag == TOOL_CALL_END:
                    logger.warning("tool call %r: dropping argument %r without a value", self._name, self._key)
                    self._close_call(events)
                else:
                    self._start_value(events)
            elif state == _VALUE:
                before, tag = self._take_until_tags(_VALUE_TAGS)
                self._value_piece(events, before)
                if not tag:
                    return
                self._end_value(events)
                if tag == TOOL_CALL_END:
                    self._close_call(events)
                else:
                    self._state = _ARGS
            else:  # pragma: no cover - states are internal
                raise AssertionError(state)

    def _start_value(self, events: list[DeltaEvent]) -> None:
        self._value = ""
        self._state = _VALUE
        if self._key in self._seen_keys:
            logger.warning("tool call %r: repeated argument %r, keeping the first value", self._name, self._key)
            self._value_mode = "drop"
        elif self._parser.is_plain_string(self._name, self._key):
            self._value_mode = "stream"
            self._emit_args(events, _arg_fragment(not self._args_started, self._key) + '"')
            self._args_started = True
            self._seen_keys.add(self._key)
        else:
            self._value_mode = "buffer"

    def _value_piece(self, events: list[DeltaEvent], text: str) -> None:
        if self._value_mode == "stream":
            self._emit_args(events, _escape(text))
        elif self._value_mode == "buffer":
            self._value += text

    def _end_value(self, events: list[DeltaEvent]) -> None:
        if self._value_mode == "stream":
            self._emit_args(events, '"')
        elif self._value_mode == "buffer":
            value = self._parser.convert(self._name, self._key, self._value)
            self._emit_args(
                events, _arg_fragment(not self._args_started, self._key) + json.dumps(value, ensure_ascii=False)
            )
            self._args_started = True
            self._seen_keys.add(self._key)
        self._value = ""

    def _close_call(self, events: list[DeltaEvent]) -> None:
        self._emit_args(events, "}" if self._args_started else "{}")
        self.calls_completed += 1
        self._reset_call()
        self._state = _TEXT
