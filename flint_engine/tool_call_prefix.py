"""Tool calls the output writes, held to the offered tools: the constraint behind `tool_choice: "required"` (the
model names an offered tool) and OpenAI's strict function calling (`strict: true`: the arguments fit the tool's
parameter schema).

GLM-4.7 writes a call as `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`; the six tags
are special tokens, read here as whole pieces. A value is parsed by its parameter's schema type
(`parsers/tool_calls.py`): a string parameter's value is its raw text, any other a JSON value. So a strict call is
checked as the parser will read it: the name is an offered one, each key a declared parameter not given before, each
value an instance of its parameter's schema (a raw string through `json_schema_prefix` as the JSON string it stands
for; any other value as JSON, ended by `</arg_value>` once it is whole), and `</tool_call>` only once every required
parameter is given. No value may contain a tag's text (the parser would end it there). Between the tags nothing else
is let through (the chat template writes none), so the sampler takes the model's most likely token that keeps the
call valid, as JSON mode does.

A request's calls are constrained from its output's start when the prompt ends in `<tool_call>` (a forced call), and
each time the output opens one with `<tool_call>` when the request carries its tools' schemas; between calls the
output is free. Without schemas (`tool_choice: "required"` over tools that are not strict), only the forced call's
name is held, as before this module: once it is followed by what ends a name for the parser (whitespace or `<`), the
rest is the model's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .json_schema_prefix import Node, SchemaError, SchemaPrefix, canonical_schema_text, compile_schema
from .parsers.tool_calls import (
    ARG_KEY_END,
    ARG_KEY_START,
    ARG_VALUE_END,
    ARG_VALUE_START,
    TOOL_CALL_END,
    TOOL_CALL_START,
    schema_types,
)

CALL_OPEN, CALL_CLOSE = TOOL_CALL_START.encode(), TOOL_CALL_END.encode()
KEY_OPEN, KEY_CLOSE = ARG_KEY_START.encode(), ARG_KEY_END.encode()
VALUE_OPEN, VALUE_CLOSE = ARG_VALUE_START.encode(), ARG_VALUE_END.encode()
TAGS = (CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)
_LONGEST_TAG = max(map(len, TAGS))
NAME_ENDS = b"< \t\n\r\f\v"  # the parser's name is the first run of non-whitespace characters other than "<"

# A raw string's bytes as the content of the JSON string they stand for.
_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x08: b"\\b", 0x0C: b"\\f"}


def callable_name(name: object) -> bool:
    """Whether a tool call can carry this name (a non-empty one without whitespace or "<")."""
    return isinstance(name, str) and bool(name) and not any(c.isspace() or c == "<" for c in name)


def _escaped(piece: bytes) -> bytes:
    if not any(b < 0x20 or b in (0x22, 0x5C) for b in piece):
        return piece
    return b"".join(_ESCAPES.get(b) or (b"\\u%04x" % b if b < 0x20 else bytes([b])) for b in piece)


@dataclass(frozen=True)
class Parameter:
    """One declared parameter: its schema node and how the parser reads its value (`raw`: the text is the string;
    `null_ok` beside it: the text `null` is None)."""

    node: Node
    raw: bool
    null_ok: bool = False

    @property
    def free(self) -> bool:
        """A string with no rules: any text is one (no JSON state to keep)."""
        return self.raw and not self.null_ok and self.node.literals is None and not self.node.string_rules


@dataclass(frozen=True)
class ToolArguments:
    """A strict tool's parameters, compiled."""

    params: dict[str, Parameter]
    required: frozenset[str]


def _string_branch(schema: dict[str, Any]) -> dict[str, Any]:
    """The string half of a string-or-null parameter's schema (`type: [string, null]`, or `anyOf` of the two)."""
    for member in schema.get("anyOf") or schema.get("oneOf") or ():
        if schema_types(member) == frozenset({"string"}):
            return member
    branch = {k: v for k, v in schema.items() if k not in ("type", "enum", "const")}
    branch["type"] = "string"
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None:
        branch["enum"] = [v for v in values if v is not None]
    return branch


def compile_tool_arguments(parameters: Any) -> ToolArguments:
    """A strict tool's `parameters` (a JSON Schema of an object, or None for no parameters), or SchemaError naming
    what cannot be enforced. Compiled once per distinct schema: the API, each `SamplingParams` made from the request
    and the engine's constraint all ask."""
    if parameters is None:
        return ToolArguments({}, frozenset())
    return _compile_arguments_text(canonical_schema_text(parameters, "parameters"))


@functools.lru_cache(maxsize=64)
def _compile_arguments_text(text: str) -> ToolArguments:
    """`compile_tool_arguments` of a schema's canonical JSON text (the result is never changed, so shared)."""
    parameters = json.loads(text)
    if parameters.get("additionalProperties") is True:
        raise SchemaError("a strict tool takes only its declared parameters: additionalProperties must be false")
    schema = {"type": "object", **parameters}
    root = compile_schema(schema)  # every keyword checked, $defs resolved
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    params: dict[str, Parameter] = {}
    for key, prop in (schema.get("properties") or {}).items():
        if not key or key.strip() != key or any(t.decode() in key for t in TAGS):
            raise SchemaError(f"parameter {key!r}: a name with a tag's text or blanks at its ends cannot be written")
        types = schema_types(prop)
        if types is None or "string" not in types:
            params[key] = Parameter(root.properties[key], raw=False)
        elif types == frozenset({"string"}):
            params[key] = Parameter(root.properties[key], raw=True)
        elif types == frozenset({"string", "null"}):
            branch = compile_schema({"type": "object", "properties": {"v": _string_branch(prop)}, **defs})
            params[key] = Parameter(branch.properties["v"], raw=True, null_ok=True)
        else:
            raise SchemaError(
                f"parameter {key!r}: a string or {', '.join(sorted(types - {'string'}))} cannot be enforced"
                " (GLM-4.7 writes a string parameter's value raw, so the two cannot be told apart)"
            )
    return ToolArguments(params, root.required)


class _Value:
    """One argument value as the parser will read it: raw text standing for a JSON string (and, where the parameter
    may be null, possibly the text `null`), or a JSON value."""

    def __init__(self, param: Parameter) -> None:
        self.raw, self.free = param.raw, param.free
        self.json: SchemaPrefix | None = SchemaPrefix(param.node)
        if self.raw:
            self.json.feed(b'"')
        self.null: bytes | None = b"" if param.null_ok else None  # the text so far, while it may still be `null`
        self.started = False
        self.text = b""  # a JSON value's text (its numbers must be finite for the parser to read it as JSON)

    def _json_piece(self, piece: bytes) -> bytes:
        return _escaped(piece) if self.raw else piece

    def _blank_outside(self, piece: bytes) -> bool:
        """A blank before a JSON value or anything after it: the chat template writes values compact (`tojson`), and
        a model held away from the value it wanted would otherwise pad the value with blanks."""
        if self.raw or self.json is None:
            return False
        return self.json.complete or (not self.started and piece[:1].isspace())

    def accepts(self, piece: bytes) -> bool:
        if self.free:
            return True
        if self.null is not None and b"null".startswith(self.null + piece):
            return True
        if self._blank_outside(piece) or self.json is None:
            return False
        after = self.json.copy()
        return after.feed(self._json_piece(piece)) and not self._blank_after(after, piece)

    def _blank_after(self, after: SchemaPrefix, piece: bytes) -> bool:
        """A piece ending in a blank that leaves a JSON value whole (the blank after it, or the one ending a number)."""
        return not self.raw and after.complete and piece[-1:].isspace()

    def feed(self, piece: bytes) -> bool:
        if self.free:
            return True
        if self._blank_outside(piece):
            self.json = self.null = None
            return False
        self.started = self.started or bool(piece)
        if not self.raw:
            self.text += piece
        if self.null is not None:
            self.null = self.null + piece if b"null".startswith(self.null + piece) else None
        if self.json is not None and (
            not self.json.feed(self._json_piece(piece)) or self._blank_after(self.json, piece)
        ):
            self.json = None
        return self.json is not None or self.null is not None

    @property
    def can_end(self) -> bool:
        if self.free or self.null == b"null":
            return True
        if self.json is None:
            return False
        whole = self.json
        if not whole.complete:
            whole = self.json.copy()  # a raw string closes with its quote; a JSON number ends at a blank
            if not (whole.feed(b'"' if self.raw else b" ") and whole.complete):
                return False
        return self.raw or _finite_json(self.text)


def _finite_json(text: bytes) -> bool:
    """Whether a JSON value's numbers are all finite (1e999 reads as infinity, which the parser does not take)."""
    try:
        json.dumps(json.loads(text), allow_nan=False)
    except (ValueError, RecursionError):
        return False
    return True


# States of a call (IDLE: outside any call; FREE: a tool's arguments that are not held; OFF: no longer constrained).
IDLE, NAME, FREE, ARGS, KEY, VALUE_NEXT, VALUE, OFF = range(8)


class ToolCallPrefix:
    """The output so far against the offered tools: `tools` maps each name to its arguments' rules (a strict tool)
    or None (its arguments are free). `opened`: the output begins inside a call, its name next, one of `names` (all
    of `tools` when None). `rearm`: every `<tool_call>` the output writes opens a call held the same way; else the
    constraint ends with the opened call's name (when its arguments are free) or the call.

    As an `output_constraint.OutputConstraint` for the sampler's filter (with the tags' special tokens left to it):
    a piece refused here is refused with anything after it, so the filter may judge tokens by their openings."""

    cheap_accepts = False  # a value's check copies its JSON state
    complete = False  # (the output may always go on after a call)

    def __init__(
        self,
        tools: Mapping[str, ToolArguments | None],
        opened: bool,
        names: Sequence[str] | None = None,
        rearm: bool = False,
    ) -> None:
        if not tools or (names is not None and not names):
            raise ValueError("a tool-call constraint needs at least one tool")
        self.tools = {n.encode(): args for n, args in tools.items()}
        self.rearm = rearm
        self.state = IDLE
        self.names: tuple[bytes, ...] = ()
        self.text = b""  # the name or key read so far
        self.args: ToolArguments | None = None
        self.given: frozenset[str] = frozenset()
        self.key = ""
        self.value: _Value | None = None
        self.tail = b""  # a value's last bytes, to find a tag's text written across pieces
        if opened:
            self._open(names)

    def _open(self, names: Sequence[str] | None = None) -> None:
        self.state, self.text = NAME, b""
        self.names = tuple(n.encode() for n in names) if names is not None else tuple(self.tools)

    @property
    def active(self) -> bool:
        """Whether the next token is held (inside a call's name or a strict tool's arguments)."""
        return self.state in (NAME, ARGS, KEY, VALUE_NEXT, VALUE)

    @property
    def can_end(self) -> bool:
        """Whether the output may end here (not inside a held call)."""
        return not self.active

    @property
    def done(self) -> bool:
        """Whether nothing more is held (the forced call's name or call is over, and no later call is held)."""
        return self.state == OFF

    def accepts(self, piece: bytes) -> bool:
        """Whether the output may go on with these bytes (a tag only as a whole piece: its special token)."""
        if not self.active:
            return True
        return self._next(piece, commit=False)

    def feed(self, piece: bytes) -> bool:
        """Take the piece; False when it breaks the call (then nothing more is held: the parser reads what it gets)."""
        if not piece:
            return True
        if self.state == IDLE:
            if piece == CALL_OPEN and self.rearm:
                self._open()
            return True
        if self.state == FREE:
            if piece == CALL_CLOSE:
                self._close()
            return True
        if self.state == OFF:
            return True
        if self._next(piece, commit=True):
            return True
        self.state = OFF
        return False

    def _close(self) -> None:
        self.state = IDLE if self.rearm else OFF
        self.args, self.given, self.value = None, frozenset(), None

    def _next(self, piece: bytes, commit: bool) -> bool:
        tag = piece if piece in TAGS else None
        s = self.state
        if s == NAME:
            return self._name(piece, tag, commit)
        if s == ARGS:
            assert self.args is not None
            return self._after_arguments(self.args, self.given, tag, commit)
        if s == KEY:
            assert self.args is not None
            left = [k.encode() for k in self.args.params if k not in self.given]
            if tag == KEY_CLOSE:
                if self.text not in left:
                    return False
                if commit:
                    self.key, self.state = self.text.decode(), VALUE_NEXT
                return True
            text = self.text + piece
            if tag is not None or not any(k.startswith(text) for k in left):
                return False
            if commit:
                self.text = text
            return True
        if s == VALUE_NEXT:
            if tag != VALUE_OPEN:
                return False
            if commit:
                assert self.args is not None
                self.value, self.tail, self.state = _Value(self.args.params[self.key]), b"", VALUE
            return True
        assert s == VALUE and self.value is not None
        if tag == VALUE_CLOSE:
            if not self.value.can_end:
                return False
            if commit:
                self.given, self.value, self.state = self.given | {self.key}, None, ARGS
            return True
        seen = self.tail + piece
        if tag is not None or any(t in seen for t in TAGS):
            return False
        if not commit:
            return self.value.accepts(piece)
        self.tail = seen[-(_LONGEST_TAG - 1) :]
        return self.value.feed(piece)

    def _after_arguments(self, args: ToolArguments, given: frozenset[str], tag: bytes | None, commit: bool) -> bool:
        """After a strict call's name or one of its values: another parameter's key, or the call's end once every
        required one is given."""
        if tag == KEY_OPEN and len(given) < len(args.params):
            if commit:
                self.state, self.text = KEY, b""
            return True
        if tag == CALL_CLOSE and args.required <= given:
            if commit:
                self._close()
            return True
        return False

    def _name(self, piece: bytes, tag: bytes | None, commit: bool) -> bool:
        if tag is not None:
            if self.text not in self.names or tag not in (KEY_OPEN, CALL_CLOSE):
                return False
            args = self.tools[self.text]
            if args is None:  # free arguments: the tag is theirs
                if commit:
                    self.state = FREE if self.rearm else OFF
                    if tag == CALL_CLOSE:
                        self._close()
                return True
            if commit:
                self.args, self.given, self.state = args, frozenset(), ARGS
            return self._after_arguments(args, frozenset(), tag, commit)
        text = self.text + piece
        if piece and any(n.startswith(text) for n in self.names):
            if commit:
                self.text = text
            return True
        # A whole name of a tool whose arguments are free, then a byte that ends a name for the parser.
        for n in self.names:
            if len(text) > len(n) and text.startswith(n) and text[len(n)] in NAME_ENDS and self.tools[n] is None:
                if commit:
                    self.text, self.state = n, FREE if self.rearm else OFF
                    if text[len(n) :].endswith(CALL_CLOSE) and self.rearm:
                        self._close()
                return True
        return False


def tool_call_prefix(
    tool_names: Sequence[str] | None, tool_schemas: Mapping[str, dict[str, Any] | None] | None
) -> ToolCallPrefix | None:
    """The constraint a request's `tool_names` (a forced call, its name next) and `tool_schemas` (the offered tools,
    strict ones with their parameters) ask for; None for neither."""
    if tool_schemas is not None:
        tools = {n: None if s is None else compile_tool_arguments(s) for n, s in tool_schemas.items()}
        return ToolCallPrefix(tools, opened=tool_names is not None, names=tool_names, rearm=True)
    if tool_names is not None:
        return ToolCallPrefix(dict.fromkeys(tool_names), opened=True)
    return None


class StrictToolError(SchemaError):
    """A strict tool whose parameters cannot be enforced; `index` is its place in the request's tools."""

    def __init__(self, index: int, name: str, why: SchemaError) -> None:
        super().__init__(f"tool {index} ({name}) is strict, but its parameters cannot be enforced: {why}")
        self.index = index


def held_tool_schemas(
    tools: Sequence[Mapping[str, Any]], allowed: Collection[str] | None = None
) -> dict[str, dict[str, Any] | None] | None:
    """A request's `tool_schemas` from OpenAI tool definitions: the tools a call may name (`allowed`, OpenAI's
    allowed_tools; else all) with the parameter schemas of the strict ones (else None); None for no tools. A call
    the model opens then names an offered tool (as OpenAI's models do), and a strict one's arguments fit it."""
    if not tools:
        return None
    schemas: dict[str, dict[str, Any] | None] = {}
    for i, t in enumerate(tools):
        fn = t["function"]
        if fn["name"] in schemas or (allowed is not None and fn["name"] not in allowed):
            continue
        params = fn.get("parameters") if fn.get("strict") else None
        if fn.get("strict"):
            try:
                compile_tool_arguments(params)
            except SchemaError as exc:
                raise StrictToolError(i, fn["name"], exc) from None
            params = params if params is not None else {"type": "object", "properties": {}}
        schemas[fn["name"]] = params
    return schemas
