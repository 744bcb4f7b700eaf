"""A real single-process server over a tiny random Flint, shared by the API tests."""

from __future__ import annotations

from pathlib import Path

import torch

from flint_engine.api.server import LocalServer, start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.checkpoint import load_checkpoint
from flint_engine.checkpoint.gguf_writer import write_gguf
from flint_engine.checkpoint.random_tensors import random_provider
from flint_engine.config import preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.tokenizer import build_default_tokenizer


def tiny_checkpoint(tmp: Path, seed: int = 1) -> Path:
    cfg = preset("tiny")
    tok = build_default_tokenizer(cfg.vocab_size)
    cfg = cfg.replace(
        bos_token_id=tok.bos_token_id, eos_token_id=tuple(tok.eos_token_ids), pad_token_id=tok.pad_token_id
    )
    path = tmp / f"tiny-{seed}.gguf"
    if not path.exists():
        write_gguf(
            path,
            cfg,
            random_provider(cfg, seed),
            fmt="bf16",
            tokenizer=tok,
            generation={"temperature": 1.0, "top_p": 0.95, "top_k": 20},
            progress=False,
        )
    return path


def tiny_engine(path: Path, **engine_kw) -> LLMEngine:
    ck = load_checkpoint(path, torch.float32, progress=False)
    ec = EngineConfig(**{"kv_cache_memory": 32 * 2**20, **engine_kw})
    return LLMEngine(FlintModel(ck.weights), ck.tokenizer, ec, ck.generation_defaults)


def tiny_server(tmp: Path, settings: APISettings | None = None, **engine_kw) -> LocalServer:
    return start_local_server(tiny_engine(tiny_checkpoint(tmp), **engine_kw), settings)
