"""Whose objects a request sees (Batch API files and batches, stored responses) and whose prefix-cache blocks it may
share: its API key's hash, as the gate put it in the request's state ("" without keys)."""

from __future__ import annotations

from fastapi import Request


def request_owner(request: Request) -> str:
    return getattr(request.state, "owner", "")


def key_salt(owner: str, salt: str | None) -> str:
    """The prefix-cache salt of a request of `owner` (with `api.isolate_prefix_cache`): the owner's, joined with the
    request's own where it names one, so no two keys' requests share cached blocks."""
    return f"key:{owner}" if salt is None else f"key:{owner}/{salt}"
