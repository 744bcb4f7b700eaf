"""Run a batch file's requests through the API application in this process, a bounded number at a time.

Each line's body is posted to its url on the same FastAPI application the server runs (`asgi_request`), so its
answer, refusal included, is what the HTTP API would give. Requests the engine sheds for overload (503
`server_overloaded`) are retried after a pause, never recorded: a batch waits for capacity instead of failing.
Records are handed to `write` as requests finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from .asgi_request import ASGIResponse, asgi_post
from .batch_lines import BatchLine, output_record
from .errors import OVERLOADED

log = logging.getLogger(__name__)

# Pauses before retrying a request the engine shed (doubling from the first, at most the last).
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


@dataclass
class BatchSummary:
    requests: int = 0
    succeeded: int = 0
    failed: int = 0  # answered with an HTTP error status (recorded with its error body)
    retries: int = 0  # overload refusals waited out
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        rate = self.completion_tokens / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.requests} requests: {self.succeeded} succeeded, {self.failed} failed (recorded with their HTTP"
            f" status); {self.prompt_tokens:,} prompt + {self.completion_tokens:,} completion tokens in"
            f" {self.seconds:.1f} s ({rate:,.1f} completion tokens/s)"
        )


def _shed(response: ASGIResponse, body: Any) -> bool:
    """Whether the answer is the engine shedding load (try again), rather than an answer to this request: OpenAI's
    error shape names the code, Anthropic's (on /v1/messages) only the message."""
    if response.status != 503 or not isinstance(body, dict):
        return False
    error = body.get("error")
    if not isinstance(error, dict):
        return False
    return error.get("code") == "server_overloaded" or str(error.get("message", "")).startswith(OVERLOADED)


def _usage(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a successful answer: chat and completions' usage, or the Responses API's."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return int(prompt or 0), int(completion or 0)


def _decode(response: ASGIResponse) -> Any:
    try:
        return json.loads(response.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = response.body.decode("utf-8", "replace")
        return {"error": {"message": text or f"HTTP {response.status}", "type": "server_error", "code": None}}


async def _answer(
    app: Any, line: BatchLine, summary: BatchSummary, headers: dict[str, str], should_stop: Callable[[], bool]
) -> dict[str, Any] | None:
    """The line's record, or None if `should_stop()` turned true while it waited out the engine's overload."""
    rid = f"batch-{uuid.uuid4().hex}"
    payload = json.dumps(line.body).encode()
    pause = RETRY_FIRST_S
    while True:
        response = await asgi_post(app, line.url, payload, {**headers, "x-request-id": rid})
        body = _decode(response)
        if not _shed(response, body):
            break
        summary.retries += 1
        await asyncio.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)
        if should_stop():
            return None
    if 200 <= response.status < 300:
        summary.succeeded += 1
        prompt, completion = _usage(body)
        summary.prompt_tokens += prompt
        summary.completion_tokens += completion
    else:
        summary.failed += 1
    return output_record(line.custom_id, response.status, body, response.headers.get("x-request-id", rid))


async def run_batch(
    app: Any,
    lines: Sequence[BatchLine],
    write: Callable[[dict[str, Any]], None],
    concurrency: int,
    progress: bool = True,
    headers: dict[str, str] | None = None,
    should_stop: Callable[[], bool] | None = None,
    gate: asyncio.Semaphore | None = None,
) -> BatchSummary:
    """Answer every line (at most `concurrency` in flight, and each holding `gate` if given: a bound shared with
    other runs), handing each record to `write` as it is made; `headers` go with each request; once `should_stop()`
    is true no further line starts (those in flight finish)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    summary = BatchSummary(requests=len(lines))
    stop = should_stop or (lambda: False)
    start = time.monotonic()
    todo = iter(lines)
    bar = tqdm(total=len(lines), unit="req", desc="batch", disable=not progress)

    async def worker() -> None:
        for line in todo:  # one shared iterator: each line is taken by exactly one worker
            async with gate or contextlib.nullcontext():
                if stop():
                    return
                record = await _answer(app, line, summary, headers or {}, stop)
            if record is None:
                return
            write(record)
            bar.update(1)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(lines)))))
    finally:
        bar.close()
        summary.seconds = time.monotonic() - start
    if summary.retries:
        log.info("the engine shed %d submissions for load; each was retried", summary.retries)
    return summary
