"""benchmarks/handoff.py: the one-launch chain (tickets and phase counters) computes what the launch chain does."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch
import triton


@pytest.fixture
def handoff(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    """benchmarks/handoff.py as a module."""
    return benchmark_script("handoff")


@pytest.mark.parametrize("phases, programs", [(5, 4), (6, 3)])
def test_one_launch_equals_the_launch_chain_and_leaves_its_counters_zero(
    handoff: ModuleType, phases: int, programs: int
) -> None:
    chunk = 64
    w = torch.randn(phases * programs * chunk, generator=torch.Generator().manual_seed(phases), dtype=torch.float16)
    xb = triton.next_power_of_2(programs)
    chained, one = torch.zeros(2, xb), torch.zeros(2, xb)
    chained[0, :programs] = one[0, :programs] = 1.0
    handoff.chain_launches(w, chained, phases, programs, chunk, False)
    cnt = torch.zeros(2 + phases, dtype=torch.int32)
    for _ in range(2):  # a second run starts from the counters the first left
        one.zero_()
        one[0, :programs] = 1.0
        handoff.chain_one_launch(w, one, cnt, phases, programs, chunk)
        assert torch.equal(one[phases % 2], chained[phases % 2])
        assert not cnt.any()
    # Each phase moved the values (the chain is not a no-op).
    assert not torch.equal(chained[phases % 2, :programs], torch.ones(programs))
