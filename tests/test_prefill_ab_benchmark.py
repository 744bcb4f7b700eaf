"""benchmarks/prefill_ab.py: alternating prefill rounds of the engine and a variant, and the variant undone after."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from flint_kernels import gemv_triton as gt


def test_scale_pass_variant_patches_and_restores(benchmark_script: Callable[[str], ModuleType]) -> None:
    prefill_ab = benchmark_script("prefill_ab")
    original = gt.dequant_matmul
    undo = prefill_ab.VARIANTS["scale_pass"]()
    try:
        assert gt.dequant_matmul is not original and gt.dequant_matmul.keywords == {"alpha": False}
    finally:
        undo()
    assert gt.dequant_matmul is original


def test_fresh_only_variant_patches_and_restores(benchmark_script: Callable[[str], ModuleType]) -> None:
    """`fresh_only` keeps chunks after a prefix off cuDNN for its rounds (no prefix segments), then restores them."""
    from flint_kernels import attention_cudnn as ac

    prefill_ab = benchmark_script("prefill_ab")
    original = ac.SEGMENT
    undo = prefill_ab.VARIANTS["fresh_only"]()
    try:
        assert ac.SEGMENT == 0 and original > 0
    finally:
        undo()
    assert original == ac.SEGMENT


def test_one_row_glue_variant_patches_and_restores(benchmark_script: Callable[[str], ModuleType]) -> None:
    """`one_row_glue` puts SiLU-and-mul back on one row a program at every row count, then restores the bound."""
    from flint_kernels import activation_triton as act

    prefill_ab = benchmark_script("prefill_ab")
    before = act.ROWS_MIN
    undo = prefill_ab.VARIANTS["one_row_glue"]()
    try:
        assert act.ROWS_MIN > 1 << 40 and before <= 2048
    finally:
        undo()
    assert before == act.ROWS_MIN


def test_attention_before_variant_swaps_the_prefill_kernel(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`attention_before` runs the prefills through an older attention_triton.py's kernel for its rounds, then puts
    the installed one back."""
    from flint_kernels import attention_triton as at

    copy = tmp_path / "attention_before.py"
    copy.write_text(Path(at.__file__).read_text())
    monkeypatch.setenv("FLINT_AB_ATTENTION_BEFORE", str(copy))
    prefill_ab = benchmark_script("prefill_ab")
    original = at.paged_attention_prefill
    undo = prefill_ab.VARIANTS["attention_before"]()
    try:
        swapped = at.paged_attention_prefill
        assert swapped is not original and swapped.__module__ == "flint_kernels._attention_triton_before"
    finally:
        undo()
        sys.modules.pop("flint_kernels._attention_triton_before", None)
        sys.modules.pop("prefill_attention_ab", None)
    assert at.paged_attention_prefill is original


def test_rounds_on_a_tiny_model(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two rounds on CPU: each run of each side is timed and profiled GPU time is 0 off CUDA; the JSON has both."""
    prefill_ab = benchmark_script("prefill_ab")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "ab.json"
    original = gt.dequant_matmul
    prefill_ab.main(
        ["--variant", "scale_pass", "--rounds", "2", "--preset", "tiny", "--device", "cpu", "--tokens", "96",
         "--out", str(out)]
    )  # fmt: skip
    got = json.loads(out.read_text())
    assert set(got["runs"]) == {"engine", "scale_pass"}
    assert all(len(rs) == 2 and all(r["wall_ms"] > 0 and r["gpu_ms"] == 0 for r in rs) for rs in got["runs"].values())
    assert got["tokens"] == 96 and set(got["median_wall_ms"]) == {"engine", "scale_pass"}
    assert gt.dequant_matmul is original


def test_a_tuning_file_variant_in_chunks(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The variant's rounds with another tuning table (and only they: FLINT_TUNING_FILE is restored), the prompt in
    steps of 32 tokens."""
    from flint_kernels import tuning

    prefill_ab = benchmark_script("prefill_ab")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv(tuning.ENV, raising=False)
    table = tmp_path / "paths.json"
    table.write_text(json.dumps({"device": "cpu", "moe.paths": []}))
    seen = []
    once = prefill_ab.prefill_once
    monkeypatch.setattr(prefill_ab, "prefill_once", lambda a, o: seen.append(os.environ.get(tuning.ENV)) or once(a, o))
    out = tmp_path / "ab.json"
    prefill_ab.main(
        ["--variant-tuning-file", str(table), "--rounds", "1", "--preset", "tiny", "--device", "cpu", "--tokens",
         "96", "--chunk", "32", "--out", str(out)]
    )  # fmt: skip
    got = json.loads(out.read_text())
    assert seen == [None, str(table)] and tuning.ENV not in os.environ
    assert set(got["runs"]) == {"engine", "paths"} and got["chunk"] == 32
    with pytest.raises(SystemExit):
        prefill_ab.main(["--rounds", "1"])
