"""One page of a list in OpenAI's shape (`limit`, `after`, `order`; `first_id`, `last_id`, `has_more`)."""

from __future__ import annotations

from typing import Any

from .errors import APIError


def page(found: list[dict[str, Any]], limit: int, after: str | None, most: int) -> dict[str, Any]:
    """Up to `limit` (1 to `most`) of the objects `found` after the one with id `after`."""
    if not 1 <= limit <= most:
        raise APIError(400, f"limit must be between 1 and {most}, got {limit}", "limit")
    if after is not None:
        ids = [item["id"] for item in found]
        found = found[ids.index(after) + 1 :] if after in ids else []
    chosen = found[:limit]
    return {
        "object": "list",
        "data": chosen,
        "first_id": chosen[0]["id"] if chosen else None,
        "last_id": chosen[-1]["id"] if chosen else None,
        "has_more": len(found) > limit,
    }


def in_order(found: list[dict[str, Any]], order: str, oldest_first: bool = True) -> list[dict[str, Any]]:
    """`found` (oldest first, or newest first if not `oldest_first`) in the `order` a list call asked: "asc" (oldest
    first) or "desc"."""
    if order not in ("asc", "desc"):
        raise APIError(400, f"order must be 'asc' or 'desc', got {order!r}", "order")
    return found if (order == "asc") == oldest_first else found[::-1]
