"""benchmarks/prefill_probe.py: each path's one-sequence prefill timed per prompt length, on a shallow model."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def test_probe_times_both_paths_per_length(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    probe = benchmark_script("prefill_probe")
    out = tmp_path / "probe.json"
    argv = ["prefill_probe.py", "--preset", "tiny", "--layers", "3", "--lengths", "5", "9", "--top", "3"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    probe.main()
    rows = json.loads(out.read_text())["nvfp4"]["rows"]
    assert [(r["path"], r["tokens"]) for r in rows] == [("fused", 5), ("fused", 9), ("plain", 5), ("plain", 9)]
    assert all(r["first_s"] > 0 and r["again_s"] > 0 for r in rows)
    assert "aten::" in capsys.readouterr().out  # the plain path's op profile
