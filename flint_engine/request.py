"""A request's lifecycle state inside the engine."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class TokenView(Sequence[int]):
    """A request's prompt followed by its output, without copying them: per-step code slices a few tokens out of it
    (concatenating the two lists is O(context) for every request in every step: ~50 us at 32K tokens, ~0.85 ms at
    256K)."""

    __slots__ = ("_head", "_tail")

    def __init__(self, head: list[int], tail: list[int]) -> None:
        self._head, self._tail = head, tail

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        head, tail = self._head, self._tail
        h = len(head)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return (head + tail)[index]
            if stop <= h:
                return head[start:stop]
            if start >= h:
                return tail[start - h : stop - h]
            return head[start:] + tail[: stop - h]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("token index out of range")
        return head[i] if i < h else tail[i - h]


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    eos_token_ids: frozenset[int]
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0
    cached_prompt_tokens: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    # Parallel list of (logprob of the sampled token, top alternatives) when logprobs were asked for.
    output_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    # With params.prompt_logprobs: per prompt position, (token, logprob, top alternatives, rank); None for the first
    # token (nothing predicts it) and for positions not computed yet.
    prompt_logprobs: list[tuple[int, float, list[tuple[int, float]], int] | None] | None = None

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """A new list of every token (O(context): per-step code slices `tokens` instead)."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def tokens(self) -> TokenView:
        return TokenView(self.prompt_token_ids, self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.params.max_tokens
