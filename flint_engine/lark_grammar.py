"""Lark grammars (the syntax of the Lark parsing toolkit, which vLLM's `guided_grammar` also takes) rewritten as GBNF
for `grammar_prefix`:

    start: pair ("," pair)*                 // rules `name: ...`; the output derives `start` (else the first rule)
    pair: KEY "=" value
    ?value: SIGNED_NUMBER | ESCAPED_STRING  // `?` and `!` prefixes, `.n` priorities and `-> alias` are dropped
    KEY: /[a-z_]+/                          // terminals: literals ("..."i too), "a".."z" ranges, /regex/ (i, s)
    %import common.SIGNED_NUMBER            // Lark's common terminals (`common (A, B)`, `common.X -> Y` too)
    %import common.ESCAPED_STRING
    %import common.WS
    %ignore WS                              // may appear before, between and after the tokens

Items take `?`, `*`, `+`, `~ n` and `~ m..n`; `[item]` is optional. A regex may use literals, `.`, classes (with
`\\d`, `\\w`, `\\s`, ASCII), groups, alternation and the quantifiers; lookarounds, anchors and back references are
refused. The output is recognised as a sentence of the grammar over characters, as Lark's Earley parser with its
dynamic lexer reads it, not by a longest-match lexer. Templates, `%declare`, `%override` and `%extend` are refused.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from .grammar_prefix import GrammarError, hex_escape

_DEFINITION = re.compile(r"[?!]?(_?[A-Za-z][A-Za-z0-9_]*|_[A-Za-z0-9_]*)(\.-?\d+)?[ \t]*:(?!:)")
_TEMPLATE = re.compile(r"[?!]?[A-Za-z_][A-Za-z0-9_]*\s*\{[^}]*\}\s*:(?!:)")  # (read, to be refused)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IGNORE = "lark-ignore"  # GBNF names made here have a '-', which no Lark name has
_SHORTHANDS = {"d": "0-9", "w": "A-Za-z0-9_", "s": " \t\n\r\f\v"}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a", "b": "\b", "e": "\x1b"}

# Lark's `common` terminals (lark/grammars/common.lark), as Lark text read by this module.
_COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+"|"-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e"|"E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+"|"-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+"|"-"] NUMBER
ESCAPED_STRING: "\"" /([^"\\\n]|\\[^\n])*/ "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_"|LETTER) ("_"|LETTER|DIGIT)*
WS_INLINE: (" "|/\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
"""


@functools.cache
def _common() -> dict[str, _Definition]:
    return {d.name: d for d in _statements(_COMMON)[0]}


def is_lark(text: str) -> bool:
    """Whether a grammar text reads as Lark rather than GBNF: a line defines `name: ...` and none `name ::= ...`."""
    lark = False
    for line in text.splitlines():
        line = line.strip()
        if re.match(r"[A-Za-z_][A-Za-z0-9_-]*[ \t]*::=", line):
            return False
        lark = lark or _DEFINITION.match(line) is not None or _TEMPLATE.match(line) is not None
    return lark


@dataclass
class _Definition:
    name: str
    body: str
    line: int

    @property
    def terminal(self) -> bool:
        """Lark's terminals are named in capitals (rules in small letters)."""
        return self.name.lstrip("_")[:1].isupper()


def _fail(line: int, why: str) -> GrammarError:
    return GrammarError(f"Lark grammar line {line}: {why}")


def _strip_comment(line: str) -> str:
    """The line without its `//` or `#` comment (not one inside a literal, a class or a regex)."""
    quote, i = "", 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote or (quote == "[" and c == "]"):
                quote = "" if quote != "[" else "/"
            elif quote == "/" and c == "[":
                quote = "["
        elif c in "\"'":
            quote = c
        elif c == "#" or line.startswith("//", i):
            return line[:i]
        elif c == "/":
            quote = "/"
        i += 1
    return line


def _statements(text: str) -> tuple[list[_Definition], list[tuple[str, int]]]:
    """Definitions (a body spans the lines after it that begin with `|`) and directives, with their lines."""
    defs: list[_Definition] = []
    directives: list[tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if line.startswith("%"):
            directives.append((line, number))
        elif line.startswith("|"):
            if not defs:
                raise _fail(number, "an alternative '|' before any rule")
            defs[-1].body += " " + line
        else:
            m = _DEFINITION.match(line)
            if m is None:
                if _TEMPLATE.match(line):
                    raise _fail(number, "templates are not supported")
                raise _fail(number, f"expected a definition `name: ...`, got {line[:30]!r}")
            defs.append(_Definition(m.group(1), line[m.end() :], number))
    return defs, directives


class _Body:
    """One definition's expansions to GBNF text; in a rule (not a terminal) each token may be followed by ignored
    text, when the grammar ignores some."""

    def __init__(self, d: _Definition, terminals: set[str], ignoring: bool) -> None:
        self.text, self.pos, self.line = d.body, 0, d.line
        self.terminals = terminals
        self.token_tail = f" {_IGNORE}" if ignoring and not d.terminal else ""
        self.names: list[str] = []  # every name used (checked against the definitions after)

    def fail(self, why: str) -> GrammarError:
        return _fail(self.line, why)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def expansions(self, closing: str = "") -> str:
        alts = [self.alias_free(self.sequence(closing))]
        while self.peek("|"):
            self.pos += 1
            alts.append(self.alias_free(self.sequence(closing)))
        return " | ".join(alts)

    def alias_free(self, seq: str) -> str:
        if self.peek("->"):
            self.pos += 2
            self.skip()
            m = _NAME.match(self.text, self.pos)
            if m is None:
                raise self.fail("expected an alias name after '->'")
            self.pos = m.end()
        return seq if seq else '""'

    def sequence(self, closing: str) -> str:
        items = []
        while True:
            self.skip()
            if self.pos >= len(self.text) or self.text[self.pos] in "|" + closing or self.peek("->"):
                return " ".join(items)
            if self.text[self.pos] in ")]":
                raise self.fail(f"unbalanced {self.text[self.pos]!r}")
            items.append(self.quantified())

    def quantified(self) -> str:
        item = self.atom()
        self.skip()
        c = self.text[self.pos : self.pos + 1]
        if c in ("?", "*", "+"):
            self.pos += 1
            return f"({item}){c}"
        if c == "~":
            self.pos += 1
            self.skip()
            m = re.match(r"(\d+)(\s*\.\.\s*(\d+))?", self.text[self.pos :])
            if m is None:
                raise self.fail("expected a count after '~' (n or m..n)")
            self.pos += m.end()
            low, high = m.group(1), m.group(3) or m.group(1)
            return f"({item}){{{low},{high}}}"
        return item

    def atom(self) -> str:
        c = self.text[self.pos]
        if c == "(":
            self.pos += 1
            inner = self.expansions(")")
            self.expect(")")
            return f"({inner})"
        if c == "[":
            self.pos += 1
            inner = self.expansions("]")
            self.expect("]")
            return f"({inner})?"
        if c in "\"'":
            first = self.literal()
            if self.peek(".."):
                self.pos += 2
                self.skip()
                last = self.literal() if self.text[self.pos : self.pos + 1] in ("'", '"') else None
                if last is None or len(first) != 1 or len(last) != 1 or ord(last) < ord(first):
                    raise self.fail('a range must be "a".."z": one character each, in order')
                return f"[{_class_char(first)}-{_class_char(last)}]" + self.token_tail
            return _literal_gbnf(first, self.literal_flags()) + self.token_tail
        if c == "/":
            return _regex_to_gbnf(self.regex(), self.regex_flags(), self.fail) + self.token_tail
        m = _NAME.match(self.text, self.pos)
        if m is None:
            raise self.fail(f"unexpected {self.text[self.pos : self.pos + 10]!r}")
        self.pos = m.end()
        if self.peek("{"):
            raise self.fail("templates are not supported")
        self.names.append(m.group())
        tail = self.token_tail if m.group() in self.terminals else ""
        return f"l-{m.group()}{tail}"

    def expect(self, c: str) -> None:
        if not self.peek(c):
            raise self.fail(f"expected {c!r}")
        self.pos += 1

    def literal(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        out = []
        while self.pos < len(self.text) and self.text[self.pos] != quote:
            c = self.text[self.pos]
            self.pos += 1
            if c == "\\":
                out.append(self._escape())
            else:
                out.append(c)
        if self.pos >= len(self.text):
            raise self.fail("a literal is not closed on its line")
        self.pos += 1
        return "".join(out)

    def _escape(self) -> str:
        if self.pos >= len(self.text):
            raise self.fail("the line ends inside an escape")
        e = self.text[self.pos]
        self.pos += 1
        if e in _ESCAPES:
            return _ESCAPES[e]
        c, self.pos = _escaped(self.text, self.pos, e, self.fail)
        return c

    def regex(self) -> str:
        start = self.pos = self.pos + 1
        in_class = False
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "\\":
                self.pos += 2
                continue
            if c == "[":
                in_class = True
            elif c == "]":
                in_class = False
            elif c == "/" and not in_class:
                self.pos += 1
                return self.text[start : self.pos - 1]
            self.pos += 1
        raise self.fail("a regular expression is not closed with '/'")

    def literal_flags(self) -> str:
        """A literal's flag (Lark's: `i`, case-insensitive)."""
        if self.text.startswith("i", self.pos) and not _NAME.match(self.text, self.pos + 1):
            self.pos += 1
            return "i"
        return ""

    def regex_flags(self) -> str:
        """A regular expression's flags (Lark's: imslux): i and s change what it matches; m and u nothing here."""
        m = re.match(r"[imslux]*", self.text[self.pos :])
        flags = m.group() if m else ""
        self.pos += len(flags)
        bad = set(flags) - {"i", "s", "m", "u"}
        if bad:
            raise self.fail(f"regular expression flag {sorted(bad)[0]!r} is not supported (i, s, m and u are)")
        return flags


def _escaped(text: str, pos: int, e: str, fail: Callable[[str], GrammarError]) -> tuple[str, int]:
    """The character an escape letter `e` stands for (a hexadecimal escape's digits from `pos`, else `e` itself),
    and where the escape ends."""
    try:
        read = hex_escape(text, pos, e)
    except GrammarError as exc:
        raise fail(str(exc)) from None
    return read if read is not None else (e, pos)


def _class_char(c: str) -> str:
    """A character as written inside a GBNF class or literal (all but letters and digits by code point)."""
    return c if c.isascii() and c.isalnum() else f"\\U{ord(c):08x}"


def _literal_gbnf(text: str, flags: str) -> str:
    """A literal as GBNF: a quoted string, or with flag i a class a letter."""
    if not text:
        return '""'
    if "i" in flags:
        return " ".join(
            f"[{_class_char(c.lower())}{_class_char(c.upper())}]" if c.lower() != c.upper() else f"[{_class_char(c)}]"
            for c in text
        )
    return '"' + "".join(_class_char(c) for c in text) + '"'


def _regex_to_gbnf(pattern: str, flags: str, fail: Callable[[str], GrammarError]) -> str:
    """A regular expression (the common subset of Python's syntax) as a GBNF group."""
    reader = _RegexReader(pattern, "i" in flags, "s" in flags, fail)
    out = reader.alternatives()
    if reader.pos < len(pattern):
        raise fail(f"unbalanced ')' in /{pattern}/")
    return f"({out})"


class _RegexReader:
    def __init__(self, pattern: str, fold: bool, dot_all: bool, fail: Callable[[str], GrammarError]) -> None:
        self.p, self.pos, self.fold, self.dot_all, self.fail_at = pattern, 0, fold, dot_all, fail

    def fail(self, why: str) -> GrammarError:
        return self.fail_at(f"/{self.p}/: {why}")

    def alternatives(self) -> str:
        alts = [self.sequence()]
        while self.p.startswith("|", self.pos):
            self.pos += 1
            alts.append(self.sequence())
        return " | ".join(a or '""' for a in alts)

    def sequence(self) -> str:
        items = []
        while self.pos < len(self.p) and self.p[self.pos] not in "|)":
            items.append(self.quantified())
        return " ".join(items)

    def quantified(self) -> str:
        item = self.atom()
        while self.pos < len(self.p) and self.p[self.pos] in "*+?{":
            c = self.p[self.pos]
            if c == "{":
                m = re.match(r"\{(\d+)(,(\d*))?\}", self.p[self.pos :])
                if m is None:
                    return item  # a literal '{' is read by atom next time round
                self.pos += m.end()
                low = m.group(1)
                high = low if m.group(2) is None else m.group(3)
                item = f"({item}){{{low},{high}}}"
            else:
                self.pos += 1
                item = f"({item}){c}"
            if self.p.startswith("?", self.pos) or self.p.startswith("+", self.pos):
                self.pos += 1  # lazy or possessive: the same strings
        return item

    def atom(self) -> str:
        c = self.p[self.pos]
        self.pos += 1
        if c == "(":
            if self.p.startswith("?", self.pos):
                if self.p.startswith("?:", self.pos):
                    self.pos += 2
                elif self.p.startswith("?P<", self.pos):
                    end = self.p.find(">", self.pos)
                    self.pos = end + 1
                else:
                    raise self.fail("lookarounds, inline flags and conditionals are not supported")
            inner = self.alternatives()
            if not self.p.startswith(")", self.pos):
                raise self.fail("a group is not closed with ')'")
            self.pos += 1
            return f"({inner})"
        if c == "[":
            return self.char_class()
        if c == ".":
            return "." if self.dot_all else "[^\\n]"
        if c in "^$":
            raise self.fail("anchors (^, $) are not supported: a terminal matches whole")
        if c in "*+?":
            raise self.fail(f"nothing to repeat before {c!r}")
        if c == "\\":
            ranges, negated = self.escape_ranges()
            if ranges is not None:
                return f"[{'^' if negated else ''}{ranges}]"
            c = self.char_escape()
        return self.char(c)

    def char(self, c: str) -> str:
        if self.fold and c.lower() != c.upper():
            return f"[{_class_char(c.lower())}{_class_char(c.upper())}]"
        return f"[{_class_char(c)}]"

    def escape_ranges(self) -> tuple[str | None, bool]:
        """A shorthand class (\\d, \\w, \\s, or negated \\D, \\W, \\S) as class text; (None, False) otherwise."""
        e = self.p[self.pos : self.pos + 1]
        if e.lower() in _SHORTHANDS:
            self.pos += 1
            return _class_text(_SHORTHANDS[e.lower()]), e.isupper()
        if e.isdigit() or e in ("b", "B", "A", "Z", "z", "G"):
            raise self.fail(f"\\{e} (a back reference or an anchor) is not supported")
        return None, False

    def char_escape(self) -> str:
        if self.pos >= len(self.p):
            raise self.fail("the pattern ends inside an escape")
        e = self.p[self.pos]
        self.pos += 1
        if e in _ESCAPES and e not in ("b", "0"):
            return _ESCAPES[e]
        c, self.pos = _escaped(self.p, self.pos, e, self.fail)  # (a metacharacter or '/' escaped is itself)
        return c

    def char_class(self) -> str:
        negated = self.p.startswith("^", self.pos)
        self.pos += negated
        parts: list[str] = []
        first = True
        while self.pos < len(self.p) and (self.p[self.pos] != "]" or first):
            first = False
            c = self.p[self.pos]
            self.pos += 1
            if c == "\\":
                ranges, neg = self.escape_ranges()
                if ranges is not None:
                    if neg:
                        raise self.fail("a negated shorthand (\\D, \\W, \\S) inside a class is not supported")
                    parts.append(ranges)
                    continue
                c = self.char_escape()
            if self.p.startswith("-", self.pos) and not self.p.startswith("-]", self.pos):
                self.pos += 1
                hi = self.p[self.pos]
                self.pos += 1
                if hi == "\\":
                    hi = self.char_escape()
                if ord(hi) < ord(c):
                    raise self.fail(f"the range {c!r}-{hi!r} is backwards")
                parts.append(self._range(c, hi))
            else:
                parts.append(self._range(c, c))
        if self.pos >= len(self.p):
            raise self.fail("a character class is not closed with ']'")
        self.pos += 1
        return f"[{'^' if negated else ''}{''.join(parts)}]"

    def _range(self, lo: str, hi: str) -> str:
        text = f"{_class_char(lo)}-{_class_char(hi)}" if lo != hi else _class_char(lo)
        if self.fold:
            for c in {chr(cp) for cp in range(ord(lo), min(ord(hi), 0x24F) + 1)}:
                for other in {c.lower(), c.upper()} - {c}:
                    if len(other) == 1:
                        text += _class_char(other)
        return text


def _class_text(ranges: str) -> str:
    """`a-z` style shorthand text (ASCII) as escaped GBNF class text."""
    out, i = [], 0
    while i < len(ranges):
        if i + 2 < len(ranges) and ranges[i + 1] == "-":
            out.append(f"{_class_char(ranges[i])}-{_class_char(ranges[i + 2])}")
            i += 3
        else:
            out.append(_class_char(ranges[i]))
            i += 1
    return "".join(out)


def _imports(directives: list[tuple[str, int]]) -> tuple[list[str], list[tuple[str, int]], list[_Definition]]:
    """The common terminals imported, the `%ignore` directives, and a definition for each import under another name
    (`%import common.INT -> COUNT`: COUNT is INT)."""
    names: list[str] = []
    ignores: list[tuple[str, int]] = []
    renamed: list[_Definition] = []
    for text, line in directives:
        word = text.split(None, 1)[0]
        rest = text[len(word) :].strip()
        if word == "%import":
            m = re.fullmatch(r"common\.([A-Z_][A-Z0-9_]*)(\s*->\s*(\w+))?|common\s*\(([^)]*)\)", rest)
            if m is None:
                raise _fail(line, "only Lark's common terminals can be imported (%import common.NAME)")
            if m.group(3):
                renamed.append(_Definition(m.group(3), m.group(1), line))
            names.extend([m.group(1)] if m.group(1) else [n.strip() for n in m.group(4).split(",") if n.strip()])
        elif word == "%ignore":
            ignores.append((rest, line))
        else:
            raise _fail(line, f"{word} is not supported (%import common.NAME and %ignore are)")
    return names, ignores, renamed


def lark_to_gbnf(text: str) -> str:
    """A Lark grammar as GBNF text deriving `root`; GrammarError naming the line of what cannot be read."""
    defs, directives = _statements(text)
    if not defs:
        raise GrammarError("the Lark grammar defines no rule")
    imported, ignores, renamed = _imports(directives)
    defs += renamed
    common = _common()
    defined = {d.name for d in defs}
    # The imported terminals and the common ones they use (not those the grammar defines itself).
    wanted, seen = [n for n in imported if n not in defined], set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        if name not in common:
            raise GrammarError(f"Lark's common has no terminal {name!r} this server provides")
        seen.add(name)
        defs.append(common[name])
        used = _Body(common[name], set(), False)
        used.expansions()
        wanted.extend(used.names)
    names = [d.name for d in defs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise GrammarError(f"the Lark grammar defines {duplicate!r} more than once")
    terminals = {d.name for d in defs if d.terminal}
    start = "start" if "start" in names else defs[0].name
    lines = []
    if ignores:
        parts = []
        for body, line in ignores:
            ignored = _Body(_Definition("%ignore", body, line), terminals, False)
            parts.append(ignored.expansions())
            _check_names(ignored, names, common)
        lines.append(f"{_IGNORE} ::= ({' | '.join(parts)})*")
        lines.append(f"root ::= {_IGNORE} l-{start}")
    else:
        lines.append(f"root ::= l-{start}")
    for d in defs:
        body = _Body(d, terminals, bool(ignores))
        gbnf = body.expansions()
        if body.pos < len(body.text):
            raise _fail(d.line, f"unexpected {body.text[body.pos : body.pos + 10]!r}")
        _check_names(body, names, common)
        lines.append(f"l-{d.name} ::= {gbnf}")
    return "\n".join(lines) + "\n"


def _check_names(body: _Body, names: list[str], common: dict[str, _Definition]) -> None:
    missing = next((n for n in body.names if n not in names), None)
    if missing is not None:
        hint = f" (import it: %import common.{missing})" if missing in common else ""
        raise _fail(body.line, f"{missing!r} is used but not defined{hint}")
