"""benchmarks/moe_grouped_tma.py: every tile it sweeps is a launch the TMA-fed MoE takes at Flint's sizes (so a device
call spends no time on configurations `fits` refuses), the NVFP4 twins' too, and it says it needs a GPU without one."""

from __future__ import annotations

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
        assert mt2.fits(x, w13, w2, bench.gate_up_cfg(c)), c
    for c in bench.NV_DOWN_TILES:
        assert mt2.fits(x, w13, w2, bench.down_cfg(c)), c
    # A joined config keeps the gate_up's fields and takes the down's.
    joined = bench.down_cfg(bench.DOWN_TILES[1], bench.gate_up_cfg(bench.GATE_UP_TILES[0]))
    assert joined.gather == bench.GATE_UP_TILES[0][5] and joined.down_block_n == bench.DOWN_TILES[1][1]


def test_needs_a_gpu(benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    bench = benchmark_script("moe_grouped_tma")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["moe_grouped_tma.py"])
    assert bench.main() == 1


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_a_dry_run_reaches_every_variant(
    benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """`run` on small experts in the interpreter, each timing replaced by one call: every tile of the sweep, the
    whole paths (64- and 128-row blocks) and, for NVFP4, the twins that decode in registers all run and report a time
    (no error strings), so a device call spends its time measuring; `--twins-only` runs only the twins."""
    from kernel_checks import random_nvfp4_experts

    bench = benchmark_script("moe_grouped_tma")
    # Two experts: half the programs of four; hidden 128 is one K step of the deepest tiles (their numerics are
    # tests/test_kernels_moe_grouped_tma.py's; here each variant only has to run).
    hidden, inter, experts, topk, t = 128, 128, 2, 2, 12
    monkeypatch.setattr(bench, "HIDDEN", hidden)
    monkeypatch.setattr(bench, "INTER", inter)
    monkeypatch.setattr(bench, "EXPERTS", experts)
    monkeypatch.setattr(bench, "TOPK", topk)
    g = torch.Generator().manual_seed(1)

    def routing(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        w, ids = torch.topk(torch.rand(n, experts, generator=gen), topk, dim=-1)
        return w / w.sum(-1, keepdim=True), ids

    calls = []
    monkeypatch.setattr(bench, "routing", routing)
    monkeypatch.setattr(bench, "time_graph", lambda fns, reps=None: calls.append([f() for f in fns]) or 1.0)
    if fmt == "bf16":
        stacks = [
            (torch.randn(experts, 2 * inter, hidden, generator=g).bfloat16(),
             torch.randn(experts, hidden, inter, generator=g).bfloat16())
        ]  # fmt: skip
    else:
        stacks = [
            (random_nvfp4_experts(experts, 2 * inter, hidden, g, (inter, inter)),
             random_nvfp4_experts(experts, hidden, inter, g, (hidden,)))
        ]  # fmt: skip
    row = bench.run(t, fmt, stacks, g)
    for key in ("gate_up_us", "down_us"):
        assert set(row[key]) == {bench.cfg_name(c) for c in getattr(bench, key.split("_us")[0].upper() + "_TILES")}
        assert all(isinstance(v, float) for v in row[key].values()), row[key]
    assert len(row["whole"]) == 2
    if fmt == "nvfp4":
        twins = row["nvfp4_in_launches"]
        assert all(isinstance(v, float) for part in ("gate_up_us", "down_us") for v in twins[part].values()), twins
        # Byte planes and packed pairs of the tiles of 64- and 128-row blocks (256-row ones with `--nv-block-m 256`).
        assert len(twins["gate_up_us"]) == 2 * sum(c[0] <= 128 for c in bench.NV_GATE_UP_TILES)
        assert len(twins["whole"]) == 4 and all(w["equal_to_copies"] is not None for w in twins["whole"].values())
        assert sum(w["config"]["packed_decode"] for w in twins["whole"].values()) == 2
        # `--twins-only` on one tile of each block size (the sweep above ran them all): its four wholes.
        monkeypatch.setattr(bench, "NV_GATE_UP_TILES", [bench.NV_GATE_UP_TILES[0], bench.NV_GATE_UP_TILES[4]])
        monkeypatch.setattr(bench, "NV_DOWN_TILES", [bench.NV_DOWN_TILES[0], bench.NV_DOWN_TILES[3]])
        only = bench.run(t, fmt, stacks, g, twins_only=True)
        assert "gate_up_us" not in only and len(only["nvfp4_in_launches"]["whole"]) == 4
    assert calls
