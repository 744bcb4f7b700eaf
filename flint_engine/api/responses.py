"""`POST /v1/responses`: OpenAI's Responses API on the chat path.

The request becomes a chat request (`responses_protocol`), runs as one choice through `ChatHandler`, and its output is
parsed as chat output is (thinking, content, GLM-4.7 tool calls) and returned as Responses output items: a
`reasoning` item (the thinking as `reasoning_text`), a `message` with `output_text`, and one `function_call` item a
call. Streaming sends the Responses event sequence (`response.created`, `response.output_item.added`, text and
argument deltas, `...done`, `response.completed`), each event numbered.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..parsers.reasoning import THINK_END
from ..parsers.tool_calls import TOOL_CALL_END, TOOL_CALL_START
from .backend import GenerationBackend
from .chat import ChatHandler, PreparedChat, chat_request_of, parsed_deltas
from .choices import ChoiceEvent, collect, totals
from .conversation_store import ConversationStore
from .errors import APIError, error_body, to_api_error
from .logprobs import Entry, TokenText, chat_logprobs
from .protocol import ChatCompletionRequest
from .response_store import ResponseStore, stored_items
from .responses_protocol import ResponsesRequest
from .settings import APISettings

log = logging.getLogger(__name__)

# The errors of an input too long for the context or the server's prompt limit (`limits.resolve_max_tokens`).
_TOO_LONG = ("context_length_exceeded", "prompt_too_long")


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class PreparedResponse:
    req: ResponsesRequest
    chat: PreparedChat
    response_id: str = field(default_factory=lambda: _item_id("resp"))
    own_items: list[dict[str, Any]] = field(default_factory=list)  # this turn's input items (stored with it)
    owner: str = ""
    stored: bool = False  # kept in the response store once finished
    conversation_id: str | None = None  # the conversation it reads and adds its turn to
    attempt: int = 0  # a background response's run (0 the first; more where a router that stopped left it)

    # The request's settings echoed in every response object.
    def envelope(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        req = self.req
        effort = req.reasoning_effort()
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.chat.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.chat.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "conversation": {"id": self.conversation_id} if self.conversation_id else None,
            "background": bool(req.background),
            "reasoning": {"effort": effort, "summary": None},
            "store": self.stored,
            "service_tier": self.chat.service_tier,
            "temperature": req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "top_p": req.top_p,
            "truncation": req.truncation or "disabled",
            "usage": usage,
            "user": req.user,
            "metadata": req.metadata or {},
        }


def _usage(prep: PreparedResponse, output_tokens: int, cached: int, reasoning_tokens: int) -> dict[str, Any]:
    prompt = len(prep.chat.prompt_ids)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt + output_tokens,
    }


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [_text_part(text, logprobs)] if status != "in_progress" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponsesHandler:
    def __init__(
        self,
        backend: GenerationBackend,
        settings: APISettings,
        store: ResponseStore | None = None,
        conversations: ConversationStore | None = None,
    ) -> None:
        self.chat = ChatHandler(backend, settings)
        self.backend = backend
        self.store = store  # where finished responses are kept (None: nowhere)
        self.conversations = conversations  # where conversations are kept (None: nowhere)

    def prepare(self, req: ResponsesRequest, owner: str = "") -> PreparedResponse:
        """`req` as the chat request it runs as, after the conversation it continues (`previous_response_id`, or the
        items of its `conversation`)."""
        own = stored_items(req.input_items())
        stored = self.store is not None and req.store is not False
        if req.background:
            why = None
            if self.store is None:
                why = "background responses are kept in the response store, which is off here (api.store_responses)"
            elif req.store is False:
                why = "background responses must be stored: leave store true"
            if why is not None:
                raise APIError(400, why, "background")
            if req.seed is None:
                # Kept with its request: a router that runs it again after its own stopped samples the same text.
                req = req.model_copy(update={"seed": random.getrandbits(63)})
        full = req
        if req.conversation is not None:
            if req.previous_response_id is not None:
                raise APIError(400, "conversation and previous_response_id cannot be used together", "conversation")
            if self.conversations is None:
                raise APIError(
                    400,
                    "conversation needs stored conversations, which this server does not keep"
                    " (api.store_responses is off): send the whole conversation in input",
                    "conversation",
                )
            items = self.conversations.items(req.conversation, owner, param="conversation")
            full = req.model_copy(update={"input": items + own})
        if req.previous_response_id is not None:
            if self.store is None:
                raise APIError(
                    400,
                    "previous_response_id needs stored responses, which this server does not keep"
                    " (api.store_responses is off): send the whole conversation in input",
                    "previous_response_id",
                )
            full = req.model_copy(update={"input": self.store.history(req.previous_response_id, owner) + own})
        chat = chat_request_of(full)
        try:
            prepared = self.chat.prepare(chat)
        except APIError as exc:
            if exc.param is not None and exc.param.startswith("tools.") and ".function." in exc.param:
                exc.param = exc.param.replace(".function.", ".", 1)  # this API's function tools are flat
            if req.truncation != "auto" or exc.code not in _TOO_LONG:
                raise
            prepared = self._truncated(chat, exc)
        return PreparedResponse(
            req, prepared, own_items=own, owner=owner, stored=stored, conversation_id=req.conversation
        )

    def _finish(self, prep: PreparedResponse, response: dict[str, Any], keep: bool) -> None:
        """A finished response's turn added to its conversation, and the response stored (if its request is and
        `keep`); a store that fails leaves it unstored, said so."""
        if prep.conversation_id is not None and self.conversations is not None:
            try:
                self.conversations.add_items(prep.conversation_id, prep.owner, prep.own_items + response["output"])
            except (OSError, APIError):  # (deleted meanwhile: a 404)
                log.exception("adding response %s to %s failed", prep.response_id, prep.conversation_id)
        if not keep or not prep.stored or self.store is None:
            return
        try:
            self.store.save(response, prep.own_items, prep.req.previous_response_id, prep.owner)
        except OSError:
            log.exception("storing response %s failed; answered without storing it", prep.response_id)
            response["store"] = False

    def _truncated(self, chat: ChatCompletionRequest, too_long: APIError) -> PreparedChat:
        """`truncation: "auto"`: the conversation without its oldest turns (a turn runs from a user message to the
        next), the instructions kept, the fewest dropped that make it fit; `too_long` again if even the last turn
        does not."""
        messages = list(chat.messages)
        lead = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), len(messages))
        system, turns = messages[:lead], messages[lead:]  # the instructions, then the conversation
        starts = [i for i, m in enumerate(turns) if m.role == "user"]
        for start in starts[1:]:
            try:
                return self.chat.prepare(chat.model_copy(update={"messages": system + turns[start:]}))
            except APIError as exc:
                if exc.code not in _TOO_LONG:
                    raise
        raise too_long

    def events(self, prep: PreparedResponse) -> AsyncIterator[ChoiceEvent]:
        return self.chat.events(prep.chat)

    def _thinking_tokens(self, prep: PreparedResponse) -> _ThinkingTokens:
        tok = self.backend.tokenizer
        return _ThinkingTokens(prep.chat.thinking, tok.token_to_id(THINK_END) if tok is not None else None)

    def _message_logprobs(self, prep: PreparedResponse) -> _MessageLogprobs:
        return _MessageLogprobs(prep.req.output_logprobs(), prep.chat.thinking, self.backend.tokenizer)

    async def complete(
        self, prep: PreparedResponse, events: AsyncIterator[ChoiceEvent], keep: bool = True
    ) -> dict[str, Any]:
        """The finished response object (its turn added to its conversation; stored, if its request is and
        `keep`)."""
        thinking, logprobs = self._thinking_tokens(prep), self._message_logprobs(prep)
        [done] = await collect(thinking.count(logprobs.watch(events)), 1)
        parsed = prep.chat.parser().parse(done.text)
        status = "incomplete" if done.final.finish_reason == "length" else "completed"
        output = []
        if parsed.reasoning:
            output.append(_reasoning_item(_item_id("rs"), parsed.reasoning, "completed"))
        if parsed.content:
            output.append(_message_item(_item_id("msg"), parsed.content, "completed", logprobs.all))
        for call in parsed.tool_calls:
            output.append(_call_item(_item_id("fc"), call.id, call.name, call.arguments, "completed"))
        if status == "incomplete" and output and output[-1]["type"] != "function_call":
            output[-1]["status"] = "incomplete"  # the item the limit cut, as the stream closes it
        completion, cached = totals([done])
        response = prep.envelope(status, output, _usage(prep, completion, cached, thinking.tokens))
        self._finish(prep, response, keep)
        return response

    async def stream(
        self, prep: PreparedResponse, events: AsyncIterator[ChoiceEvent], include_usage: bool, continuous: bool
    ) -> AsyncIterator[str]:
        """The Responses event stream for `events` (primed by the caller) as server-sent events."""
        async for event in self.stream_events(prep, events):
            yield sse(event)

    async def stream_events(
        self, prep: PreparedResponse, events: AsyncIterator[ChoiceEvent], queued: bool = False, keep: bool = True
    ) -> AsyncIterator[dict[str, Any]]:
        """The Responses events for `events` (primed by the caller), numbered; an error after the first is an `error`
        event followed by `response.failed`. `queued`: a background response's, whose `response.created` and
        `response.queued` went out as it was queued (`queued_events`). The final response's turn is added to its
        conversation, and it is stored if its request is and `keep`."""
        emitter = _EventStream(prep, self._message_logprobs(prep))
        if queued:
            emitter.seq = len(queued_events(prep))
        else:
            yield emitter.event("response.created", response=prep.envelope("in_progress", [], None))
        yield emitter.event("response.in_progress", response=prep.envelope("in_progress", [], None))
        completion, cached, finish = 0, 0, None
        try:
            thinking = self._thinking_tokens(prep)
            async for ev, deltas in parsed_deltas(prep.chat, thinking.count(emitter.logprobs.watch(events))):
                completion, cached = ev.completion_tokens, max(cached, ev.cached_tokens)
                finish = ev.finish_reason if ev.finished else finish
                for d in deltas:
                    for event in emitter.delta(d.reasoning, d.content, d.tool_calls):
                        yield event
            status = "incomplete" if finish == "length" else "completed"
            for event in emitter.close_item(status):
                yield event
            usage = _usage(prep, completion, cached, thinking.tokens)
            final = prep.envelope(status, emitter.output, usage)
            self._finish(prep, final, keep)  # before the last event: a client may ask for it as soon as it has that
            yield emitter.event(f"response.{status}", response=final)
        except Exception as exc:  # after the first event went out, an error travels as events
            api = to_api_error(exc) or APIError(500, "internal server error", code="internal_error")
            body = error_body(api.status, api.message, api.param, api.code)["error"]
            yield emitter.event("error", code=api.code, message=api.message, param=api.param)
            failed = prep.envelope("failed", emitter.output, None)
            failed["error"] = {"code": body.get("code") or "server_error", "message": api.message}
            yield emitter.event("response.failed", response=failed)


def queued_events(prep: PreparedResponse) -> list[dict[str, Any]]:
    """A streamed background response's first events, sent as it is queued (then `stream_events(queued=True)`)."""
    queued = prep.envelope("queued", [], None)
    return [
        {"type": "response.created", "sequence_number": 0, "response": queued},
        {"type": "response.queued", "sequence_number": 1, "response": queued},
    ]


def sse(event: dict[str, Any]) -> str:
    """One Responses event as a server-sent event."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class _ThinkingTokens:
    """Counts a choice's sampled tokens before its `</think>` (all of them if the limit cut the thinking; none with
    thinking off) from the events' token ids, as the events pass."""

    def __init__(self, thinking: bool, end_id: int | None) -> None:
        self.open = thinking and end_id is not None
        self.end_id = end_id
        self.tokens = 0

    async def count(self, events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[ChoiceEvent]:
        async for ev in events:
            for t in ev.token_ids if self.open else ():
                if t == self.end_id:
                    self.open = False
                    break
                self.tokens += 1
            yield ev


class _MessageLogprobs:
    """The output text's token logprobs, in the Responses API's shape, from the events' entries as they pass: the
    tokens outside the thinking (up to `</think>`, or a tool call opened inside it, as the reasoning parser reads it)
    and outside tool calls, special tokens left out. `all` for the whole text, `take_pending` for a delta's."""

    def __init__(self, top: int | None, thinking: bool, tokenizer: Any) -> None:
        self.top = top
        ids = tokenizer.token_to_id if tokenizer is not None else (lambda _: None)
        self.think_end, self.call_start, self.call_end = ids(THINK_END), ids(TOOL_CALL_START), ids(TOOL_CALL_END)
        self.special = tokenizer.special_token_ids if tokenizer is not None else frozenset()
        self.text = TokenText(tokenizer) if tokenizer is not None else None
        self.in_thinking = thinking and self.think_end is not None
        self.in_call = False
        self.all: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []

    async def watch(self, events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[ChoiceEvent]:
        async for ev in events:
            if self.top is not None and self.text is not None:
                for entry in ev.logprobs or ():
                    self._take(entry)
            yield ev

    def _take(self, entry: Entry) -> None:
        token = entry[0]
        if token == self.call_start:
            self.in_thinking, self.in_call = False, True
        elif self.in_thinking:
            self.in_thinking = token != self.think_end
        elif self.in_call:
            self.in_call = token != self.call_end
        elif token not in self.special:
            [shaped] = chat_logprobs(self.text, [entry], self.top or 0).model_dump()["content"]  # type: ignore[arg-type]
            self.all.append(shaped)
            self.pending.append(shaped)

    def take_pending(self) -> list[dict[str, Any]]:
        out, self.pending = self.pending, []
        return out


class _EventStream:
    """Numbers events and tracks the output item being written (reasoning, message, or a function call)."""

    def __init__(self, prep: PreparedResponse, logprobs: _MessageLogprobs) -> None:
        self.prep = prep
        self.logprobs = logprobs
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: str | None = None  # "reasoning", "message" or "call"
        self.text = ""
        self.call_index: int | None = None

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return body

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1}

    def _open(self, kind: str, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self.open, self.text = kind, ""
        out = [self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)]
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            out.append(self.event("response.content_part.added", **self._where(), content_index=0, part=part))
        elif kind == "message":
            part = _text_part("")
            out.append(self.event("response.content_part.added", **self._where(), content_index=0, part=part))
        return out

    def close_item(self, status: str = "completed") -> list[dict[str, Any]]:
        if self.open is None:
            return []
        item, where, out = self.output[-1], self._where(), []
        if self.open == "reasoning":
            done = _reasoning_item(item["id"], self.text, status)
            part = done["content"][0]
            out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=self.text))
            out.append(self.event("response.content_part.done", **where, content_index=0, part=part))
        elif self.open == "message":
            done = _message_item(item["id"], self.text, status, self.logprobs.all)
            all_lp = self.logprobs.all
            out.append(
                self.event("response.output_text.done", **where, content_index=0, text=self.text, logprobs=all_lp)
            )
            out.append(self.event("response.content_part.done", **where, content_index=0, part=done["content"][0]))
        else:
            done = _call_item(item["id"], item["call_id"], item["name"], self.text, "completed")
            out.append(self.event("response.function_call_arguments.done", **where, arguments=self.text))
        self.output[-1] = done
        out.append(self.event("response.output_item.done", output_index=where["output_index"], item=done))
        self.open = None
        return out

    def delta(
        self, reasoning: str | None, content: str | None, tool_calls: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if reasoning:
            if self.open != "reasoning":
                out += self.close_item()
                out += self._open("reasoning", _reasoning_item(_item_id("rs"), "", "in_progress") | {"content": []})
            self.text += reasoning
            out.append(self.event("response.reasoning_text.delta", **self._where(), content_index=0, delta=reasoning))
        if content:
            if self.open != "message":
                out += self.close_item()
                out += self._open("message", _message_item(_item_id("msg"), "", "in_progress"))
            self.text += content
            lp = self.logprobs.take_pending()
            out.append(
                self.event("response.output_text.delta", **self._where(), content_index=0, delta=content, logprobs=lp)
            )
        for call in tool_calls or []:
            index = call.get("index", 0)
            function = call.get("function") or {}
            if self.open != "call" or self.call_index != index:
                out += self.close_item()
                item = _call_item(_item_id("fc"), call.get("id") or "", function.get("name") or "", "", "in_progress")
                out += self._open("call", item)
                self.call_index = index
            fragment = function.get("arguments") or ""
            if fragment:
                self.text += fragment
                out.append(self.event("response.function_call_arguments.delta", **self._where(), delta=fragment))
        return out
