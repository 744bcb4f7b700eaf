"""JSON mode (`response_format: {"type": "json_object"}`): an incremental JSON checker that constrains sampling.

The checker reads bytes and knows at every point whether the text so far can still be extended to one JSON object
(optionally preceded by whitespace). The sampler walks candidates in the order it would have picked them and takes
the first whose bytes keep the prefix valid, so the output is the model's most likely valid JSON under its own
sampling settings, and generation ends once the object is closed. Whitespace outside strings comes in runs of at most
`MAX_WHITESPACE_RUN` bytes: a model that prefers blanks to the object (OpenAI warns that its JSON mode may then emit
"an unending stream of whitespace" up to the token limit) has to go on with the JSON once a run is that long.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

WS = b" \t\n\r"
# A newline and an indent of up to 23 (llama.cpp's JSON grammar allows 21): pretty JSON fits, a blank stream ends.
MAX_WHITESPACE_RUN = 24
# value-expecting states
VALUE, OBJ_FIRST_KEY, OBJ_KEY, COLON, AFTER_VALUE, ARR_FIRST_VALUE, START, DONE = range(8)


def number_accepts(number: str, b: int) -> bool:
    """Whether byte `b` may extend the JSON number begun as `number` (not empty)."""
    ch = chr(b) if b < 0x80 else ""
    if ch.isdigit():
        return number not in ("0", "-0")  # no leading zeros
    if ch == ".":
        return "." not in number and "e" not in number.lower() and number[-1].isdigit()
    if ch and ch in "eE":
        return "e" not in number.lower() and number[-1].isdigit()
    if ch and ch in "+-":
        return number[-1] in "eE"
    return False


class WholeValueEnd:
    """`accepts` and `can_end` of a checker that reads one whole value and then lets only the turn's end follow."""

    cheap_accepts = False  # each check copies the parser state

    def copy(self) -> WholeValueEnd:
        raise NotImplementedError

    def feed(self, data: bytes) -> bool:
        raise NotImplementedError

    @property
    def complete(self) -> bool:
        raise NotImplementedError

    def accepts(self, piece: bytes) -> bool:
        """Whether the output may go on with these bytes (the state itself is left as it is)."""
        return self.copy().feed(piece)

    @property
    def can_end(self) -> bool:
        return self.complete


@dataclass
class JsonPrefix(WholeValueEnd):
    """State of a JSON-object prefix; `feed` returns False (and leaves the state unusable) on invalid input."""

    state: int = START
    stack: list[str] = field(default_factory=list)  # "{" or "["
    in_string: bool = False
    string_is_key: bool = False
    escape: int = 0  # 0: none, 1: after backslash, 2..5: reading \\uXXXX hex digits
    number: str = ""  # the number being read (its characters so far)
    literal: bytes = b""  # remaining bytes of true/false/null
    blanks: int = 0  # whitespace bytes since the last byte of JSON

    def copy(self) -> JsonPrefix:
        # Field by field (every other field is immutable): deepcopy took ~20 us, a sampler's walk copies per token.
        return dataclasses.replace(self, stack=list(self.stack))

    @property
    def complete(self) -> bool:
        """A whole object has been read (only whitespace may follow)."""
        return self.state == DONE

    def feed(self, data: bytes) -> bool:
        return all(self._byte(b) for b in data)

    # --------------------------------------------------------------------------------------------------------
    def _value_done(self) -> None:
        self.state = AFTER_VALUE if self.stack else DONE

    def _byte(self, b: int) -> bool:
        c = bytes([b])
        if self.in_string:
            if self.escape == 1:
                if c in b'"\\/bfnrt':
                    self.escape = 0
                    return True
                if c == b"u":
                    self.escape = 2
                    return True
                return False
            if self.escape >= 2:
                if c not in b"0123456789abcdefABCDEF":
                    return False
                self.escape = 0 if self.escape == 5 else self.escape + 1
                return True
            if c == b"\\":
                self.escape = 1
                return True
            if c == b'"':
                self.in_string = False
                if self.string_is_key:
                    self.state = COLON
                else:
                    self._value_done()
                return True
            return b >= 0x20  # raw control characters are not allowed inside strings
        if self.literal:
            if b != self.literal[0]:
                return False
            self.literal = self.literal[1:]
            if not self.literal:
                self._value_done()
            return True
        if self.number:
            if self._number_accepts(c):
                self.number += c.decode()
                return True
            if not self._number_complete():
                return False
            self.number = ""
            self._value_done()
            # fall through: this byte ends the number and is read in the new state
        if c in WS:
            self.blanks += 1
            return self.blanks <= MAX_WHITESPACE_RUN
        self.blanks = 0
        if self.state == DONE:
            return False
        if self.state == START:
            if c != b"{":
                return False
            self.stack.append("{")
            self.state = OBJ_FIRST_KEY
            return True
        if self.state in (OBJ_FIRST_KEY, OBJ_KEY):
            if c == b'"':
                self.in_string, self.string_is_key = True, True
                return True
            if c == b"}" and self.state == OBJ_FIRST_KEY:
                self.stack.pop()
                self._value_done()
                return True
            return False
        if self.state == COLON:
            if c == b":":
                self.state = VALUE
                return True
            return False
        if self.state == AFTER_VALUE:
            top = self.stack[-1]
            if c == b",":
                self.state = OBJ_KEY if top == "{" else VALUE
                return True
            if (c == b"}" and top == "{") or (c == b"]" and top == "["):
                self.stack.pop()
                self._value_done()
                return True
            return False
        if self.state == ARR_FIRST_VALUE and c == b"]":
            self.stack.pop()
            self._value_done()
            return True
        # VALUE or ARR_FIRST_VALUE: the start of a value
        if c == b'"':
            self.in_string, self.string_is_key = True, False
            return True
        if c == b"{":
            self.stack.append("{")
            self.state = OBJ_FIRST_KEY
            return True
        if c == b"[":
            self.stack.append("[")
            self.state = ARR_FIRST_VALUE
            return True
        for word in (b"true", b"false", b"null"):
            if c == word[:1]:
                self.literal = word[1:]
                return True
        if c in b"-0123456789":
            self.number = c.decode()
            return True
        return False

    def _number_accepts(self, c: bytes) -> bool:
        return number_accepts(self.number, c[0])

    def _number_complete(self) -> bool:
        return self.number[-1].isdigit()
