"""Checkpoints: read HF safetensors and GGUF (F32/F16/BF16/NVFP4) lazily; write HF and GGUF."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import kernel_profile as _kernel_profile
from ..config import FlintConfig
from ..weights import FlintWeights
from .assemble import assemble_weights
from .errors import CheckpointError
from .gguf_source import GGUFSource
from .hf_source import HFSource
from .tensor_plan import checkpoint_plan

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "LoadedCheckpoint", "kernel_profile", "load_checkpoint", "open_source"]

# Flint's recommended sampling (its generation_config): temperature 1.0, top_p 0.95, top_k 20.
FLINT_GENERATION_DEFAULTS = {"temperature": 1.0, "top_p": 0.95, "top_k": 20}


@dataclass
class LoadedCheckpoint:
    path: str
    format: str
    config: FlintConfig
    weights: FlintWeights
    tokenizer: Any | None
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    tensor_types: dict[str, int] = field(default_factory=dict)


def open_source(path: str | os.PathLike[str]) -> GGUFSource | HFSource:
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").is_file():
            return HFSource(p)
        raise CheckpointError("directory has no config.json (not a Hugging Face checkpoint)", path=str(p))
    if not p.exists():
        raise CheckpointError("no such file or directory", path=str(p))
    return GGUFSource(p)


def kernel_profile(src: GGUFSource | HFSource, dtype: torch.dtype) -> str:
    """The kernel profile (`flint_engine.kernel_profile`) the checkpoint's weights will have, from its header alone."""
    specs = {spec.key: spec for spec in checkpoint_plan(src.config)}
    return _kernel_profile.of_checkpoint(src.config, dtype, lambda key: src.is_nvfp4(specs[key]))


def _tokenizer_and_generation(src: GGUFSource | HFSource) -> tuple[Any | None, dict[str, Any]]:
    from ..tokenizer import FlintTokenizer

    gen: dict[str, Any] = dict(FLINT_GENERATION_DEFAULTS)
    if isinstance(src, GGUFSource):
        tok = FlintTokenizer.from_gguf_metadata(src.meta) if "tokenizer.ggml.tokens" in src.meta else None
        for key, name in (
            ("general.sampling.temp", "temperature"),
            ("general.sampling.top_p", "top_p"),
            ("general.sampling.top_k", "top_k"),
            ("general.sampling.min_p", "min_p"),
        ):
            if key in src.meta:
                gen[name] = src.meta[key]
        return tok, gen
    tok = FlintTokenizer.from_hf_dir(src.path) if (Path(src.path) / "tokenizer.json").is_file() else None
    gc = src.read_json("generation_config.json") or {}
    for name in ("temperature", "top_p", "top_k", "min_p"):
        if gc.get(name) is not None:
            gen[name] = gc[name]
    return tok, gen


def load_checkpoint(
    path: str | os.PathLike[str],
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    progress: bool = True,
    source: GGUFSource | HFSource | None = None,
) -> LoadedCheckpoint:
    """Load the checkpoint at `path` (`source`: the same, already opened with `open_source`)."""
    src = source or open_source(path)
    weights = assemble_weights(src, dtype=dtype, device=device, progress=progress)
    tokenizer, gen = _tokenizer_and_generation(src)
    if tokenizer is not None and tokenizer.vocab_size > src.config.vocab_size:
        raise CheckpointError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model only {src.config.vocab_size} embeddings",
            path=str(path),
        )
    types: dict[str, int] = {}
    if isinstance(src, GGUFSource):
        for t in src.tensor_types().values():
            types[t] = types.get(t, 0) + 1
    return LoadedCheckpoint(str(path), src.format_name, src.config, weights, tokenizer, gen, types)
