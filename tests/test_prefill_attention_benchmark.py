"""benchmarks/prefill_attention_sdpa.py: its "ours" rows time the Triton kernel, never the cuDNN path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from flint_kernels import attention_triton as at
from flint_kernels.configs import AttentionPrefillConfig


def test_ours_never_goes_to_cudnn(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a table that sends 4,096+ token prompts to cuDNN (the H200's), the Triton rows keep the table's tiles
    and turn cuDNN off: the twenty-sixth session's "ours" rows at 8K after 8K were cuDNN's (626 TFLOP/s)."""
    bench = benchmark_script("prefill_attention_sdpa")
    table = AttentionPrefillConfig(block_n=128, max_block_m=128, cudnn_min_tokens=4096)
    seen: list[tuple[int, object]] = []

    def tuned(tokens: int, window: int | None, *args: object, **kw: object) -> AttentionPrefillConfig:
        seen.append((tokens, window))
        return table

    monkeypatch.setattr(at, "prefill_config", tuned)
    cfg = bench.triton_only(8192, torch.device("cpu"))
    assert cfg.cudnn_min_tokens == 0
    assert (cfg.block_n, cfg.max_block_m) == (128, 128)
    assert bench.triton_only(4096, torch.device("cpu"), 513).cudnn_min_tokens == 0
    assert seen == [(8192, None), (4096, 513)]


def test_before_version_loads_beside_the_current_one(
    benchmark_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """prefill_attention_ab.py loads an older attention_triton.py as a module of flint_kernels (its relative imports
    resolved to this checkout), apart from the installed one; without a GPU it says so and exits 1."""
    import sys

    bench = benchmark_script("prefill_attention_ab")
    copy = tmp_path / "attention_before.py"
    copy.write_text(Path(at.__file__).read_text())
    before = bench.load_before(copy)
    try:
        assert before is not at and before.__name__ == "flint_kernels._attention_triton_before"
        assert before.paged_attention_prefill is not at.paged_attention_prefill
        assert before.prefill_config(8192, None, torch.device("cpu")) == at.prefill_config(
            8192, None, torch.device("cpu")
        )
        if not torch.cuda.is_available():
            assert bench.main(["--before", str(copy)]) == 1
    finally:
        sys.modules.pop("flint_kernels._attention_triton_before", None)
