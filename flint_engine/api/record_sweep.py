"""The sweep of a directory of records kept one JSON file each (stored responses, conversations): the expired ones by
their files' last write (no file is read), then the oldest while the records are past a byte budget. The files kept
beside a record (the same name with another suffix) count in its bytes and go with it."""

from __future__ import annotations

import contextlib
from pathlib import Path


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
