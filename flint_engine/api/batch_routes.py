"""The routes of OpenAI's Files and Batch APIs: upload a JSONL file of requests, start a batch on it, poll it, read
its output file (`batch_store` keeps them, `batch_jobs` runs them)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from .batch_jobs import BatchCreate, BatchJobs, ExpiresAfter
from .batch_store import BatchStore, public
from .errors import APIError, validation_error
from .list_page import in_order, page
from .ownership import request_owner
from .settings import APISettings

FILES_PATH = "/v1/files"
# Room in an upload's body beside the file's own bytes (the form's boundaries, headers and purpose field): the body
# is capped at the file cap plus this, the file itself exactly at the cap.
FORM_OVERHEAD_BYTES = 64 * 1024


# Request bodies that carry a whole batch (a file upload, an Anthropic message batch's requests) are capped by
# `max_file_bytes`, not `max_request_bytes`.
BATCH_BODY_PATHS = (FILES_PATH, "/v1/messages/batches")


def body_cap(settings: APISettings, path: str) -> int:
    """The most bytes a request body to `path` may hold."""
    if path in BATCH_BODY_PATHS:
        return settings.max_file_bytes + FORM_OVERHEAD_BYTES
    return settings.max_request_bytes


def _capped(receive: Callable, cap: int) -> Callable:
    """`receive` refusing a body past `cap` bytes as it arrives (a chunked upload has no Content-Length to check)."""
    seen = 0

    async def capped() -> dict[str, Any]:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > cap:
                raise APIError(413, f"request body is larger than {cap} bytes", code="request_too_large")
        return message

    return capped


def batch_jobs(settings: APISettings) -> BatchJobs:
    def make_store() -> BatchStore:
        root = settings.batch_dir
        if root is None:  # this process's alone: the next start makes another, so it goes when this one exits
            root = tempfile.mkdtemp(prefix="flint-batches-")
            atexit.register(shutil.rmtree, root, ignore_errors=True)
        return BatchStore(root, settings.max_file_bytes, settings.max_stored_bytes)

    s = settings
    return BatchJobs(
        make_store, s.model_name, s.batch_concurrency, s.max_batch_requests, s.batch_priority, s.batch_file_ttl_s
    )


def add_batch_routes(
    app: FastAPI,
    jobs: BatchJobs,
    body: Callable[[Request], Awaitable[Any]],
    parse: Callable[[type, Any], Any],
    settings: APISettings,
) -> None:
    """Add the routes; `body` reads a JSON body and `parse` validates it into a model as the other routes do."""

    def store() -> BatchStore:
        jobs.resume()
        return jobs.store

    @app.post(FILES_PATH)
    async def upload_file(request: Request) -> Any:
        capped = Request(request.scope, _capped(request.receive, body_cap(settings, FILES_PATH)))
        try:
            form = await capped.form(max_files=1, max_fields=8)
        except AssertionError as exc:  # Starlette's way of saying python-multipart is missing
            raise APIError(501, f"file uploads need the python-multipart package: {exc}") from None
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise APIError(400, "send the file as multipart/form-data field 'file'", "file")
            if not isinstance(purpose, str):
                raise APIError(400, "send the file's purpose as multipart/form-data field 'purpose'", "purpose")
            owner = request_owner(request)
            ttl = settings.batch_file_ttl_s
            if "expires_after[anchor]" in form or "expires_after[seconds]" in form:  # the openai client's form keys
                policy = {"anchor": form.get("expires_after[anchor]"), "seconds": form.get("expires_after[seconds]")}
                try:
                    ttl = ExpiresAfter.model_validate(policy).seconds
                except ValidationError as exc:
                    raise APIError(400, f"expires_after: {validation_error(exc).message}", "expires_after") from None
            return await run_in_threadpool(
                store().save_upload, upload.file, upload.filename or "upload.jsonl", purpose, owner, ttl
            )
        finally:
            await form.close()

    @app.get(FILES_PATH)
    async def list_files(
        request: Request, purpose: str | None = None, limit: int = 10_000, after: str | None = None, order: str = "desc"
    ) -> dict[str, Any]:
        found = store().files(request_owner(request), purpose)
        return page(in_order(found, order, oldest_first=False), limit, after, 10_000)

    @app.get(FILES_PATH + "/{file_id}")
    async def get_file(request: Request, file_id: str) -> dict[str, Any]:
        return store().file(file_id, request_owner(request))

    @app.delete(FILES_PATH + "/{file_id}")
    async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
        return store().delete_file(file_id, request_owner(request))

    @app.get(FILES_PATH + "/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> FileResponse:
        path = store().content(file_id, request_owner(request))
        return FileResponse(path, media_type="application/octet-stream")

    @app.post("/v1/batches")
    async def create_batch(request: Request) -> JSONResponse:
        req = parse(BatchCreate, await body(request))
        store()
        return JSONResponse(jobs.create(req, request_owner(request)))

    @app.get("/v1/batches")
    async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        return page([public(b) for b in store().batches(request_owner(request))], limit, after, 100)

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(request: Request, batch_id: str) -> dict[str, Any]:
        return public(store().batch(batch_id, request_owner(request)))

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> dict[str, Any]:
        store()
        return jobs.cancel(batch_id, request_owner(request))
