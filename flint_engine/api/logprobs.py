"""Logprobs in OpenAI's shapes, with each token's exact bytes (byte-level BPE tokens may split a character)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob

Entry = tuple[int, float, list[tuple[int, float]]]


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable stand-in character -> raw byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenText:
    """Per-token strings and bytes for one tokenizer, cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.special = set(tokenizer.special_token_ids)
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        piece = self.tokenizer.id_to_token(token_id) or ""
        if token_id in self.special:
            raw = piece.encode("utf-8")
        else:
            table = _unicode_to_byte()
            raw = bytes(table[ch] for ch in piece) if all(ch in table for ch in piece) else piece.encode("utf-8")
        text = raw.decode("utf-8", errors="replace")
        self._cache[token_id] = (text, list(raw))
        return self._cache[token_id]


def chat_logprobs(tt: TokenText, entries: list[Entry], top_n: int) -> ChoiceLogprobs:
    content = []
    for tid, lp, top in entries:
        text, raw = tt.get(tid)
        alts = [TopLogprob(token=tt.get(t)[0], logprob=v, bytes=tt.get(t)[1]) for t, v in top[:top_n]]
        content.append(TokenLogprob(token=text, logprob=lp, bytes=raw, top_logprobs=alts))
    return ChoiceLogprobs(content=content)


def completion_logprobs(tt: TokenText, entries: list[Entry], top_n: int, offset: int) -> CompletionLogprobs:
    out = CompletionLogprobs()
    pos = offset
    for tid, lp, top in entries:
        text, _ = tt.get(tid)
        out.tokens.append(text)
        out.token_logprobs.append(lp)
        out.top_logprobs.append({tt.get(t)[0]: v for t, v in top[:top_n]} if top_n else None)
        out.text_offset.append(pos)
        pos += len(text)
    return out
