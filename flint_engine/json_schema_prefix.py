"""Structured outputs (`response_format: {"type": "json_schema"}`): an incremental checker for one JSON value that a
JSON Schema describes, with the same interface as JSON mode's `JsonPrefix`.

`compile_schema` turns the request's schema into nodes once (a `SchemaError` names what it cannot honour); a
`SchemaPrefix` then reads output bytes and accepts a prefix only if it can still be completed to an instance, so the
sampler (which walks candidates in the model's order) never reaches a dead end. The subset enforced exactly:

* `type` (one or a list of: object, array, string, number, integer, boolean, null) or no type (any value);
* objects: `properties`, `required`, `additionalProperties` (false or absent: only the declared properties, as
  OpenAI's strict mode; true: any further keys, with any values); keys in any order, each at most once;
* arrays: `items`, `minItems`, `maxItems`; `enum` and `const` of any JSON values (written compactly);
* `anyOf` whose branches start differently (e.g. a type or null), and `$ref` into `$defs` / `definitions`.

Annotations (`title`, `description`, `default`, `examples`, `format`, `$schema`, `strict`) are ignored; any other
keyword (`pattern`, `minimum`, `minLength`, ...) is refused rather than silently not enforced.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from .json_mode import MAX_WHITESPACE_RUN, WS, WholeValueEnd, number_accepts

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
IGNORED = {"title", "description", "default", "examples", "format", "$schema", "$id", "$comment", "strict"}
HANDLED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum"}
HANDLED |= {"const", "anyOf", "$ref", "$defs", "definitions"}
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

    def starts(self) -> bytes:
        if self.branches:
            return b"".join(b.starts() for b in self.branches)
        if self.literals is not None:
            return bytes({lit[0] for lit in self.literals})
        return b"".join(STARTS[t] for t in self.types)


ANY = Node()


def compile_schema(schema: Any) -> Node:
    """The root node of `schema` (a JSON Schema whose root describes an object). Compiled once per distinct schema
    (the API, `SamplingParams` and the engine each ask; clients tend to send the same schema again)."""
    if not isinstance(schema, dict):
        raise SchemaError("the schema must be a JSON object")
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"the schema is not JSON: {exc}") from None
    return _compile_text(text)


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
    return node


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
    """Inside a string (a value, or an object's key when `keys` is set: the text must lead to one of them)."""

    def __init__(self, keys: tuple[bytes, ...] | None = None) -> None:
        self.keys, self.read, self.escape = keys, b"", 0


class _Number(_Frame):
    def __init__(self, integer: bool) -> None:
        self.integer, self.text = integer, ""


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
        return all(self._byte(b) for b in data)

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
            if not top.text[-1].isdigit():
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
            self.stack[-1] = _String()
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
            self.stack[-1] = _Number(integer="number" not in node.types)
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
            elif b == ord("u"):
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
            frame.escape = 1
            return self._key_text(frame, b)
        if b == ord('"'):
            parent = self.stack[-2] if len(self.stack) > 1 else None
            if not (isinstance(parent, _Object) and parent.state in ("key", "key!")):
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

    @staticmethod
    def _key_text(frame: _String, b: int) -> bool:
        """Record a byte of the string; for a key, it must still lead to one of the allowed keys."""
        frame.read += bytes([b])
        return frame.keys is None or any(k.startswith(frame.read) for k in frame.keys)

    @staticmethod
    def _number_accepts(frame: _Number, b: int) -> bool:
        if not frame.text:
            return b == ord("-") or 48 <= b <= 57
        if frame.integer and b in b".eE":
            return False
        return number_accepts(frame.text, b)
