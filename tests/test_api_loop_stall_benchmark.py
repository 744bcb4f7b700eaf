"""benchmarks/api_loop_stall.py against a real server: a row a prompt, the poller's waits during each request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from api_fixtures import module_server

ROOT = Path(__file__).resolve().parents[1]

server = module_server("loop_stall")


def test_rows_and_json(server, tmp_path: Path) -> None:
    out = tmp_path / "stall.json"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "api_loop_stall.py"), "--url", server.base_url, "--sizes", "2000",
        "200000", "--reps", "2", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["idle_poll_p50_ms"] > 0
    assert [(r["chars"], r["rep"]) for r in data["rows"]] == [(2000, 0), (2000, 1), (200000, 0), (200000, 1)]
    for row in data["rows"]:
        # The tiny model's 2,000-character prompt fits; the 200,000-character one is refused after tokenizing.
        assert row["status"] == (200 if row["chars"] == 2000 else 400)
        assert row["polls"] >= 1 and row["poll_max_ms"] >= row["poll_p99_ms"] > 0 and row["request_s"] > 0
    assert "| 200000 | 400 |" in proc.stdout
