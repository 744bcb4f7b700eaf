"""Faster Triton CPU interpreter for the suite: nine pure-overhead spots of `triton.runtime.interpreter`, same results.

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

A later profile (2026-12-06, the NVFP4 GEMV with the add+RMSNorm prologue, K = 1200: 68 profiled seconds, 218k ops)
found five more, four of them in the semantic layer every op goes through:

- Every 32-bit integer add, sub and mul runs `binary_op_sanitize_overflow_impl`: the operands cast to int64, the op
  again, two compares and an and, all for a `device_assert` that returns at once because the interpreter's options
  never set `debug` (12.5 s). Its `sanitize_overflow` option is turned off where that holds.
- Each op's result type is a fresh `block_type` (its shape unwrapped and validated, its name formatted; 399k made,
  13.5 s): the distinct ones are made once and shared (a type is a value nothing changes once made).
- Each op's result tensor builds its shape as a Triton tuple of constexprs with its tuple type (469k, 8.3 s): a shared
  block type's shape and numel are made once and shared by its tensors.
- Two blocks of one shape still have their shapes compared as Triton tuples in `broadcast_impl_value` (129k compares,
  3.4 s, each unwrapping and rebuilding both); equal plain shapes return as the plain function would.
- Every nested `@triton.jit` call patches the language again into a scope it drops (86k calls, 2.4 s), though the
  launch already patched those modules: skipped inside a launch that did.

Together: that GEMV test 22.8 -> ~11 s; the GEMV and NVFP4 MMA MoE files on two workers 146 -> 88 s (204 s on the
interpreter as shipped); the CPU suite 938 -> 657 s on this 2-core machine.
Each patch is applied only where the interpreter has the names and shapes it was written against; otherwise that
patch is left out (the suite is then only slower). `install()` returns the names applied, so a test can pin them.
"""

from __future__ import annotations

import dataclasses
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
    # In this order: `once_a_launch` works through the `languages` path's function.
    paths = {
        "xor_reduce": lambda: _xor_reduce(interp, tl, np),
        "np_dtype": lambda: _cached_np_dtype(interp, tl),
        "builtins": lambda: _listed_builtins(interp, tl),
        "languages": lambda: _found_languages(interp, tl),
        "once_a_launch": lambda: _patched_once_a_launch(interp),
        "overflow_checks": lambda: _no_dead_overflow_checks(interp, tl),
        "block_types": lambda: _shared_block_types(interp, tl),
        "tensor_shapes": lambda: _shared_tensor_shapes(tl),
        "equal_shapes": lambda: _equal_shapes_kept(interp, tl),
    }
    return [name for name, apply in paths.items() if apply()]


# Launches running (`_patched_once_a_launch`) and the language modules (ids) patched since the innermost began.
_LAUNCH: dict[str, Any] = {"depth": 0, "patched": set()}
# The block types `_shared_block_types` made, by element type's class, element type and shape.
_BLOCK_TYPES: dict[tuple[type, Any, tuple[int, ...]], Any] = {}


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
    found: dict[int, tuple[dict, SimpleNamespace, frozenset[int]]] = {}

    def patch_lang(fn: Any) -> Any:
        g = fn.__globals__
        entry = found.get(id(g))
        if entry is None or entry[0] is not g:
            langs = {name: v for name, v in g.items() if v is tl or v is tl.core}
            entry = found[id(g)] = (g, SimpleNamespace(__globals__=langs), frozenset(map(id, langs.values())))
        if _LAUNCH["depth"]:  # inside a launch (`_patched_once_a_launch`)
            if entry[2] <= _LAUNCH["patched"]:
                return interp._LangPatchScope()
            _LAUNCH["patched"] |= entry[2]
        return plain(entry[1])

    return _replace(interp, "_patch_lang", patch_lang)


def _patched_once_a_launch(interp: Any) -> bool:
    executor = getattr(interp, "GridExecutor", None)
    function = getattr(interp, "InterpretedFunction", None)
    scope = getattr(interp, "_LangPatchScope", None)
    if executor is None or function is None or scope is None or getattr(executor, "_flint_once", False):
        return False
    if not getattr(interp._patch_lang, "_flint_fast", False):  # the languages fast path keeps the count
        return False
    try:
        launch, nested = inspect.getsource(executor.__call__), inspect.getsource(function.__call__)
    except (AttributeError, OSError, TypeError):
        return False
    # A nested @triton.jit call patches the language again (every builtin checked, the tensor and dtype methods set to
    # new closures of the same code) into a scope it drops: inside a launch whose scope already patched those modules,
    # that changes nothing, so it is skipped. Only where the launch patches into the scope it restores at its end and
    # a nested call drops its scope.
    if "patch_scope = _patch_lang(self.fn)" not in launch or "patch_scope.restore()" not in launch:
        return False
    if "        _patch_lang(self.fn)\n" not in nested:
        return False
    plain = executor.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        _LAUNCH["depth"] += 1
        _LAUNCH["patched"] = set()
        try:
            return plain(self, *args, **kwargs)
        finally:
            _LAUNCH["depth"] -= 1
            _LAUNCH["patched"] = set()

    executor.__call__ = __call__
    executor._flint_once = True
    return True


def _no_dead_overflow_checks(interp: Any, tl: Any) -> bool:
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    semantic = getattr(getattr(interp, "interpreter_semantic", None), "__class__", None)
    if not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow") or semantic is None:
        return False
    if getattr(options, "debug", True) or not options.sanitize_overflow:
        return False
    try:
        check = inspect.getsource(semantic.binary_op_sanitize_overflow_impl)
        assert_ = inspect.getsource(semantic.device_assert)
    except (AttributeError, OSError, TypeError):
        return False
    # Only where the check's one effect is its device_assert, and that returns at once without `debug`: the check's
    # casts, products and compares are then computed and dropped on every 32-bit integer add, sub and mul.
    body = [line.strip() for line in assert_.splitlines()[1:] if line.strip()]
    if "self.device_assert(" not in check or body[:2] != ["if not self.builder.options.debug:", "return"]:
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def _shared_block_types(interp: Any, tl: Any) -> bool:
    block_type = getattr(getattr(tl, "core", None), "block_type", None)
    builder_class = getattr(interp, "InterpreterBuilder", None)
    if block_type is None or builder_class is None or getattr(block_type, "_flint_shared", False):
        return False
    if not hasattr(block_type, "with_element_ty") or not hasattr(builder_class, "get_block_ty"):
        return False
    # A block type is a value (element type and shape, compared by both) that nothing changes once made; building one
    # unwraps and validates the shape and formats its name. Each distinct one is made once and then shared.
    # Keyed by the element type's class too (dtypes compare by name alone); pointer types are not hashable and are
    # made as before, like shapes that are not plain ints.
    made = _BLOCK_TYPES

    def block(element_ty: Any, shape: Any) -> Any:
        key = (type(element_ty), element_ty, tuple(shape))
        if not all(type(d) is int for d in key[2]):
            return block_type(element_ty, shape)
        try:
            return made[key]
        except KeyError:
            made[key] = got = block_type(element_ty, shape)
            got._flint_made = True  # `_shared_tensor_shapes` keeps its tensors' shape on it
            return got
        except TypeError:
            return block_type(element_ty, shape)

    def with_element_ty(self: Any, scalar_ty: Any) -> Any:
        return block(scalar_ty, self.shape)

    def get_block_ty(self: Any, dtype: Any, shape: Any) -> Any:
        return block(dtype, shape)

    block_type.with_element_ty = with_element_ty
    builder_class.get_block_ty = get_block_ty
    block_type._flint_shared = True
    return True


def _shared_tensor_shapes(tl: Any) -> bool:
    tensor = getattr(getattr(tl, "core", None), "tensor", None)
    if tensor is None or getattr(tensor, "_flint_shared", False):
        return False
    plain = tensor.__init__
    if list(inspect.signature(plain).parameters) != ["self", "handle", "type"]:
        return False
    # A tensor's shape (a Triton tuple of constexprs, with its tuple type) and numel follow from its type alone, and
    # the interpreter makes a tensor for every op: a shared block type (`_shared_block_types`) keeps the pair its
    # first tensor got from the plain constructor, and its later tensors take that pair.
    fields = {"handle", "type", "dtype", "shape", "numel"}
    state = {"on": True}

    def __init__(self: Any, handle: Any, type: Any) -> None:
        kept = getattr(type, "_flint_tensor_shape", None) if state["on"] else None
        if kept is None:
            plain(self, handle, type)
            if state["on"] and getattr(type, "_flint_made", False):
                if set(vars(self)) == fields:
                    type._flint_tensor_shape = (self.shape, self.numel)
                else:  # a Triton whose tensors hold more than these: the plain constructor from now on
                    state["on"] = False
            return
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.shape, self.numel = kept

    tensor.__init__ = __init__
    tensor._flint_shared = True
    return True


def _equal_shapes_kept(interp: Any, tl: Any) -> bool:
    semantic = getattr(getattr(interp, "interpreter_semantic", None), "__class__", None)
    plain = getattr(semantic, "broadcast_impl_value", None)
    if plain is None or getattr(plain, "_flint_fast", False):
        return False
    try:
        source = inspect.getsource(plain)
    except (OSError, TypeError):
        return False
    if "if lhs_shape != ret_shape:" not in source or "if rhs_shape != ret_shape:" not in source:
        return False
    tuple_class = tl.core.tuple
    # Two blocks of one shape broadcast to that shape: the plain function returns both as they came, after comparing
    # the shapes as Triton tuples (each compare unwraps and rebuilds them). Equal shapes as plain int lists are that
    # case; everything else goes the plain way.

    def broadcast_impl_value(self: Any, lhs: Any, rhs: Any) -> Any:
        lt, rt = lhs.type, rhs.type
        if lt.is_block() and rt.is_block():
            ls, rs = lt.shape, rt.shape
            if ls is rs or (type(ls) is tuple_class and type(rs) is tuple_class and ls.values == rs.values):
                return lhs, rhs
        return plain(self, lhs, rhs)

    broadcast_impl_value._flint_fast = True
    semantic.broadcast_impl_value = broadcast_impl_value
    return True
