"""POST /v1/completions: raw prompts (text or token ids), n choices each, optional echo and logprobs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..beam_search import BeamSettings
from ..sampling_params import SamplingParams
from .backend import GenerationBackend
from .beam_search import beam_events, beam_settings
from .choices import ChoiceEvent, ChoicePlan, collect, run_choices, totals
from .errors import APIError, error_body, to_api_error
from .limits import (
    check_common_request,
    check_prompt_logprobs,
    request_priority,
    resolve_max_tokens,
    truncate_prompt,
)
from .logprobs import TokenText, completion_logprobs, prompt_logprobs
from .protocol import CompletionChoice, CompletionRequest, CompletionResponse, PromptTokensDetails, Usage
from .settings import APISettings


@dataclass
class PreparedCompletion:
    prompts: list[list[int]]
    prompt_texts: list[str]
    plans: list[ChoicePlan]  # len(prompts) * n, prompt-major
    n: int
    echo: bool
    logprobs: int | None
    model: str
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs (top k) on each choice
    # Beam search (use_beam_search): its settings for each prompt (max_tokens is each one's); the plans are not run
    beams: list[BeamSettings] | None = None
    token_ids: bool = False  # vLLM's return_token_ids
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids
    request_id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))


class CompletionHandler:
    def __init__(self, backend: GenerationBackend, settings: APISettings) -> None:
        self.backend = backend
        self.settings = settings
        self.token_text = TokenText(backend.tokenizer) if backend.tokenizer is not None else None

    def prepare(self, req: CompletionRequest) -> PreparedCompletion:
        backend, s = self.backend, self.settings
        check_common_request(req, backend, s)
        if req.logprobs is not None and req.logprobs > min(s.max_top_logprobs, 5):
            raise APIError(400, f"logprobs must be <= {min(s.max_top_logprobs, 5)}", "logprobs")
        tok = backend.tokenizer
        prompts: list[list[int]] = []
        texts: list[str] = []
        for p in req.prompts():
            if isinstance(p, str):
                if tok is None:
                    raise APIError(400, "this checkpoint has no tokenizer: send token ids", "prompt")
                ids = tok.encode(p)
                texts.append(p)
            else:
                ids = list(p)
                texts.append(tok.decode(ids) if tok is not None else "")
            if not ids:
                raise APIError(400, "the prompt is empty", "prompt")
            kept = truncate_prompt(ids, req.truncate_prompt_tokens, backend, req.truncation_side)
            if len(kept) < len(ids):
                ids = kept
                texts[-1] = tok.decode(ids) if tok is not None else ""  # what echo returns: the prompt that ran
            prompts.append(ids)
        json_mode, json_schema = req.json_constraint()
        wanted = (req.prompt_logprobs, req.logprobs if req.echo else None)
        prompt_k = max((k for k in wanted if k is not None), default=None)
        if prompt_k is not None:
            for ids in prompts:
                check_prompt_logprobs(len(ids), s, "prompt_logprobs" if req.prompt_logprobs is not None else "echo")
        plans = []
        for ids in prompts:
            max_tokens = resolve_max_tokens(
                req.max_tokens if req.max_tokens is not None else 16, len(ids), backend, s, "prompt"
            )
            for i in range(req.n):
                plans.append(
                    ChoicePlan(
                        ids,
                        SamplingParams(
                            max_tokens=max_tokens,
                            temperature=req.temperature,
                            top_p=req.top_p,
                            top_k=req.top_k,
                            min_p=req.min_p,
                            presence_penalty=req.presence_penalty,
                            frequency_penalty=req.frequency_penalty,
                            repetition_penalty=req.repetition_penalty,
                            logit_bias=req.token_biases(),
                            allowed_token_ids=tuple(req.allowed_token_ids) if req.allowed_token_ids else None,
                            bad_words=tuple(req.bad_words or ()),
                            seed=None if req.seed is None else req.seed + i,
                            stop=req.stop_list(),
                            stop_token_ids=list(req.stop_token_ids or []),
                            include_stop_str_in_output=req.include_stop_str_in_output,
                            ignore_eos=req.ignore_eos,
                            min_tokens=min(req.min_tokens, max_tokens),
                            logprobs=req.logprobs,
                            # echo with logprobs scores the prompt too (lm-evaluation-harness's loglikelihood)
                            prompt_logprobs=prompt_k,
                            skip_special_tokens=req.skip_special_tokens,
                            json_mode=json_mode,
                            json_schema=json_schema,
                            choice=tuple(req.guided_choice) if req.guided_choice is not None else None,
                            regex=req.guided_regex,
                            grammar=req.guided_grammar,
                            priority=request_priority(req, s),
                            cache_salt=req.cache_salt,
                        ),
                        thinking=False,
                    )
                )
        beams = None
        if req.use_beam_search:
            refused = {"logprobs": req.logprobs is not None, "echo": req.echo}
            beams = [beam_settings(req, plan.params, backend.eos_token_ids, refused) for plan in plans[:: req.n]]
        return PreparedCompletion(
            prompts,
            texts,
            plans,
            req.n,
            req.echo,
            req.logprobs,
            backend.model_name,
            req.prompt_logprobs,
            beams,
            req.return_token_ids,
            req.return_tokens_as_token_ids,
        )

    def _prefix(self, prep: PreparedCompletion, index: int) -> str:
        return prep.prompt_texts[index // prep.n] if prep.echo else ""

    @staticmethod
    def _echoed(prep: PreparedCompletion, index: int, entries: list | None) -> tuple[list[int], list] | None:
        """The echoed prompt's token ids and log-probabilities of choice `index`, once the engine has sent them."""
        return (prep.prompts[index // prep.n], entries) if prep.echo and entries is not None else None

    def events(self, prep: PreparedCompletion) -> AsyncIterator[ChoiceEvent]:
        if prep.beams is not None:
            skip = prep.plans[0].params.skip_special_tokens
            return beam_events(self.backend, prep.prompts, prep.beams, prep.request_id, skip)
        return run_choices(self.backend, prep.plans, prep.request_id)

    async def complete(self, prep: PreparedCompletion, events: AsyncIterator[ChoiceEvent]) -> CompletionResponse:
        done = await collect(events, len(prep.plans))
        choices = []
        for i, c in enumerate(done):
            ev = c.final
            prefix = self._prefix(prep, i)
            lp = None
            if prep.logprobs is not None and self.token_text is not None:
                prompt = self._echoed(prep, i, c.prompt_logprobs)
                start = 0 if prompt else len(prefix)  # echoed prompt tokens carry the prompt's text themselves
                lp = completion_logprobs(self.token_text, c.logprobs, prep.logprobs, start, prompt, prep.tokens_as_ids)
            scored = None
            if prep.prompt_logprobs is not None and c.prompt_logprobs is not None and self.token_text is not None:
                scored = prompt_logprobs(self.token_text, c.prompt_logprobs, prep.prompt_logprobs)
            choices.append(
                CompletionChoice(
                    index=i,
                    text=prefix + c.text,
                    logprobs=lp,
                    finish_reason=ev.finish_reason,
                    stop_reason=ev.stop_reason,
                    prompt_logprobs=scored,
                    prompt_token_ids=prep.prompts[i // prep.n] if prep.token_ids else None,
                    token_ids=c.token_ids if prep.token_ids else None,
                )
            )
        completion_tokens, cached = totals(done)
        prompt_tokens = sum(len(p) for p in prep.prompts)
        return CompletionResponse(
            id=prep.request_id,
            created=prep.created,
            model=prep.model,
            choices=choices,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
                prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            ),
        )

    async def stream(
        self, prep: PreparedCompletion, events: AsyncIterator[ChoiceEvent], include_usage: bool, continuous_usage: bool
    ) -> AsyncIterator[str]:
        completion = [0] * len(prep.plans)
        started = [False] * len(prep.plans)
        sent_prompt = [False] * len(prep.plans)  # (with return_token_ids: the prompt's ids go with a choice's first)
        offsets = [len(self._prefix(prep, i)) for i in range(len(prep.plans))]

        def body(choices: list[dict[str, Any]], with_usage: bool) -> str:
            out: dict[str, Any] = {
                "id": prep.request_id,
                "object": "text_completion",
                "created": prep.created,
                "model": prep.model,
                "choices": choices,
            }
            if with_usage:
                total = sum(completion)
                prompt = sum(len(p) for p in prep.prompts)
                out["usage"] = {"prompt_tokens": prompt, "completion_tokens": total, "total_tokens": prompt + total}
            return f"data: {json.dumps(out, ensure_ascii=False)}\n\n"

        try:
            async for ev in events:
                i = ev.index
                completion[i] = ev.completion_tokens
                if ev.error is not None or ev.finish_reason == "error":
                    raise APIError(500, ev.error or "generation failed", code="generation_failed")
                text = ev.text
                if not started[i]:
                    started[i] = True
                    text = self._prefix(prep, i) + text
                lp = None
                prompt = self._echoed(prep, i, ev.prompt_logprobs)
                if prep.logprobs is not None and (ev.logprobs or prompt) and self.token_text is not None:
                    at = 0 if prompt else offsets[i]
                    lp = completion_logprobs(
                        self.token_text, ev.logprobs or [], prep.logprobs, at, prompt, prep.tokens_as_ids
                    ).model_dump()
                offsets[i] += len(text)
                if text or ev.finished or lp or (prep.token_ids and ev.token_ids):
                    choice: dict[str, Any] = {
                        "index": i,
                        "text": text,
                        "logprobs": lp,
                        "finish_reason": ev.finish_reason if ev.finished else None,
                    }
                    if prep.token_ids:
                        if not sent_prompt[i]:
                            sent_prompt[i] = True
                            choice["prompt_token_ids"] = prep.prompts[i // prep.n]
                        choice["token_ids"] = ev.token_ids
                    yield body([choice], continuous_usage)
            if include_usage:
                yield body([], True)
        except Exception as exc:
            api = to_api_error(exc) or APIError(500, "internal server error", code="internal_error")
            yield f"data: {json.dumps(error_body(api.status, api.message, api.param, api.code))}\n\n"
        yield "data: [DONE]\n\n"
