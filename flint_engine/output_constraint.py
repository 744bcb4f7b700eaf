"""The output constraints a request may carry, behind one interface the engine and sampler use.

JSON mode (with or without a schema), a choice among strings and a regular expression each read the output's
bytes: `accepts(piece)` says whether the output may go on with a token's bytes, `feed(piece)` takes them, `can_end`
says whether the turn may end here and `complete` whether only its end may follow.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from .choice_prefix import ChoicePrefix
from .json_mode import JsonPrefix
from .json_schema_prefix import SchemaPrefix, compile_schema
from .regex_prefix import RegexPrefix
from .sampling_params import SamplingParams


class OutputConstraint(Protocol):
    def accepts(self, piece: bytes) -> bool: ...

    def feed(self, piece: bytes) -> bool: ...

    @property
    def can_end(self) -> bool: ...

    @property
    def complete(self) -> bool: ...


def token_filter(
    prefix: OutputConstraint,
    token_bytes: Callable[[int], bytes],
    stops: Collection[int],
    special: Collection[int],
) -> Callable[[int], bool]:
    """Which tokens the sampler may take next under `prefix` (the sampler walks candidates in its own order and
    takes the first allowed): a stop token once the output may end, no other special token, and a text token whose
    bytes keep the output valid. The state does not change while the filter is used (one step).

    A token whose first byte is ASCII and may not follow is refused without reading its other bytes, and that
    answer is kept for the step, per byte: most of a vocabulary fails there where few tokens fit, and a character
    that may not come next cannot begin a longer piece either, under every constraint here (a walk over Flint's
    150,144 tokens: ~30 ms instead of 74-171 ms for a pattern or a choice and ~3.7 s for JSON,
    `benchmarks/constraint_walk.py`)."""
    can_end, complete = prefix.can_end, prefix.complete  # read once, not per candidate
    ascii_ok: dict[int, bool] = {}

    def allowed(token: int) -> bool:
        if token in stops:
            return can_end
        if complete or token in special:
            return False  # e.g. the object is closed: only the end of the turn may follow
        piece = token_bytes(token)
        if piece and piece[0] < 0x80:
            ok = ascii_ok.get(piece[0])
            if ok is None:
                ok = ascii_ok[piece[0]] = prefix.accepts(piece[:1])
            if not ok:
                return False
        return prefix.accepts(piece)

    return allowed


def output_constraint(params: SamplingParams) -> OutputConstraint:
    """A fresh checker for the request's constraint (`params.constrained` must be true)."""
    if params.choice is not None:
        return ChoicePrefix(params.choice)
    if params.regex is not None:
        return RegexPrefix(params.regex)
    if params.json_schema is not None:
        return SchemaPrefix(compile_schema(params.json_schema))
    return JsonPrefix()
