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

    every = ["xor_reduce", "np_dtype", "builtins", "languages", "once_a_launch"]
    every += ["overflow_checks", "block_types", "tensor_shapes", "equal_shapes"]
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


@triton.jit
def _int_ops_kernel(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs)
    b = tl.load(b_ptr + offs)
    tl.store(out_ptr + offs, (a * b + a) - b * 3)


def test_integer_ops_wrap_as_before_without_the_dead_overflow_check() -> None:
    """The check's only effect was an assert the interpreter never enables: int32 ops that overflow still wrap, as the
    plain interpreter (and a GPU without `debug`) computes them."""
    from triton.runtime import interpreter as interp

    options = interp.interpreter_builder.options
    assert not options.sanitize_overflow and not options.debug
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-(2**31), 2**31 - 1, (256,), dtype=torch.int32, generator=g)
    b = torch.randint(-(2**31), 2**31 - 1, (256,), dtype=torch.int32, generator=g)
    out = torch.empty_like(a)
    _int_ops_kernel[(1,)](a, b, out, BLOCK=256)
    want = (a.long() * b.long() + a.long() - b.long() * 3 + 2**31) % 2**32 - 2**31  # two's complement wrap
    assert int((want.abs() > 2**31 - 1).sum()) == 0 and torch.equal(out, want.int())
    assert int(((a.long() * b.long()).abs() > 2**31).sum()) > 200  # most products did overflow


def test_block_types_are_shared_and_equal_to_fresh_ones() -> None:
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    for elem, shape in [(tl.float32, [4, 8]), (tl.int64, [16]), (tl.float16, [2, 4, 8])]:
        got = builder.get_block_ty(elem, shape)
        assert builder.get_block_ty(elem, list(shape)) is got  # the same object for the same type
        fresh = tl.block_type(elem, shape)
        assert got == fresh and got.shape == fresh.shape == tuple(shape) and got.name == fresh.name
        assert got.numel == fresh.numel and got.element_ty == elem
        assert fresh.with_element_ty(tl.int32) is builder.get_block_ty(tl.int32, shape)
    assert builder.get_block_ty(tl.float32, [4, 8]) is not builder.get_block_ty(tl.float32, [8, 4])
    ptr = tl.pointer_type(tl.float32)  # not hashable: made as before
    a, b = builder.get_block_ty(ptr, [4]), builder.get_block_ty(ptr, [4])
    assert a == b and a is not b and a.element_ty == ptr


def test_tensors_of_a_shared_type_have_the_plain_shape_and_numel() -> None:
    from triton.runtime import interpreter as interp

    ty = interp.interpreter_builder.get_block_ty(tl.float32, [4, 8])
    handle = interp.TensorHandle(np.random.default_rng(1).standard_normal((4, 8), dtype=np.float32), tl.float32)
    first, second = tl.core.tensor(handle, ty), tl.core.tensor(handle, ty)
    for t in (first, second):
        assert [int(d) for d in t.shape] == [4, 8] and int(t.numel) == 32 and t.type is ty and t.dtype == tl.float32
        assert t.handle is handle
    scalar = tl.core.tensor(interp.TensorHandle(np.array([3], dtype=np.int32), tl.int32), tl.int32)
    assert tuple(scalar.shape) == () and int(scalar.numel) == 1


@triton.jit
def _twice_four_times_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(4):
        x = _twice(x)
    tl.store(out_ptr + offs, x)


def test_nested_calls_inside_a_launch_patch_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch patches the language once; its helper calls find it patched, and after the launch a helper called
    outside any launch patches as before."""
    from triton.runtime import interpreter as interp

    calls = []
    plain = interp._patch_builtin
    monkeypatch.setattr(interp, "_patch_builtin", lambda *a: calls.append(a[0]) or plain(*a))
    interp._patch_lang(_twice.fn).restore()
    once = len(calls)
    assert once >= 3
    calls.clear()
    x = torch.randn(32, generator=torch.Generator().manual_seed(9))
    out = torch.empty_like(x)
    _twice_four_times_kernel[(3,)](x, out, BLOCK=32)
    assert torch.equal(out, x * 16) and len(calls) == once  # not once more for each of the 3 x 4 helper calls
    calls.clear()
    interp._patch_lang(_twice.fn).restore()
    assert len(calls) == once


def test_broadcasts_as_before() -> None:
    """Blocks of one shape come back as they were; other pairs broadcast the plain way."""
    from triton.runtime import interpreter as interp

    sem = interp.interpreter_semantic
    rng = np.random.default_rng(4)

    def block(shape: list[int], t: object = tl.float32) -> object:
        data = rng.standard_normal(shape).astype(np.float32 if t is tl.float32 else np.int32)
        return tl.core.tensor(interp.TensorHandle(data, t), tl.block_type(t, shape))

    a, b = block([4, 8]), block([4, 8], tl.int32)
    same = sem.broadcast_impl_value(a, b)
    assert same[0] is a and same[1] is b
    row, col = block([1, 8]), block([4, 1])
    x, y = sem.broadcast_impl_value(row, col)
    assert [int(d) for d in x.shape] == [int(d) for d in y.shape] == [4, 8]
    assert np.array_equal(x.handle.data, np.broadcast_to(row.handle.data, (4, 8)))
    assert np.array_equal(y.handle.data, np.broadcast_to(col.handle.data, (4, 8)))
    low, high = sem.broadcast_impl_value(block([8]), block([4, 8]))
    assert [int(d) for d in low.shape] == [4, 8] and [int(d) for d in high.shape] == [4, 8]
    with pytest.raises(ValueError, match="incompatible dimensions"):
        sem.broadcast_impl_value(block([4, 8]), block([8, 4]))
