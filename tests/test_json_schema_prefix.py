"""Structured outputs: the incremental JSON Schema checker (`flint_engine.json_schema_prefix`).

Instances drawn at random from each schema are accepted byte by byte, however they are spaced; random walks over
printable bytes never reach a dead end (a prefix the checker accepted but no byte continues), and every walk that
closes its object yields an instance of the schema; strings' lengths and patterns and numbers' bounds included.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from flint_engine.json_mode import MAX_WHITESPACE_RUN
from flint_engine.json_schema_prefix import SchemaError, SchemaPrefix, compile_schema

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "annotations are ignored"},
        "age": {"type": "integer"},
        "height": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "unit": {"enum": ["kg", "m", 10, 1, None, True]},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "pet": {"$ref": "#/$defs/Pet"},
        'é"q': {"const": 'x"é'},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {
        "Pet": {
            "type": "object",
            "properties": {
                "kind": {"enum": ["cat", "dog"]},
                "friends": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
            },
            "required": ["kind"],
        }
    },
}
OPEN = {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": True}
ANY_OBJECT = {"type": "object"}
NESTED = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {"type": "array", "items": {"type": ["integer", "null"]}, "minItems": 2},
        },
        "flag": {"type": "boolean"},
    },
    "required": ["rows", "flag"],
}
BOUNDED = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"},
        "name": {"type": "string", "minLength": 2, "maxLength": 5},
        "about": {"type": "string", "pattern": "c[a-z]"},  # found anywhere, as JSON Schema reads a pattern
        "score": {"type": "integer", "minimum": -5, "maximum": 120},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
        "big": {"type": "integer", "exclusiveMinimum": 1000},
        "pet": {"allOf": [{"$ref": "#/$defs/Pet"}], "description": "one schema in allOf, as Pydantic v1 writes"},
    },
    "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}},
    "required": ["code", "score", "ratio"],
    "additionalProperties": False,
}
SCHEMAS = [PERSON, OPEN, ANY_OBJECT, NESTED, BOUNDED]
# Instances of BOUNDED's patterns (the draw below cannot invert a pattern in general).
PATTERN_DRAWS = {
    "^[A-Z]{2}-[0-9]+$": lambda rng: "".join(rng.choice("ABZ") for _ in range(2)) + "-" + str(rng.randint(0, 999)),
    "c[a-z]": lambda rng: rng.choice(["", "x", "é "]) + "c" + rng.choice("az") + rng.choice(["", "C", '"q']),
}


def _resolve(s: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in s or "allOf" in s:
        s = root["$defs"][s["$ref"].rsplit("/", 1)[-1]] if "$ref" in s else s["allOf"][0]
    return s


def draw(s: Any, root: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A random instance of schema `s` (the subset the checker enforces)."""
    s = _resolve(s, root) if isinstance(s, dict) else {}
    if "anyOf" in s:
        return draw(rng.choice(s["anyOf"]), root, rng, depth)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    types = s.get("type", ["object", "array", "string", "number", "integer", "boolean", "null"])
    t = rng.choice(types if isinstance(types, list) else [types])
    if depth > 3 and t in ("object", "array") and not s.get("required") and not s.get("minItems"):
        t = "null" if "type" not in s else t
    if t == "object":
        props = s.get("properties", {})
        keys = [k for k in props if k in s.get("required", []) or rng.random() < 0.5]
        out = {k: draw(props[k], root, rng, depth + 1) for k in keys}
        if s.get("additionalProperties") is True or ("additionalProperties" not in s and not props):
            for i in range(rng.randint(0, 2)):
                out[f"x{i}"] = draw({}, root, rng, depth + 1) if depth < 2 else i
        rng.shuffle(keys)
        return {k: out[k] for k in [*keys, *[k for k in out if k not in keys]]}
    if t == "array":
        lo, hi = s.get("minItems", 0), s.get("maxItems", 3)
        return [draw(s.get("items", {}), root, rng, depth + 1) for _ in range(rng.randint(lo, max(lo, min(hi, 3))))]
    if t == "string":
        if "pattern" in s:
            return PATTERN_DRAWS[s["pattern"]](rng)
        lo, hi = s.get("minLength", 0), s.get("maxLength", 6)
        return "".join(rng.choice('ab "\\\né\u2603\t') for _ in range(rng.randint(lo, max(lo, min(hi, 6)))))
    if t == "integer":
        lo = s.get("minimum", s.get("exclusiveMinimum", -1001) + 1)
        return rng.randint(lo, s.get("maximum", lo + 2000))
    if t == "number":
        if "maximum" in s:  # BOUNDED's ratio: (0, 1.5], no exponent
            return rng.choice([1.5, 1, 0.25, round(rng.uniform(0.001, 1.5), 3)])
        return rng.choice([rng.randint(-5, 5), rng.uniform(-1e3, 1e3), 1.5e-7])
    if t == "boolean":
        return rng.random() < 0.5
    return None


def conforms(v: Any, s: Any, root: dict[str, Any]) -> bool:
    """Whether `v` is an instance of `s` (the same subset), checked on the parsed value."""
    s = _resolve(s, root) if isinstance(s, dict) else {}
    if "anyOf" in s:
        return any(conforms(v, b, root) for b in s["anyOf"])
    if "const" in s or "enum" in s:
        options = [s["const"]] if "const" in s else s["enum"]
        return any(
            json.dumps(v, sort_keys=True) == json.dumps(o, sort_keys=True) and type(v) is type(o) for o in options
        )
    types = s.get("type")
    types = [types] if isinstance(types, str) else types
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v))
    kind = kind or ("integer" if isinstance(v, int) else "number")
    if types is not None and kind not in types and not (kind == "integer" and "number" in types):
        return False
    if kind == "object":
        props = s.get("properties", {})
        closed = s.get("additionalProperties") is False or ("additionalProperties" not in s and props)
        return (
            all(k in v for k in s.get("required", []))
            and (not closed or all(k in props for k in v))
            and all(conforms(x, props.get(k, {}), root) for k, x in v.items())
        )
    if kind == "array":
        return s.get("minItems", 0) <= len(v) <= s.get("maxItems", len(v)) and all(
            conforms(x, s.get("items", {}), root) for x in v
        )
    if kind == "string":
        return s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v)) and (
            "pattern" not in s or re.search(s["pattern"], v) is not None
        )
    if kind in ("integer", "number"):
        return (
            v >= s.get("minimum", v)
            and v <= s.get("maximum", v)
            and ("exclusiveMinimum" not in s or v > s["exclusiveMinimum"])
            and ("exclusiveMaximum" not in s or v < s["exclusiveMaximum"])
        )
    return True


def spaced(v: Any, rng: random.Random) -> str:
    """`v` as JSON, compact, pretty or with random blanks around its punctuation."""
    style = rng.randrange(3)
    if style == 0:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if style == 1:
        return json.dumps(v, ensure_ascii=False, indent=2)  # keys are matched as the schema writes them, not \u-escaped
    return json.dumps(
        v, ensure_ascii=False, separators=(rng.choice([",", " , ", ",\n  "]), rng.choice([":", ": ", " :\t"]))
    )


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "open", "any-object", "nested", "bounded"])
def test_random_instances_are_accepted(schema: dict[str, Any]) -> None:
    root, rng = compile_schema(schema), random.Random(len(json.dumps(schema)))
    for _ in range(150):
        v = draw(schema, schema, rng)
        assert conforms(v, schema, schema), v
        text = spaced(v, rng).encode()
        if any(len(run) > MAX_WHITESPACE_RUN for run in re.findall(rb"[ \t\n\r]+", text)):
            continue
        p = SchemaPrefix(root)
        for i in range(len(text)):
            assert p.feed(text[i : i + 1]), (text[: i + 1], v)
            assert p.complete == (i == len(text) - 1) or text[i + 1 :].strip() == b"", text
        assert p.complete and p.copy().feed(b" \n") and not p.copy().feed(b"x")


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "open", "any-object", "nested", "bounded"])
def test_random_walks_reach_no_dead_end_and_close_on_instances(schema: dict[str, Any]) -> None:
    root, rng = compile_schema(schema), random.Random(7)
    alphabet = [bytes([b]) for b in range(0x20, 0x7F)] + ["é".encode(), b"\n"]
    structural = [bytes([c]) for c in b'{}[],:"0123456789-.etnulfasr']
    names = "".join(re.findall(r'"properties": \{"([a-z]+)"', json.dumps(schema))).encode()  # for `required` keys
    closed = 0
    for _ in range(40):
        p, text = SchemaPrefix(root), b""
        for _step in range(400):
            options = [c for c in alphabet if p.copy().feed(c)]
            assert options or p.complete, f"dead end after {text!r}"
            if p.complete:
                break
            # Lean on structure so walks close objects instead of growing strings forever, and on closing
            # bytes once a walk is long.
            closing = [c for c in options if c in b'}]",:' + names] if len(text) > 120 else []
            good = closing or [c for c in options if c in structural]
            c = rng.choice(good if good and rng.random() < 0.85 else options)
            assert p.feed(c)
            text += c
        if p.complete:
            closed += 1
            assert conforms(json.loads(text), schema, schema), text
    assert closed >= 10


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "string"}, "root must be an object"),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
            "'multipleOf' is not supported",
        ),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(x"}}}, "not a regular expression"),
        ({"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}, "non-negative integer"),
        ({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}}}, "maxLength is"),
        ({"type": "object", "properties": {"a": {"type": "number", "minimum": 2, "maximum": 1}}}, "no number is"),
        ({"type": "object", "properties": {"a": {"type": "number", "exclusiveMinimum": True}}}, "finite number"),
        ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1.2, "maximum": 1.8}}}, "no integer is"),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": 1, "maximum": 1}}},
            "no number",
        ),
        ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"maxLength": 2}]}}}, "allOf is"),
        ({"type": "object", "required": ["q"]}, "required names 'q'"),
        (
            {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}}},
            "start differently",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "does not name a definition"),
        ({"type": "object", "properties": {"a": {"type": "date"}}}, "type must be"),
        ({"type": "object", "properties": {"a": {"enum": []}}}, "enum needs at least one value"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties must be true or false"),
        ({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}}, "maxItems is below"),
    ],
)
def test_schemas_it_cannot_enforce_are_refused(schema: dict[str, Any], says: str) -> None:
    with pytest.raises(SchemaError, match=says):
        compile_schema(schema)


def test_closed_objects_keys_and_required() -> None:
    root = compile_schema(PERSON)
    p = SchemaPrefix(root)
    assert p.feed(b'{"name": "x"')
    assert not p.copy().feed(b"}")  # age is required
    assert not p.copy().feed(b', "nam')  # name was given
    assert not p.copy().feed(b', "zzz')  # not a property
    assert p.copy().feed(b', "ag')
    assert p.feed(b', "age": 7}') and p.complete


def test_compound_literals_are_written_compactly() -> None:
    """enum / const values that are arrays or objects are matched as compact JSON text (documented)."""
    root = compile_schema({"type": "object", "properties": {"c": {"const": [1, {"a": False}]}}})
    assert SchemaPrefix(root).feed(b'{"c": [1,{"a":false}]}')
    assert not SchemaPrefix(root).feed(b'{"c": [1, {"a": false}]}')


def test_numbers_take_ascii_digits_only() -> None:
    """A UTF-8 byte that Python calls a digit as a character ("²" is 0xC2 0xB2) does not extend a number."""
    root = compile_schema(PERSON)
    for prefix in (b'{"name": "x", "age": 1', b'{"name": "x", "height": 2.5'):
        p = SchemaPrefix(root)
        assert p.feed(prefix)
        assert not p.copy().feed(bytes([0xB2])) and not p.copy().feed("²".encode())
        assert p.copy().feed(b"7, ")  # digits, then the number ends
    assert not SchemaPrefix(root).feed(b'{"name": "x", "age": 1.5')  # an integer has no fraction


def test_a_key_that_is_not_utf8_does_not_close() -> None:
    root = compile_schema(OPEN)
    p = SchemaPrefix(root)
    assert p.feed(b'{"a' + bytes([0xB2]))  # inside the string: the model may still go on
    assert not p.copy().feed(b'"')  # but this key can never close as it is
    assert p.feed(b"bc")  # the string goes on, still unclosable
    assert not p.copy().feed(b'"')
    good = SchemaPrefix(root)
    assert good.feed('{"é": 1}'.encode()) and good.complete


def test_zero_items_and_compiled_once() -> None:
    root = compile_schema({"type": "object", "properties": {"a": {"type": "array", "maxItems": 0}}})
    assert SchemaPrefix(root).feed(b'{"a": [ ]}')
    assert not SchemaPrefix(root).feed(b'{"a": [1')
    assert compile_schema({"properties": {"a": {"type": "array", "maxItems": 0}}, "type": "object"}) is root


def test_strings_lengths_and_patterns_and_numbers_bounds() -> None:
    root = compile_schema(BOUNDED)

    def fits(text: str) -> bool:
        return SchemaPrefix(root).feed(text.encode())

    assert fits('{"code": "AB-1') and not fits('{"code": "A1') and not fits('{"code": "AB-"')
    assert fits('{"name": "ab"') and not fits('{"name": "a"') and not fits('{"name": "abcdef')
    assert fits('{"name": "a\\n"') and not fits('{"name": "a\\u0041')  # short escapes only, in a string with rules
    assert not fits('{"name": "abcde\\\\')  # no room for the escaped character
    assert fits('{"about": "xcay"') and not fits('{"about": "xy"') and not fits('{"about": "CA"')
    assert fits('{"score": 120,') and not fits('{"score": 121') and not fits('{"score": -6') and fits('{"score": -5,')
    assert fits('{"score": 1') and fits('{"score": 12') and not fits('{"score": 1.') and not fits('{"score": 1e2')
    assert fits('{"ratio": 1.5,') and fits('{"ratio": 1.50000') and not fits('{"ratio": 1.500001')
    assert not fits('{"ratio": 0,') and fits('{"ratio": 0.001,') and not fits('{"ratio": -') and not fits('{"ratio": 2')
    assert fits('{"big": 1001,') and not fits('{"big": 1000,') and fits('{"big": 9') and not fits('{"big": -')


def test_a_piece_that_ends_inside_a_character_of_a_patterned_string() -> None:
    """A token may end inside a UTF-8 character: it is taken where some character it begins fits the pattern."""

    def state(pattern: str) -> SchemaPrefix:
        p = SchemaPrefix(
            compile_schema({"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}})
        )
        assert p.feed(b'{"s": "a')
        return p

    assert not state("^[a-f]+$").feed(b"\xc3")  # no character from U+00C0 to U+00FF is in [a-f]
    p = state("^[a-zé]+$")
    assert p.feed(b"\xc3") and not p.copy().feed(b"\xa8") and p.feed(b"\xa9")  # è no, é yes
    assert state("^a.*$").feed(b"\xe2\x98") and state("^a.$").feed("☃".encode()[:1])
