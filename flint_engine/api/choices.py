"""Run a request's n choices against the backend and merge their outputs into one event stream.

A choice may be generated in two phases when a tool call is forced (`tool_choice` "required" or a named tool):
the model first thinks freely up to `</think>`, then the call's opening (`<tool_call>` or `<tool_call>NAME`) is
appended and generation continues from there, so the answer is a tool call without constrained decoding.
The second phase's prompt is the first phase's prompt plus its output, so the prefix cache makes it cheap.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..parsers.reasoning import THINK_END
from ..sampling_params import SamplingParams
from .backend import GenerationBackend
from .errors import APIError
from .logprobs import PromptEntry

if TYPE_CHECKING:
    from ..engine import RequestOutput


@dataclass
class ChoiceEvent:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    prompt_logprobs: list[PromptEntry | None] | None = None  # with the first token

    @classmethod
    def of(cls, index: int, o: RequestOutput, prompt_tokens: int, completion_tokens: int, cached: int) -> ChoiceEvent:
        """The event for one engine output: its new text, tokens, log-probs and end, with the choice's counts."""
        return cls(
            index,
            o.new_text,
            o.new_token_ids,
            o.new_logprobs,
            o.finished,
            o.finish_reason,
            o.stop_reason,
            prompt_tokens,
            completion_tokens,
            cached,
            o.error,
            o.prompt_logprobs,
        )


@dataclass
class ChoicePlan:
    prompt_ids: list[int]
    params: SamplingParams  # n == 1; per-choice seed already set
    thinking: bool
    force: str | None = None  # text to append once thinking ends, e.g. "<tool_call>get_weather"
    tool_names: tuple[str, ...] | None = None  # after `force`, the model names one of these (tool_choice required)


async def _stream_choice(
    backend: GenerationBackend, index: int, plan: ChoicePlan, request_id: str
) -> AsyncIterator[ChoiceEvent]:
    n_prompt = len(plan.prompt_ids)
    if plan.force is None:
        async for item in backend.generate(plan.prompt_ids, plan.params, request_id):
            o = item.output
            yield ChoiceEvent.of(index, o, n_prompt, o.num_output_tokens, o.num_cached_tokens)
        return
    tok = backend.tokenizer
    produced: list[int] = []
    cached = 0
    budget = plan.params.max_tokens
    if plan.thinking:
        phase1 = dataclasses.replace(plan.params, stop=[*plan.params.stop, THINK_END], include_stop_str_in_output=True)
        last = None
        async for item in backend.generate(plan.prompt_ids, phase1, f"{request_id}-think"):
            o = item.output
            produced += o.new_token_ids
            cached, last = o.num_cached_tokens, o
            if not o.finished:
                yield ChoiceEvent(
                    index,
                    o.new_text,
                    o.new_token_ids,
                    o.new_logprobs,
                    prompt_tokens=n_prompt,
                    completion_tokens=len(produced),
                    cached_tokens=cached,
                )
        assert last is not None
        closed = last.finish_reason == "stop" and last.stop_reason == THINK_END
        user_stop = last.finish_reason == "stop" and isinstance(last.stop_reason, str) and not closed
        if last.finish_reason in ("length", "abort", "error") or user_stop:
            yield ChoiceEvent.of(index, last, n_prompt, len(produced), cached)
            return
        tokens, logprobs = list(last.new_token_ids), last.new_logprobs
        ended_turn = bool(tokens) and tokens[-1] in set(getattr(tok, "eos_token_ids", ()))
        if not closed and ended_turn:  # the model ended its turn inside the thinking: drop the end token
            produced, tokens, logprobs = produced[:-1], tokens[:-1], None
        force_text = ("" if closed else THINK_END) + plan.force
    else:
        tokens, logprobs, force_text = [], None, plan.force
        last = None
    forced_ids = tok.encode(force_text)
    produced += forced_ids
    yield ChoiceEvent(
        index,
        (last.new_text if last is not None else "") + force_text,
        tokens + forced_ids,
        logprobs,
        prompt_tokens=n_prompt,
        completion_tokens=len(produced),
        cached_tokens=cached,
    )
    remaining = budget - len(produced)
    if remaining <= 0:
        yield ChoiceEvent(index, "", [], None, True, "length", None, n_prompt, len(produced), cached)
        return
    phase2 = dataclasses.replace(
        plan.params,
        max_tokens=remaining,
        seed=None if plan.params.seed is None else plan.params.seed + 7919,
        tool_names=plan.tool_names,
    )
    async for item in backend.generate(plan.prompt_ids + produced, phase2, f"{request_id}-call"):
        o = item.output
        yield ChoiceEvent.of(index, o, n_prompt, len(produced) + o.num_output_tokens, cached)


async def run_choices(
    backend: GenerationBackend, plans: list[ChoicePlan], request_id: str
) -> AsyncIterator[ChoiceEvent]:
    """Events of all choices as they arrive; closing this iterator cancels every choice (and so aborts them)."""
    if len(plans) == 1:
        async for ev in _stream_choice(backend, 0, plans[0], request_id):
            yield ev
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, plan: ChoicePlan) -> None:
        try:
            async for ev in _stream_choice(backend, i, plan, f"{request_id}-{i}"):
                await queue.put(ev)
        except BaseException as exc:  # surfaced to the consumer below
            await queue.put(exc)
        finally:
            await queue.put(done)

    tasks = [asyncio.ensure_future(pump(i, p)) for i, p in enumerate(plans)]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class FinishedChoice:
    """One choice of a non-streamed request, gathered."""

    text: str
    logprobs: list[tuple[int, float, list[tuple[int, float]]]]
    final: ChoiceEvent
    prompt_logprobs: list[PromptEntry | None] | None = None
    token_ids: list[int] = field(default_factory=list)


async def primed(events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[ChoiceEvent]:
    """Pull the first event now (so validation and overload errors surface before any response is sent)."""
    first = await events.__anext__()

    async def chained() -> AsyncIterator[ChoiceEvent]:
        yield first
        async for ev in events:
            yield ev

    return chained()


async def collect(events: AsyncIterator[ChoiceEvent], n: int) -> list[FinishedChoice]:
    """Gather every choice's text and logprobs; a choice that failed fails the request (500)."""
    texts = [""] * n
    entries: list[list[tuple[int, float, list[tuple[int, float]]]]] = [[] for _ in range(n)]
    final: list[ChoiceEvent | None] = [None] * n
    prompt: list[list | None] = [None] * n
    ids: list[list[int]] = [[] for _ in range(n)]
    async for ev in events:
        texts[ev.index] += ev.text
        ids[ev.index] += ev.token_ids
        if ev.prompt_logprobs is not None:
            prompt[ev.index] = ev.prompt_logprobs
        if ev.logprobs:
            entries[ev.index] += ev.logprobs
        if ev.finished:
            final[ev.index] = ev
    out = []
    for i in range(n):
        ev = final[i]
        assert ev is not None
        if ev.error is not None or ev.finish_reason == "error":
            raise APIError(500, ev.error or "generation failed", code="generation_failed")
        out.append(FinishedChoice(texts[i], entries[i], ev, prompt[i], ids[i]))
    return out


def totals(choices: list[FinishedChoice]) -> tuple[int, int]:
    """(completion tokens over all choices, prompt tokens served from the prefix cache)."""
    return sum(c.final.completion_tokens for c in choices), max((c.final.cached_tokens for c in choices), default=0)
