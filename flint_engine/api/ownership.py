"""Whose objects a request sees (Batch API files and batches, stored responses): its API key's hash, as the gate
put it in the request's state ("" without keys)."""

from __future__ import annotations

from fastapi import Request


def request_owner(request: Request) -> str:
    return getattr(request.state, "owner", "")
