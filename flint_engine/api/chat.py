"""POST /v1/chat/completions: template the conversation, generate n choices, parse reasoning and tool calls."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..beam_search import BeamSettings
from ..chat_template import ChatTemplateError, compile_chat_template
from ..parsers import ChatOutputParser
from ..parsers.reasoning import THINK_END, THINK_START
from ..sampling_params import SamplingParams
from ..tool_call_prefix import StrictToolError, held_tool_schemas
from .backend import GenerationBackend
from .beam_search import beam_events, beam_settings
from .choices import ChoiceEvent, ChoicePlan, collect, run_choices, totals
from .errors import APIError, error_body, to_api_error, validation_error
from .limits import (
    check_common_request,
    check_prompt_logprobs,
    request_priority,
    resolve_max_tokens,
    truncate_prompt,
)
from .logprobs import Entry, TokenText, chat_logprobs, prompt_logprobs
from .protocol import (
    AllowedToolsChoice,
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    FunctionCallOut,
    NamedToolChoice,
    PromptTokensDetails,
    ToolCallOut,
    Usage,
)
from .settings import APISettings


@dataclass
class PreparedChat:
    prompt_ids: list[int]
    plans: list[ChoicePlan]
    thinking: bool
    tools: list[dict[str, Any]] | None
    tool_choice_none: bool
    parallel_tool_calls: bool
    top_logprobs: int | None
    model: str
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs (top k), on the response
    service_tier: str | None = None  # the tier it ran at, echoed where the request named one (OpenAI's)
    beam: BeamSettings | None = None  # beam search (use_beam_search): its settings; the plans are not run
    token_ids: bool = False  # vLLM's return_token_ids
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids
    echo: str = ""  # what the answer's content begins with (vLLM's echo: the assistant turn it continues)
    include_reasoning: bool = True  # vLLM's: false leaves the thinking out of the answer
    legacy_functions: bool = False  # asked in OpenAI's deprecated `functions`: the call answers as `function_call`
    request_id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def call_reason(self) -> str:
        """The finish reason of an answer that calls a tool (OpenAI's deprecated functions name it otherwise)."""
        return "function_call" if self.legacy_functions else "tool_calls"

    def parser(self) -> ChatOutputParser:
        return ChatOutputParser(
            self.thinking, self.tools, self.tool_choice_none, parallel_tool_calls=self.parallel_tool_calls
        )


def served_tier(asked: str | None) -> str | None:
    """The service tier a request runs at, as OpenAI names it in its answer: "flex" (`api.flex_priority`), or
    "default" for every other tier asked for (this server has no faster one); None where none was asked for."""
    if asked is None:
        return None
    return "flex" if asked == "flex" else "default"


def chat_request_of(req: Any) -> ChatCompletionRequest:
    """`req.to_chat()`: another API's request (Responses, Anthropic Messages) as the chat request it runs as; what
    has no chat equivalent is a 400."""
    try:
        return req.to_chat()
    except ValidationError as exc:
        raise validation_error(exc) from None
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


async def parsed_deltas(
    prep: PreparedChat, events: AsyncIterator[ChoiceEvent]
) -> AsyncIterator[tuple[ChoiceEvent, list[Any]]]:
    """One choice's events, each with the parsed message deltas it adds (thinking, content, tool-call pieces; the
    parser's last ones with the final event), for the APIs that stream in their own shape; a failed generation raises
    APIError 500."""
    streamer = prep.parser().stream()
    async for ev in events:
        deltas = streamer.feed(ev.text) if ev.text else []
        if ev.finished:
            if ev.error is not None or ev.finish_reason == "error":
                raise APIError(500, ev.error or "generation failed", code="generation_failed")
            deltas += streamer.finish()
        yield ev, deltas


def legacy_call_delta(tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed tool-call delta as OpenAI's deprecated `function_call` delta: the one call's name when it comes,
    then its arguments' pieces."""
    out: dict[str, Any] = {}
    for call in tool_calls:
        fn = call.get("function", {})
        if "name" in fn:
            out["name"] = fn["name"]
        if fn.get("arguments"):
            out["arguments"] = out.get("arguments", "") + fn["arguments"]
    out.setdefault("arguments", "")
    return out


class ChatHandler:
    def __init__(self, backend: GenerationBackend, settings: APISettings) -> None:
        self.backend = backend
        self.settings = settings
        self.token_text = TokenText(backend.tokenizer) if backend.tokenizer is not None else None

    # ------------------------------------------------------------------ request -> plan
    def _thinking_budget(self, req: ChatCompletionRequest) -> int | None:
        """The request's thinking_token_budget, else its reasoning effort's budget in the settings, else the
        server's default (None: no cap)."""
        if req.thinking_token_budget is not None:
            return req.thinking_token_budget
        s = self.settings
        if req.reasoning_effort is not None and req.reasoning_effort in s.reasoning_effort_budgets:
            return s.reasoning_effort_budgets[req.reasoning_effort]
        return s.thinking_token_budget

    def prepare(self, req: ChatCompletionRequest) -> PreparedChat:
        backend, s = self.backend, self.settings
        check_common_request(req, backend, s)
        if backend.tokenizer is None:
            raise APIError(400, "this checkpoint has no tokenizer: use /v1/completions with token ids", "messages")
        if req.top_logprobs is not None and req.top_logprobs > s.max_top_logprobs:
            raise APIError(400, f"top_logprobs must be <= {s.max_top_logprobs}", "top_logprobs")
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        if tools is not None:
            if len(tools) > s.max_tools:
                raise APIError(400, f"at most {s.max_tools} tools are allowed, got {len(tools)}", "tools")
            for i, t in enumerate(tools):
                size = len(json.dumps(t, ensure_ascii=False).encode())
                if size > s.max_tool_schema_bytes:
                    raise APIError(
                        400, f"tool {i} schema is {size} bytes; the limit is {s.max_tool_schema_bytes}", f"tools.{i}"
                    )
        choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
        tool_choice_none = choice == "none"
        json_mode, json_schema = req.json_constraint()
        constrained = (
            json_mode or req.guided_choice is not None or req.guided_regex is not None or req.guided_grammar is not None
        )
        # Under an output constraint no call can be written (its tags are refused), so strict tools have no effect.
        allowed = choice.names() if isinstance(choice, AllowedToolsChoice) else None
        try:
            held = tools and not tool_choice_none and not constrained
            tool_schemas = held_tool_schemas(tools, allowed) if held else None
        except StrictToolError as exc:
            raise APIError(400, str(exc), f"tools.{exc.index}.function.parameters") from None
        force, tool_names = None, None
        # A forced name is written into the prompt unless its arguments are held: those need the name read by the
        # constraint (a name in the prompt leaves the constraint waiting for the next call).
        strict = {name for name, schema in (tool_schemas or {}).items() if schema is not None}
        if choice == "required":  # one of the offered tools, named by the model under a constraint
            names = tuple(dict.fromkeys(t["function"]["name"] for t in tools or []))
            one = len(names) == 1 and names[0] not in strict
            force, tool_names = (f"<tool_call>{names[0]}", None) if one else ("<tool_call>", names)
        elif isinstance(choice, NamedToolChoice):
            name = choice.function.name
            force, tool_names = (f"<tool_call>{name}", None) if name not in strict else ("<tool_call>", (name,))
        elif allowed is not None and choice.allowed_tools.mode == "required":
            force, tool_names = "<tool_call>", allowed
        if req.prompt_logprobs is not None and force is not None:
            # A forced call runs as two requests, the second over the prompt and the forced tokens.
            raise APIError(400, "prompt_logprobs cannot be combined with a forced tool_choice", "prompt_logprobs")
        if constrained and force is not None:
            field = (
                "response_format"
                if json_mode
                else "guided_choice"
                if req.guided_choice
                else "guided_regex"
                if req.guided_regex
                else "guided_grammar"
            )
            raise APIError(400, "an output constraint cannot be combined with a forced tool_choice", field)
        kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
        if req.documents is not None:
            kwargs.setdefault("documents", req.documents)
        if req.reasoning_effort is not None and "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = req.reasoning_effort != "none"
        messages = [m.for_template() for m in req.messages]
        prompt_text = backend.tokenizer.apply_chat_template(
            messages,
            None if tool_choice_none else tools,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            template=self._request_template(req),
            **kwargs,
        )
        prompt_ids = truncate_prompt(
            backend.tokenizer.encode(prompt_text, add_special_tokens=req.add_special_tokens),
            req.truncate_prompt_tokens,
            backend,
            req.truncation_side,
        )
        if req.prompt_logprobs is not None:
            check_prompt_logprobs(len(prompt_ids), s, "prompt_logprobs")
        thinking = prompt_text.rstrip().endswith(THINK_START)
        max_tokens = resolve_max_tokens(req.requested_max_tokens(), len(prompt_ids), backend, s)
        base = SamplingParams(
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
            seed=req.seed,
            n=1,
            stop=req.stop_list(),
            stop_token_ids=list(req.stop_token_ids or []),
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            min_tokens=min(req.min_tokens, max_tokens),
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            prompt_logprobs=req.prompt_logprobs,
            skip_special_tokens=False,  # the parsers need the <think>/<tool_call> tags in the text
            json_mode=json_mode,
            json_schema=json_schema,
            choice=tuple(req.guided_choice) if req.guided_choice is not None else None,
            regex=req.guided_regex,
            grammar=req.guided_grammar,
            # With thinking on, the model reasons freely (within the budget, if any) and the constraint starts after
            # </think>.
            reasoning_end_token=backend.tokenizer.token_to_id(THINK_END) if thinking else None,
            thinking_token_budget=self._thinking_budget(req) if thinking else None,
            priority=request_priority(req, s),
            cache_salt=req.cache_salt,
            tool_schemas=tool_schemas,
        )
        plans = []
        for i in range(req.n):
            seed = None if req.seed is None else req.seed + i
            # The prompt's logprobs are the response's, not a choice's: the first choice computes them alone.
            changes = {"seed": seed} | ({"prompt_logprobs": None} if i else {})
            params = base if seed == base.seed and not i else SamplingParams(**{**base.__dict__, **changes})
            plans.append(ChoicePlan(prompt_ids, params, thinking, force, tool_names))
        return PreparedChat(
            prompt_ids,
            plans,
            thinking,
            tools,
            tool_choice_none,
            req.parallel_tool_calls,
            (req.top_logprobs or 0) if req.logprobs else None,
            backend.model_name,
            req.prompt_logprobs,
            served_tier(req.service_tier),
            beam=self._beam(req, base, force) if req.use_beam_search else None,
            token_ids=req.return_token_ids,
            tokens_as_ids=req.return_tokens_as_token_ids,
            echo=req.echoed(),
            include_reasoning=req.include_reasoning,
            legacy_functions=req.functions is not None,
        )

    def _request_template(self, req: ChatCompletionRequest) -> str | None:
        """The request's own chat_template (vLLM's), where it sends one: refused unless the operator trusts them;
        one that does not compile is a 400 naming it rather than the messages."""
        if req.chat_template is None:
            return None
        if not self.settings.trust_request_chat_template:
            raise APIError(
                400,
                "this server does not take a request's chat_template (api.trust_request_chat_template)",
                "chat_template",
            )
        try:
            compile_chat_template(req.chat_template)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), "chat_template") from None
        return req.chat_template

    def _beam(self, req: ChatCompletionRequest, base: SamplingParams, force: str | None) -> BeamSettings:
        refused = {
            "logprobs": bool(req.logprobs),
            "tool_choice": force is not None,  # (a forced call is generated in two phases)
            "thinking_token_budget": base.thinking_token_budget is not None,
        }
        return beam_settings(req, base, self.backend.eos_token_ids, refused)

    # ------------------------------------------------------------------ non-streaming
    async def complete(self, prep: PreparedChat, events: AsyncIterator[ChoiceEvent]) -> ChatCompletionResponse:
        done = await collect(events, len(prep.plans))
        choices = []
        for i, c in enumerate(done):
            ev = c.final
            parsed = prep.parser().parse(c.text)
            calls = [
                ToolCallOut(id=call.id, function=FunctionCallOut(name=call.name, arguments=call.arguments))
                for call in parsed.tool_calls
            ]
            reason = prep.call_reason if calls else ev.finish_reason
            reasoning = parsed.reasoning if prep.include_reasoning else None
            message = AssistantMessage(
                content=prep.echo + (parsed.content or "") if prep.echo else parsed.content,
                reasoning=reasoning,
                reasoning_content=reasoning,
                tool_calls=None if prep.legacy_functions else calls or None,
                function_call=calls[0].function if prep.legacy_functions and calls else None,
            )
            lp = None
            if prep.top_logprobs is not None and self.token_text is not None:
                lp = chat_logprobs(self.token_text, c.logprobs, prep.top_logprobs, prep.tokens_as_ids)
            choices.append(
                ChatChoice(
                    index=i,
                    message=message,
                    logprobs=lp,
                    finish_reason=reason,
                    stop_reason=ev.stop_reason,
                    token_ids=c.token_ids if prep.token_ids else None,
                )
            )
        completion_tokens, cached = totals(done)
        usage = Usage(
            prompt_tokens=len(prep.prompt_ids),
            completion_tokens=completion_tokens,
            total_tokens=len(prep.prompt_ids) + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )
        scored = None
        if prep.prompt_logprobs is not None and done and done[0].prompt_logprobs is not None and self.token_text:
            scored = prompt_logprobs(self.token_text, done[0].prompt_logprobs, prep.prompt_logprobs)
        return ChatCompletionResponse(
            id=prep.request_id,
            created=prep.created,
            model=prep.model,
            choices=choices,
            usage=usage,
            prompt_logprobs=scored,
            service_tier=prep.service_tier,
            prompt_token_ids=prep.prompt_ids if prep.token_ids else None,
        )

    # ------------------------------------------------------------------ streaming
    def events(self, prep: PreparedChat) -> AsyncIterator[ChoiceEvent]:
        if prep.beam is not None:  # (the parsers read the <think> and <tool_call> tags: special tokens kept)
            return beam_events(self.backend, [prep.prompt_ids], [prep.beam], prep.request_id, False)
        return run_choices(self.backend, prep.plans, prep.request_id)

    async def stream(
        self, prep: PreparedChat, events: AsyncIterator[ChoiceEvent], include_usage: bool, continuous_usage: bool
    ) -> AsyncIterator[str]:
        """SSE lines for `events`, which the caller has primed so that early errors become a plain HTTP error."""
        n = len(prep.plans)
        streamers = [prep.parser().stream() for _ in range(n)]
        started = [False] * n
        pending_lp: list[list[Entry]] = [[] for _ in range(n)]
        pending_ids: list[list[int]] = [[] for _ in range(n)]  # a delta's tokens go with it (return_token_ids)
        called = [False] * n
        completion = [0] * n
        cached = 0

        def chunk(
            i: int,
            delta: dict[str, Any],
            finish: str | None = None,
            stop_reason: Any = None,
            logprobs: list[Entry] | None = None,
            token_ids: list[int] | None = None,
            first: bool = False,
        ) -> str:
            choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish is not None and stop_reason is not None:
                choice["stop_reason"] = stop_reason
            if logprobs and prep.top_logprobs is not None and self.token_text is not None:
                choice["logprobs"] = chat_logprobs(
                    self.token_text, logprobs, prep.top_logprobs, prep.tokens_as_ids
                ).model_dump()
            if prep.token_ids:
                choice["token_ids"] = token_ids or []
            body: dict[str, Any] = {
                "id": prep.request_id,
                "object": "chat.completion.chunk",
                "created": prep.created,
                "model": prep.model,
                "choices": [choice],
            }
            if prep.service_tier is not None:
                body["service_tier"] = prep.service_tier
            if first and prep.token_ids:
                body["prompt_token_ids"] = prep.prompt_ids
            if continuous_usage:
                body["usage"] = usage_dict()
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        def usage_dict() -> dict[str, Any]:
            total = sum(completion)
            return {
                "prompt_tokens": len(prep.prompt_ids),
                "completion_tokens": total,
                "total_tokens": len(prep.prompt_ids) + total,
                "prompt_tokens_details": {"cached_tokens": cached},
            }

        try:
            async for ev in events:
                i = ev.index
                completion[i] = ev.completion_tokens
                cached = max(cached, ev.cached_tokens)
                if not started[i]:
                    started[i] = True
                    yield chunk(i, {"role": "assistant", "content": ""}, first=True)
                    if prep.echo:
                        yield chunk(i, {"content": prep.echo})
                if ev.logprobs:
                    pending_lp[i] += ev.logprobs
                pending_ids[i] += ev.token_ids
                deltas = streamers[i].feed(ev.text) if ev.text else []
                if ev.finished:
                    if ev.error is not None or ev.finish_reason == "error":
                        raise APIError(500, ev.error or "generation failed", code="generation_failed")
                    deltas += streamers[i].finish()
                for d in deltas:
                    if d.tool_calls:
                        called[i] = True
                    delta = d.to_openai()
                    if prep.legacy_functions and "tool_calls" in delta:
                        delta["function_call"] = legacy_call_delta(delta.pop("tool_calls"))
                    if not prep.include_reasoning:
                        for key in ("reasoning", "reasoning_content"):
                            delta.pop(key, None)
                        if not delta:
                            continue  # (its logprobs and token ids go with the next delta sent)
                    yield chunk(i, delta, logprobs=pending_lp[i], token_ids=pending_ids[i])
                    pending_lp[i], pending_ids[i] = [], []
                if ev.finished:
                    reason = prep.call_reason if called[i] else ev.finish_reason
                    yield chunk(i, {}, reason, ev.stop_reason, logprobs=pending_lp[i], token_ids=pending_ids[i])
                    pending_lp[i], pending_ids[i] = [], []
            if include_usage:
                body = {
                    "id": prep.request_id,
                    "object": "chat.completion.chunk",
                    "created": prep.created,
                    "model": prep.model,
                    "choices": [],
                    "usage": usage_dict(),
                }
                if prep.service_tier is not None:
                    body["service_tier"] = prep.service_tier
                yield f"data: {json.dumps(body)}\n\n"
        except Exception as exc:  # after the 200 went out, an error travels as an SSE event
            api = to_api_error(exc) or APIError(500, "internal server error", code="internal_error")
            yield f"data: {json.dumps(error_body(api.status, api.message, api.param, api.code))}\n\n"
        yield "data: [DONE]\n\n"
