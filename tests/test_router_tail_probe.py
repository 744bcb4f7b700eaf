"""benchmarks/router_tail_probe.py: its router without the counter tail, in the interpreter (float32): fixed ids
while the variant table is set, the counter-tail router's results otherwise (whatever the table says of the top-k
launch), and the shipped source still holds the tail where the probe patches it."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from flint_kernels import router_triton, tuning

H200_TABLE = Path(__file__).resolve().parents[1] / "kernels" / "tuning" / "nvidia-h200.json"


def test_the_probe_router_skips_the_tail_only_in_the_variant(
    benchmark_script: Callable[[str], ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = benchmark_script("router_tail_probe")
    assert inspect.getsource(router_triton).count(probe.TAIL) == 1
    for name in ("_router_kernel", "_router_norm_kernel", "small_config"):  # restored after the test
        monkeypatch.setattr(router_triton, name, getattr(router_triton, name))
    monkeypatch.delitem(sys.modules, "flint_kernels.router_tail_probe", raising=False)
    probe.install(tmp_path)
    g = torch.Generator().manual_seed(5)
    x, res, w = (torch.randn(shape, generator=g) for shape in ((1, 64), (1, 64), (16, 64)))
    norm_w = torch.rand(64, generator=g) + 0.5
    outs = []
    for name in ("table.json", "skip_tail.json"):  # copies of the shipped table, as the probe's A/B uses
        (tmp_path / name).write_text(H200_TABLE.read_text())
        monkeypatch.setenv(tuning.ENV, str(tmp_path / name))
        # The shipped table takes the top-k into a launch of its own; the probe keeps the counter tail it measures.
        assert tuning.load(tmp_path / name).ops["router.small"][0].config["tail_launch"]
        assert not router_triton.small_config(1, 16, x.device).tail_launch
        outs.append(router_triton.add_rms_norm_sigmoid_topk(x, res, norm_w, 1e-6, w, 6))
    shipped, probed = outs
    ref_w, ref_ids = router_triton.sigmoid_topk_ref(shipped[0], w, 6)
    assert torch.equal(shipped[3], ref_ids) and torch.allclose(shipped[2], ref_w, atol=1e-6)
    assert probed[3].tolist() == [[j * 37 % 16 for j in range(6)]]
    assert torch.equal(probed[2], torch.full((1, 6), 1 / 6))
    assert torch.equal(probed[0], shipped[0]) and torch.equal(probed[1], shipped[1])  # the norm is untouched
