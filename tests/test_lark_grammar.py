"""Lark grammars (`flint_engine/lark_grammar.py`) read into the grammar constraint: told apart from GBNF, regular
expression terminals against the `regex` package as the oracle, Lark's JSON grammar against `json`, `%ignore`, the
other items, and errors naming what cannot be read."""

from __future__ import annotations

import json
import random

import pytest
import regex
from grammar_walks import walk_against_pattern

from flint_engine.grammar_prefix import GrammarError, GrammarPrefix
from flint_engine.lark_grammar import is_lark

JSON_LARK = r"""
?value: dict
      | list
      | string
      | SIGNED_NUMBER      -> number
      | "true"             -> true
      | "false"            -> false
      | "null"             -> null

list : "[" [value ("," value)*] "]"    // Lark's own example grammar
dict : "{" [pair ("," pair)*] "}"
pair : string ":" value
string : ESCAPED_STRING

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""


def whole(grammar: str, text: str) -> bool:
    state = GrammarPrefix(grammar)
    return state.feed(text.encode()) and state.can_end


def test_lark_and_gbnf_are_told_apart() -> None:
    assert is_lark(JSON_LARK) and is_lark("start: 'a'") and is_lark("?start.2 : x\nx: /a/")
    assert not is_lark('root ::= "a"') and not is_lark('root ::= x\nx ::= "a:b"')
    assert not is_lark("# start: a\n")  # (a comment only)


# (Lark grammar, the same language as a pattern, the alphabet random strings are drawn from)
CASES = [
    ("start: WORD DIGITS\nWORD: /[a-z]+/\nDIGITS: /\\d{2,3}/", r"[a-z]+[0-9]{2,3}", "ab09"),
    ("start: /(ab|cd)*e?/", r"(ab|cd)*e?", "abcde"),
    ("start: /[^x\\n]{1,4}/ | /x./", r"[^x\n]{1,4}|x[^\n]", "xy\n"),
    ('start: "hi"i NAME\nNAME: /[a-c]+/i', r"[hH][iI][a-cA-C]+", "hHiIaBd"),
    ("start: /(a.b)+/s", r"(a(.|\n)b)+", "ab\n"),
    ('start: item ~ 2..5\nitem: "x" | "y"', r"[xy]{2,5}", "xyz"),
    ('start: "(" [num ("," num)*] ")"\nnum: "0".."3"+', r"\(([0-3]+(,[0-3]+)*)?\)", "(),03"),
    ('start: part+\npart: "a" part "b" | "c"', r"(?P<p>a(?&p)b|c)+", "abc"),
    (r"start: /\w+@\w+\.(com|org)/", r"[A-Za-z0-9_]+@[A-Za-z0-9_]+\.(com|org)", "a@.comrg"),
]


@pytest.mark.parametrize(("grammar", "pattern", "alphabet"), CASES)
def test_prefixes_and_ends_agree_with_the_pattern(grammar: str, pattern: str, alphabet: str) -> None:
    """Random walks into the language: each character is accepted exactly when the pattern matches the text with it
    partially, and the text may end exactly when it matches whole."""
    assert walk_against_pattern(grammar, pattern, alphabet, walks=40, longest=16) >= 4


def _random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.choice(["num", "str", "lit"] + (["list", "dict"] if depth < 3 else []))
    if kind == "num":
        return rng.choice([0, -7, 3.25, -1.5e-3, 12345678, 2e10])
    if kind == "str":
        return "".join(rng.choice('ab "\\/é\t') for _ in range(rng.randint(0, 5)))
    if kind == "lit":
        return rng.choice([True, False, None])
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _random_json(rng, depth + 1) for i in range(rng.randint(0, 3))}


def test_lark_json_grammar_takes_json_and_ignores_whitespace() -> None:
    """Documents `json.dumps` writes (compact, indented, or with blanks between every token) are sentences; broken
    ones are not, and no prefix of a sentence is refused on the way."""
    rng = random.Random(1)
    for _ in range(40):
        doc = _random_json(rng)
        for text in (json.dumps(doc), json.dumps(doc, indent=2), " " + json.dumps(doc, separators=(" , ", " : "))):
            state = GrammarPrefix(JSON_LARK)
            assert all(state.feed(c.encode()) for c in text), text
            assert state.can_end, text
    for bad in ('{"a" 1}', "[1,]", "tru", '{"a": }', "01x", '"a\nb"', "[1 2]"):
        assert not whole(JSON_LARK, bad), bad


def test_ignored_text_goes_between_tokens_not_inside_them() -> None:
    grammar = 'start: "ab" NUM\nNUM: /[0-9]+/\n%import common.WS_INLINE\n%ignore WS_INLINE'
    assert whole(grammar, "ab12") and whole(grammar, " ab \t 12 ")
    assert not whole(grammar, "a b12") and not whole(grammar, "ab1 2")


def test_start_is_the_start_else_the_first_rule_and_terminals_inline() -> None:
    assert whole("x: 'a'\nstart: x 'b'", "ab") and not whole("x: 'a'\nstart: x 'b'", "a")
    assert whole("first: second '!'\nsecond: 'hi'", "hi!")
    assert whole('start: A\nA: B "-" B\nB: "a".."c"', "a-c") and not whole('start: A\nA: B "-" B\nB: "a".."c"', "a-d")
    assert whole("start: x\n    | y\nx: 'x'\ny: 'y' -> why", "y")  # an alternative on its own line, an alias
    renamed = 'start: COUNT "x"\n%import common.INT -> COUNT'  # an import under another name
    assert whole(renamed, "12x") and not whole(renamed, "x")


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        ("start: x", "'x' is used but not defined"),
        ("start: INT", "import it: %import common.INT"),
        ("start: 'a'\n%import common.NOPE", "no terminal 'NOPE'"),
        ("start: 'a'\n%import other.A", "only Lark's common terminals"),
        ("start: 'a'\n%declare X", "%declare is not supported"),
        ("start: 'a'\nstart: 'b'", "defines 'start' more than once"),
        ("start: /(?=a)a/", "lookarounds"),
        ("start: /^a$/", "anchors"),
        (r"start: /(a)\1/", "back reference"),
        ("start: /a/x", "flag 'x'"),
        ("start: 'a'..'zz'", "a range must be"),
        ("start: (a", "expected ')'"),
        ('start: "a', "not closed"),
        ("start{x}: x", "templates are not supported"),
    ],
)
def test_bad_lark_grammars_say_what_is_wrong(grammar: str, says: str) -> None:
    with pytest.raises(GrammarError, match=regex.escape(says)):
        GrammarPrefix(grammar)
