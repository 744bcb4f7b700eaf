"""The GBNF grammar constraint (`flint_engine/grammar_prefix.py`) against the `regex` package as the oracle: for
grammars a regular expression can also say (and a recursive one, through `regex`'s recursion), every prefix of many
random walks is accepted exactly when the pattern matches it partially, and may end exactly when it matches
whole; then UTF-8 cut inside a character, the grammar's syntax, and its errors."""

from __future__ import annotations

import pytest
import regex
from grammar_walks import walk_against_pattern

from flint_engine.grammar_prefix import GrammarError, GrammarPrefix, compile_grammar

CASES = [
    # (grammar, the same language as a pattern, the alphabet random strings are drawn from)
    (
        'root ::= answer " because " reason\nanswer ::= "yes" | "no"\nreason ::= [a-z ]+ ("." | "!")?',
        r"(yes|no) because [a-z ]+(\.|!)?",
        "yesnobcau .!x",
    ),
    ('root ::= [0-9]{2,4} ("-" [a-c]{3})?  # a comment\n', r"[0-9]{2,4}(-[a-c]{3})?", "0129-abcd"),
    ('root ::= x*\nx ::= "ab" | [^a-b\\n]', r"(ab|[^a-b\n])*", "abc\n"),
    ('root ::= item ("," item)*\nitem ::= "\'" . "\'"', r"'.'(,'.')*", "',a"),
    ('root ::= "a"? "b"{0,2} c\nc ::= "" | "c" c', r"a?b{0,2}c*", "abc"),
    # Left recursion, and a recursive (non-regular) language.
    (
        'root ::= expr\nexpr ::= expr "+" term | term\nterm ::= [0-9]{1,3} | "(" expr ")"',
        r"(?P<e>(?P<t>[0-9]{1,3}|\((?&e)\))(\+(?&t))*)",
        "12+()",
    ),
]


@pytest.mark.parametrize(("grammar", "pattern", "alphabet"), CASES)
def test_prefixes_and_ends_agree_with_the_pattern(grammar: str, pattern: str, alphabet: str) -> None:
    """Random walks into the language: at each step every character of the alphabet is accepted exactly when the
    pattern matches the text with it partially, and the walk goes on with one of those."""
    deep = walk_against_pattern(grammar, pattern, alphabet, walks=60, longest=24)
    assert deep >= 8  # the walks went well into the language (the second case's longest sentence has 8)


def test_a_piece_of_several_characters_is_one_step_and_leaves_no_trace() -> None:
    state = GrammarPrefix('root ::= "yes" | "no"')
    assert state.accepts(b"ye") and not state.accepts(b"yo") and state.accepts(b"no")
    assert state.feed(b"y") and not state.can_end and state.accepts(b"es") and not state.accepts(b"o")
    assert state.feed(b"es") and state.can_end and state.complete  # nothing may follow "yes"


def test_a_character_cut_between_tokens() -> None:
    """A token may end inside a UTF-8 character: it is accepted where some character it begins may follow."""
    state = GrammarPrefix('root ::= "é" [α-ω]+ "\\u00e9"')
    e, alpha, x = "é".encode(), "α".encode(), "ж".encode()
    assert state.accepts(e[:1]) and not state.accepts(b"e") and not state.accepts(x[:1])
    assert state.feed(e) and state.feed(alpha[:1]) and not state.can_end
    assert state.feed(alpha[1:]) and state.accepts("ωé".encode()) and not state.accepts(x)
    assert state.feed("é".encode()) and state.can_end and state.complete
    # A lead byte whose low bits are 0 begins no ASCII character (that would be an overlong form).
    digits = GrammarPrefix("root ::= [0-9]+")
    assert not any(digits.accepts(bytes([lead])) for lead in (0xC0, 0xC1, 0xE0, 0xF0, 0xF5))
    anything = GrammarPrefix("root ::= .+")
    assert anything.accepts(b"\xf0") and anything.accepts(b"\xe0\xa0") and not anything.accepts(b"\xe0\x80")


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        ("", "empty"),
        ('answer ::= "a"', "no rule 'root'"),
        ("root ::= other", "does not define it"),
        ('root ::= "a', "not closed"),
        ("root ::= [b-a]", "backwards"),
        ('root ::= "a"{5,2}', "m <= n"),
        ('root ::= "a"{1001}', "at most 1000"),
        ('root ::= "a" (\n"b"', "line 2"),
        ("root ::= \\q", "unexpected"),
        ('root ::= "\\q"', "unknown escape"),
        ("root = x", "'::='"),
    ],
)
def test_bad_grammars_say_what_is_wrong(grammar: str, says: str) -> None:
    with pytest.raises(GrammarError, match=regex.escape(says)):
        compile_grammar(grammar)
