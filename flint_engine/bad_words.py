"""vLLM's `bad_words`: words the output must not contain, as token sequences banned at their last token.

Each word is tokenized as written and with a leading space (the word in the middle of a sentence). A one-token
sequence is banned always; a longer one only where the output so far ends with all of it but its last token, which
is then banned. So the word cannot be completed in those spellings; other tokenizations of the same text (rarer
splits) are not caught, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bad_word_sequences(tokenizer: Any, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """The token sequences of `words`: each as written, and with a leading space unless that is only the space as a
    token of its own before the same tokens (which the first already bans). vLLM keeps the spaced form only where it
    has as many tokens as the plain one, and so misses a word that is one token with its space and two without."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word))
        spaced = tuple(tokenizer.encode(" " + word.lstrip()))
        for ids in (plain, spaced):
            if ids and ids not in out and (ids is plain or ids[1:] != plain):
                out.append(ids)
    return tuple(out)


def banned_by_bad_words(sequences: Sequence[tuple[int, ...]], output_ids: Sequence[int]) -> set[int]:
    """The tokens that would complete one of `sequences` after `output_ids`."""
    banned = set()
    for seq in sequences:
        *head, last = seq
        if len(head) <= len(output_ids) and list(output_ids[len(output_ids) - len(head) :]) == head:
            banned.add(last)
    return banned


def bans_before_reading(
    sequences: Sequence[tuple[int, ...]], output_ids: Sequence[int]
) -> tuple[set[int], tuple[tuple[int, int], ...]]:
    """`banned_by_bad_words` for the token after one not read yet (a step launched ahead): the tokens banned
    whatever that token is, and (if it is this token, ban that one) pairs for the sequences it may complete the head
    of. Together they ban exactly what `banned_by_bad_words` bans once the token is known."""
    always: set[int] = set()
    pairs: set[tuple[int, int]] = set()
    for seq in sequences:
        *head, last = seq
        if not head:
            always.add(last)
        elif len(head) - 1 <= len(output_ids) and list(output_ids[len(output_ids) - len(head) + 1 :]) == head[:-1]:
            pairs.add((head[-1], last))
    return always, tuple(sorted(pairs))
