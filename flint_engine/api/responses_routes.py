"""The routes of stored responses (`GET` and `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`,
`POST /v1/responses/{id}/cancel` and `GET /v1/responses/{id}?stream=true` of a background one), and the store they
read (`response_store`), made when `api.store_responses` is on."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from .background_responses import BackgroundResponses
from .conversation_store import ConversationStore
from .errors import APIError
from .event_stream import event_stream
from .list_page import in_order, page
from .ownership import request_owner
from .response_store import ResponseStore
from .settings import APISettings


def response_store(settings: APISettings) -> ResponseStore | None:
    """The store of `settings` (under `api.responses_dir`, else a temporary directory removed at exit), or None when
    responses are not stored."""
    if not settings.store_responses:
        return None
    root = settings.responses_dir
    if root is None:  # this process's alone: the next start makes another
        root = tempfile.mkdtemp(prefix="flint-responses-")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    return ResponseStore(root, settings.response_ttl_s, settings.max_stored_response_bytes)


def conversation_store(responses: ResponseStore | None, settings: APISettings) -> ConversationStore | None:
    """The conversations kept beside the stored responses (`<responses dir>/conversations`), None without them."""
    if responses is None:
        return None
    return ConversationStore(
        responses.root / "conversations", settings.response_ttl_s, settings.max_stored_response_bytes
    )


def add_response_routes(app: FastAPI, store: ResponseStore | None, background: BackgroundResponses | None) -> None:
    def stored() -> ResponseStore:
        if store is None:
            raise APIError(
                404, "this server stores no responses (api.store_responses is off)", "response_id", "response_not_found"
            )
        return store

    @app.get("/v1/responses/{response_id}", response_model=None)
    async def get_response(
        request: Request, response_id: str, stream: bool = False, starting_after: int = -1
    ) -> dict[str, Any] | StreamingResponse:
        """The response; with `stream`, a streamed background response's events after `starting_after` (all of
        them by default), those sent already and then the rest as they come."""
        if background is not None:
            background.take_over_stale()  # (a router that restarted runs its stopped responses again)
        if not stream:
            return stored().response(response_id, request_owner(request))
        stored()
        assert background is not None  # made with the store
        return event_stream(background.follow(response_id, request_owner(request), starting_after))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
        return stored().delete(response_id, request_owner(request))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> dict[str, Any]:
        stored()
        assert background is not None  # made with the store
        return background.cancel(response_id, request_owner(request))

    @app.get("/v1/responses/{response_id}/input_items")
    async def response_input_items(
        request: Request, response_id: str, limit: int = 20, after: str | None = None, order: str = "desc"
    ) -> dict[str, Any]:
        return page(in_order(stored().input_items(response_id, request_owner(request)), order), limit, after, 100)
