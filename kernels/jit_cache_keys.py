"""Triton cache keys that do not depend on the order in which a process first hashed its kernels.

Triton 3.6's dependency hash (`DependenciesFinder._update_hash`) merges a called jit function's global values into
its caller's before it computes the callee's own key. So a kernel hashed before its helpers leaves their constexpr
globals out of its key, and one hashed after them puts them in. Two processes that met the kernels in different
orders then disagree on a key. The engine's in-process precompile pass missed what its worker processes had
compiled, and compiled the sampler's two longest kernels again: ~20 s of an H200 cold start (reproduced on CPU with
a fake sm_90 driver, 2026-12-02). Triton 3.9 computes the callee's key first.

`settle` hashes every jit function of the given packages again until no key changes. Global values only grow from
one pass to the next, so every process reaches the same, complete keys. Call it before compiling: the precompile
workers and the in-process pass do.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from triton.runtime.jit import JITFunction

PACKAGES = ("flint_kernels", "triton.language")
MAX_PASSES = 8  # a call chain this deep settles within it; ours are 2-4 deep


def jit_functions(packages: tuple[str, ...] = PACKAGES) -> list[JITFunction]:
    """Every jit function that a loaded module of these packages defines or imports, in a fixed order."""
    found: dict[int, JITFunction] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(p + ".") for p in packages):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, JITFunction):
                found[id(value)] = value
    return sorted(found.values(), key=lambda fn: fn._fn_name)


def import_kernels() -> None:
    """Import every `flint_kernels` module that defines Triton kernels (`*_triton`), so `settle` sees them all."""
    package = importlib.import_module("flint_kernels")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.endswith("_triton"):
            importlib.import_module(f"flint_kernels.{info.name}")


def settle(packages: tuple[str, ...] = PACKAGES) -> int:
    """Hash the packages' jit functions until their keys stop changing; returns how many passes that took."""
    import_kernels()
    fns = jit_functions(packages)
    before = [fn.cache_key for fn in fns]
    for passes in range(1, MAX_PASSES + 1):
        for fn in fns:
            with fn._hash_lock:  # not under a compile computing this key in another thread
                fn.hash = None  # used_global_vals stay: the next pass merges them into the callers
        after = [fn.cache_key for fn in fns]
        if after == before:
            return passes
        before = after
    return MAX_PASSES
