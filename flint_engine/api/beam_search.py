"""Beam search (vLLM's `use_beam_search` on completions and chat): the `n` continuations of highest score, found a
token at a time.

Each step asks the engine for one token of every live beam with the top 2n log-probabilities of the model's
distribution (greedy, so the sampling settings do not apply), extends each beam by each of those tokens, keeps the n
best extensions and sets aside those that end (an end token, once `min_tokens` are out). A beam's score is its summed
log-probability over its length to the power `length_penalty`, the length counting the prompt and not the end token
(vLLM's); the n best of the ended and the still-running beams are the choices. Each step's requests share their
prefix with the step before, which the prefix cache serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field

from ..sampling_params import SamplingParams
from .backend import GenerationBackend
from .choices import ChoiceEvent
from .errors import APIError
from .protocol import SamplingFields

MAX_WIDTH = 10  # 2 x width log-probabilities a step, and the engine gives at most 20


@dataclass(frozen=True)
class BeamSettings:
    width: int
    length_penalty: float
    max_tokens: int
    min_tokens: int
    ends: frozenset[int]  # tokens that end a beam (none with ignore_eos)
    priority: int = 0


@dataclass
class Beam:
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    ended: bool = False  # by its last token (else it ran to max_tokens)

    def score(self, prompt_len: int, length_penalty: float) -> float:
        length = prompt_len + len(self.tokens) - self.ended
        return self.logprob / (max(length, 1) ** length_penalty)


async def _top_tokens(
    backend: GenerationBackend, ids: list[int], k: int, priority: int, request_id: str
) -> list[tuple[int, float]]:
    """The k most likely next tokens after `ids` with their log-probabilities (the model's distribution)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=k, ignore_eos=True, priority=priority)
    top: dict[int, float] = {}
    async for choice in backend.generate(ids, params, request_id):  # (to its end: one token)
        out = choice.output
        if out.error is not None or out.finish_reason == "error":
            raise APIError(500, out.error or "generation failed", code="generation_failed")
        for token, logprob, alts in out.new_logprobs or ():
            top = dict(alts)
            top.setdefault(token, logprob)
    if not top:
        raise APIError(500, "the engine returned no token for a beam", code="generation_failed")
    return sorted(top.items(), key=lambda t: -t[1])[:k]


async def search(backend: GenerationBackend, prompt: list[int], s: BeamSettings, request_id: str) -> list[Beam]:
    """The `s.width` beams of highest score after `prompt`, best first."""
    live, ended = [Beam()], []
    for step in range(s.max_tokens):
        tops = await asyncio.gather(
            *(
                _top_tokens(backend, prompt + b.tokens, 2 * s.width, s.priority, f"{request_id}-s{step}-b{i}")
                for i, b in enumerate(live)
            )
        )
        grown = []
        for beam, top in zip(live, tops, strict=True):
            for token, logprob in top:
                if token in s.ends:
                    if len(beam.tokens) >= s.min_tokens:
                        ended.append(Beam([*beam.tokens, token], beam.logprob + logprob, ended=True))
                else:
                    grown.append(Beam([*beam.tokens, token], beam.logprob + logprob))
        grown.sort(key=lambda b: b.score(len(prompt), s.length_penalty), reverse=True)
        live = grown[: s.width]
        if not live:
            break
    return sorted(ended + live, key=lambda b: b.score(len(prompt), s.length_penalty), reverse=True)[: s.width]


async def beam_events(
    backend: GenerationBackend,
    prompts: list[list[int]],
    s: BeamSettings,
    request_id: str,
    skip_special_tokens: bool,
) -> AsyncIterator[ChoiceEvent]:
    """Each prompt's beams as finished choices (choice p * width + j: prompt p's j-th best), once its search ends."""
    tok = backend.tokenizer
    for p, prompt in enumerate(prompts):
        for j, beam in enumerate(await search(backend, prompt, s, f"{request_id}-{p}")):
            text_ids = beam.tokens[:-1] if beam.ended else beam.tokens  # (an end token's text is not output)
            text = tok.decode(text_ids, skip_special_tokens=skip_special_tokens) if tok is not None else ""
            yield ChoiceEvent(
                p * s.width + j,
                text,
                beam.tokens,
                finished=True,
                finish_reason="stop" if beam.ended else "length",
                stop_reason=beam.tokens[-1] if beam.ended else None,
                prompt_tokens=len(prompt),
                completion_tokens=len(beam.tokens),
            )


def beam_settings(
    req: SamplingFields, params: SamplingParams, eos: Collection[int], refused: dict[str, bool]
) -> BeamSettings:
    """A request's beam search, refusing what it does not combine with (`refused`: the endpoint's own fields, each
    with whether the request sets it): beam search scores the model's log-probabilities, so what changes the sampled
    distribution or cuts the output's text does not apply."""
    if req.n > MAX_WIDTH:
        raise APIError(400, f"beam search takes n (its width) up to {MAX_WIDTH}, got {req.n}", "n")
    unsupported = {
        **refused,
        "prompt_logprobs": req.prompt_logprobs is not None,
        "stop": bool(req.stop_list()),
        "bad_words": bool(req.bad_words),
        "logit_bias": bool(req.token_biases()),
        "allowed_token_ids": bool(req.allowed_token_ids),
        "presence_penalty": bool(req.presence_penalty),
        "frequency_penalty": bool(req.frequency_penalty),
        "repetition_penalty": req.repetition_penalty != 1.0,
        "guided_* / structured_outputs / response_format": params.constrained,
    }
    named = next((name for name, given in unsupported.items() if given), None)
    if named is not None:
        raise APIError(400, f"{named} cannot be used with beam search (use_beam_search)", named.split(" ")[0])
    ends = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(eos))
    return BeamSettings(req.n, req.length_penalty, params.max_tokens, params.min_tokens, ends, params.priority)
