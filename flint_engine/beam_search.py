"""Beam search, one prompt's: the `width` continuations of highest score, found a token at a time.

Each step takes the top 2 x width next tokens (with their log-probabilities under the model) of every live beam,
extends each beam by each of those tokens, keeps the `width` best extensions and sets aside those that end (an end
token, once `min_tokens` are out). A beam's score is its summed log-probability over its length to the power
`length_penalty`, the length counting the prompt and not the end token (vLLM's); the best `width` of the ended and
the still-running beams are the answer. What runs the model is the caller's: the API server (a request per beam and
step, `api/beam_search.py`) and `LLM.beam_search` (every beam of a step in one batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sampling_params import SamplingParams

MAX_WIDTH = 10  # 2 x width log-probabilities a step, and the engine gives at most 20


@dataclass(frozen=True)
class BeamSettings:
    width: int
    length_penalty: float
    max_tokens: int
    min_tokens: int = 0
    ends: frozenset[int] = frozenset()  # tokens that end a beam (none with ignore_eos)
    priority: int = 0
    cache_salt: str | None = None  # the request's (its steps share cached blocks only under it)

    def __post_init__(self) -> None:
        if not 1 <= self.width <= MAX_WIDTH:
            raise ValueError(f"beam width must be 1 to {MAX_WIDTH}, got {self.width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass
class Beam:
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    ended: bool = False  # by its last token (else it ran to max_tokens)

    @property
    def text_tokens(self) -> list[int]:
        """Its tokens but an end token (whose text is not output)."""
        return self.tokens[:-1] if self.ended else self.tokens

    def score(self, prompt_len: int, length_penalty: float) -> float:
        length = prompt_len + len(self.tokens) - self.ended
        return self.logprob / (max(length, 1) ** length_penalty)


def ranked(token: int, logprob: float, alts: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A step's top tokens, likeliest first, from what the engine returns for a token with logprobs: the token
    chosen and its alternatives (which may or may not include it)."""
    top = dict(alts)
    top.setdefault(token, logprob)
    return sorted(top.items(), key=lambda t: -t[1])


class BeamSearch:
    """One prompt's search: `asks()` the sequences whose next tokens it needs, `advance(tops)` takes them (each
    sequence's top tokens with log-probabilities, in the same order), until `done`; then `best()`."""

    def __init__(self, prompt: list[int], settings: BeamSettings) -> None:
        self.prompt, self.s = list(prompt), settings
        self.live, self.ended, self.steps = [Beam()], [], 0

    @property
    def done(self) -> bool:
        return not self.live or self.steps >= self.s.max_tokens

    @property
    def top_k(self) -> int:
        return 2 * self.s.width

    def step_params(self) -> SamplingParams:
        """What a beam's step asks the engine for: one greedy token with the top_k likeliest (raw log-probabilities,
        so the request's sampling settings do not apply); a part of one client request, so not one in the engine's
        request metrics."""
        s = self.s
        return SamplingParams(
            max_tokens=1,
            temperature=0.0,
            logprobs=self.top_k,
            ignore_eos=True,
            priority=s.priority,
            cache_salt=s.cache_salt,
            in_request_metrics=False,
        )

    def asks(self) -> list[list[int]]:
        return [] if self.done else [self.prompt + b.tokens for b in self.live]

    def _score(self, beam: Beam) -> float:
        return beam.score(len(self.prompt), self.s.length_penalty)

    def advance(self, tops: list[list[tuple[int, float]]]) -> None:
        grown = []
        for beam, top in zip(self.live, tops, strict=True):
            for token, logprob in top[: self.top_k]:
                if token in self.s.ends:
                    if len(beam.tokens) >= self.s.min_tokens:
                        self.ended.append(Beam([*beam.tokens, token], beam.logprob + logprob, ended=True))
                else:
                    grown.append(Beam([*beam.tokens, token], beam.logprob + logprob))
        grown.sort(key=self._score, reverse=True)
        self.live = grown[: self.s.width]
        self.steps += 1

    def best(self) -> list[Beam]:
        """The `width` beams of highest score, best first."""
        return sorted(self.ended + self.live, key=self._score, reverse=True)[: self.s.width]
