"""Beam search on the API (vLLM's `use_beam_search` on completions and chat; the search itself is
`flint_engine/beam_search.py`): each step asks the engine for one greedy token of every live beam, a request each,
with the top 2n log-probabilities of the model's distribution (so the sampling settings do not apply). Each step's
requests share their prefix with the step before, which the prefix cache serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection

from ..beam_search import MAX_WIDTH, Beam, BeamSearch, BeamSettings, ranked
from ..sampling_params import SamplingParams
from .backend import GenerationBackend
from .choices import ChoiceEvent
from .errors import APIError
from .protocol import SamplingFields


async def _top_tokens(
    backend: GenerationBackend, ids: list[int], params: SamplingParams, request_id: str
) -> list[tuple[int, float]]:
    """The most likely next tokens after `ids` with their log-probabilities (the model's distribution), as many as
    the step's `params` ask for."""
    top: list[tuple[int, float]] = []
    async for choice in backend.generate(ids, params, request_id):  # (to its end: one token)
        out = choice.output
        if out.error is not None or out.finish_reason == "error":
            raise APIError(500, out.error or "generation failed", code="generation_failed")
        for token, logprob, alts in out.new_logprobs or ():
            top = ranked(token, logprob, alts)
    if not top:
        raise APIError(500, "the engine returned no token for a beam", code="generation_failed")
    return top


async def search(backend: GenerationBackend, prompt: list[int], s: BeamSettings, request_id: str) -> list[Beam]:
    """The `s.width` beams of highest score after `prompt`, best first."""
    run = BeamSearch(prompt, s)
    while not run.done:
        asks = run.asks()
        run.advance(
            await asyncio.gather(
                *(
                    _top_tokens(backend, ids, run.step_params(), f"{request_id}-s{run.steps}-b{i}")
                    for i, ids in enumerate(asks)
                )
            )
        )
    return run.best()


async def beam_events(
    backend: GenerationBackend,
    prompts: list[list[int]],
    settings: list[BeamSettings],
    request_id: str,
    skip_special_tokens: bool,
) -> AsyncIterator[ChoiceEvent]:
    """Each prompt's beams (under its settings) as finished choices (choice p * width + j: prompt p's j-th best),
    once its search ends."""
    tok = backend.tokenizer
    for p, (prompt, s) in enumerate(zip(prompts, settings, strict=True)):
        for j, beam in enumerate(await search(backend, prompt, s, f"{request_id}-{p}")):
            text = tok.decode(beam.text_tokens, skip_special_tokens=skip_special_tokens) if tok is not None else ""
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
    return BeamSettings(
        req.n, req.length_penalty, params.max_tokens, params.min_tokens, ends, params.priority, params.cache_salt
    )
