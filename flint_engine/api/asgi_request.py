"""One HTTP request to an ASGI application in this process, without a socket (the batch runner's way into the API).

The request passes through every middleware and handler the HTTP server runs, so a batch line is answered exactly as
the same body posted to the server would be: its checks, its error shapes, its status codes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ASGIResponse:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


async def asgi_post(app: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> ASGIResponse:
    """POST `body` (JSON) to `path` of `app` and return the whole response once the application has sent it."""
    head = {"content-type": "application/json", "content-length": str(len(body)), **(headers or {})}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in head.items()],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    sent_body = False
    never = asyncio.Event()  # the client never disconnects: it waits for the whole answer

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # cancellable: Starlette's disconnect poll cancels this wait at once
        return {"type": "http.disconnect"}

    response = ASGIResponse()
    parts: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.status = int(message["status"])
            response.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    response.body = b"".join(parts)
    return response
