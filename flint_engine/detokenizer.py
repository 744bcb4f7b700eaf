"""Streaming detokenization: turn generated token ids into text pieces without splitting UTF-8 characters.

Scheme (a variant of vLLM's prefix/read offsets): keep a short window of recent ids, decode the whole window
on every token and emit the part of its text past what was already emitted. The window starts with a few
context tokens (so decoders that depend on the previous token, e.g. leading-space rules, see it) and is
re-based to its last few tokens once it grows, so each step decodes a bounded number of ids.

Lossy UTF-8 decoding changes only its last character when bytes are appended, so the one character that may
still change is held back: when the window's text ends in U+FFFD (an incomplete byte sequence, or a real
replacement character we cannot yet tell apart) that character waits for the next token or for `flush()`.
Holding one character rather than whole tokens means a run of tokens that each end mid-character (common in
CJK text) still streams every completed character at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from flint_engine.tokenizer import FlintTokenizer

REPLACEMENT_CHAR = "\ufffd"
# Context kept after a re-base. It must cover the bytes of a held-back character (at most 3 of a 4-byte one),
# so a few tokens are plenty; more only costs decode time.
CONTEXT_TOKENS = 8
# Re-base once the window reaches this size; a step then decodes at most this many ids.
MAX_WINDOW_TOKENS = 32


class IncrementalDetokenizer:
    """Incremental decoder for one sequence; `add` returns the newly completed text."""

    def __init__(
        self,
        tokenizer: FlintTokenizer,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._special_ids = tokenizer.special_token_ids
        self._vocab_size = tokenizer.vocab_size
        tail = [int(i) for i in prompt_ids[-4 * CONTEXT_TOKENS :]] if prompt_ids else []
        context = [i for i in tail if self._keeps(i)]
        self._window: list[int] = context[-CONTEXT_TOKENS:]
        # Characters of the window's decoded text already accounted for (emitted, or prompt context).
        # A prompt ending mid-character leaves that character to be completed, and emitted, by the output.
        self._consumed = self._stable_length(self._decode(self._window))
        self._pieces: list[str] = []
        self._text = ""
        self._num_tokens = 0

    def _keeps(self, token_id: int) -> bool:
        """Whether a token contributes to the decoded text (skipped specials and unknown ids do not)."""
        if not 0 <= token_id < self._vocab_size:
            return False
        return not (self._skip_special_tokens and token_id in self._special_ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    @staticmethod
    def _stable_length(text: str) -> int:
        """Length of the prefix of `text` that later tokens cannot change."""
        return len(text) - 1 if text.endswith(REPLACEMENT_CHAR) else len(text)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completed (often "", never a partial character)."""
        token_id = int(token_id)
        self._num_tokens += 1
        if not self._keeps(token_id):
            # Decoding drops these anyway; keeping them out of the window keeps its context made of real text.
            return ""
        self._window.append(token_id)
        text = self._decode(self._window)
        stable = self._stable_length(text)
        piece = text[self._consumed : stable] if stable > self._consumed else ""
        self._consumed = max(self._consumed, stable)
        if len(self._window) >= MAX_WINDOW_TOKENS:
            self._rebase(len(text))
        if piece:
            self._pieces.append(piece)
        return piece

    def add_many(self, token_ids: Iterable[int]) -> str:
        """Append several tokens; return the text they completed."""
        return "".join(self.add(t) for t in token_ids)

    def _rebase(self, window_text_len: int) -> None:
        # Decoded chars not yet emitted (0, or 1 held-back char); the shorter window must hold them back too.
        pending = max(0, window_text_len - self._consumed)
        self._window = self._window[-CONTEXT_TOKENS:]
        self._consumed = max(0, len(self._decode(self._window)) - pending)

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete final character decodes to U+FFFD); call at the end."""
        text = self._decode(self._window)
        piece = text[self._consumed :]
        self._consumed = len(text)
        if piece:
            self._pieces.append(piece)
        return piece

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._pieces:
            self._text += "".join(self._pieces)
            self._pieces.clear()
        return self._text

    @property
    def num_tokens(self) -> int:
        """How many tokens have been added."""
        return self._num_tokens
