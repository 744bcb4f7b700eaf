"""Regular-expression constraint (vLLM's `guided_regex`): the whole output matches the pattern.

The `regex` package matches partially (`fullmatch(..., partial=True)` succeeds on text that some continuation would
turn into a match), which is the test the sampler's walk needs: it takes the model's most likely token whose bytes
keep the output such a prefix. The turn may end once the output is a whole match. A pattern is the client's, so
every match runs under a time limit: a pattern that backtracks without end (`(x+x+)+y`) stops being enforced,
and the output ends where it is, instead of stalling the engine's step for every request in it.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)

MAX_PATTERN_CHARS = 4096
# One partial match of the output so far; far above what a sane pattern needs on an output of max_tokens.
MATCH_TIMEOUT_S = 0.2


class RegexError(ValueError):
    """The pattern cannot be compiled (or is too long)."""


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """The compiled pattern (cached: n choices and repeated requests share it); RegexError on a bad one."""
    import regex  # here, not at import: only requests with a pattern need it

    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexError(f"the pattern is {len(pattern)} characters; at most {MAX_PATTERN_CHARS} are allowed")
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise RegexError(f"invalid regular expression: {exc}") from None


def split_utf8(data: bytes) -> tuple[str, bytes] | None:
    """(text, the incomplete UTF-8 sequence at its end) or None where the bytes are not UTF-8 so far."""
    try:
        return data.decode(), b""
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(data):  # cut inside the last character
            return data[: exc.start].decode(), data[exc.start :]
        return None


def char_length(lead: int) -> int:
    """The length of the UTF-8 sequence this lead byte starts (1 for anything else)."""
    return 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF8 else 1


class RegexPrefix:
    """The output so far against a pattern; a byte-level tokenizer may split a character over two tokens."""

    cheap_accepts = True  # its own memo answers most tokens by their first character

    def __init__(self, pattern: str) -> None:
        self.pattern = compile_pattern(pattern)
        self.data = b""
        self.timed_out = False
        self._whole_chars = True  # the output so far does not end inside a character
        self._first_chars: dict[str, bool] = {}  # per state: may the output go on with this character?

    def _match(self, text: str) -> Any:
        try:
            return self.pattern.fullmatch(text, partial=True, timeout=MATCH_TIMEOUT_S)
        except TimeoutError:
            if not self.timed_out:
                log.warning("a guided_regex pattern timed out on %d characters; ending the output there", len(text))
            self.timed_out = True
            return None

    def _prefix_ok(self, data: bytes) -> bool:
        split = split_utf8(data)
        if split is None or self._match(split[0]) is None:
            return False
        text, tail = split
        if not tail:
            return True
        # The output ends inside a character: some character that this tail begins must go on with the match, or
        # the next step finds no token. With one byte missing that is 64 candidates; with more (a lone lead byte)
        # the token is refused rather than checked thousands of times: the model can still write such a character
        # whole, or from a token that holds all but its last byte.
        if char_length(tail[0]) - len(tail) != 1:
            return False
        for last in range(0x80, 0xC0):
            try:
                char = (tail + bytes([last])).decode()
            except UnicodeDecodeError:  # overlong forms and surrogates are no characters
                continue
            if self._match(text + char) is not None:
                return True
        return False

    def accepts(self, piece: bytes) -> bool:
        """Whether the output may go on with these bytes."""
        if not piece or self.timed_out:
            return False
        # Most of a vocabulary fails on its first character: one match per distinct character, not per token.
        head = split_utf8(piece[:4]) if self._whole_chars else None  # after a cut character, no cache
        first = head[0][:1] if head is not None else ""
        if first:
            ok = self._first_chars.get(first)
            if ok is None:
                ok = self._first_chars[first] = self._prefix_ok(self.data + first.encode())
            if not ok:
                return False
        return self._prefix_ok(self.data + piece)

    def feed(self, piece: bytes) -> bool:
        self.data += piece
        self._first_chars = {}
        split = split_utf8(self.data)
        self._whole_chars = split is not None and not split[1]
        return self._prefix_ok(self.data)

    @property
    def can_end(self) -> bool:
        """The output so far is a whole match (or the pattern timed out: the output ends as it is)."""
        if self.timed_out:
            return True
        split = split_utf8(self.data)
        if split is None or split[1]:
            return False
        m = self._match(split[0])
        return self.timed_out or (m is not None and not m.partial)

    @property
    def complete(self) -> bool:
        """Only the end of the turn may follow: whether a match could go on is not known in general, so only after
        a timeout."""
        return self.timed_out
