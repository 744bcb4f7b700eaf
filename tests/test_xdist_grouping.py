"""`make test` runs the suite with `--dist loadgroup` so that the Ray cluster tests (`xdist_group("ray_cluster")`)
share one worker, in turn: two local Ray clusters at once on CI's two cores starve each other's health checks. That
grouping broke silently once (pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386): this test runs a tiny
suite the same way and fails if the group's tests spread over several workers again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("cluster")


def test_{name}_first():
    assert True


def test_{name}_second():
    assert True


def test_{name}_third():
    assert True
"""

FREE = """
def test_free_one():
    assert True


def test_free_two():
    assert True
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_alpha.py").write_text(GROUPED.format(name="alpha"))
    (tmp_path / "test_beta.py").write_text(GROUPED.format(name="beta"))
    (tmp_path / "test_free.py").write_text(FREE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = re.findall(r"\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", proc.stdout)
    assert len(ran) == 8, proc.stdout
    workers = {worker for worker, test in ran if "test_alpha" in test or "test_beta" in test}
    assert len(workers) == 1, f"the group's tests ran on {sorted(workers)}:\n{proc.stdout}"
