"""The output constraints a request may carry, behind one interface the engine and sampler use.

JSON mode (with or without a schema), a choice among strings, a regular expression and a grammar each read the
output's bytes: `accepts(piece)` says whether the output may go on with a token's bytes, `feed(piece)` takes them,
`can_end` says whether the turn may end here and `complete` whether only its end may follow.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from .choice_prefix import ChoicePrefix
from .grammar_prefix import GrammarPrefix
from .json_mode import JsonPrefix
from .json_schema_prefix import SchemaPrefix, compile_schema
from .regex_prefix import RegexPrefix
from .sampling_params import SamplingParams


class OutputConstraint(Protocol):
    # Whether `accepts` is cheap enough that memoising openings costs more than it saves (a choice's bisection, a
    # pattern's own first-character memo) rather than a copy of a parser state per token (JSON).
    cheap_accepts: bool

    def accepts(self, piece: bytes) -> bool: ...

    def feed(self, piece: bytes) -> bool: ...

    @property
    def can_end(self) -> bool: ...

    @property
    def complete(self) -> bool: ...


MEMO_BYTES = 3  # openings of 1-3 ASCII bytes: ~95^3 at most a step, far fewer in practice


def token_filter(
    prefix: OutputConstraint,
    token_bytes: Callable[[int], bytes],
    stops: Collection[int],
    special: Collection[int],
    whole: Collection[int] = (),
) -> Callable[[int], bool]:
    """Which tokens the sampler may take next under `prefix` (the sampler walks candidates in its own order and
    takes the first allowed): a stop token once the output may end, no other special token, and a text token whose
    bytes keep the output valid. The state does not change while the filter is used (one step).

    Unless the prefix's `accepts` is cheap, a token is first judged by its opening ASCII bytes, up to MEMO_BYTES of
    them, each such opening answered once a step: a piece whose opening may not follow is refused without copying
    the parser state. Most of a vocabulary fails there where few tokens fit (" word" after a JSON value fails at
    "w"), and an opening of whole characters that may not come next cannot begin a longer piece either
    (`benchmarks/constraint_walk.py`: a whole-vocabulary walk after a JSON value 784 -> 249 ms, before a schema's key
    512 -> 231). Tokens in `whole` (a tool call's tags, special tokens its constraint reads as units) are judged
    whole only."""
    can_end, complete = prefix.can_end, prefix.complete  # read once, not per candidate
    opening_ok: dict[bytes, bool] = {}

    def opening_refused(piece: bytes) -> bool:
        for n in range(1, min(MEMO_BYTES, len(piece) - 1) + 1):
            if piece[n - 1] >= 0x80:
                return False  # a character's bytes: its opening alone may be refused where the whole is not
            opening = piece[:n]
            ok = opening_ok.get(opening)
            if ok is None:
                ok = opening_ok[opening] = prefix.accepts(opening)
            if not ok:
                return True
        return False

    def allowed(token: int) -> bool:
        if token in stops:
            return can_end
        if complete or token in special:
            return False  # e.g. the object is closed: only the end of the turn may follow
        piece = token_bytes(token)
        if cheap or token in whole:
            return prefix.accepts(piece)
        return not opening_refused(piece) and prefix.accepts(piece)

    cheap = prefix.cheap_accepts
    return allowed


def output_constraint(params: SamplingParams) -> OutputConstraint:
    """A fresh checker for the request's constraint (`params.constrained` must be true)."""
    if params.choice is not None:
        return ChoicePrefix(params.choice)
    if params.regex is not None:
        return RegexPrefix(params.regex)
    if params.grammar is not None:
        return GrammarPrefix(params.grammar)
    if params.json_schema is not None:
        return SchemaPrefix(compile_schema(params.json_schema))
    return JsonPrefix()
