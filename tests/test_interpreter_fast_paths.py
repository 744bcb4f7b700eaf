"""tests/interpreter_fast_paths.py: applied under the suite's Triton, and each fast path gives what the interpreter's
own path gives (random inputs; the kernel tests that sort, reduce and call helpers check the rest)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("FLINT_TEST_PLAIN_INTERPRETER") == "1",
    reason="the fast paths are installed only for the interpreter (machines without a GPU), unless asked not to be",
)


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _sort_twice_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.sort(_twice(tl.load(x_ptr + offs)), descending=True))


def test_every_fast_path_is_applied() -> None:
    """A Triton whose interpreter moved these names would leave the suite slow, not wrong: this says so in CI."""
    from conftest import INTERPRETER_FAST_PATHS

    every = ["xor_reduce", "np_dtype", "builtins", "languages"]
    assert every == INTERPRETER_FAST_PATHS, (
        f"Triton {triton.__version__}'s interpreter took only {INTERPRETER_FAST_PATHS} of {every}: the suite runs"
        " slower (not wrong); see tests/interpreter_fast_paths.py"
    )


@pytest.mark.parametrize(("axis", "keep_dims"), [(0, False), (1, True), (None, False), (None, True)])
@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64])
def test_xor_reduce_equals_the_generic_loop(axis: int | None, keep_dims: bool, dtype: type) -> None:
    from triton.runtime import interpreter as interp

    data = np.random.default_rng(3).integers(0, np.iinfo(dtype).max, size=(8, 16), dtype=dtype)
    tt = {np.int32: tl.int32, np.uint16: tl.uint16, np.int64: tl.int64}[dtype]
    x = tl.core.tensor(interp.TensorHandle(data, tt), tl.block_type(tt, [8, 16]))
    ops = interp.ReduceOps(axis, tl.standard._xor_combine, keep_dims)
    scope = interp._patch_lang(_twice.fn)  # the language as inside a launch (the combine function's `^`)
    try:
        fast = ops.apply((x,))[0].handle.data
        slow = ops.generic_reduce((x,))[0].handle.data
    finally:
        scope.restore()
    assert np.asarray(fast).dtype == np.asarray(slow).dtype and np.array_equal(fast, slow)


def test_np_dtypes_as_before() -> None:
    from triton.runtime import interpreter as interp

    assert interp._get_np_dtype._flint_fast
    types = [tl.float32, tl.float16, tl.bfloat16, tl.int8, tl.uint32, tl.int1, tl.pointer_type(tl.float32)]
    types += [tl.block_type(t, [4, 8]) for t in (tl.float32, tl.int64, tl.pointer_type(tl.int8))]
    want = [np.float32, np.float16, np.uint16, np.int8, np.uint32, np.bool_, np.uint64, np.float32, np.int64, np.uint64]
    for t, w in zip(types, want, strict=True):
        assert interp._get_np_dtype(t) == np.dtype(w), t
        assert interp._get_np_dtype(t) == np.dtype(w), t  # from the cache


def test_a_launch_leaves_triton_language_as_it_was() -> None:
    """Builtins are patched for a launch and restored after it, nested helper calls included (as without the list)."""
    before = {name: getattr(tl, name) for name in ("load", "store", "arange", "sum")}
    x = torch.randint(-1000, 1000, (64,), dtype=torch.int32)
    out = torch.empty_like(x)
    _sort_twice_kernel[(1,)](x, out, BLOCK=64)
    assert torch.equal(out, (x * 2).sort(descending=True).values)
    assert {name: getattr(tl, name) for name in before} == before
