"""Anthropic's Message Batches API (`/v1/messages/batches`), on the Batch API's jobs (`batch_jobs`).

A create call's requests (`custom_id`, `params` as `/v1/messages` takes them) are written as a batch file of
`/v1/messages` lines and run as an OpenAI batch is, through this app; the batch object and the results are
Anthropic's: `processing_status` in_progress / canceling / ended, `request_counts` by outcome, and a results file of
`{"custom_id", "result": {"type": "succeeded", "message"} | {"type": "errored", "error"} | {"type": "canceled"} |
{"type": "expired"}}` lines, in the order requests finished. Errors are in Anthropic's shape.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, field_validator
from starlette.concurrency import run_in_threadpool

from .anthropic_messages import anthropic_error
from .batch_jobs import TERMINAL, BatchCreate, BatchJobs
from .batch_store import ANTHROPIC, MESSAGE_BATCH_PURPOSE
from .errors import APIError
from .ownership import request_owner

PATH = "/v1/messages/batches"
_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class MessageBatchRequest(BaseModel):
    custom_id: str
    params: dict[str, Any]

    @field_validator("custom_id")
    @classmethod
    def _custom_id(cls, v: str) -> str:
        if not _CUSTOM_ID.fullmatch(v):
            raise ValueError("custom_id must be 1-64 letters, digits, '-' or '_'")
        return v


class MessageBatchCreate(BaseModel):
    requests: list[MessageBatchRequest] = Field(min_length=1)


def _time(ts: int | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def message_batch(record: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The batch record as Anthropic's MessageBatch object."""
    status, counts = record["status"], record["request_counts"]
    ended = status in TERMINAL
    expired = record.get("expired_count", 0)
    answered = counts["completed"] + counts["failed"]
    ended_at = next(
        (record[f"{s}_at"] for s in ("completed", "cancelled", "expired", "failed") if record[f"{s}_at"]), None
    )
    return {
        "id": record["id"],
        "type": "message_batch",
        "processing_status": "ended" if ended else "canceling" if status == "cancelling" else "in_progress",
        "request_counts": {
            "processing": 0 if ended else counts["total"] - answered,
            "succeeded": counts["completed"],
            "errored": counts["failed"] - expired + (counts["total"] if status == "failed" else 0),
            "canceled": counts["total"] - answered if status == "cancelled" else 0,
            "expired": expired,
        },
        "ended_at": _time(ended_at),
        "created_at": _time(record["created_at"]),
        "expires_at": _time(record["expires_at"]),
        "archived_at": None,
        "cancel_initiated_at": _time(record["cancelling_at"]),
        "results_url": f"{base_url}{PATH}/{record['id']}/results" if ended else None,
    }


def _result(record: dict[str, Any]) -> dict[str, Any]:
    """One results line from a batch record (an answer, a refusal, or an expiry)."""
    response = record.get("response")
    if response is None:
        return {"custom_id": record["custom_id"], "result": {"type": "expired"}}
    if 200 <= response["status_code"] < 300:
        return {"custom_id": record["custom_id"], "result": {"type": "succeeded", "message": response["body"]}}
    return {"custom_id": record["custom_id"], "result": {"type": "errored", "error": response["body"]}}


def _results(jobs: BatchJobs, record: dict[str, Any]) -> Iterator[bytes]:
    """The results file's lines: the answered requests in the order they finished, then the canceled ones."""
    store = jobs.store
    seen: set[str] = set()
    for key in ("output_file_id", "error_file_id"):
        if not record.get(key):
            continue
        with store.data_path(record[key]).open(encoding="utf-8") as f:
            for text in f:
                if text.strip():
                    line = json.loads(text)
                    seen.add(line["custom_id"])
                    yield (json.dumps(_result(line), ensure_ascii=False) + "\n").encode()
    if record["status"] == "cancelled":
        with store.data_path(record["input_file_id"]).open(encoding="utf-8") as f:
            for text in f:
                if text.strip() and (cid := json.loads(text)["custom_id"]) not in seen:
                    yield (json.dumps({"custom_id": cid, "result": {"type": "canceled"}}) + "\n").encode()


def add_message_batch_routes(
    app: FastAPI,
    jobs: BatchJobs,
    body: Callable[[Request], Awaitable[Any]],
    parse: Callable[[type, Any], Any],
) -> None:
    """Add the routes (`body` and `parse` read and validate JSON as the other routes do)."""

    def base(request: Request) -> str:
        return str(request.base_url).rstrip("/")

    def mine(request: Request, batch_id: str) -> dict[str, Any]:
        return jobs.store.batch(batch_id, request_owner(request), ANTHROPIC)

    def answer(work: Callable[[], Any]) -> Response:
        try:
            return JSONResponse(work())
        except APIError as exc:
            return anthropic_error(exc)

    @app.post(PATH)
    async def create_message_batch(request: Request) -> Response:
        try:
            req = parse(MessageBatchCreate, await body(request))
        except APIError as exc:
            return anthropic_error(exc)
        try:  # writing up to max_file_bytes of requests: off the event loop
            record = await run_in_threadpool(_create, jobs, req, request_owner(request))
        except APIError as exc:
            return anthropic_error(exc)
        jobs.launch(record["id"])
        return JSONResponse(message_batch(record, base(request)))

    @app.get(PATH)
    async def list_message_batches(
        request: Request, limit: int = 20, after_id: str | None = None, before_id: str | None = None
    ) -> Response:
        def page() -> dict[str, Any]:
            if not 1 <= limit <= 1000:
                raise APIError(400, f"limit must be between 1 and 1000, got {limit}", "limit")
            jobs.resume()
            found = [message_batch(r, base(request)) for r in jobs.store.batches(request_owner(request), ANTHROPIC)]
            ids = [b["id"] for b in found]
            if after_id is not None:
                found = found[ids.index(after_id) + 1 :] if after_id in ids else []
                shown = found[:limit]
            elif before_id is not None:
                found = found[: ids.index(before_id)] if before_id in ids else []
                shown = found[-limit:]
            else:
                shown = found[:limit]
            return {
                "data": shown,
                "has_more": len(found) > limit,
                "first_id": shown[0]["id"] if shown else None,
                "last_id": shown[-1]["id"] if shown else None,
            }

        return answer(page)

    @app.get(PATH + "/{batch_id}")
    async def get_message_batch(request: Request, batch_id: str) -> Response:
        return answer(lambda: message_batch(mine(request, batch_id), base(request)))

    @app.post(PATH + "/{batch_id}/cancel")
    async def cancel_message_batch(request: Request, batch_id: str) -> Response:
        def cancel() -> dict[str, Any]:
            jobs.cancel(batch_id, request_owner(request), ANTHROPIC)
            return message_batch(mine(request, batch_id), base(request))

        return answer(cancel)

    @app.delete(PATH + "/{batch_id}")
    async def delete_message_batch(request: Request, batch_id: str) -> Response:
        def delete() -> dict[str, Any]:
            record = mine(request, batch_id)
            if record["status"] not in TERMINAL:
                raise APIError(400, f"batch {batch_id} is still processing: cancel it, then delete it once ended")
            jobs.store.delete_batch(batch_id)
            return {"id": batch_id, "type": "message_batch_deleted"}

        return answer(delete)

    @app.get(PATH + "/{batch_id}/results")
    async def message_batch_results(request: Request, batch_id: str) -> Response:
        try:
            record = mine(request, batch_id)
            if record["status"] not in TERMINAL:
                raise APIError(400, f"batch {batch_id} is still processing: its results come once it has ended")
        except APIError as exc:
            return anthropic_error(exc)
        return StreamingResponse(_results(jobs, record), media_type="application/x-jsonl")


def _create(jobs: BatchJobs, req: MessageBatchCreate, owner: str) -> dict[str, Any]:
    """Check the requests, write them as a batch file of /v1/messages lines, and start the batch."""
    if len(req.requests) > jobs.max_requests:
        raise APIError(400, f"a batch holds at most {jobs.max_requests} requests, got {len(req.requests)}", "requests")
    seen: set[str] = set()
    for i, item in enumerate(req.requests):
        where = f"requests.{i}"
        if item.custom_id in seen:
            raise APIError(400, f"{where}.custom_id {item.custom_id!r} is used twice (each must be unique)", where)
        seen.add(item.custom_id)
        if item.params.get("stream"):
            raise APIError(400, f"{where}.params.stream: a batch's requests are not streamed", f"{where}.params")
        model = item.params.get("model")
        if model is not None and model != jobs.model_name:
            served = jobs.model_name
            raise APIError(400, f"{where}.params.model is {model!r}; the model served here is {served!r}", where)
    lines = [
        {"custom_id": r.custom_id, "method": "POST", "url": "/v1/messages", "body": r.params} for r in req.requests
    ]
    data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    source = jobs.store.save_file(io.BytesIO(data), "message_batch_requests.jsonl", MESSAGE_BATCH_PURPOSE, owner)
    spec = BatchCreate.model_construct(input_file_id=source["id"], endpoint="/v1/messages", completion_window="24h")
    return jobs.save_new(spec, owner, ANTHROPIC, total=len(req.requests))
