"""The output constraints a request may carry, behind one interface the engine and sampler use.

JSON mode (with or without a schema), a choice among strings and a regular expression each read the output's
bytes: `accepts(piece)` says whether the output may go on with a token's bytes, `feed(piece)` takes them, `can_end`
says whether the turn may end here and `complete` whether only its end may follow.
"""

from __future__ import annotations

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


def output_constraint(params: SamplingParams) -> OutputConstraint:
    """A fresh checker for the request's constraint (`params.constrained` must be true)."""
    if params.choice is not None:
        return ChoicePrefix(params.choice)
    if params.regex is not None:
        return RegexPrefix(params.regex)
    if params.json_schema is not None:
        return SchemaPrefix(compile_schema(params.json_schema))
    return JsonPrefix()
