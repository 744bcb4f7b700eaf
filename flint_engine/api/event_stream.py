"""The HTTP response of a stream of server-sent events (generation streams, a background response's stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse


def event_stream(lines: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(lines, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
