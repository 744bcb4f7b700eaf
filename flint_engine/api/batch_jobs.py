"""OpenAI's Batch API jobs: a batch's input file answered in the background through this server's own app.

A batch goes validating -> in_progress -> finalizing -> completed (or failed, when its file has bad lines; cancelling
-> cancelled; expired after its 24 h window). Its requests run as `batch_runner` runs a `flint run-batch` file, at
most `batch_concurrency` at a time for all batches together, each through the whole app (the same checks and
answers as over HTTP; the gate lets them in by a token only this process knows, as their batch's owner), at the
batch priority unless a line names its own. Successful records go to the output file, refused ones to the error
file, both appended as requests finish, so a batch whose process stopped resumes where its files end: the next
process on its directory takes it up as it starts (a lock file keeps one runner a batch, also across router
processes sharing the directory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import functools
import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from .batch_lines import BATCH_URLS, BatchFileError, BatchLine, read_batch_lines, recorded_ids
from .batch_runner import run_batch
from .batch_store import (
    ANTHROPIC,
    OPENAI,
    OUTPUT_PURPOSE,
    TERMINAL,
    BatchStore,
    public,
)
from .errors import APIError
from .metadata import Metadata

log = logging.getLogger(__name__)

COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
CANCELLABLE = frozenset({"validating", "in_progress"})  # finalizing is only the registering of its files
# Headers of the requests a batch makes through the app: the process's token, and the batch's owner.
INTERNAL_TOKEN_HEADER = "x-flint-batch-token"
INTERNAL_OWNER_HEADER = "x-flint-batch-owner"
# How often a running batch saves its counts and looks for a cancel made by another process.
_SAVE_EVERY_S = 1.0


# OpenAI's bounds on a file's lifetime (`expires_after.seconds`): one hour to thirty days.
MIN_TTL_S, MAX_TTL_S = 3600, 30 * 24 * 3600


class ExpiresAfter(BaseModel):
    """OpenAI's expiration policy of a file: `seconds` after its creation."""

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_TTL_S, le=MAX_TTL_S)


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Metadata = None
    output_expires_after: ExpiresAfter | None = None  # the output and error files' lifetime (else the server's)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v not in BATCH_URLS:
            raise ValueError(f"endpoint must be one of {', '.join(BATCH_URLS)}, got {v!r}")
        return v

    @field_validator("completion_window")
    @classmethod
    def _window(cls, v: str) -> str:
        if v != COMPLETION_WINDOW:
            raise ValueError(f"completion_window must be {COMPLETION_WINDOW!r}, got {v!r}")
        return v


def new_batch(req: BatchCreate, owner: str, now: int | None = None, kind: str = OPENAI) -> dict[str, Any]:
    """A batch object as it is created (status validating), with its owner and the API that made it."""
    now = int(time.time()) if now is None else now
    times = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
    return {
        "id": f"{'msgbatch' if kind == ANTHROPIC else 'batch'}_{uuid.uuid4().hex}",
        "kind": kind,
        "object": "batch",
        "endpoint": req.endpoint,
        "errors": None,
        "input_file_id": req.input_file_id,
        "completion_window": req.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "created_ns": time.time_ns(),
        "expires_at": now + COMPLETION_WINDOW_S,
        **{f"{name}_at": None for name in times},
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": req.metadata,
        "owner": owner,
        "output_ttl_s": req.output_expires_after.seconds if req.output_expires_after else None,
    }


class BatchJobs:
    def __init__(
        self,
        make_store: Callable[[], BatchStore],
        model_name: str,
        concurrency: int,
        max_requests: int,
        priority: int = 0,
        file_ttl_s: int | None = None,
    ) -> None:
        self._make_store = make_store
        self.file_ttl_s = file_ttl_s  # an OpenAI batch's output and error files' lifetime unless it names one
        self.priority = priority  # the requests' scheduling priority, unless a line's body names one
        self.model_name = model_name
        self.concurrency = concurrency
        self.max_requests = max_requests
        self.app: Any = None  # the app the requests go through (set once it is built)
        self.token = secrets.token_hex(32)
        self._gate: asyncio.Semaphore | None = None  # `concurrency` requests in flight for all batches together
        self._tasks: dict[str, asyncio.Task] = {}
        self._resumed = False

    @functools.cached_property
    def store(self) -> BatchStore:
        """Made at the first Batch API call (its directory, when none is configured, too)."""
        return self._make_store()

    def status_counts(self) -> tuple[dict[str, int], int]:
        """`BatchStore.status_counts`, or none before the store is made (no batch directory, no Batch API call)."""
        if "store" not in self.__dict__:  # the cached property not made yet: making it would make a directory
            return {}, 0
        return self.store.status_counts()

    def internal_headers(self, owner: str) -> dict[str, str]:
        return {INTERNAL_TOKEN_HEADER: self.token, INTERNAL_OWNER_HEADER: owner}

    # ------------------------------------------------------------------ the API's calls
    def create(self, req: BatchCreate, owner: str) -> dict[str, Any]:
        source = self.store.file(req.input_file_id, owner)
        if source["purpose"] != "batch":
            raise APIError(
                400, f"file {req.input_file_id} has purpose {source['purpose']!r}, not 'batch'", "input_file_id"
            )
        return public(self.start(req, owner))

    def start(self, req: BatchCreate, owner: str) -> dict[str, Any]:
        """Save a new batch on an input file already checked, start its runner, and return its whole record."""
        record = self.save_new(req, owner)
        self.launch(record["id"])
        return record

    def save_new(self, req: BatchCreate, owner: str, kind: str = OPENAI, total: int = 0) -> dict[str, Any]:
        """Save a new batch (of `total` requests, where known before its file is read); `launch` starts it."""
        record = new_batch(req, owner, kind=kind)
        if kind == OPENAI and record["output_ttl_s"] is None:
            record["output_ttl_s"] = self.file_ttl_s  # a message batch's results live as long as the batch
        record["request_counts"]["total"] = total
        self.store.save_batch(record)
        return record

    def launch(self, batch_id: str) -> None:
        """Start the batch's runner on this event loop (a no-op while one runs here)."""
        self.resume()
        self._start(batch_id)

    def cancel(self, batch_id: str, owner: str, kind: str = OPENAI) -> dict[str, Any]:
        record = self.store.batch(batch_id, owner, kind)
        if record["status"] in CANCELLABLE:
            # The marker, not the batch's JSON, is what its runner reads: a runner saving its counts could overwrite
            # a status written between its read and its write, never a file it does not write.
            self.store.cancel_marker(batch_id).touch()
            record["status"], record["cancelling_at"] = "cancelling", int(time.time())
            self.store.save_batch(record)
            self._start(batch_id)  # a batch no process runs is settled by its next runner (at once here)
        elif record["status"] != "cancelling":
            raise APIError(400, f"batch {batch_id} is {record['status']}: only a running batch can be cancelled")
        return public(record)

    def resume(self) -> None:
        """Take up the batches no process is running (at the app's start with a configured directory, else at this
        process's first Batch API call)."""
        if self._resumed:
            return
        self._resumed = True
        for record in self.store.all_batches():
            if record["status"] not in TERMINAL:
                self._start(record["id"])

    # ------------------------------------------------------------------ the runner
    def _shared_gate(self) -> asyncio.Semaphore:
        """Made on the loop the batches run on (at their first run), so that many batches share one bound."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.concurrency)
        return self._gate

    def _start(self, batch_id: str) -> None:
        if batch_id in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(self._run(batch_id))
        self._tasks[batch_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))

    async def _run(self, batch_id: str) -> None:
        with self.store.lock_path(batch_id).open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process runs it
            try:
                await self._process(batch_id)
            except Exception:
                log.exception("batch %s failed", batch_id)
                record = self.store.batch_record(batch_id)
                if record is not None and record["status"] not in TERMINAL:
                    self._fail(record, "server_error", "the batch stopped on a server error (see the server's log)")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _fail(self, record: dict[str, Any], code: str, message: str) -> None:
        self._fail_all(record, [{"code": code, "message": message, "param": None, "line": None}])

    def _fail_all(self, record: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        record["status"], record["failed_at"] = "failed", int(time.time())
        record["errors"] = {"object": "list", "data": errors}
        self.store.save_batch(record)

    def _lines(self, record: dict[str, Any]) -> list[BatchLine] | None:
        """The input file's requests, or None after failing the batch over the file's problems."""
        path = self.store.data_path(record["input_file_id"])
        try:
            with path.open(encoding="utf-8") as f:
                return read_batch_lines(f, self.model_name, record["endpoint"], self.max_requests)
        except BatchFileError as exc:
            errors = [
                {"code": "invalid_request", "message": what, "param": None, "line": n} for n, what in exc.found[:100]
            ]
            self._fail_all(record, errors)
        except FileNotFoundError:
            self._fail(record, "file_not_found", f"the input file {record['input_file_id']} was deleted")
        except UnicodeDecodeError:
            self._fail(record, "invalid_request", "the input file is not UTF-8 text")
        return None

    async def _process(self, batch_id: str) -> None:
        record = self.store.batch_record(batch_id)
        if record is None or record["status"] in TERMINAL:
            return
        owner = record["owner"]
        marker = self.store.cancel_marker(batch_id)
        if marker.exists() and record["in_progress_at"] is None:
            self._settle(record, "cancelled")  # cancelled before any request ran
            return
        lines = self._lines(record)
        if lines is None:
            return
        if not lines:
            self._fail(record, "empty_file", f"the input file {record['input_file_id']} holds no requests")
            return
        if record["output_file_id"] is None:
            record["output_file_id"] = self.store.new_output_file()
            record["error_file_id"] = self.store.new_output_file()
        out_path = self.store.data_path(record["output_file_id"])
        err_path = self.store.data_path(record["error_file_id"])
        # A resumed batch: what its files already answer stays, and counts.
        done_out, done_err = _whole_records(out_path), _whole_records(err_path)
        todo = [
            dataclasses.replace(line, body={"priority": self.priority, **line.body})
            for line in lines
            if line.custom_id not in done_out and line.custom_id not in done_err
        ]
        counts = {"total": len(lines), "completed": len(done_out), "failed": len(done_err)}
        if record["status"] == "validating":
            record["status"], record["in_progress_at"] = "in_progress", int(time.time())
        record["request_counts"] = counts
        self.store.save_batch(record)
        resumed = f" ({counts['total'] - len(todo)} answered before a stop)" if len(todo) < counts["total"] else ""
        log.info("batch %s: %d requests to %s%s", batch_id, counts["total"], record["endpoint"], resumed)
        answered: set[str] = set()
        last_check = time.monotonic()
        stop = {"why": None}

        def should_stop() -> bool:
            nonlocal last_check
            if stop["why"] is None and time.time() >= record["expires_at"]:
                stop["why"] = "expired"
            if stop["why"] is None and time.monotonic() - last_check >= _SAVE_EVERY_S:
                last_check = time.monotonic()
                if marker.exists():
                    stop["why"] = "cancelled"
                else:
                    self.store.save_batch(record)
            return stop["why"] is not None

        with out_path.open("a", encoding="utf-8") as out, err_path.open("a", encoding="utf-8") as err:

            def write(rec: dict[str, Any]) -> None:
                ok = 200 <= rec["response"]["status_code"] < 300
                (out if ok else err).write(json.dumps(rec, ensure_ascii=False) + "\n")
                (out if ok else err).flush()
                counts["completed" if ok else "failed"] += 1
                answered.add(rec["custom_id"])

            if not marker.exists():
                await run_batch(
                    self.app,
                    todo,
                    write,
                    self.concurrency,
                    progress=False,
                    headers=self.internal_headers(owner),
                    should_stop=should_stop,
                    gate=self._shared_gate(),
                )
            unrun = [line for line in todo if line.custom_id not in answered]
            if marker.exists():
                outcome = "cancelled"
            elif unrun:  # the window closed first: each request left gets OpenAI's batch_expired error record
                for line in unrun:
                    err.write(json.dumps(_expired_record(line.custom_id)) + "\n")
                counts["failed"] += len(unrun)
                record["expired_count"] = record.get("expired_count", 0) + len(unrun)
                outcome = "expired"
            else:
                outcome = "completed"
        if outcome == "completed":
            record["status"], record["finalizing_at"] = "finalizing", int(time.time())
            self.store.save_batch(record)
        self._settle(record, outcome)

    def _settle(self, record: dict[str, Any], status: str) -> None:
        """The batch's last state: its output and error files registered (an empty error file dropped)."""
        owner, bid = record["owner"], record["id"]
        for key, name in (("output_file_id", "output"), ("error_file_id", "error")):
            file_id = record[key]
            if file_id is None:
                continue
            path = self.store.data_path(file_id)
            if key == "error_file_id" and (not path.exists() or path.stat().st_size == 0):
                path.unlink(missing_ok=True)
                record[key] = None
                continue
            self.store.register_file(file_id, f"{bid}_{name}.jsonl", OUTPUT_PURPOSE, owner, record.get("output_ttl_s"))
        now = int(time.time())
        if status == "cancelled":  # its cancel's time, as the cancel call saved it (the runner's copy may predate it)
            on_disk = self.store.batch_record(bid) or record
            record["cancelling_at"] = on_disk.get("cancelling_at") or record.get("cancelling_at") or now
        record["status"] = status
        record[f"{status}_at"] = now
        self.store.save_batch(record)
        self.store.cancel_marker(bid).unlink(missing_ok=True)
        counts = record["request_counts"]
        log.info(
            "batch %s %s: %d answered, %d refused, of %d (%d s since it was created)",
            bid, status, counts["completed"], counts["failed"], counts["total"], now - record["created_at"],
        )  # fmt: skip


def _whole_records(path: Path) -> set[str]:
    """The custom_ids a results file answers, after cutting it to its whole records (a stopped process may have
    left one cut short, which the next record appended would corrupt)."""
    with path.open(encoding="utf-8") as f:
        kept, ids = recorded_ids(f)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(path)
    return ids


def _expired_record(custom_id: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": "batch_expired", "message": "This request could not be executed before the completion"
                  " window expired."},
    }  # fmt: skip
