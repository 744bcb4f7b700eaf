"""Conversations of OpenAI's Conversations API (`/v1/conversations`, and `conversation` on `POST /v1/responses`).

    <root>/<conversation id>.json    the conversation object (id, created_at, metadata) and its owner; the file's
                                     last write is the conversation's last use (its expiry counts from there)
    <root>/<conversation id>.items   its items, one JSON object a line, appended as they come (`{"item": ...}`), and
                                     the removal of one (`{"deleted": <item id>}`)

Appending lines (never rewriting the file) lets routers sharing the directory add turns to one conversation at once
without losing each other's. Conversations belong to the API key that made them, as stored responses do; they expire
`ttl_s` after their last use, and past `max_bytes` the least recently used go first (swept on a thread at most once
once a minute as items are added).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from .errors import APIError
from .json_files import write_json
from .record_sweep import SweptRecords
from .response_store import stored_items


def _not_found(conversation_id: str, param: str = "conversation_id") -> APIError:
    return APIError(404, f"Conversation with id '{conversation_id}' not found.", param, "conversation_not_found")


class ConversationStore(SweptRecords):
    beside = (".items",)
    kind = "conversations"

    def _record(self, conversation_id: str, owner: str, param: str = "conversation_id") -> dict[str, Any]:
        found = self._owned(conversation_id, owner)
        if found is None:
            raise _not_found(conversation_id, param)
        return found[0]

    @staticmethod
    def _public(record: dict[str, Any]) -> dict[str, Any]:
        return {k: record[k] for k in ("id", "object", "created_at", "metadata")}

    def create(self, owner: str, items: list[dict[str, Any]], metadata: dict[str, str] | None) -> dict[str, Any]:
        """A new conversation holding `items` (as `stored_items` keeps them)."""
        conversation_id = f"conv_{uuid.uuid4().hex}"
        record = {
            "id": conversation_id,
            "object": "conversation",
            "created_at": int(self.clock()),
            "metadata": metadata or {},
            "owner": owner,
        }
        self._append(conversation_id, [{"item": item} for item in stored_items(items)])
        write_json(self._path(conversation_id), record)
        self.maybe_sweep()
        return self._public(record)

    def conversation(self, conversation_id: str, owner: str) -> dict[str, Any]:
        return self._public(self._record(conversation_id, owner))

    def update(self, conversation_id: str, owner: str, metadata: dict[str, str] | None) -> dict[str, Any]:
        record = self._record(conversation_id, owner)
        record["metadata"] = metadata or {}
        write_json(self._path(conversation_id), record)
        return self._public(record)

    def delete(self, conversation_id: str, owner: str) -> dict[str, Any]:
        self._record(conversation_id, owner)
        self._remove(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def items(self, conversation_id: str, owner: str, param: str = "conversation_id") -> list[dict[str, Any]]:
        """The conversation's items, oldest first (`param`: the request field that named it, for a 404)."""
        self._record(conversation_id, owner, param)
        try:
            lines = self._path(conversation_id).with_suffix(".items").read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:  # deleted meanwhile
            raise _not_found(conversation_id, param) from None
        kept: list[dict[str, Any]] = []
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line another router is writing
                continue
            if "item" in entry:
                kept.append(entry["item"])
            else:
                kept = [item for item in kept if item["id"] != entry.get("deleted")]
        return kept

    def add_items(self, conversation_id: str, owner: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Append `items` (ids given to those without) and return them as kept."""
        self._record(conversation_id, owner)
        added = stored_items(items)
        self._append(conversation_id, [{"item": item} for item in added])
        self._used(conversation_id)
        return added

    def item(self, conversation_id: str, owner: str, item_id: str) -> dict[str, Any]:
        for item in self.items(conversation_id, owner):
            if item["id"] == item_id:
                return item
        raise APIError(404, f"Item with id '{item_id}' not found.", "item_id", "item_not_found")

    def delete_item(self, conversation_id: str, owner: str, item_id: str) -> dict[str, Any]:
        """Remove an item; returns the conversation."""
        self.item(conversation_id, owner, item_id)
        self._append(conversation_id, [{"deleted": item_id}])
        self._used(conversation_id)
        return self.conversation(conversation_id, owner)

    def _append(self, conversation_id: str, entries: list[dict[str, Any]]) -> None:
        # One write in append mode: the lines of routers adding at once do not overwrite each other.
        lines = "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries)
        with self._path(conversation_id).with_suffix(".items").open("a", encoding="utf-8") as f:
            f.write(lines)

    def _used(self, conversation_id: str) -> None:
        """Its expiry counts from now."""
        now = self.clock()
        os.utime(self._path(conversation_id), (now, now))
        self.maybe_sweep()
