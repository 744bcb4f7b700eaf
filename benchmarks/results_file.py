"""Writing a benchmark's JSON result: the rows plus the date, GPU, torch version, host and command that made them."""

from __future__ import annotations

import json
import platform
from datetime import date
from pathlib import Path
from typing import Any

import torch


def write_results(path: Path, command: str, rows: list[dict], **extra: Any) -> None:
    """Write `rows` (and any `extra` fields) to `path` as JSON, stamped with where and how they were measured."""
    out = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "host": platform.node(),
        "command": command,
        **extra,
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
