"""Split GLM-4.7-style model output into reasoning and content.

With thinking on, the prompt ends ``<|assistant|><think>``, so the output starts straight with reasoning and
``</think>`` ends it: ``REASONING</think>CONTENT``. With thinking off the prompt ends ``<|assistant|></think>``
and the output is plain content. The text is the detokenised output with special tokens kept.

Choices (the non-streaming :meth:`ReasoningParser.extract` and the streaming :class:`ReasoningStreamer` give the
same result for any chunking of the same text):

* A ``<think>`` at the very start (after optional whitespace) is dropped, in both modes. With thinking on it is
  redundant; with thinking off it means the model thought anyway, and the text up to ``</think>`` is returned as
  reasoning rather than leaking the tags into content (it is what the model wrote, and dropping it would lose it).
* No ``</think>`` at all (truncated by max_tokens, or the model stopped inside its thinking) leaves everything as
  reasoning, as vLLM's R1-style parser does. A model that skips thinking and answers without ``</think>`` therefore
  lands in reasoning too; nothing in the text can tell the two apart.
* ``<tool_call>`` inside the reasoning is an implicit end of reasoning (``tool_call_ends_reasoning``, on by
  default; vLLM's newest GLM adapter does the same). The tool call and everything after it become content, so the
  tool parser sees the call instead of it being silently dropped inside the thinking (vLLM's older pipeline bug).
  The cost: a model that merely *mentions* the ``<tool_call>`` token while thinking ends its reasoning there. The
  chat parser turns this off when no tools are active, so the text then stays reasoning.
* Every ``</think>`` in the content is removed: a stray second one (e.g. after a call made inside the thinking),
  and, with thinking off, a ``</think>`` the model repeats although the prompt already closed the thinking.
  A ``<think>`` anywhere but the start is left alone.
* Text is otherwise kept verbatim (no stripping); a blank (empty or whitespace-only) reasoning or content is
  returned as ``None``. The streamer holds back leading whitespace until something else arrives, so it never
  emits a piece of a result that the non-streaming parse would return as ``None``.
* The streamer holds back a possible partial tag at the end of each chunk (``<``, ``</thi``, ``<tool_ca`` ...)
  until the next chunk or :meth:`ReasoningStreamer.finish` decides it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"

REASONING = "reasoning"
CONTENT = "content"

Piece = tuple[str, str]
"""A streamed piece: (``"reasoning"`` or ``"content"``, text)."""

_START, _REASONING, _CONTENT = "start", "reasoning", "content"


# Shared streaming helpers (also used by the tool-call parser).


def none_if_blank(text: str | None) -> str | None:
    """``None`` for empty or whitespace-only text, else the text unchanged."""
    return text if text and not text.isspace() else None


def find_first(text: str, tags: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    """Earliest occurrence of any of ``tags`` in ``text[start:]``: (index, tag), or (-1, "")."""
    best, best_tag = -1, ""
    for tag in tags:
        i = text.find(tag, start)
        if i >= 0 and (best < 0 or i < best):
            best, best_tag = i, tag
    return best, best_tag


def partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags`` (0 if none)."""
    longest = max(len(t) for t in tags) - 1
    for n in range(min(longest, len(text)), 0, -1):
        tail = text[-n:]
        if any(len(t) > n and t.startswith(tail) for t in tags):
            return n
    return 0


class BlankGate:
    """Passes text through once it contains a non-whitespace character; until then holds it back.

    This keeps a streamed result identical to the non-streaming one, where a blank result is ``None``.
    """

    def __init__(self) -> None:
        self._held = ""
        self._open = False

    def push(self, text: str) -> str:
        if self._open:
            return text
        self._held += text
        if not self._held or self._held.isspace():
            return ""
        self._open = True
        out, self._held = self._held, ""
        return out

    def finish(self) -> None:
        # Whatever is still held is blank by construction: the non-streaming result is None, so drop it.
        self._held = ""


def append_piece(pieces: list[Piece], kind: str, text: str) -> None:
    """Append ``(kind, text)``, merging with the last piece when it is of the same kind."""
    if not text:
        return
    if pieces and pieces[-1][0] == kind:
        pieces[-1] = (kind, pieces[-1][1] + text)
    else:
        pieces.append((kind, text))


class ReasoningParser:
    """Splits complete output text into (reasoning, content); see the module docstring for the rules."""

    def __init__(self, thinking: bool = True, *, tool_call_ends_reasoning: bool = True) -> None:
        self.thinking = thinking
        self.tool_call_ends_reasoning = tool_call_ends_reasoning

    def _end_tags(self) -> tuple[str, ...]:
        return (THINK_END, TOOL_CALL_START) if self.tool_call_ends_reasoning else (THINK_END,)

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """Return (reasoning, content); blank parts are ``None``."""
        head = text.lstrip()
        in_reasoning = self.thinking
        if head.startswith(THINK_START):
            text = head[len(THINK_START) :]
            in_reasoning = True
        if in_reasoning:
            idx, tag = find_first(text, self._end_tags())
            if idx < 0:
                reasoning, content = text, ""
            elif tag == THINK_END:
                reasoning, content = text[:idx], text[idx + len(tag) :]
            else:
                # The tool call itself belongs to the content.
                logger.debug("<tool_call> inside the reasoning ends it")
                reasoning, content = text[:idx], text[idx:]
        else:
            reasoning, content = "", text
        return none_if_blank(reasoning), none_if_blank(content.replace(THINK_END, ""))

    def stream(self) -> ReasoningStreamer:
        """A fresh streamer with this parser's settings."""
        return ReasoningStreamer(self.thinking, tool_call_ends_reasoning=self.tool_call_ends_reasoning)


class ReasoningStreamer:
    """Incremental counterpart of :meth:`ReasoningParser.extract`: ``feed`` deltas, then ``finish`` once."""

    def __init__(self, thinking: bool = True, *, tool_call_ends_reasoning: bool = True) -> None:
        self.thinking = thinking
        self._end_tags = (THINK_END, TOOL_CALL_START) if tool_call_ends_reasoning else (THINK_END,)
        self._state = _START
        self._buf = ""
        self._gates = {REASONING: BlankGate(), CONTENT: BlankGate()}
        self._finished = False

    def feed(self, delta: str) -> list[Piece]:
        """Consume ``delta``; return the (kind, text) pieces that are now certain."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += delta
        raw: list[Piece] = []
        self._drain(raw, final=False)
        return self._gate(raw)

    def finish(self) -> list[Piece]:
        """Flush held-back text at the end of the output."""
        if self._finished:
            return []
        raw: list[Piece] = []
        self._drain(raw, final=True)
        self._finished = True
        out = self._gate(raw)
        for gate in self._gates.values():
            gate.finish()
        return out

    @property
    def in_reasoning(self) -> bool:
        """Whether the output is (still) in its reasoning part."""
        return self._state == _REASONING or (self._state == _START and self.thinking)

    def _gate(self, raw: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for kind, text in raw:
            append_piece(out, kind, self._gates[kind].push(text))
        return out

    def _drain(self, out: list[Piece], *, final: bool) -> None:
        while True:
            buf = self._buf
            if self._state == _START:
                head = buf.lstrip()
                if head.startswith(THINK_START):
                    self._buf = head[len(THINK_START) :]
                    self._state = _REASONING
                    continue
                # Still only whitespace or a prefix of "<think>": undecided.
                if not final and THINK_START.startswith(head):
                    return
                self._state = _REASONING if self.thinking else _CONTENT
                continue
            if self._state == _REASONING:
                idx, tag = find_first(buf, self._end_tags)
                if idx < 0:
                    keep = 0 if final else partial_tag_len(buf, self._end_tags)
                    append_piece(out, REASONING, buf[: len(buf) - keep])
                    self._buf = buf[len(buf) - keep :]
                    return
                append_piece(out, REASONING, buf[:idx])
                if tag == THINK_END:
                    self._buf = buf[idx + len(tag) :]
                else:
                    logger.debug("<tool_call> inside the reasoning ends it")
                    self._buf = buf[idx:]
                self._state = _CONTENT
                continue
            # Content: drop every </think>, hold back a partial one.
            idx = buf.find(THINK_END)
            if idx < 0:
                keep = 0 if final else partial_tag_len(buf, (THINK_END,))
                append_piece(out, CONTENT, buf[: len(buf) - keep])
                self._buf = buf[len(buf) - keep :]
                return
            append_piece(out, CONTENT, buf[:idx])
            self._buf = buf[idx + len(THINK_END) :]
