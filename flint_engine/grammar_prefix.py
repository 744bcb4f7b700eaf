"""Grammar constraint (vLLM's `guided_grammar`, `structured_outputs.grammar`): the whole output is a sentence of a
context-free grammar written in GBNF, the EBNF of llama.cpp and xgrammar:

    root   ::= answer " because " reason          # rules `name ::= ...`; the output derives `root`
    answer ::= "yes" | "no"                       # literals, alternatives
    reason ::= [a-z ]+ ("." | "!")?               # character classes ([^...] negated, `.` any), groups,
                                                  # * + ? and {m}, {m,}, {m,n}

The grammar is rewritten into plain productions (each repetition a left-recursive rule) over characters, and the
output is recognised by an Earley parser one character at a time, so any context-free grammar works, ambiguous or
left-recursive ones included. `accepts(piece)` extends the parse with a token's characters without keeping them;
a token that ends inside a UTF-8 character is accepted where some character it begins could follow. A grammar in
Lark's syntax is rewritten into GBNF first (`lark_grammar`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

MAX_GRAMMAR_CHARS = 16_384
MAX_PRODUCTIONS = 20_000  # after the rewrite (a guard on {m,n} counts)
MAX_REPEAT = 1_000
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "[": "[", "]": "]", "-": "-", "^": "^"}


class GrammarError(ValueError):
    """The grammar cannot be read (or is too large)."""


_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def hex_escape(text: str, pos: int, e: str) -> tuple[str, int] | None:
    """The character of a `\\x`, `\\u` or `\\U` escape (`e` its letter) whose digits begin at `pos`, and where it
    ends; None for another letter; GrammarError (without a place) for bad digits."""
    digits = _HEX_DIGITS.get(e)
    if digits is None:
        return None
    hexa = text[pos : pos + digits]
    if len(hexa) != digits or not re.fullmatch(r"[0-9A-Fa-f]+", hexa):
        raise GrammarError(f"\\{e} needs {digits} hexadecimal digits")
    return chr(int(hexa, 16)), pos + digits


@dataclass(frozen=True)
class CharSet:
    """Characters by code point ranges (inclusive), or all but them."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def has(self, cp: int) -> bool:
        if len(self.ranges) == 1:  # (most sets: a literal's character, or one range)
            lo, hi = self.ranges[0]
            return (lo <= cp <= hi) != self.negated
        return any(lo <= cp <= hi for lo, hi in self.ranges) != self.negated

    def meets(self, lo: int, hi: int) -> bool:
        """Whether some character in lo..hi is in the set."""
        if not self.negated:
            return any(a <= hi and lo <= b for a, b in self.ranges)
        covered = lo  # the first character of lo..hi not yet shown to be excluded
        for a, b in sorted(self.ranges):
            if a > covered:
                break
            covered = max(covered, b + 1)
        return covered <= hi


Symbol = str | CharSet  # a rule's name, or one character of a set


@dataclass(frozen=True)
class Grammar:
    """Plain productions: `lhs[i] ::= rhs[i]`; production 0 is the start (`<start> ::= root`)."""

    lhs: tuple[str, ...]
    rhs: tuple[tuple[Symbol, ...], ...]
    by_lhs: dict[str, tuple[int, ...]]
    nullable: frozenset[str]


class _Reader:
    """GBNF text to productions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.productions: list[tuple[str, tuple[Symbol, ...]]] = []
        self.fresh = 0

    def fail(self, why: str) -> GrammarError:
        line = self.text.count("\n", 0, self.pos) + 1
        return GrammarError(f"grammar line {line}: {why}")

    def skip(self, newlines: bool = True) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            else:
                return

    def rule_starts_here(self) -> bool:
        m = _NAME.match(self.text, self.pos)
        return m is not None and re.match(r"[ \t]*::=", self.text[m.end() :]) is not None

    def read(self) -> None:
        self.skip()
        while self.pos < len(self.text):
            m = _NAME.match(self.text, self.pos)
            if m is None:
                raise self.fail(f"expected a rule name, got {self.text[self.pos : self.pos + 20]!r}")
            self.pos = m.end()
            self.skip(newlines=False)
            if not self.text.startswith("::=", self.pos):
                raise self.fail(f"expected '::=' after {m.group()!r}")
            self.pos += 3
            for alt in self.alternatives():
                self.add(m.group(), alt)
            self.skip()

    def alternatives(self) -> list[tuple[Symbol, ...]]:
        alts = [self.sequence()]
        while True:
            self.skip()
            if self.pos < len(self.text) and self.text[self.pos] == "|":
                self.pos += 1
                alts.append(self.sequence())
            else:
                return alts

    def sequence(self) -> tuple[Symbol, ...]:
        out: list[Symbol] = []
        while True:
            self.skip()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)" or self.rule_starts_here():
                return tuple(out)
            out.extend(self.quantified())

    def quantified(self) -> list[Symbol]:
        item = self.primary()
        c = self.text[self.pos] if self.pos < len(self.text) else ""
        if c == "*":
            self.pos += 1
            return [self.repeat(item, 0, None)]
        if c == "+":
            self.pos += 1
            return [self.repeat(item, 1, None)]
        if c == "?":
            self.pos += 1
            return [self.repeat(item, 0, 1)]
        if c == "{":
            m = re.match(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}", self.text[self.pos :])
            if m is None:
                raise self.fail("expected {m}, {m,} or {m,n}")
            self.pos += m.end()
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if (high is not None and high < low) or max(low, high or 0) > MAX_REPEAT:
                raise self.fail(f"a repetition count must be at most {MAX_REPEAT}, and {{m,n}} needs m <= n")
            return [self.repeat(item, low, high)]
        return list(item)

    def primary(self) -> tuple[Symbol, ...]:
        """One item: a literal, a character class, `.`, a rule's name, or a group (its symbols as a sequence)."""
        if self.pos >= len(self.text):
            raise self.fail("the grammar ends inside a rule")
        c = self.text[self.pos]
        if c in "\"'":
            return tuple(CharSet(((ord(ch), ord(ch)),)) for ch in self.literal(c))
        if c == "[":
            return (self.char_class(),)
        if c == ".":
            self.pos += 1
            return (CharSet((), negated=True),)
        if c == "(":
            self.pos += 1
            alts = self.alternatives()
            if self.pos >= len(self.text) or self.text[self.pos] != ")":
                raise self.fail("a group is not closed with ')'")
            self.pos += 1
            return alts[0] if len(alts) == 1 else (self.rule_of(alts),)
        m = _NAME.match(self.text, self.pos)
        if m is None:
            raise self.fail(f"unexpected {c!r}")
        self.pos = m.end()
        return (m.group(),)

    def char(self) -> str:
        """One character of a literal or class, escapes read."""
        c = self.text[self.pos]
        self.pos += 1
        if c != "\\":
            return c
        if self.pos >= len(self.text):
            raise self.fail("the grammar ends inside an escape")
        e = self.text[self.pos]
        self.pos += 1
        if e in _ESCAPES:
            return _ESCAPES[e]
        try:
            read = hex_escape(self.text, self.pos, e)
        except GrammarError as exc:
            raise self.fail(str(exc)) from None
        if read is None:
            raise self.fail(f"unknown escape \\{e}")
        c, self.pos = read
        return c

    def literal(self, quote: str) -> str:
        self.pos += 1
        out = []
        while self.pos < len(self.text) and self.text[self.pos] != quote:
            if self.text[self.pos] == "\n":
                raise self.fail("a literal is not closed on its line")
            out.append(self.char())
        if self.pos >= len(self.text):
            raise self.fail("a literal is not closed")
        self.pos += 1
        return "".join(out)

    def char_class(self) -> CharSet:
        self.pos += 1
        negated = self.text.startswith("^", self.pos)
        self.pos += negated
        ranges = []
        while self.pos < len(self.text) and self.text[self.pos] != "]":
            lo = self.char()
            hi = lo
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                hi = self.char()
            if ord(hi) < ord(lo):
                raise self.fail(f"the range {lo!r}-{hi!r} is backwards")
            ranges.append((ord(lo), ord(hi)))
        if self.pos >= len(self.text):
            raise self.fail("a character class is not closed with ']'")
        self.pos += 1
        return CharSet(tuple(ranges), negated)

    def rule_of(self, alts: list[tuple[Symbol, ...]]) -> str:
        """A fresh rule deriving `alts`."""
        self.fresh += 1
        name = f"<{self.fresh}>"  # no rule of the text can have this name
        for alt in alts:
            self.add(name, alt)
        return name

    def repeat(self, item: tuple[Symbol, ...], low: int, high: int | None) -> str:
        """A fresh rule deriving `item` low to high times (any number above low where high is None)."""
        one = item[0] if len(item) == 1 and isinstance(item[0], str) else self.rule_of([item])
        if high is None:
            many = self.rule_of([()])  # many ::= "" | many one (left-recursive: Earley's best case)
            self.add(many, (many, one))
            return self.rule_of([(one,) * low + (many,)])
        up_to = self.rule_of([()])  # up to (high - low) more, each optional: opt_k ::= "" | one opt_(k-1)
        for _ in range(high - low):
            up_to = self.rule_of([(), (one, up_to)])
        return self.rule_of([(one,) * low + (up_to,)])

    def add(self, lhs: str, rhs: tuple[Symbol, ...]) -> None:
        self.productions.append((lhs, rhs))
        if len(self.productions) > MAX_PRODUCTIONS:
            raise self.fail(f"the grammar is larger than {MAX_PRODUCTIONS} productions once its repetitions are spelt")


@lru_cache(maxsize=64)
def compile_grammar(text: str) -> Grammar:
    """The grammar of a GBNF text (cached: n choices and repeated requests share it); GrammarError on a bad one."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("the grammar is empty")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is {len(text)} characters; at most {MAX_GRAMMAR_CHARS} are allowed")
    from .lark_grammar import is_lark, lark_to_gbnf  # here: it imports GrammarError from this module

    if is_lark(text):
        text = lark_to_gbnf(text)
    reader = _Reader(text)
    reader.read()
    productions = [("<start>", ("root",)), *reader.productions]
    lhs = tuple(p[0] for p in productions)
    by_lhs: dict[str, list[int]] = {}
    for i, name in enumerate(lhs):
        by_lhs.setdefault(name, []).append(i)
    if "root" not in by_lhs:
        raise GrammarError("the grammar has no rule 'root' (the output derives root)")
    for _, rhs in productions:
        missing = next((s for s in rhs if isinstance(s, str) and s not in by_lhs), None)
        if missing is not None:
            raise GrammarError(f"the grammar uses rule {missing!r} but does not define it")
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, rhs in productions:
            if name not in nullable and all(isinstance(s, str) and s in nullable for s in rhs):
                nullable.add(name)
                changed = True
    return Grammar(lhs, tuple(p[1] for p in productions), {k: tuple(v) for k, v in by_lhs.items()}, frozenset(nullable))


class _Set:
    """One Earley set: items (production, dot, origin), and those waiting on each rule name (for completion)."""

    __slots__ = ("items", "scans", "seen", "waiting")

    def __init__(self) -> None:
        self.items: list[tuple[int, int, int]] = []
        self.seen: set[tuple[int, int, int]] = set()
        self.waiting: dict[str, list[tuple[int, int, int]]] = {}
        self.scans: list[tuple[CharSet, tuple[int, int, int]]] = []  # items before a character, with its set


def _utf8_tail_range(tail: bytes) -> tuple[int, int] | None:
    """The code points a UTF-8 sequence beginning with `tail` (a lead byte, maybe continuations) can be."""
    lead = tail[0]
    if 0xC0 <= lead < 0xE0:
        n, bits = 2, lead & 0x1F
    elif 0xE0 <= lead < 0xF0:
        n, bits = 3, lead & 0x0F
    elif 0xF0 <= lead < 0xF8:
        n, bits = 4, lead & 0x07
    else:
        return None
    if len(tail) >= n or any(not 0x80 <= b < 0xC0 for b in tail[1:]):
        return None
    for b in tail[1:]:
        bits = bits << 6 | (b & 0x3F)
    missing = 6 * (n - len(tail))
    lo, hi = bits << missing, (bits << missing) | ((1 << missing) - 1)
    # The shortest form only (a lead byte's low bits of 0 would spell smaller characters at more length), and no
    # further than Unicode goes.
    lo, hi = max(lo, (0x80, 0x800, 0x10000)[n - 2]), min(hi, 0x10FFFF)
    return (lo, hi) if lo <= hi else None


class GrammarPrefix:
    """The output so far against a grammar."""

    cheap_accepts = False  # each piece runs the parser: openings are memoised by the token filter

    def __init__(self, grammar: str) -> None:
        self.g = compile_grammar(grammar)
        self.sets: list[_Set] = []
        first = _Set()
        self._add(first, (0, 0, 0))
        self._close(first, 0, [], [])
        self.sets.append(first)
        self.tail = b""  # the bytes of a character the output has begun and not finished

    # ------------------------------------------------------------------ Earley
    def _add(self, s: _Set, item: tuple[int, int, int]) -> None:
        if item in s.seen:
            return
        s.seen.add(item)
        s.items.append(item)
        prod, dot, _ = item
        rhs = self.g.rhs[prod]
        if dot < len(rhs):
            nxt = rhs[dot]
            if isinstance(nxt, CharSet):
                s.scans.append((nxt, item))
            else:
                s.waiting.setdefault(nxt, []).append(item)

    def _close(self, s: _Set, k: int, base: list[_Set], new: list[_Set]) -> None:
        """Predict and complete in set `k` (the sets before it are `base` then `new`) until nothing is added."""
        g = self.g
        i = 0
        while i < len(s.items):
            prod, dot, origin = s.items[i]
            i += 1
            rhs = g.rhs[prod]
            if dot == len(rhs):  # complete: advance those that waited on this rule where it began
                name = g.lhs[prod]
                began = s if origin == k else base[origin] if origin < len(base) else new[origin - len(base)]
                for w_prod, w_dot, w_origin in list(began.waiting.get(name, ())):
                    self._add(s, (w_prod, w_dot + 1, w_origin))
                continue
            nxt = rhs[dot]
            if isinstance(nxt, CharSet):
                continue
            for p in g.by_lhs[nxt]:
                self._add(s, (p, 0, k))
            if nxt in g.nullable:  # (Aycock and Horspool: an empty rule completes as it is predicted)
                self._add(s, (prod, dot + 1, origin))

    def _walk(self, text: str, close_last: bool = True) -> list[_Set] | None:
        """The sets after the output and `text` (only the new ones), None where `text` cannot follow. Without
        `close_last` the last set holds only what its character advanced (enough to know that it may follow)."""
        base = self.sets
        new: list[_Set] = []
        for i, ch in enumerate(text):
            cp, k = ord(ch), len(base) + len(new)
            s = _Set()
            for charset, (prod, dot, origin) in (new[-1] if new else base[-1]).scans:
                if charset.has(cp):
                    self._add(s, (prod, dot + 1, origin))
            if not s.items:
                return None
            if close_last or i < len(text) - 1:
                self._close(s, k, base, new)
            new.append(s)
        return new

    # ------------------------------------------------------------------ the constraint
    def _split(self, piece: bytes) -> tuple[str, bytes] | None:
        data = self.tail + piece
        try:
            return data.decode(), b""
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data" and exc.end == len(data):
                try:
                    return data[: exc.start].decode(), data[exc.start :]
                except UnicodeDecodeError:
                    return None
            return None

    def _allows_tail(self, last: _Set, tail: bytes) -> bool:
        span = _utf8_tail_range(tail)
        return span is not None and any(charset.meets(*span) for charset, _ in last.scans)

    def _advance(self, piece: bytes, keep: bool = True) -> tuple[list[_Set], bytes] | None:
        """The parse's new sets after `piece`, and the bytes of a character it ends inside; None where it cannot
        follow. Not to `keep` (a question only), the last set is left unclosed where no character is left begun."""
        split = self._split(piece)
        if split is None:
            return None
        text, tail = split
        new = self._walk(text, close_last=keep or bool(tail))
        if new is None or (tail and not self._allows_tail(new[-1] if new else self.sets[-1], tail)):
            return None
        return new, tail

    def accepts(self, piece: bytes) -> bool:
        """Whether the output may go on with these bytes."""
        return bool(piece) and self._advance(piece, keep=False) is not None

    def feed(self, piece: bytes) -> bool:
        step = self._advance(piece)
        if step is None:
            return False
        new, tail = step
        if new:
            # A set behind the last is read only for the items waiting in it (completion): the rest goes, so a long
            # output keeps a few entries a character rather than its whole parse.
            for old in (self.sets[-1], *new[:-1]):
                old.items, old.seen, old.scans = [], set(), []
        self.sets.extend(new)
        self.tail = tail
        return True

    @property
    def can_end(self) -> bool:
        """The output so far derives root."""
        return not self.tail and (0, 1, 0) in self.sets[-1].seen

    @property
    def complete(self) -> bool:
        """Only the end of the turn may follow: no character can."""
        return not self.tail and not self.sets[-1].scans
