"""A forced tool call names an offered tool: the constraint behind `tool_choice: "required"`.

With `required` the answer is made to open with `<tool_call>` (see `api/choices.py`), and the model writes the name.
A model may still name a tool the request did not offer; OpenAI's API never returns one. So the tokens right after
the opening are constrained like JSON mode's: the sampler takes the model's most likely token (under its own
sampling settings) whose bytes keep the output a prefix of one offered name, until a whole name is followed by what
ends a name for the tool-call parser (whitespace or `<`, such as `<arg_key>` or `</tool_call>`). From then on the
model writes the arguments freely.
"""

from __future__ import annotations

from collections.abc import Sequence

NAME_ENDS = b"< \t\n\r\f\v"  # the parser's name is the first run of non-whitespace characters other than "<"


def _ends_name(byte: int) -> bool:
    return byte in NAME_ENDS


def callable_name(name: object) -> bool:
    """Whether a tool call can carry this name (a non-empty one without whitespace or "<")."""
    return isinstance(name, str) and bool(name) and not any(c.isspace() or c == "<" for c in name)


class ToolNamePrefix:
    """The output so far, against the offered names; `done` once one of them is complete."""

    def __init__(self, names: Sequence[str]) -> None:
        if not names:
            raise ValueError("a tool-name constraint needs at least one name")
        self.names = [n.encode() for n in names]
        self.text = b""
        self.done = False

    def _named(self, text: bytes) -> bool:
        """Whether `text` is a whole offered name followed by a byte that ends a name."""
        return any(len(text) > len(n) and text.startswith(n) and _ends_name(text[len(n)]) for n in self.names)

    def accepts(self, piece: bytes) -> bool:
        """Whether the output may go on with these bytes (always, once a name is complete)."""
        if self.done:
            return True
        text = self.text + piece
        return bool(piece) and (any(n.startswith(text) for n in self.names) or self._named(text))

    def feed(self, piece: bytes) -> None:
        if not self.done:
            self.text += piece
            self.done = self._named(self.text)
