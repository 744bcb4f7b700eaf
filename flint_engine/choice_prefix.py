"""Choice constraint (vLLM's `guided_choice`): the output is exactly one of the given strings.

Like JSON mode, the sampler takes the model's most likely token (under its own sampling settings) whose bytes keep
the output a prefix of some choice, so the answer is the model's preferred choice, spelled in any tokenisation it
likes. The turn may end once the output is a whole choice, and must end when no longer choice continues it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


class ChoicePrefix:
    """The output so far (bytes) against the sorted choices' UTF-8 bytes."""

    cheap_accepts = True  # a bisection

    def __init__(self, choices: Sequence[str]) -> None:
        if not choices:
            raise ValueError("a choice constraint needs at least one choice")
        self.choices = sorted({c.encode() for c in choices})
        self.text = b""

    def _extensions(self, text: bytes) -> list[bytes]:
        """The choices that start with `text` (a run of the sorted list), at most two: enough to tell "several"."""
        i = bisect.bisect_left(self.choices, text)
        return [c for c in self.choices[i : i + 2] if c.startswith(text)]

    def accepts(self, piece: bytes) -> bool:
        """Whether the output may go on with these bytes (some choice still starts with the result)."""
        return bool(piece) and bool(self._extensions(self.text + piece))

    def feed(self, piece: bytes) -> bool:
        self.text += piece
        return bool(self._extensions(self.text))

    @property
    def can_end(self) -> bool:
        """The output is one of the choices."""
        i = bisect.bisect_left(self.choices, self.text)
        return i < len(self.choices) and self.choices[i] == self.text

    @property
    def complete(self) -> bool:
        """The output is a choice that no longer choice continues: only the end of the turn may follow."""
        return self.can_end and len(self._extensions(self.text)) == 1
