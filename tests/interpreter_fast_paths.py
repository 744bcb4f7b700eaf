"""Faster Triton CPU interpreter for the suite: four pure-overhead spots of `triton.runtime.interpreter`, same results.

Profiles of two interpreter tests (the sampler's draw filter and the NVFP4 MoE's folded shared expert, 2026-12-06,
Triton 3.9) put most of their time in places that compute nothing a kernel sees:

- `tl.xor_sum` (which `tl.sort`'s bitonic network calls for every compare-and-swap) has no NumPy path and falls to
  `generic_reduce`, a Python loop calling the combine function element by element: 1,788 reductions over 306,528
  elements took 34 of the test's ~50 profiled seconds. XOR is associative and commutative, so NumPy's
  `bitwise_xor.reduce` gives the same integers in any order.
- `_get_np_dtype` builds a 20-entry dict on every call (468k calls); the mapping is fixed, so it is cached.
- `_patch_builtin` runs `inspect.getmembers` over `triton.language` for every nested `@triton.jit` call (39k calls)
  to find the builtins still unpatched; the builtins are listed once and the same check (is the attribute still the
  original builtin?) is made on that list.
- `_patch_lang`, for each of those calls too, scans the function's module globals for `triton.language`; it reads
  nothing else of the function, so it is handed the language modules found there, found once a module.

Each patch is applied only where the interpreter has the names and shapes it was written against; otherwise that
patch is left out (the suite is then only slower). `install()` returns the names applied, so a test can pin them.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any


def install() -> list[str]:
    """Apply the fast paths to the imported interpreter; the names of those applied."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return []
    applied = []
    if _xor_reduce(interp, tl, np):
        applied.append("xor_reduce")
    if _cached_np_dtype(interp, tl):
        applied.append("np_dtype")
    if _listed_builtins(interp, tl):
        applied.append("builtins")
    if _found_languages(interp, tl):
        applied.append("languages")
    return applied


def _plain(interp: Any, name: str) -> Any:
    """The interpreter's own function of that name; None if it lacks one or it is already replaced."""
    fn = getattr(interp, name, None)
    return None if fn is None or getattr(fn, "_flint_fast", False) else fn


def _replace(interp: Any, name: str, fast: Any) -> bool:
    fast._flint_fast = True
    setattr(interp, name, fast)
    return True


def _xor_reduce(interp: Any, tl: Any, np: Any) -> bool:
    ops = getattr(interp, "ReduceOps", None)
    xor = getattr(getattr(tl, "standard", None), "_xor_combine", None)
    if ops is None or xor is None or not hasattr(ops, "apply_impl") or getattr(ops, "_flint_xor", False):
        return False
    generic = ops.apply_impl

    def apply_impl(self: Any, input: tuple) -> Any:
        if self.combine_fn is xor and len(input) == 1:
            data, axis = input[0].handle.data, self.axis
            if axis is None:  # flattened first, as the generic loop does (keep_dims then leaves one axis, not all)
                data, axis = data.reshape(-1), 0
            return self.to_tensor(np.bitwise_xor.reduce(data, axis=axis, keepdims=self.keep_dims), input[0].dtype)
        return generic(self, input)

    ops.apply_impl = apply_impl
    ops._flint_xor = True
    return True


def _cached_np_dtype(interp: Any, tl: Any) -> bool:
    plain = _plain(interp, "_get_np_dtype")
    if plain is None:
        return False
    cache: dict[Any, Any] = {}

    def get_np_dtype(tt_dtype: Any) -> Any:
        # Blocks map by their element type; pointers are left to the plain function (not cached by their hash).
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):
            return plain(tt_dtype)
        try:
            return cache[key]
        except KeyError:
            cache[key] = got = plain(tt_dtype)
            return got
        except TypeError:  # an unhashable type: as before
            return plain(tt_dtype)

    return _replace(interp, "_get_np_dtype", get_np_dtype)


def _listed_builtins(interp: Any, tl: Any) -> bool:
    plain = _plain(interp, "_patch_builtin")
    patch_attr = getattr(interp, "_patch_attr", None)
    is_builtin = getattr(getattr(tl, "core", None), "is_builtin", None)
    if plain is None or patch_attr is None or is_builtin is None:
        return False
    if list(inspect.signature(plain).parameters) != ["pkg", "builder", "scope"]:
        return False
    listed: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        entry = listed.get(id(pkg))
        if entry is None or entry[0] is not pkg:
            # Listed while nothing is patched (the first launch lists before it patches), as getmembers would.
            members = [(name, m) for name, m in inspect.getmembers(pkg) if is_builtin(m)]
            entry = listed[id(pkg)] = (pkg, members)
        for name, member in entry[1]:
            # getmembers' check on the attribute as it is now: only an original builtin is patched again.
            if getattr(pkg, name, None) is member:
                patch_attr(pkg, name, member, builder, scope)

    return _replace(interp, "_patch_builtin", patch_builtin)


def _found_languages(interp: Any, tl: Any) -> bool:
    plain = _plain(interp, "_patch_lang")
    if plain is None:
        return False
    try:
        source = inspect.getsource(plain)
    except (OSError, TypeError):
        return False
    # Only where the function is read for its globals alone, and only for the modules themselves.
    if source.count("fn.") != source.count("fn.__globals__") or "value in [tl, tl.core]" not in source:
        return False
    found: dict[int, tuple[dict, SimpleNamespace]] = {}

    def patch_lang(fn: Any) -> Any:
        g = fn.__globals__
        entry = found.get(id(g))
        if entry is None or entry[0] is not g:
            langs = {name: v for name, v in g.items() if v is tl or v is tl.core}
            entry = found[id(g)] = (g, SimpleNamespace(__globals__=langs))
        return plain(entry[1])

    return _replace(interp, "_patch_lang", patch_lang)
