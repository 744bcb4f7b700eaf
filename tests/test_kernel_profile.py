"""The kernel profile: the same name from loaded weights and from a checkpoint's header (so the kernel precompile
can start before the weights load)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flint_engine.checkpoint import kernel_profile, load_checkpoint, open_source
from flint_engine.checkpoint.gguf_writer import write_gguf
from flint_engine.checkpoint.hf_writer import write_hf
from flint_engine.checkpoint.random_tensors import random_provider
from flint_engine.config import preset
from flint_engine.random_model import load_random_model


def test_kernel_profile_names_the_weight_format() -> None:
    bf16, _, _ = load_random_model("random:tiny", torch.float32, torch.device("cpu"))
    bf16_again, _, _ = load_random_model("random:tiny:seed=3", torch.float32, torch.device("cpu"))
    nvfp4, _, _ = load_random_model("random:tiny:nvfp4", torch.float32, torch.device("cpu"))
    assert bf16.kernel_profile() == bf16_again.kernel_profile()  # the values do not matter, the layout does
    assert bf16.kernel_profile() != nvfp4.kernel_profile()
    assert "expertsf4" in nvfp4.kernel_profile() and "expertsbf" in bf16.kernel_profile()
    assert bf16.kernel_profile().startswith("float32-v")


@pytest.mark.parametrize(("fmt", "scope"), [("bf16", "all"), ("nvfp4", "all"), ("nvfp4", "experts")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_header_names_the_profile_the_weights_will_have(
    tmp_path: Path, fmt: str, scope: str, dtype: torch.dtype
) -> None:
    config = preset("tiny")
    path = tmp_path / "m.gguf"
    write_gguf(path, config, random_provider(config, 1, nvfp4_values=fmt == "nvfp4"), fmt=fmt, nvfp4_scope=scope,
               progress=False)  # fmt: skip
    from_header = kernel_profile(open_source(path), dtype)
    loaded = load_checkpoint(path, dtype, progress=False).weights
    assert from_header == loaded.kernel_profile()
    assert ("expertsf4" in from_header) == (fmt == "nvfp4")
    assert ("moe.qkvf4" in from_header) == (fmt == "nvfp4" and scope == "all")


def test_a_safetensors_header_names_the_profile_too(tmp_path: Path) -> None:
    config = preset("tiny")
    write_hf(tmp_path / "hf", config, random_provider(config, 2), progress=False)
    from_header = kernel_profile(open_source(tmp_path / "hf"), torch.float32)
    assert from_header == load_checkpoint(tmp_path / "hf", torch.float32, progress=False).weights.kernel_profile()
    assert "f4" not in from_header.rsplit("-", 1)[-1]
