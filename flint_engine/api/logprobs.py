"""Logprobs in OpenAI's shapes, with each token's exact bytes (byte-level BPE tokens may split a character)."""

from __future__ import annotations

from typing import Any

from .protocol import ChoiceLogprobs, CompletionLogprobs, PromptLogprob, TokenLogprob, TopLogprob

Entry = tuple[int, float, list[tuple[int, float]]]
PromptEntry = tuple[int, float, list[tuple[int, float]], int]  # and the prompt token's rank (1: the most likely)


class TokenText:
    """Per-token strings and bytes for one tokenizer, cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self.tokenizer.token_bytes(token_id)
            hit = self._cache[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit

    def name(self, token_id: int, as_id: bool) -> str:
        """How logprobs spell a token: its text, or "token_id:<id>" (vLLM's return_tokens_as_token_ids, for tokens
        whose text is a piece of a character)."""
        return f"token_id:{token_id}" if as_id else self.get(token_id)[0]


def chat_logprobs(tt: TokenText, entries: list[Entry], top_n: int, as_ids: bool = False) -> ChoiceLogprobs:
    """Chat's logprobs of `entries`; with `as_ids` each token named by its id (its bytes stay the token's own)."""
    content = []
    for tid, lp, top in entries:
        alts = [TopLogprob(token=tt.name(t, as_ids), logprob=v, bytes=tt.get(t)[1]) for t, v in top[:top_n]]
        content.append(TokenLogprob(token=tt.name(tid, as_ids), logprob=lp, bytes=tt.get(tid)[1], top_logprobs=alts))
    return ChoiceLogprobs(content=content)


def completion_logprobs(
    tt: TokenText,
    entries: list[Entry],
    top_n: int,
    offset: int,
    prompt: tuple[list[int], list[PromptEntry | None]] | None = None,
    as_ids: bool = False,
) -> CompletionLogprobs:
    """The legacy completions' logprobs of `entries`, their text starting at `offset`; with `prompt` (its token ids
    and their entries, as `echo` returns them) the prompt's tokens first, the first one without a logprob. With
    `as_ids` tokens are named by their ids; the offsets still count the text."""
    out = CompletionLogprobs()
    pos = offset
    rows: list[tuple[int, float | None, list[tuple[int, float]] | None]] = []
    if prompt is not None:
        ids, prompt_entries = prompt
        rows += [(t, None, None) if e is None else (t, e[1], e[2]) for t, e in zip(ids, prompt_entries)]
    rows += entries
    for tid, lp, top in rows:
        text, _ = tt.get(tid)
        out.tokens.append(tt.name(tid, as_ids))
        out.token_logprobs.append(lp)
        out.top_logprobs.append({tt.name(t, as_ids): v for t, v in top[:top_n]} if top_n and top is not None else None)
        out.text_offset.append(pos)
        pos += len(text)
    return out


def prompt_logprobs(
    tt: TokenText, entries: list[PromptEntry | None], top_n: int
) -> list[dict[str, PromptLogprob] | None]:
    """vLLM's `prompt_logprobs`: per prompt position (None for the first) the prompt token and the top `top_n`, by
    token id, each with its logprob, rank and text."""
    out: list[dict[str, PromptLogprob] | None] = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        token, lp, top, rank = e
        row = {
            str(t): PromptLogprob(logprob=v, rank=r, decoded_token=tt.get(t)[0])
            for r, (t, v) in enumerate(top[:top_n], 1)
        }
        row[str(token)] = PromptLogprob(logprob=lp, rank=rank, decoded_token=tt.get(token)[0])
        out.append(row)
    return out
