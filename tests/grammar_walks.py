"""Random walks into a grammar's language, checked against the `regex` package as the oracle (shared by the GBNF and
Lark grammar tests)."""

from __future__ import annotations

import random

import regex

from flint_engine.grammar_prefix import GrammarPrefix


def walk_against_pattern(grammar: str, pattern: str, alphabet: str, walks: int, longest: int) -> int:
    """At each step of each walk every character of the alphabet is accepted exactly when the pattern matches the
    text with it partially, the walk goes on with one of those, and the text may end exactly when the pattern
    matches it whole. Returns the longest text walked."""
    rng = random.Random(0)
    compiled = regex.compile(pattern)
    deep = 0
    for _ in range(walks):
        state, text = GrammarPrefix(grammar), ""
        for _ in range(rng.randint(1, longest)):
            fits = [c for c in alphabet if compiled.fullmatch(text + c, partial=True) is not None]
            assert [c for c in alphabet if state.accepts(c.encode())] == fits, text
            if not fits:
                break
            text += rng.choice(fits)
            assert state.feed(text[-1].encode())
            assert state.can_end == (compiled.fullmatch(text) is not None), text
        deep = max(deep, len(text))
    return deep
