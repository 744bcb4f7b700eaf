"""Triton's process-wide JIT cache hook, which the compile recorder (`precompile.Recorder`) and the engine's
late-compile watch (`flint_engine.late_compiles`) both chain onto."""

from __future__ import annotations

from typing import Any


def runtime_knobs() -> Any:
    """`triton.knobs.runtime` when this Triton has a JIT cache hook (3.4 and later), else None."""
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    return runtime if hasattr(runtime, "jit_cache_hook") else None
