"""The embedded default checkpoint that `flint-serve` runs with no arguments.

A checkpoint shipped in the package (`assets/flint-demo.gguf`) wins; otherwise a deterministic random-weight
`small` Flint is made once with the project's own writer and kept in the cache directory (no download).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_PRESET = "small"
DEFAULT_SEED = 0
_VERSION = "v1"


def cache_dir() -> Path:
    return Path(os.environ.get("FLINT_CACHE_DIR") or Path.home() / ".cache" / "flint-serve")


def shipped_checkpoint() -> Path:
    return Path(__file__).parent / "assets" / "flint-demo.gguf"


def default_checkpoint_path() -> Path:
    shipped = shipped_checkpoint()
    if shipped.is_file():
        return shipped
    path = cache_dir() / f"flint-{DEFAULT_PRESET}-random-seed{DEFAULT_SEED}-{_VERSION}.gguf"
    if not path.is_file():
        make_random_checkpoint(path, DEFAULT_PRESET, DEFAULT_SEED)
    return path


def make_random_checkpoint(path: Path, preset_name: str, seed: int, fmt: str = "bf16") -> Path:
    from .checkpoint import FLINT_GENERATION_DEFAULTS
    from .checkpoint.gguf_writer import write_gguf
    from .checkpoint.random_tensors import random_provider
    from .random_model import preset_with_tokenizer

    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("making the default %s checkpoint at %s", preset_name, path)
    config, tok = preset_with_tokenizer(preset_name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write_gguf(
            tmp,
            config,
            random_provider(config, seed),
            fmt=fmt,
            tokenizer=tok,
            generation=FLINT_GENERATION_DEFAULTS,
            name=f"flint-{preset_name}-random",
            progress=False,
        )
        os.replace(tmp, path)  # atomic: concurrent replicas never see a half-written file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
