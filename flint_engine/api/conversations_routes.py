"""OpenAI's Conversations API (`/v1/conversations` and its items) on the conversation store (`conversation_store`),
there when `api.store_responses` is on; `POST /v1/responses` with `conversation` reads and extends one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from .chat import chat_request_of
from .conversation_store import ConversationStore
from .errors import APIError
from .list_page import in_order, page
from .metadata import Metadata
from .ownership import request_owner
from .responses_protocol import ResponsesRequest

# As OpenAI: at most this many items added a call.
MAX_ITEMS_A_CALL = 20


class ConversationCreate(BaseModel):
    items: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_ITEMS_A_CALL)
    metadata: Metadata = None


class ConversationUpdate(BaseModel):
    metadata: Metadata


class ItemsCreate(BaseModel):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS_A_CALL)


def checked_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` if each is an input item this server can run (as `input` of a response), else a 400 naming it."""
    if items:
        chat_request_of(ResponsesRequest.model_validate({"input": items}))
    return items


def add_conversation_routes(
    app: FastAPI,
    store: ConversationStore | None,
    body: Callable[[Request], Awaitable[Any]],
    parse: Callable[[type, Any], Any],
) -> None:
    """Add the routes; `body` reads a JSON body and `parse` validates it into a model as the other routes do."""

    def kept() -> ConversationStore:
        if store is None:
            raise APIError(
                404,
                "this server keeps no conversations (api.store_responses is off)",
                "conversation_id",
                "conversation_not_found",
            )
        return store

    @app.post("/v1/conversations")
    async def create_conversation(request: Request) -> dict[str, Any]:
        conversations = kept()
        req = parse(ConversationCreate, await body(request))
        return conversations.create(request_owner(request), checked_items(req.items or []), req.metadata)

    @app.get("/v1/conversations/{conversation_id}")
    async def get_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        return kept().conversation(conversation_id, request_owner(request))

    @app.post("/v1/conversations/{conversation_id}")
    async def update_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        conversations = kept()
        req = parse(ConversationUpdate, await body(request))
        return conversations.update(conversation_id, request_owner(request), req.metadata)

    @app.delete("/v1/conversations/{conversation_id}")
    async def delete_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        return kept().delete(conversation_id, request_owner(request))

    @app.get("/v1/conversations/{conversation_id}/items")
    async def list_items(
        request: Request, conversation_id: str, limit: int = 20, after: str | None = None, order: str = "desc"
    ) -> dict[str, Any]:
        return page(in_order(kept().items(conversation_id, request_owner(request)), order), limit, after, 100)

    @app.post("/v1/conversations/{conversation_id}/items")
    async def create_items(request: Request, conversation_id: str) -> dict[str, Any]:
        conversations = kept()
        req = parse(ItemsCreate, await body(request))
        added = conversations.add_items(conversation_id, request_owner(request), checked_items(req.items))
        return page(added, len(added), None, MAX_ITEMS_A_CALL)

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}")
    async def get_item(request: Request, conversation_id: str, item_id: str) -> dict[str, Any]:
        return kept().item(conversation_id, request_owner(request), item_id)

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}")
    async def delete_item(request: Request, conversation_id: str, item_id: str) -> dict[str, Any]:
        return kept().delete_item(conversation_id, request_owner(request), item_id)
