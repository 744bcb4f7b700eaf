"""Objects kept as one JSON file each, replaced atomically: a reader (another router process on the same directory,
or this one after a restart) never sees half an object."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The object, or None where there is none (or only a damaged one)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def safe_id(name: str) -> bool:
    """An id that names a file inside its directory (no separators, no dot files): clients send ids in URLs."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".") and ".." not in name
