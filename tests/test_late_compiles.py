"""The watch for Triton kernels compiled after the warm-up: Triton's hook, the log line and the count."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from triton import knobs

from flint_engine.late_compiles import LateCompileWatch, describe

HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def watch():
    w = LateCompileWatch()
    before = knobs.runtime.jit_cache_hook
    yield w
    w.disarm()
    knobs.runtime.jit_cache_hook = before


def test_arm_installs_the_hook_and_chains_the_previous_one(watch: LateCompileWatch, caplog) -> None:
    seen: list[str] = []

    def earlier(**kwargs) -> None:
        seen.append(kwargs["repr"])

    knobs.runtime.jit_cache_hook = earlier
    assert watch.arm() and watch.arm()  # idempotent: the second call must not chain the watch to itself
    assert knobs.runtime.jit_cache_hook == watch.hook
    fn = SimpleNamespace(name="flint_kernels.moe._moe_gate_up_kernel")
    with caplog.at_level(logging.WARNING, logger="flint_engine.late_compiles"):
        # Triton's own call: keyword arguments only.
        knobs.runtime.jit_cache_hook(
            key="k", repr="_moe_gate_up_kernel[num_warps=4](T: i32)", fn=fn, compile={}, is_manual_warmup=False,
            already_compiled=False,
        )  # fmt: skip
        knobs.runtime.jit_cache_hook(
            key="k2", repr="explicit", fn=fn, compile={}, is_manual_warmup=True, already_compiled=False
        )
    assert watch.count == 1 and watch.events[0].kernel == "_moe_gate_up_kernel"
    assert "num_warps=4" in watch.events[0].specialisation
    assert seen == ["_moe_gate_up_kernel[num_warps=4](T: i32)", "explicit"]
    assert "_moe_gate_up_kernel" in caplog.text and "after the warm-up" in caplog.text
    watch.disarm()
    assert knobs.runtime.jit_cache_hook is earlier


def test_the_warning_names_the_variant(watch: LateCompileWatch, caplog) -> None:
    """The line names the constexprs, the specialised arguments and the launch options, from Triton's
    specialisation record (here one the H200 manifest holds); a record it cannot read is shown as it is."""
    manifest = json.loads((ROOT / "kernels" / "precompile" / "nvidia-h200.json").read_text())
    entry = next(e for p in manifest["profiles"].values() for e in p if e["kernel"].endswith("_silu_and_mul_kernel"))
    assert watch.arm()
    fn = SimpleNamespace(name=entry["kernel"])
    with caplog.at_level(logging.WARNING, logger="flint_engine.late_compiles"):
        watch.hook(key="k", repr="x(a: ())", fn=fn, compile={"specialization_data": json.dumps(entry["spec"])})
    said = watch.events[0].specialisation
    assert said.startswith("BLOCK=") and "PDL=True" in said and "num_warps=" in said, said
    assert "gate_up_ptr:tt.divisibility=16" in said and said in caplog.text
    assert describe('{"signature": 3}') == '{"signature": 3}'


def test_engine_counts_late_compiles_in_its_metrics() -> None:
    """The counter reaches the engine snapshot (and with it /metrics as flint:late_kernel_compiles_total)."""
    from flint_engine.api.prometheus import COUNTERS, render
    from flint_engine.metrics import EngineMetrics

    m = EngineMetrics()
    m.late_kernel_compiles = 3
    snap = m.snapshot()
    assert snap["late_kernel_compiles_total"] == 3 and "late_kernel_compiles" in COUNTERS
    assert b"flint:late_kernel_compiles_total 3.0" in render([({}, snap)])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_real_compiles_are_seen_once_per_specialisation(watch: LateCompileWatch) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def _late_probe_kernel(x, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1.0, mask=i < n)

    x = torch.randn(64, device="cuda")
    assert watch.arm()
    _late_probe_kernel[(1,)](x, 64, BLOCK=64)
    _late_probe_kernel[(1,)](x, 64, BLOCK=64)  # the same specialisation: cached in the process
    assert [e.kernel for e in watch.events] == ["_late_probe_kernel"]
    _late_probe_kernel[(1,)](x, 63, BLOCK=64)  # 63 is not a multiple of 16: a new specialisation
    assert watch.count == 2
