"""Files and batches of OpenAI's Batch API, kept on disk under one directory.

    <root>/files/<file id>.json   the file object (and its owner), <root>/files/<file id>.data its bytes
    <root>/batches/<batch id>.json  the batch object (and its owner), rewritten at each change

Every object lives in its own JSON file, replaced atomically (`json_files`). Objects belong to the API key that made
them (its hash; "" without keys): another key's id answers 404, as if it did not exist.

Files may expire (OpenAI's `expires_after`; batch uploads and outputs after 30 days unless told otherwise, by
default): past its `expires_at` a file answers 404 and is removed at the next sweep (an upload, a list, a lookup),
unless a batch still running reads or writes it, which keeps it until that batch settles.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import APIError
from .json_files import read_json, safe_id, write_json

log = logging.getLogger(__name__)

# Purposes a client may upload with, and the ones this server writes (OpenAI's names; a message batch's requests,
# written from an Anthropic Message Batches call, are not listed unless asked for by purpose).
UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"
MESSAGE_BATCH_PURPOSE = "message_batch"
# Which API made a batch: OpenAI's Batch API or Anthropic's Message Batches (each API sees only its own).
OPENAI, ANTHROPIC = "openai", "anthropic"
# A batch's states after which it reads and writes none of its files.
TERMINAL = frozenset({"failed", "completed", "expired", "cancelled"})
_COPY_CHUNK = 1 << 20


# Kept beside an object, never shown: its owner, its creation time in nanoseconds (lists are ordered by it;
# `created_at` has whole seconds), which API made a batch, how many of its requests expired, and the lifetime of its
# output and error files.
_HIDDEN = frozenset({"owner", "created_ns", "kind", "expired_count", "output_ttl_s"})


def public(record: dict[str, Any]) -> dict[str, Any]:
    """An object as the API shows it (without its owner)."""
    return {k: v for k, v in record.items() if k not in _HIDDEN}


def _expired(record: dict[str, Any], now: float) -> bool:
    return record.get("expires_at") is not None and record["expires_at"] <= now


def _newest_first(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=lambda r: (r.get("created_ns", r["created_at"] * 10**9), r["id"]), reverse=True)


class BatchStore:
    def __init__(
        self, root: str | Path, max_file_bytes: int, max_stored_bytes: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = Path(root)
        self.files_dir = self.root / "files"
        self.batches_dir = self.root / "batches"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self.max_file_bytes = max_file_bytes
        self.max_stored_bytes = max_stored_bytes
        self._lock = threading.Lock()  # one upload's room is reserved at a time
        self.clock = clock  # the time files expire by
        self._settled: dict[str, str] = {}  # batch id -> its terminal status (a settled batch no longer changes)

    # ------------------------------------------------------------------ files
    def data_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.data"

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files_dir.glob("*.data") if p.is_file())

    def save_upload(
        self, source: IO[bytes], filename: str, purpose: str, owner: str, ttl_s: int | None = None
    ) -> dict[str, Any]:
        """Copy an uploaded file in (within the size caps; expiring `ttl_s` seconds after, if given) and return its
        file object."""
        if purpose not in UPLOAD_PURPOSES:
            raise APIError(400, f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}, got {purpose!r}", "purpose")
        return self.save_file(source, filename, purpose, owner, ttl_s)

    def save_file(
        self, source: IO[bytes], filename: str, purpose: str, owner: str, ttl_s: int | None = None
    ) -> dict[str, Any]:
        """`save_upload` for any purpose (the server's own files, such as a message batch's requests)."""
        file_id = f"file-{uuid.uuid4().hex}"
        path = self.data_path(file_id)
        size = 0
        self.sweep()
        with self._lock:
            room = self.max_stored_bytes - self.stored_bytes()
            try:
                with path.open("wb") as out:
                    while chunk := source.read(_COPY_CHUNK):
                        size += len(chunk)
                        if size > self.max_file_bytes:
                            raise APIError(
                                413, f"the file is larger than {self.max_file_bytes} bytes", "file", "file_too_large"
                            )
                        if size > room:
                            raise APIError(
                                413,
                                f"the server's file storage ({self.max_stored_bytes} bytes) is full: delete files"
                                " (DELETE /v1/files/{file_id}) first",
                                "file",
                                "storage_full",
                            )
                        out.write(chunk)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        return self.register_file(file_id, filename, purpose, owner, ttl_s)

    def new_output_file(self) -> str:
        """An id for a file this server writes (a batch's output or errors), its data file created empty."""
        file_id = f"file-{uuid.uuid4().hex}"
        self.data_path(file_id).touch()
        return file_id

    def register_file(
        self, file_id: str, filename: str, purpose: str, owner: str, ttl_s: int | None = None
    ) -> dict[str, Any]:
        """Write (or rewrite, as its data grew) the file object of data already under `data_path(file_id)`, expiring
        `ttl_s` seconds after its creation if given."""
        previous = read_json(self.files_dir / f"{file_id}.json")
        created_at = previous["created_at"] if previous else int(self.clock())
        record = {
            "id": file_id,
            "object": "file",
            "bytes": self.data_path(file_id).stat().st_size,
            "created_at": created_at,
            "created_ns": previous.get("created_ns", 0) if previous else time.time_ns(),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None if ttl_s is None else created_at + ttl_s,
            "owner": owner,
        }
        write_json(self.files_dir / f"{file_id}.json", record)
        return public(record)

    def _file(self, file_id: str, owner: str) -> dict[str, Any]:
        record = read_json(self.files_dir / f"{file_id}.json") if safe_id(file_id) else None
        if record is not None and _expired(record, self.clock()):
            self.sweep()
            record = None
        if record is None or record.get("owner") != owner:
            raise APIError(404, f"No such File object: {file_id}", "file_id", "file_not_found")
        return record

    def _in_use(self) -> set[str]:
        """The files of batches still running (their input, output and error files)."""
        keys = ("input_file_id", "output_file_id", "error_file_id")
        return {r[k] for r in self.all_batches() if r.get("status") not in TERMINAL for k in keys if r.get(k)}

    def sweep(self) -> int:
        """Remove the expired files no running batch uses; returns how many went."""
        now = self.clock()
        expired = [r for r in map(read_json, self.files_dir.glob("file-*.json")) if r and _expired(r, now)]
        if not expired:
            return 0
        in_use = self._in_use()
        gone = 0
        for record in expired:
            if record["id"] not in in_use:
                (self.files_dir / f"{record['id']}.json").unlink(missing_ok=True)
                self.data_path(record["id"]).unlink(missing_ok=True)
                gone += 1
        if gone:
            log.info("removed %d expired files", gone)
        return gone

    def file(self, file_id: str, owner: str) -> dict[str, Any]:
        return public(self._file(file_id, owner))

    def files(self, owner: str, purpose: str | None = None) -> list[dict[str, Any]]:
        """The owner's files, newest first."""
        self.sweep()
        found = []
        now = self.clock()
        for path in self.files_dir.glob("file-*.json"):
            record = read_json(path)
            if not record or record.get("owner") != owner or _expired(record, now):
                continue
            if record.get("purpose") == purpose or (purpose is None and record.get("purpose") != MESSAGE_BATCH_PURPOSE):
                found.append(record)
        return [public(r) for r in _newest_first(found)]

    def delete_file(self, file_id: str, owner: str) -> dict[str, Any]:
        self._file(file_id, owner)
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)
        self.data_path(file_id).unlink(missing_ok=True)
        return {"id": file_id, "object": "file", "deleted": True}

    def content(self, file_id: str, owner: str) -> Path:
        self._file(file_id, owner)
        return self.data_path(file_id)

    # ------------------------------------------------------------------ batches
    def save_batch(self, record: dict[str, Any]) -> None:
        write_json(self.batches_dir / f"{record['id']}.json", record)

    def batch_record(self, batch_id: str) -> dict[str, Any] | None:
        return read_json(self.batches_dir / f"{batch_id}.json") if safe_id(batch_id) else None

    def batch(self, batch_id: str, owner: str, kind: str = OPENAI) -> dict[str, Any]:
        record = self.batch_record(batch_id)
        if record is None or record.get("owner") != owner or record.get("kind", OPENAI) != kind:
            raise APIError(404, f"No such Batch object: {batch_id}", "batch_id", "batch_not_found")
        return record

    def all_batches(self) -> Iterator[dict[str, Any]]:
        for path in self.batches_dir.glob("*.json"):  # not the dot-named files being written
            record = read_json(path)
            if record:
                yield record

    def status_counts(self) -> tuple[dict[str, int], int]:
        """How many batches are in each status, and how many requests of unsettled batches wait for an answer (for
        the metrics: settled batches are read once)."""
        counts: dict[str, int] = {}
        remaining = 0
        for path in self.batches_dir.glob("*.json"):  # not the dot-named files being written
            status = self._settled.get(path.stem)
            if status is None:
                record = read_json(path)
                if record is None:
                    continue
                status = record["status"]
                if status in TERMINAL:
                    self._settled[path.stem] = status
                else:
                    c = record["request_counts"]
                    remaining += max(0, c["total"] - c["completed"] - c["failed"])
            counts[status] = counts.get(status, 0) + 1
        return counts, remaining

    def batches(self, owner: str, kind: str = OPENAI) -> list[dict[str, Any]]:
        """The owner's batches of one API, newest first (whole records: `public` shows one)."""
        mine = [r for r in self.all_batches() if r.get("owner") == owner and r.get("kind", OPENAI) == kind]
        return _newest_first(mine)

    def delete_batch(self, batch_id: str) -> None:
        """The batch's object and files (its requests, results and errors) removed."""
        record = self.batch_record(batch_id)
        if record is None:
            return
        for key in ("input_file_id", "output_file_id", "error_file_id"):
            if record.get(key):
                (self.files_dir / f"{record[key]}.json").unlink(missing_ok=True)
                self.data_path(record[key]).unlink(missing_ok=True)
        for path in (self.lock_path(batch_id), self.cancel_marker(batch_id)):
            path.unlink(missing_ok=True)
        (self.batches_dir / f"{batch_id}.json").unlink(missing_ok=True)

    def lock_path(self, batch_id: str) -> Path:
        return self.batches_dir / f"{batch_id}.lock"

    def cancel_marker(self, batch_id: str) -> Path:
        """Present from a cancel call until the batch is settled (its runner, in any process, polls for it)."""
        return self.batches_dir / f"{batch_id}.cancel"
