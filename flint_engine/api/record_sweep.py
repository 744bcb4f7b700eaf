"""Directories of records kept one JSON file each (stored responses, conversations), and their sweep: the expired
ones by their files' last write (no file is read), then the oldest while the records are past a byte budget. The
files kept beside a record (the same name with another suffix) count in its bytes and go with it."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .json_files import read_json, safe_id

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 60.0


def remove_record(path: Path, beside: tuple[str, ...]) -> None:
    path.unlink(missing_ok=True)
    for suffix in beside:
        path.with_suffix(suffix).unlink(missing_ok=True)


def _bytes(path: Path, own: int, beside: tuple[str, ...]) -> int:
    total = own
    for suffix in beside:
        with contextlib.suppress(FileNotFoundError):
            total += path.with_suffix(suffix).stat().st_size
    return total


def sweep_records(root: Path, ttl_s: float, max_bytes: int, now: float, beside: tuple[str, ...] = ()) -> int:
    """Remove `root`'s records last written `ttl_s` or more before `now`, then the oldest past `max_bytes`; returns
    how many went."""
    kept, gone = [], 0
    for path in root.glob("*.json"):  # not the dot-named files being written
        try:
            st = path.stat()
        except FileNotFoundError:  # deleted meanwhile
            continue
        if st.st_mtime + ttl_s <= now:
            remove_record(path, beside)
            gone += 1
        else:
            kept.append((st.st_mtime_ns, path.name, path, _bytes(path, st.st_size, beside)))
    total = sum(k[3] for k in kept)
    for _, _, path, size in sorted(kept):
        if total <= max_bytes:
            break
        remove_record(path, beside)
        total -= size
        gone += 1
    return gone


class SweptRecords:
    """A directory of records, one `<id>.json` each with files `beside` it, that belong to their owners and expire
    `ttl_s` after their last write; swept on a thread at most once every `sweep_every_s` (`maybe_sweep`)."""

    beside: tuple[str, ...] = ()
    kind = "records"  # for the log

    def __init__(
        self,
        root: str | Path,
        ttl_s: int,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
        sweep_every_s: float = SWEEP_EVERY_S,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.sweep_every_s = sweep_every_s  # (tests sweep by hand)
        self._lock = threading.Lock()
        self._last_sweep = 0.0

    def _path(self, record_id: str) -> Path:
        return self.root / f"{record_id}.json"

    def _owned(self, record_id: str, owner: str) -> tuple[dict[str, Any], float] | None:
        """The record and its last write, if it is there, unexpired and `owner`'s."""
        path = self._path(record_id)
        try:
            written = path.stat().st_mtime if safe_id(record_id) else None
        except FileNotFoundError:
            written = None
        record = read_json(path) if written is not None else None
        if record is None or record.get("owner") != owner or written + self.ttl_s <= self.clock():
            return None
        return record, written

    def _remove(self, record_id: str) -> None:
        remove_record(self._path(record_id), self.beside)

    def maybe_sweep(self) -> None:
        now = self.clock()
        if now - self._last_sweep >= self.sweep_every_s:
            self._last_sweep = now
            # On a thread: this runs on the server's event loop, and a large directory takes a while to list.
            threading.Thread(target=self.sweep, name=f"flint-sweep-{self.kind}", daemon=True).start()

    def sweep(self) -> int:
        """Remove the expired records (by their files' last write: no file is read), then the oldest while the
        directory is past `max_bytes`; returns how many went."""
        with self._lock:
            self._last_sweep = now = self.clock()
            gone = sweep_records(self.root, self.ttl_s, self.max_bytes, now, self.beside)
        if gone:
            log.info("removed %d %s (expired, or the oldest past %d bytes)", gone, self.kind, self.max_bytes)
        return gone
