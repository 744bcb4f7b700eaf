"""The incremental JSON-object checker behind response_format json_object."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flint_engine.json_mode import MAX_WHITESPACE_RUN, JsonPrefix

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    obj=st.dictionaries(st.text(max_size=6), json_values, max_size=5),
    indent=st.sampled_from([None, 2]),
    ascii_only=st.booleans(),
)
def test_every_prefix_of_a_json_object_is_accepted(obj: dict, indent: int | None, ascii_only: bool) -> None:
    data = json.dumps(obj, indent=indent, ensure_ascii=ascii_only).encode()
    state = JsonPrefix()
    for i, b in enumerate(data):
        assert state.feed(bytes([b])), data[: i + 1]
        assert state.complete == (i == len(data) - 1)
    assert state.feed(b"  \n")  # trailing whitespace is fine; nothing else is
    assert not state.copy().feed(b"x")


@pytest.mark.parametrize(
    "text",
    [
        "[1]",
        '"s"',
        "1",
        "{a: 1}",
        '{"a" 1}',
        '{"a": 01}',
        '{"a": 1,}',
        '{"a": tru}',
        '{"a": "\x01"}',
        "{}}",
        '{"a": 1.}',
        '{"a": -}',
        '{"a": 1e}',
        '{"a": "\\q"}',
        '{"a": "\\u12g4"}',
        "{'a': 1}",
        '{"a": 1 2}',
        '{"a": [1,]}',
        "{,}",
    ],
)
def test_invalid_text_is_rejected(text: str) -> None:
    state = JsonPrefix()
    assert not (state.feed(text.encode()) and state.complete)


def test_copy_is_independent() -> None:
    s = JsonPrefix()
    assert s.feed(b'{"a": [1')
    c = s.copy()
    assert c.feed(b"]}") and c.complete
    assert not s.complete and s.feed(b", 2]}") and s.complete


@pytest.mark.parametrize("prefix", ["", '{"a"', '{"a":', '{"a": [1', '{"a": 1', '{"a": [true'])
@pytest.mark.parametrize("blank", [" ", "\n", "\t", "\r\n"])
def test_whitespace_runs_are_capped(prefix: str, blank: str) -> None:
    """Blanks between JSON tokens come in runs of at most MAX_WHITESPACE_RUN bytes; any JSON byte starts a new run."""
    state = JsonPrefix()
    assert state.feed(prefix.encode())
    run = (blank * MAX_WHITESPACE_RUN)[:MAX_WHITESPACE_RUN].encode()
    assert state.feed(run)
    assert not state.copy().feed(blank[0].encode())
    rest = {"": "{}", '{"a"': ":1}", '{"a":': "1}", '{"a": [1': "]}", '{"a": 1': "}", '{"a": [true': "]}"}[prefix]
    after = state.copy()
    assert after.feed(rest[0].encode() + run) and after.feed(rest[1:].encode()) and after.complete
    in_string = JsonPrefix()
    assert in_string.feed(b'{"' + b" " * (3 * MAX_WHITESPACE_RUN) + b'": 1}') and in_string.complete  # not in strings


def test_numbers_take_ascii_digits_only() -> None:
    state = JsonPrefix()
    assert state.feed(b'{"a": 1')
    assert not state.copy().feed(bytes([0xB2])) and not state.copy().feed("٣".encode())
    assert state.feed(b"2e+5}") and state.complete
