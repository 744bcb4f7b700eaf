"""The FastAPI app (OpenAI-compatible, plus Anthropic's Messages API), usable alone (one process) or as Ray Serve's
ingress."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from .anthropic_batches import add_message_batch_routes
from .anthropic_messages import MessagesHandler, anthropic_error
from .anthropic_protocol import MessagesRequest
from .api_metrics import api_snapshot
from .auth import APIKeys
from .backend import GenerationBackend
from .background_responses import BackgroundResponses
from .batch_jobs import INTERNAL_OWNER_HEADER, INTERNAL_TOKEN_HEADER
from .batch_routes import add_batch_routes, batch_jobs, body_cap
from .chat import ChatHandler
from .choices import primed
from .completions import CompletionHandler
from .conversations_routes import add_conversation_routes
from .errors import APIError, error_response, install_error_handlers, to_api_error, validation_error
from .event_stream import event_stream
from .ownership import key_salt, request_owner
from .prometheus import render
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from .responses import ResponsesHandler
from .responses_protocol import ResponsesRequest
from .responses_routes import add_response_routes, conversation_store, response_store
from .settings import APISettings

log = logging.getLogger("flint_engine.api")

PUBLIC_PATHS = {"/health"}  # the probe answers without a key


def version() -> str:
    try:
        return metadata.version("flint-serve")
    except metadata.PackageNotFoundError:
        return "0+unknown"


async def _until_disconnect(request: Request, work: Awaitable[Any], poll_s: float) -> Any:
    """Run `work`, cancelling it (which aborts generation) if the client goes away first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()


class GateMiddleware:
    """Pure ASGI (so disconnects still reach the handlers): API keys, body-size cap, per-key concurrency, request
    ids and one log line per request, which never contains prompt or completion text."""

    def __init__(self, app: Any, settings: APISettings, keys: APIKeys, internal_token: str | None = None) -> None:
        self.app = app
        self.settings = settings
        self.keys = keys
        self.internal_token = internal_token  # a Batch API job's requests, in this process, carry it
        self.in_flight: dict[str, int] = {}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        s = self.settings
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        rid = headers.get("x-request-id") or uuid.uuid4().hex
        path, method = scope.get("path", ""), scope.get("method", "")
        start = time.monotonic()
        status = {"code": 0}

        async def refuse(code: int, message: str, error_code: str, extra: dict[str, str] | None = None) -> None:
            """The gate's refusal, in the shape the route's clients read (Anthropic's on /v1/messages)."""
            if path.startswith("/v1/messages"):
                response = anthropic_error(APIError(code, message, code=error_code, headers=extra))
            else:
                response = error_response(code, message, code=error_code, headers=extra)
            response.headers["x-request-id"] = rid
            status["code"] = response.status_code
            await response(scope, receive, send)

        key_id = None
        token = headers.get(INTERNAL_TOKEN_HEADER, "")
        internal = bool(self.internal_token and token) and hmac.compare_digest(token, self.internal_token or "")
        if internal:  # a batch's request: its owner's, admitted when the batch was
            key_id = headers.get(INTERNAL_OWNER_HEADER, "")
        elif self.keys.enabled and path not in PUBLIC_PATHS and (path != "/metrics" or s.protect_metrics):
            auth = headers.get("authorization", "")
            # Anthropic's clients send the key as x-api-key.
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "").strip()
            key = self.keys.check(token) if token else None
            if key is None:
                await refuse(
                    401,
                    "missing or invalid API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')",
                    "invalid_api_key",
                    {"WWW-Authenticate": "Bearer"},
                )
                log.info("request %s %s %s -> 401", rid, method, path)
                return
            key_id = hashlib.sha256(key.encode()).hexdigest()[:12]
        # The request's owner (its key's hash, "" without keys): the Batch API's files and batches are the owner's.
        scope.setdefault("state", {})["owner"] = key_id or ""
        length = headers.get("content-length", "")
        cap = body_cap(s, path)
        if length.isdigit() and int(length) > cap:
            await refuse(413, f"request body is larger than {cap} bytes", "request_too_large")
            return
        limited = key_id is not None and not internal and s.max_concurrent_per_key is not None and method == "POST"
        if limited:
            if self.in_flight.get(key_id, 0) >= s.max_concurrent_per_key:  # type: ignore[arg-type,operator]
                await refuse(
                    429,
                    f"this API key already has {s.max_concurrent_per_key} requests in flight",
                    "concurrency_limit_exceeded",
                    {"Retry-After": "1"},
                )
                return
            self.in_flight[key_id] = self.in_flight.get(key_id, 0) + 1  # type: ignore[index]

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if limited:
                self.in_flight[key_id] -= 1  # type: ignore[index]  # a stream holds its slot to the end
            log.info(
                "request %s %s %s -> %d in %.3f s%s",
                rid,
                method,
                path,
                status["code"],
                time.monotonic() - start,
                f" key {key_id}" if key_id else "",
            )


def build_app(backend: GenerationBackend, settings: APISettings | None = None) -> FastAPI:
    settings = settings or APISettings(model_name=backend.model_name)
    jobs = batch_jobs(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.batch_dir is not None:  # a stopped process's batches go on now, not at a later Batch API call
            jobs.resume()
        yield

    app = FastAPI(title="Flint Serve", version=version(), docs_url=None, redoc_url=None, lifespan=lifespan)
    install_error_handlers(app)
    chat = ChatHandler(backend, settings)
    completions = CompletionHandler(backend, settings)
    stored_responses = response_store(settings)
    responses = ResponsesHandler(backend, settings, stored_responses, conversation_store(stored_responses, settings))
    background = None
    if responses.store is not None:
        background = BackgroundResponses(
            responses, responses.store, settings.max_background_responses, settings.max_concurrent_per_key
        )
    messages = MessagesHandler(backend, settings)
    keys = APIKeys(settings.api_keys, settings.api_key_file)
    app.state.backend, app.state.settings, app.state.keys = backend, settings, keys

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )

    jobs.app = app  # a batch's requests go through the whole app, this gate included
    app.state.batch_jobs = jobs
    app.state.background = background  # background responses (None without stored responses)
    app.add_middleware(GateMiddleware, settings=settings, keys=keys, internal_token=jobs.token)

    async def _body(request: Request) -> Any:
        """The JSON body, read with a hard size cap (chunked uploads have no Content-Length)."""
        cap = body_cap(settings, request.url.path)
        size = 0
        parts = []
        async for part in request.stream():
            size += len(part)
            if size > cap:
                raise APIError(413, f"request body is larger than {cap} bytes", code="request_too_large")
            parts.append(part)
        try:
            return json.loads(b"".join(parts))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "the request body is not valid JSON") from None

    def _parse(model: type, data: Any) -> Any:
        from pydantic import ValidationError

        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc) from None

    def _log_prompt(rid: str, what: Any) -> None:
        if settings.log_prompts:
            log.info("request %s body (log_prompts on): %s", rid, json.dumps(what, ensure_ascii=False)[:4000])

    async def _generate(
        request: Request,
        handler: ChatHandler | CompletionHandler | ResponsesHandler | MessagesHandler,
        request_type: type,
        exclude_none: bool,
        prepare: Callable[[Any], Any] | None = None,
        answer_now: Callable[[Any, Any], dict[str, Any] | Response | None] | None = None,
    ) -> Response:
        """One generation request: parsed, prepared (by `prepare` if given, else the handler's), then answered by
        `answer_now` if it gives an answer (a background response, queued), else streamed as server-sent events or
        answered whole (the latter abandoned if the client disconnects)."""
        data = await _body(request)
        _log_prompt(request.headers.get("x-request-id", "-"), data)
        owner = request_owner(request) if settings.isolate_prefix_cache else ""

        def parsed_and_prepared() -> tuple[Any, Any]:
            req = _parse(request_type, data)
            if owner:
                req.cache_salt = key_salt(owner, req.cache_salt)
            return req, (prepare or handler.prepare)(req)

        # In a worker thread: templating and tokenizing a long prompt takes a while (~1.5 s for 2 MB of text), and the
        # tokenizer lets go of the GIL meanwhile, so the loop goes on answering other requests.
        req, prep = await asyncio.to_thread(parsed_and_prepared)
        if answer_now is not None and (now := answer_now(req, prep)) is not None:
            return now if isinstance(now, Response) else JSONResponse(now)
        if req.stream:
            events = await primed(handler.events(prep))
            opts = req.stream_options
            include_usage = bool(getattr(opts, "include_usage", False))
            continuous = bool(getattr(opts, "continuous_usage_stats", False))
            return event_stream(handler.stream(prep, events, include_usage, continuous))  # type: ignore[arg-type]

        async def run() -> Response:
            result = await handler.complete(prep, handler.events(prep))  # type: ignore[arg-type]
            if isinstance(result, dict):  # the Responses and Messages APIs' objects, built as their clients read them
                return JSONResponse(result)
            return JSONResponse(result.model_dump(exclude_none=exclude_none))

        return await _until_disconnect(request, run(), settings.disconnect_poll_s)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat, ChatCompletionRequest, exclude_none=True)

    @app.post("/v1/completions")
    async def text_completions(request: Request) -> Response:
        return await _generate(request, completions, CompletionRequest, exclude_none=False)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        owner = request_owner(request)  # a stored response is its key's alone
        prepare = functools.partial(responses.prepare, owner=owner)

        def queued(req: ResponsesRequest, prep: Any) -> dict[str, Any] | Response | None:
            # `prepare` refused a background request without a store, so `background` is there when asked for.
            if not req.background or background is None:
                return None
            answer = background.start(prep)
            if not req.stream:
                return answer
            return event_stream(background.follow(prep.response_id, owner))

        return await _generate(
            request, responses, ResponsesRequest, exclude_none=False, prepare=prepare, answer_now=queued
        )

    @app.post("/v1/messages")
    async def anthropic_create_message(request: Request) -> Response:
        try:
            return await _generate(request, messages, MessagesRequest, exclude_none=False)
        except Exception as exc:  # Anthropic's clients read errors in Anthropic's shape
            api = to_api_error(exc)
            if api is None:
                raise
            return anthropic_error(api)

    @app.post("/v1/messages/count_tokens")
    async def anthropic_count_tokens(request: Request) -> Response:
        try:
            data = await _body(request)
            if isinstance(data, dict):
                data = {**data, "max_tokens": 1}  # counting needs no output budget (nor fails on a large one)
            return JSONResponse(await asyncio.to_thread(lambda: messages.count_tokens(_parse(MessagesRequest, data))))
        except APIError as exc:
            return anthropic_error(exc)

    add_batch_routes(app, jobs, _body, _parse, settings)
    add_message_batch_routes(app, jobs, _body, _parse)

    add_response_routes(app, responses.store, background)
    add_conversation_routes(app, responses.conversations, _body, _parse)

    def _card() -> ModelCard:
        return ModelCard(id=backend.model_name, root=backend.model_name, max_model_len=backend.max_model_len)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[_card()])

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        if model_id != backend.model_name:
            raise APIError(404, f"The model '{model_id}' does not exist.", "model", "model_not_found")
        return _card()

    @app.get("/health")
    async def health() -> Response:
        ok, why = await backend.check_health()
        if ok:
            return JSONResponse({"status": "ok"})
        return error_response(503, f"unhealthy: {why}", code="unhealthy")

    @app.get("/replicas")
    async def replicas() -> dict[str, Any]:
        """The engines behind this API: id, process, device (e.g. cuda:0 and the GPU's name), health and load."""
        return {"object": "list", "data": await backend.replicas()}

    @app.get("/version")
    async def get_version() -> dict[str, str]:
        return {"version": version()}

    @app.get("/metrics")
    async def metrics() -> Response:
        body = render(await backend.metrics_snapshots(), api_snapshot(app.state))
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        data = await _body(request)
        return await asyncio.to_thread(lambda: _tokenized(_parse(TokenizeRequest, data)))

    def _tokenized(req: TokenizeRequest) -> dict[str, Any]:
        tok = backend.tokenizer
        if tok is None:
            raise APIError(400, "this checkpoint has no tokenizer")
        if req.model is not None and req.model != backend.model_name:
            raise APIError(404, f"The model '{req.model}' does not exist.", "model", "model_not_found")
        if req.messages is not None:
            text = tok.apply_chat_template(
                [m.for_template() for m in req.messages],
                None,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                **(req.chat_template_kwargs or {}),
            )
        else:
            text = req.prompt or ""
        ids = tok.encode(text, add_special_tokens=req.add_special_tokens)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": backend.max_model_len, "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = [tok.id_to_token(i) for i in ids]
        return out

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        """The tokenizer's special tokens and chat template, as vLLM's endpoint of that name answers (clients such
        as lm-evaluation-harness's remote tokenizer read it, then call /tokenize and /detokenize)."""
        tok = backend.tokenizer
        if tok is None:
            raise APIError(400, "this checkpoint has no tokenizer")
        return {
            "tokenizer_class": "FlintTokenizer",
            "vocab_size": tok.vocab_size,
            "model_max_length": backend.max_model_len,
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "pad_token": tok.pad_token,
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "chat_template": tok.chat_template,
        }

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, str]:
        req: DetokenizeRequest = _parse(DetokenizeRequest, await _body(request))
        tok = backend.tokenizer
        if tok is None:
            raise APIError(400, "this checkpoint has no tokenizer")
        bad = next((t for t in req.tokens if not 0 <= t < tok.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary of {tok.vocab_size}", "tokens")
        return {"prompt": tok.decode(req.tokens)}

    return app
