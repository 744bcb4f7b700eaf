"""benchmarks/moe_grouped_tma.py: every tile it sweeps is a launch the TMA-fed MoE takes at Flint's sizes (so a device
call spends no time on configurations `fits` refuses), the NVFP4 twins' too, and it says it needs a GPU without one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from flint_kernels import moe_grouped_tma_triton as mt2

HIDDEN, INTER, EXPERTS = 2048, 512, 4  # Flint's expert shapes, few experts


def _stacks(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Operands of Flint's shapes; `fits` reads only their shapes, dtypes and layouts."""
    x = torch.empty(3, HIDDEN, dtype=dtype)
    return x, torch.empty(EXPERTS, 2 * INTER, HIDDEN, dtype=dtype), torch.empty(EXPERTS, HIDDEN, INTER, dtype=dtype)


def test_swept_tiles_fit_flints_experts(benchmark_script: Callable[[str], ModuleType]) -> None:
    bench = benchmark_script("moe_grouped_tma")
    x, w13, w2 = _stacks(torch.float32)  # the CPU takes any float dtype (the interpreter's)
    names = set()
    for c in bench.GATE_UP_TILES:
        cfg = bench.gate_up_cfg(c)
        assert mt2.fits(x, w13, w2, cfg) and cfg.gather == c[5], c
        names.add(bench.cfg_name(c))
    for c in bench.DOWN_TILES:
        assert mt2.fits(x, w13, w2, bench.down_cfg(c)), c
    assert len(names) == len(bench.GATE_UP_TILES)  # each row of the table is told apart
    for c in bench.NV_GATE_UP_TILES:
        cfg = dataclasses.replace(bench.gate_up_cfg(c[:6]), w_operand_a=c[6])
        assert mt2.fits(x, w13, w2, cfg) and bench.nv_name(c).endswith(" w-left") == c[6]
    for c in bench.NV_DOWN_TILES:
        assert mt2.fits(x, w13, w2, dataclasses.replace(bench.down_cfg(c[:5]), w_operand_a=c[5]))
    # A joined config keeps the gate_up's fields and takes the down's.
    joined = bench.down_cfg(bench.DOWN_TILES[1], bench.gate_up_cfg(bench.GATE_UP_TILES[0]))
    assert joined.gather == bench.GATE_UP_TILES[0][5] and joined.down_block_n == bench.DOWN_TILES[1][1]


def test_needs_a_gpu(benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    bench = benchmark_script("moe_grouped_tma")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["moe_grouped_tma.py"])
    assert bench.main() == 1
