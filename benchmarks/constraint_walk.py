"""Cost of constrained sampling's token filter on the host: one walk over a vocabulary of Flint's size, 150,144
tokens (the worst case of the sampler's walk, when the model's favourites do not fit), for each constraint kind, in
states where few tokens fit and where most do, with the engine's filter (`output_constraint.token_filter`: ASCII
first bytes answered once a step) and with each token checked whole (`prefix.accepts`). Both must allow the same
tokens (checked).

The real Flint tokenizer is not shipped here (the embedded demo tokenizer fills its 150,144 ids with special
tokens, which the filter skips before reading bytes), so the vocabulary is synthetic with a BPE vocabulary's make-up
(`synthetic_vocab`): words with and without a leading space, digit runs, punctuation, whitespace runs, code-like
pieces, and multi-byte UTF-8 words (CJK, accented), a fixed seed.

    python benchmarks/constraint_walk.py [--reps 3] [--out benchmarks/results/constraint_walk.json]

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path

from results_file import write_results

from flint_engine.choice_prefix import ChoicePrefix
from flint_engine.grammar_prefix import GrammarPrefix
from flint_engine.json_mode import JsonPrefix
from flint_engine.json_schema_prefix import SchemaPrefix, compile_schema
from flint_engine.output_constraint import OutputConstraint, token_filter
from flint_engine.regex_prefix import RegexPrefix
from flint_engine.tool_call_prefix import KEY_CLOSE, KEY_OPEN, VALUE_OPEN, tool_call_prefix

RESULTS = Path(__file__).parent / "results"
VOCAB = 150_144
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}}
# JSON as a GBNF grammar, and sums of numbers (left-recursive), for the grammar constraint's cases.
JSON_GRAMMAR = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ([0-9] | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws     ::= [ \t\n]*
"""
SUMS = 'root ::= sum\nsum ::= sum "+" num | num\nnum ::= [0-9]{1,3}'


def synthetic_vocab(n: int, seed: int = 0) -> list[bytes]:
    """`n` distinct token byte strings shaped like a byte-level BPE vocabulary's (see the module docstring)."""
    rng = random.Random(seed)
    letters, cjk = string.ascii_letters, [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
    accented = "éèêàçöüñßåøæ"
    seen: set[bytes] = set()
    out: list[bytes] = [bytes([b]) for b in range(256)]  # every byte alone, as byte-level BPE has
    seen.update(out)
    while len(out) < n:
        kind = rng.random()
        if kind < 0.55:
            word = "".join(rng.choice(letters + accented * (rng.random() < 0.1)) for _ in range(rng.randint(2, 9)))
            piece = (" " if rng.random() < 0.6 else "") + word
        elif kind < 0.65:
            piece = "".join(rng.choice(cjk) for _ in range(rng.randint(1, 3)))
        elif kind < 0.75:
            piece = (" " if rng.random() < 0.5 else "") + "".join(
                rng.choice(string.digits) for _ in range(rng.randint(1, 3))
            )
        elif kind < 0.85:
            piece = "".join(rng.choice(string.punctuation) for _ in range(rng.randint(1, 3)))
        elif kind < 0.9:
            piece = rng.choice([" ", "\n", "\t"]) * rng.randint(1, 16)
        else:
            piece = rng.choice(["_", ".", "(", "::", "->", '"', "'"]) + "".join(
                rng.choice(letters) for _ in range(rng.randint(1, 6))
            )
        raw = piece.encode()
        if raw not in seen:
            seen.add(raw)
            out.append(raw)
    return out


# A strict tool (OpenAI's strict function calling, `tool_call_prefix`): its cases feed a call's pieces before the walk.
TOOL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Lisbon"]},
        "note": {"type": "string"},
        "code": {"type": "string", "pattern": "^[a-z]+$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
}


def _tool_call(*value: bytes) -> list[bytes]:
    return [b"get_weather", KEY_OPEN, value[0], KEY_CLOSE, VALUE_OPEN, *value[1:]]


def cases() -> list[tuple[str, Callable[[], OutputConstraint], bytes | list[bytes]]]:
    """(name, a fresh constraint, the output fed before the walk: bytes, or pieces with tags whole)."""
    strict = functools.partial(tool_call_prefix, ("get_weather",), {"get_weather": TOOL})
    return [
        ("regex, digits next", lambda: RegexPrefix(r"[0-9]{3}-[A-Z]{2}"), b"12"),
        ("choice, after 'y'", lambda: ChoicePrefix(["yes", "no", "maybe"]), b"y"),
        ("JSON, after a value", JsonPrefix, b'{"a": 1'),
        ("JSON, inside a string", JsonPrefix, b'{"a'),
        ("schema, a key next", lambda: SchemaPrefix(compile_schema(SCHEMA)), b"{"),
        ("grammar, JSON value", lambda: GrammarPrefix(JSON_GRAMMAR), b'{"a": 1'),
        ("grammar, JSON string", lambda: GrammarPrefix(JSON_GRAMMAR), b'{"a'),
        ("grammar, 4K-char sum", lambda: GrammarPrefix(SUMS), b"12+" * 1365 + b"4"),
        ("strict tool, its name", strict, [b"get_"]),
        ("strict tool, enum value", strict, _tool_call(b"city", b"Os")),
        ("strict tool, integer", strict, _tool_call(b"days")),
        ("strict tool, string", strict, _tool_call(b"note", b"some text")),
        ("strict tool, pattern", strict, _tool_call(b"code", b"abc")),
    ]


def whole_check(prefix: OutputConstraint, pieces: list[bytes], token: int) -> bool:
    """Each token's bytes checked whole (every token is text here)."""
    return prefix.accepts(pieces[token])


def walk(allowed: Callable[[int], bool]) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = sum(1 for t in range(VOCAB) if allowed(t))
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "constraint_walk.json"))
    args = ap.parse_args()
    pieces = synthetic_vocab(VOCAB)
    stops, special = {VOCAB}, frozenset({VOCAB + 1})  # ids outside the walk: every token is text
    rows = []
    for name, make, fed in cases():
        prefix = make()
        assert all(prefix.feed(piece) for piece in ([fed] if isinstance(fed, bytes) else fed)), name
        times: dict[str, list[float]] = {"filter": [], "whole": []}
        counts = set()
        for _ in range(args.reps):
            filtered = token_filter(prefix, pieces.__getitem__, stops, special)  # a new step: an empty memo
            dt, n = walk(filtered)
            times["filter"].append(dt)
            counts.add(n)
            dt, n = walk(functools.partial(whole_check, prefix, pieces))
            times["whole"].append(dt)
            counts.add(n)
        assert len(counts) == 1, (name, counts)  # both allow the same tokens
        row = {
            "case": name,
            "allowed": counts.pop(),
            **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()},
        }
        rows.append(row)
        filt, whole = row["filter_ms"], row["whole_ms"]
        print(f"{name:<24} {row['allowed']:>7} allowed   filter {filt:>8.1f} ms   whole {whole:>8.1f} ms")
    write_results(Path(args.out), " ".join(["python", *sys.argv]), rows, vocab=VOCAB)


if __name__ == "__main__":
    main()
