"""Structured outputs (`response_format: {"type": "json_schema"}`): an incremental checker for one JSON value that a
JSON Schema describes, with the same interface as JSON mode's `JsonPrefix`.

`compile_schema` turns the request's schema into nodes once (a `SchemaError` names what it cannot honour); a
`SchemaPrefix` then reads output bytes and accepts a prefix only if it can still be completed to an instance, so the
sampler (which walks candidates in the model's order) never reaches a dead end. The subset enforced exactly:

* `type` (one or a list of: object, array, string, number, integer, boolean, null) or no type (any value);
* objects: `properties`, `required`, `additionalProperties` (false or absent: only the declared properties, as
  OpenAI's strict mode; true: any further keys, with any values); keys in any order, each at most once;
* arrays: `items`, `minItems`, `maxItems`; `enum` and `const` of any JSON values (written compactly);
* strings: `minLength`, `maxLength` (characters) and `pattern` (found anywhere in the string, as JSON Schema reads
  it; Python's `regex` syntax, which ECMA-262's common patterns share), checked as the string is written;
* numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numbers, as in JSON Schema 2019+); a
  bounded number is written without an exponent, so its digits so far say which values it can still reach
  (`number_bounds`);
* `anyOf` whose branches start differently (e.g. a type or null), `$ref` into `$defs` / `definitions`, and
  `allOf` of one schema (Pydantic v1's way to give a `$ref` a description).

Annotations (`title`, `description`, `default`, `examples`, `format`, `$schema`, `strict`) are ignored; any other
keyword (`multipleOf`, `uniqueItems`, `oneOf`, ...) is refused rather than silently not enforced. A string whose
pattern and maxLength cannot both be met from what it holds can reach a dead end (the output then ends there).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .json_mode import MAX_WHITESPACE_RUN, WS, WholeValueEnd, number_accepts
from .number_bounds import NumberBounds
from .regex_prefix import char_length, split_utf8

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
IGNORED = {"title", "description", "default", "examples", "format", "$schema", "$id", "$comment", "strict"}
HANDLED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum"}
HANDLED |= {"const", "anyOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "pattern"}
HANDLED |= {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
MAX_PATTERN_CHARS = 1024
PATTERN_TIMEOUT_S = 0.2  # one partial match of a string so far (a pattern that backtracks without end fails it)
# The first byte of a value of each type.
STARTS = {
    "object": b"{",
    "array": b"[",
    "string": b'"',
    "number": b"-0123456789",
    "integer": b"-0123456789",
    "boolean": b"tf",
    "null": b"n",
}


class SchemaError(ValueError):
    """A schema this server cannot enforce; the message names the keyword and where it is."""


@dataclass(eq=False, repr=False)  # nodes may refer to themselves ($ref recursion)
class Node:
    """One compiled schema: what a value here may be."""

    types: frozenset[str] = frozenset(TYPES)
    literals: tuple[bytes, ...] | None = None  # enum / const: the value's compact JSON text is one of these
    properties: dict[str, Node] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    open_keys: bool = True  # further keys beyond `properties` (with any values)
    items: Node | None = None
    min_items: int = 0
    max_items: int | None = None
    branches: tuple[Node, ...] = ()  # anyOf, told apart by their first byte
    # A string's length in characters and a pattern it holds (JSON Schema's: found anywhere in it, unless anchored)
    min_length: int = 0
    max_length: int | None = None
    pattern: Any = None  # compiled to match the whole string (`_string_pattern`)
    bounds: NumberBounds | None = None  # a number's minimum / maximum (written without an exponent then)

    @property
    def string_rules(self) -> bool:
        return bool(self.min_length) or self.max_length is not None or self.pattern is not None

    def starts(self) -> bytes:
        if self.branches:
            return b"".join(b.starts() for b in self.branches)
        if self.literals is not None:
            return bytes({lit[0] for lit in self.literals})
        return b"".join(STARTS[t] for t in self.types)


ANY = Node()


def canonical_schema_text(schema: Any, what: str = "the schema") -> str:
    """`schema`'s canonical JSON text (sorted keys): the key its compiled form is cached under, or SchemaError where
    it is not a JSON object (`what` names it in the message)."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{what} must be a JSON Schema object")
    try:
        return json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{what} is not JSON: {exc}") from None


def compile_schema(schema: Any) -> Node:
    """The root node of `schema` (a JSON Schema whose root describes an object). Compiled once per distinct schema
    (the API, `SamplingParams` and the engine each ask; clients tend to send the same schema again)."""
    return _compile_text(canonical_schema_text(schema))


@functools.lru_cache(maxsize=64)
def _compile_text(text: str) -> Node:
    """`compile_schema` of a schema's canonical JSON text (nodes are never changed after compiling, so shared)."""
    schema = json.loads(text)
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    compiled: dict[str, Node] = {}
    root = _compile(schema, "#", defs, compiled)
    if "object" not in root.types or root.branches or root.literals is not None:
        raise SchemaError("the schema's root must be an object (type: object)")
    return root


def _compile(s: Any, where: str, defs: dict[str, Any], compiled: dict[str, Node]) -> Node:
    if s is True or s == {}:
        return ANY
    if not isinstance(s, dict):
        raise SchemaError(f"{where}: a schema must be an object")
    if "allOf" in s:  # one schema, as Pydantic v1 wraps a $ref to carry a description beside it
        parts = s["allOf"]
        if not isinstance(parts, list) or len(parts) != 1 or set(s) - IGNORED - {"allOf"}:
            raise SchemaError(f"{where}: allOf is supported with one schema and annotations beside it only")
        return _compile(parts[0], f"{where}/allOf/0", defs, compiled)
    unknown = sorted(set(s) - HANDLED - IGNORED)
    if unknown:
        raise SchemaError(f"{where}: keyword {unknown[0]!r} is not supported")
    if "$ref" in s:
        ref = s["$ref"]
        name = ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None
        if name is None or not ref.startswith(("#/$defs/", "#/definitions/")) or name not in defs:
            raise SchemaError(f"{where}: $ref {ref!r} does not name a definition in $defs")
        if name not in compiled:  # a placeholder first, so recursive definitions resolve to the same node
            compiled[name] = Node()
            node = _compile(defs[name], f"#/$defs/{name}", defs, compiled)
            compiled[name].__dict__.update(node.__dict__)
        return compiled[name]
    if "anyOf" in s:
        branches = tuple(_compile(b, f"{where}/anyOf/{i}", defs, compiled) for i, b in enumerate(s["anyOf"]))
        if not branches:
            raise SchemaError(f"{where}: anyOf needs at least one schema")
        seen: set[int] = set()
        for b in branches:
            firsts = set(b.starts())
            if firsts & seen:
                raise SchemaError(f"{where}: anyOf branches must start differently (e.g. different types)")
            seen |= firsts
        return Node(branches=branches)
    node = Node()
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not types or any(t not in TYPES for t in types):
            raise SchemaError(f"{where}: type must be one or more of {', '.join(TYPES)}")
        node.types = frozenset(types)
    for key in ("enum", "const"):
        if key in s:
            options = s[key] if key == "enum" else [s[key]]
            if not isinstance(options, list) or not options:
                raise SchemaError(f"{where}: {key} needs at least one value")
            lits = [json.dumps(o, ensure_ascii=False, separators=(",", ":")).encode() for o in options]
            node.literals = tuple(dict.fromkeys(lits))
    props = s.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"{where}: properties must be an object")
    node.properties = {k: _compile(v, f"{where}/properties/{k}", defs, compiled) for k, v in props.items()}
    required = s.get("required", [])
    missing = [k for k in required if k not in node.properties]
    if missing:
        raise SchemaError(f"{where}: required names {missing[0]!r}, which is not in properties")
    node.required = frozenset(required)
    extra = s.get("additionalProperties", None)
    if extra not in (None, True, False):
        raise SchemaError(f"{where}: additionalProperties must be true or false")
    # Absent: only the declared properties (OpenAI's strict mode), unless none are declared at all.
    node.open_keys = extra is True or (extra is None and not props)
    if "items" in s:
        node.items = _compile(s["items"], f"{where}/items", defs, compiled)
    node.min_items = int(s.get("minItems", 0))
    node.max_items = int(s["maxItems"]) if "maxItems" in s else None
    if node.max_items is not None and node.max_items < node.min_items:
        raise SchemaError(f"{where}: maxItems is below minItems")
    for key in ("minLength", "maxLength"):
        if key in s and (not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < 0):
            raise SchemaError(f"{where}: {key} must be a non-negative integer")
    node.min_length = s.get("minLength", 0)
    node.max_length = s.get("maxLength")
    if node.max_length is not None and node.max_length < node.min_length:
        raise SchemaError(f"{where}: maxLength is below minLength")
    if "pattern" in s:
        node.pattern = _string_pattern(s["pattern"], where)
    node.bounds = _number_bounds(s, where)
    b = node.bounds
    if b is not None and "number" not in node.types and b.low is not None and b.high is not None:
        low = math.floor(b.low) + 1 if b.low_open or b.low != math.floor(b.low) else int(b.low)
        high = math.ceil(b.high) - 1 if b.high_open or b.high != math.ceil(b.high) else int(b.high)
        if "integer" in node.types and low > high:
            raise SchemaError(f"{where}: no integer is within its minimum and maximum")
    return node


def _string_pattern(pattern: Any, where: str) -> Any:
    """JSON Schema's `pattern` (found anywhere in the string, as ECMA-262's `test`) as a pattern the whole string
    matches, for partial matching as the string is written."""
    import regex

    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS:
        raise SchemaError(f"{where}: pattern must be a regular expression of at most {MAX_PATTERN_CHARS} characters")
    try:
        regex.compile(pattern)
        return regex.compile(f"(?s:.*?)(?:{pattern})(?s:.*)")
    except regex.error as exc:
        raise SchemaError(f"{where}: pattern is not a regular expression this server reads: {exc}") from None


def _number_bounds(s: dict[str, Any], where: str) -> NumberBounds | None:
    given = {k: s[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in s}
    if not given:
        return None
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == math.inf:
            raise SchemaError(f"{where}: {key} must be a finite number")
    lows = [(Fraction(str(given[k])), k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum") if k in given]
    highs = [(Fraction(str(given[k])), k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum") if k in given]
    # The tighter of each pair (at a tie the exclusive one).
    low = max(lows, key=lambda b: (b[0], b[1])) if lows else (None, False)
    high = min(highs, key=lambda b: (b[0], not b[1])) if highs else (None, False)
    if low[0] is not None and high[0] is not None and (low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1]))):
        raise SchemaError(f"{where}: no number is within its minimum and maximum")
    return NumberBounds(low[0], high[0], low[1], high[1])


def _pattern_match(pattern: Any, text: str, partial: bool) -> bool:
    """A string against its pattern (`partial`: some continuation would match); one that backtracks past the time
    limit fails it."""
    try:
        return pattern.fullmatch(text, partial=partial, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        return False


# ------------------------------------------------------------------------------------------------ frames
class _Frame:
    def clone(self) -> _Frame:
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        return copy


class _Value(_Frame):
    """Waiting for a value's first byte."""

    def __init__(self, node: Node) -> None:
        self.node = node


class _Literal(_Frame):
    """Reading one of a few exact texts (enum, const, true/false/null)."""

    def __init__(self, options: tuple[bytes, ...]) -> None:
        self.options, self.read = options, b""


class _String(_Frame):
    """Inside a string (a value, or an object's key when `keys` is set: the text must lead to one of them); a value's
    `node` when it holds a length or a pattern."""

    def __init__(self, keys: tuple[bytes, ...] | None = None, node: Node | None = None) -> None:
        self.keys, self.read, self.escape, self.node = keys, b"", 0, node


class _Number(_Frame):
    def __init__(self, integer: bool, bounds: NumberBounds | None = None) -> None:
        self.integer, self.text, self.bounds = integer, "", bounds


class _Object(_Frame):
    # states: "key" (a key or "}"), "key!" (a key only, after a comma), "colon", "value", "next" ("," or "}")
    def __init__(self, node: Node) -> None:
        self.node, self.seen, self.state, self.key = node, frozenset(), "key", ""


class _Array(_Frame):
    # states: "first" (a value or "]"), "value" (after a comma), "next" ("," or "]")
    def __init__(self, node: Node) -> None:
        self.node, self.count, self.state = node, 0, "first"


class SchemaPrefix(WholeValueEnd):
    """State of an instance prefix; `feed` returns False (and leaves the state unusable) on bytes that cannot lead
    to an instance."""

    def __init__(self, root: Node) -> None:
        self.stack: list[_Frame] = [_Value(root)]
        self.blanks = 0
        self.done = False

    def copy(self) -> SchemaPrefix:
        other = object.__new__(SchemaPrefix)
        other.stack = [f.clone() for f in self.stack]
        other.blanks, other.done = self.blanks, self.done
        return other

    @property
    def complete(self) -> bool:
        """A whole instance has been read (only whitespace may follow)."""
        return self.done

    def feed(self, data: bytes) -> bool:
        if not all(self._byte(b) for b in data):
            return False
        # A piece that ends inside a character in a string with a pattern: can some character it begins fit? (Within
        # the piece each byte was let through until its character was whole.)
        top = self.stack[-1] if self.stack else None
        return not (isinstance(top, _String) and top.node is not None and top.node.pattern is not None) or (
            self._tail_fits(top)
        )

    # --------------------------------------------------------------------------------------------------------
    def _value_done(self) -> None:
        self.stack.pop()
        if not self.stack:
            self.done = True
            return
        parent = self.stack[-1]
        if isinstance(parent, _Object):
            parent.state = "next"
        elif isinstance(parent, _Array):
            parent.count += 1
            parent.state = "next"

    def _byte(self, b: int) -> bool:
        top = self.stack[-1] if self.stack else None
        if isinstance(top, _String):
            return self._string_byte(top, b)
        if isinstance(top, _Literal):
            read = top.read + bytes([b])
            if not any(o.startswith(read) for o in top.options):
                # A number literal may end here: the byte then belongs to the parent.
                if top.read in top.options and top.read[:1] in b"-0123456789":
                    self._value_done()
                    return self._byte(b)
                return False
            top.read = read
            if read in top.options and not any(len(o) > len(read) for o in top.options if o.startswith(read)):
                self._value_done()
            return True
        if isinstance(top, _Number):
            if self._number_accepts(top, b):
                top.text += chr(b)
                return True
            if not top.text[-1:].isdigit() or (top.bounds is not None and not top.bounds.holds(top.text)):
                return False
            self._value_done()  # this byte ends the number and is read by the parent
            top = self.stack[-1] if self.stack else None
        if b in WS:
            self.blanks += 1
            return self.blanks <= MAX_WHITESPACE_RUN
        self.blanks = 0
        if top is None:  # the instance is complete: only whitespace may follow
            return False
        if isinstance(top, _Value):
            return self._start_value(top, b)
        if isinstance(top, _Object):
            return self._object_byte(top, b)
        assert isinstance(top, _Array)
        return self._array_byte(top, b)

    def _start_value(self, frame: _Value, b: int) -> bool:
        node = frame.node
        while node.branches:
            node = next((br for br in node.branches if b in br.starts()), None)  # type: ignore[assignment]
            if node is None:
                return False
        c = bytes([b])
        if node.literals is not None:
            if not any(o.startswith(c) for o in node.literals):
                return False
            self.stack[-1] = _Literal(node.literals)
            return self._byte(b)
        if not any(b in STARTS[t] for t in node.types):
            return False
        if c == b'"':
            self.stack[-1] = _String(node=node if node.string_rules else None)
        elif c == b"{":
            self.stack[-1] = _Object(node)
        elif c == b"[":
            self.stack[-1] = _Array(node)
        elif c in b"tf":
            self.stack[-1] = _Literal((b"true", b"false"))
            return self._byte(b)
        elif c == b"n":
            self.stack[-1] = _Literal((b"null",))
            return self._byte(b)
        else:
            self.stack[-1] = _Number("number" not in node.types, node.bounds)
            return self._byte(b)
        return True

    def _keys_left(self, frame: _Object) -> tuple[bytes, ...] | None:
        """The keys that may come next (their JSON-escaped text), or None for any key."""
        if frame.node.open_keys:
            return None
        return tuple(
            json.dumps(k, ensure_ascii=False)[1:-1].encode() for k in frame.node.properties if k not in frame.seen
        )

    def _object_byte(self, frame: _Object, b: int) -> bool:
        c = bytes([b])
        if frame.state in ("key", "key!"):
            if c == b'"':
                keys = self._keys_left(frame)
                if keys == ():
                    return False
                self.stack.append(_String(keys))
                return True
            if c == b"}" and frame.state == "key" and frame.node.required <= frame.seen:
                self._value_done()
                return True
            return False
        if frame.state == "colon":
            if c != b":":
                return False
            frame.state = "value"
            known = frame.node.properties.get(frame.key)
            self.stack.append(_Value(known if known is not None else ANY))
            return True
        if frame.state == "next":
            if c == b"," and self._keys_left(frame) != ():
                frame.state = "key!"
                return True
            if c == b"}" and frame.node.required <= frame.seen:
                self._value_done()
                return True
            return False
        return False

    def _array_byte(self, frame: _Array, b: int) -> bool:
        c = bytes([b])
        node = frame.node
        if frame.state in ("first", "value"):
            if c == b"]" and frame.state == "first" and frame.count >= node.min_items:
                self._value_done()
                return True
            if node.max_items == 0:  # "[" then only "]"
                return False
            self.stack.append(_Value(node.items or ANY))
            return self._byte(b)  # the item's first byte; its end sets this frame's state to "next"
        if c == b"," and (node.max_items is None or frame.count < node.max_items):
            frame.state = "value"
            return True
        if c == b"]" and frame.count >= node.min_items:
            self._value_done()
            return True
        return False

    def _string_byte(self, frame: _String, b: int) -> bool:
        if frame.escape == 1:
            if bytes([b]) in (b'"', b"\\", b"/", b"b", b"f", b"n", b"r", b"t"):
                frame.escape = 0
            elif b == ord("u") and frame.node is None:  # (a string with rules takes its characters unescaped)
                frame.escape = 2
            else:
                return False
            return self._key_text(frame, b)
        if frame.escape >= 2:
            if bytes([b]) not in b"0123456789abcdefABCDEF":
                return False
            frame.escape = 0 if frame.escape == 5 else frame.escape + 1
            return self._key_text(frame, b)
        if b == ord("\\"):
            if frame.node is not None and not self._escape_fits(frame):
                return False
            frame.escape = 1
            return self._key_text(frame, b)
        if b == ord('"'):
            parent = self.stack[-2] if len(self.stack) > 1 else None
            if not (isinstance(parent, _Object) and parent.state in ("key", "key!")):
                if frame.node is not None and not self._string_holds(frame, whole=True):
                    return False
                self._value_done()  # a value string
                return True
            if frame.keys is not None and frame.read not in frame.keys:
                return False
            try:
                key = json.loads(b'"' + frame.read + b'"')
            except ValueError:  # bytes that are not UTF-8: no key of an object (the string may still go on)
                return False
            if key in parent.seen:
                return False
            self.stack.pop()
            parent.key, parent.seen, parent.state = key, parent.seen | {key}, "colon"
            return True
        if b < 0x20:
            return False
        return self._key_text(frame, b)

    @classmethod
    def _key_text(cls, frame: _String, b: int) -> bool:
        """Record a byte of the string; for a key, it must still lead to one of the allowed keys, and a value string
        with a length or a pattern must still be able to hold them."""
        frame.read += bytes([b])
        if frame.node is not None:
            return frame.escape != 0 or cls._string_holds(frame, whole=False)
        return frame.keys is None or any(k.startswith(frame.read) for k in frame.keys)

    @staticmethod
    def _text(frame: _String) -> tuple[str, bytes] | None:
        """The string read so far, and the bytes of a UTF-8 character it ends inside (left out of the text); None
        where its bytes are not UTF-8."""
        split = split_utf8(frame.read)
        if split is None:
            return None
        try:
            return json.loads('"' + split[0] + '"'), split[1]
        except ValueError:
            return None

    @classmethod
    def _string_holds(cls, frame: _String, whole: bool) -> bool:
        """Whether the string read so far (`whole`: ended here) keeps its node's length and pattern; a character
        begun is counted, and checked against the pattern once whole."""
        read = cls._text(frame)
        if read is None:
            return False
        text, tail = read
        node = frame.node
        assert node is not None
        if whole and (tail or len(text) < node.min_length):
            return False
        if node.max_length is not None and len(text) + bool(tail) > node.max_length:
            return False
        return node.pattern is None or _pattern_match(node.pattern, text, partial=not whole)

    @classmethod
    def _tail_fits(cls, frame: _String) -> bool:
        """Whether a string with a pattern that a piece left inside a UTF-8 character can finish it with one the
        pattern takes: each character it can be, where one or two bytes are missing (at most 4,096 tries, and only
        for pieces that end inside a character); a lone lead byte of four is judged by two common characters of
        that range."""
        if frame.escape:
            return True  # (inside an escape, which the backslash was let through for)
        read = cls._text(frame)
        node = frame.node
        assert node is not None and node.pattern is not None
        if read is None:
            return False
        text, tail = read
        if not tail:
            return True
        missing = char_length(tail[0]) - len(tail)
        if missing > 2:
            candidates = ["\U0001f600", "\U00020000"]
        else:
            candidates = []
            for rest in itertools.product(range(0x80, 0xC0), repeat=missing):
                try:
                    candidates.append((tail + bytes(rest)).decode())
                except UnicodeDecodeError:  # overlong forms and surrogates are no characters
                    continue
        return any(_pattern_match(node.pattern, text + c, partial=True) for c in candidates)

    @classmethod
    def _escape_fits(cls, frame: _String) -> bool:
        """Whether a backslash may begin an escape here: room for one more character, which one of the short
        escapes makes fit the pattern."""
        read = cls._text(frame)
        node = frame.node
        assert node is not None
        if read is None or read[1] or (node.max_length is not None and len(read[0]) >= node.max_length):
            return False
        return node.pattern is None or any(_pattern_match(node.pattern, read[0] + c, True) for c in '"\\/\b\f\n\r\t')

    @staticmethod
    def _number_accepts(frame: _Number, b: int) -> bool:
        if not frame.text:
            ok = b == ord("-") or 48 <= b <= 57
        elif (frame.integer and b in b".eE") or (frame.bounds is not None and b in b"eE"):
            return False
        else:
            ok = number_accepts(frame.text, b)
        return ok and (frame.bounds is None or frame.bounds.may_become(frame.text + chr(b), frame.integer))
