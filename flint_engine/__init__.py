"""Flint's engine: config, checkpoints, model, KV cache, scheduler, sampler, tokenizer, parsers and the OpenAI API.

`LLM` (generation in this process) and `SamplingParams` are importable from here; they load on first use, so that
importing a submodule (the parsers, the API's protocol) does not import the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .llm import LLM, ChatReply, Completion
    from .sampling_params import SamplingParams

__all__ = ["LLM", "ChatReply", "Completion", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in ("LLM", "ChatReply", "Completion"):
        from . import llm

        return getattr(llm, name)
    if name == "SamplingParams":
        from .sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'flint_engine' has no attribute {name!r}")
