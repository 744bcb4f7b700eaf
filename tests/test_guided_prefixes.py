"""Choice and regex constraints (`choice_prefix`, `regex_prefix`): what they accept, when the turn may end, UTF-8
characters split across tokens, a pattern that backtracks without end, and the request checks of SamplingParams."""

from __future__ import annotations

import random
import time

import pytest
import regex

from flint_engine.choice_prefix import ChoicePrefix
from flint_engine.output_constraint import output_constraint
from flint_engine.regex_prefix import MATCH_TIMEOUT_S, RegexPrefix
from flint_engine.sampling_params import SamplingParams, SamplingParamsError


def walk(prefix, pieces: list[bytes]) -> bool:
    """Feed the pieces one by one, each checked with `accepts` first; False at the first refused piece."""
    for piece in pieces:
        if not prefix.accepts(piece):
            return False
        assert prefix.feed(piece)
    return True


def test_choice_accepts_the_prefixes_of_its_choices_only() -> None:
    p = ChoicePrefix(["yes", "no", "yesterday", "ñu"])
    assert p.accepts(b"y") and p.accepts(b"yes") and p.accepts(b"n") and p.accepts("ñ".encode())
    assert not p.accepts(b"x") and not p.accepts(b"") and not p.accepts(b"yess")
    assert p.accepts("ñ".encode()[:1])  # the first byte of a character split over two tokens
    assert not p.can_end and not p.complete
    assert walk(p, [b"y", b"es"])
    assert p.can_end and not p.complete  # "yes" may end here or go on to "yesterday"
    assert walk(p, [b"ter", b"day"]) and p.can_end and p.complete
    assert not p.accepts(b"s")
    q = ChoicePrefix(["ñu"])
    assert walk(q, ["ñ".encode()[:1], "ñ".encode()[1:], b"u"]) and q.complete


def test_choice_walks_end_on_a_choice() -> None:
    """Random walks over the bytes the choices use: every accepted walk stays a prefix of a choice, and a walk that
    may end is one of them."""
    choices = ["alpha", "alpine", "beta", "b", "ünïcode", "a b c"]
    alphabet = sorted({bytes([b]) for c in choices for b in c.encode()} | {b"z", b"ab", b"pha"})
    rng = random.Random(3)
    ended = 0
    for _ in range(300):
        p = ChoicePrefix(choices)
        for _ in range(12):
            options = [a for a in alphabet if p.accepts(a)]
            if p.complete:
                assert not options
                break
            assert options, p.text  # never a dead end before a whole choice
            p.feed(rng.choice(options))
            assert any(c.encode().startswith(p.text) for c in choices)
        if p.can_end:
            ended += 1
            assert p.text.decode() in choices
    assert ended > 100


def test_regex_accepts_partial_matches_and_ends_on_a_full_one() -> None:
    p = RegexPrefix(r"\d{3}-[A-Z]{2}")
    assert p.accepts(b"1") and p.accepts(b"12") and not p.accepts(b"a") and not p.accepts(b"1234")
    assert walk(p, [b"12", b"3-"]) and not p.can_end
    assert walk(p, [b"AB"]) and p.can_end
    assert not p.accepts(b"C")
    assert not p.complete  # whether a match could go on is not known in general: the sampler's walk decides
    q = RegexPrefix(r"(yes|no)!?")
    assert walk(q, [b"no"]) and q.can_end and walk(q, [b"!"]) and q.can_end


def test_regex_characters_split_over_tokens() -> None:
    """A token may end inside a UTF-8 character when one byte is missing and some completion keeps the match; a
    lone lead byte of a longer character is refused (the model writes it whole or from its first bytes)."""
    e = "é".encode()  # 2 bytes
    p = RegexPrefix(r"é+!")
    assert p.accepts(e[:1]) and walk(p, [e[:1], e[1:], e, b"!"]) and p.can_end
    assert not RegexPrefix(r"a+").accepts(e[:1])  # no character that byte begins is an "a"
    han = "好".encode()  # 3 bytes
    p = RegexPrefix(r"[一-龥]+")
    assert not p.accepts(han[:1])  # two bytes missing: refused
    assert p.accepts(han[:2]) and walk(p, [han[:2], han[2:]]) and p.can_end
    assert not p.accepts(b"\xff")  # never UTF-8
    p = RegexPrefix(r"a")
    assert walk(p, [b"a"]) and p.can_end


def test_regex_walks_stay_partial_matches() -> None:
    pattern = r"(GET|POST) /[a-z]{1,8}(\?id=\d+)?"
    compiled = regex.compile(pattern)
    alphabet = [b"G", b"ET", b"POST", b" /", b"/", b"x", b"users", b"?id=", b"7", b"42", b"!", b" "]
    rng = random.Random(5)
    full = 0
    for _ in range(200):
        p = RegexPrefix(pattern)
        for _ in range(10):
            options = [a for a in alphabet if p.accepts(a)]
            if not options:
                break
            p.feed(rng.choice(options))
            assert compiled.fullmatch(p.data.decode(), partial=True)
        if p.can_end:
            full += 1
            assert compiled.fullmatch(p.data.decode())
    assert full > 50


def test_a_backtracking_pattern_times_out_and_ends_the_output() -> None:
    """Matching "a"s against (a|aa)+b backtracks exponentially in their number: each check is cut at the time
    limit, and from the first cut the output may only end."""
    p = RegexPrefix(r"(a|aa)+b")
    for _ in range(200):
        t0 = time.monotonic()
        ok = p.accepts(b"a") and p.feed(b"a")
        assert time.monotonic() - t0 < 10 * MATCH_TIMEOUT_S
        if not ok:
            break
    assert p.timed_out and p.can_end and p.complete and not p.accepts(b"b")
    assert 10 < len(p.data) < 200


def test_output_constraint_picks_the_requested_kind() -> None:
    assert isinstance(output_constraint(SamplingParams(choice=("a", "b"))), ChoicePrefix)
    assert isinstance(output_constraint(SamplingParams(regex="a+")), RegexPrefix)
    assert output_constraint(SamplingParams(json_mode=True)).accepts(b"{")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not output_constraint(SamplingParams(json_mode=True, json_schema=schema)).accepts(b'{"b"')


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"choice": ()}, "choice"),
        ({"choice": ("a", "")}, "choice"),
        ({"choice": "ab"}, "choice"),
        ({"regex": "(a"}, "regex"),
        ({"regex": "a" * 5000}, "regex"),
        ({"regex": 3}, "regex"),
        ({"choice": ("a",), "regex": "a"}, "regex"),
        ({"json_mode": True, "choice": ("a",)}, "choice"),
        ({"thinking_token_budget": 2.5}, "thinking_token_budget"),
        ({"thinking_token_budget": -1, "reasoning_end_token": 7}, "thinking_token_budget"),
        ({"choice": ("a",), "tool_names": ("f",)}, "tool_names"),
    ],
)
def test_sampling_params_refuse_bad_constraints(kwargs: dict, field: str) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field


def test_sampling_params_choice_is_a_tuple_and_constrained() -> None:
    p = SamplingParams(choice=["a", "b"])  # type: ignore[arg-type]
    assert p.choice == ("a", "b") and p.constrained
    assert SamplingParams(regex="x").constrained and SamplingParams(json_mode=True).constrained
    assert not SamplingParams().constrained
