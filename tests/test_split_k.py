"""`flint_kernels.split_k_triton`: the deterministic in-launch split-K reduce (the last arrival sums the partials
in split order and leaves the counters at zero) in Triton's interpreter, and the host's choice of splits."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from flint_kernels import split_k_triton
from flint_kernels.split_k_triton import COUNTER_SLOTS, choose_split_k, counters, is_last, num_sms, split_k_reduce


@triton.jit
def _sum_splits_kernel(
    part_ptr, out_ptr, ws_ptr, cnt_ptr, m_real, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Program (tile, split) holds partial [BLOCK_N, BLOCK_M] number `split` of its tile; the tile's last arrival
    stores the sum of the first m_real columns."""
    tile, pid_k = tl.program_id(0), tl.program_id(1)
    n, m = tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_M)
    acc = tl.load(part_ptr + ((tile * SPLIT_K + pid_k) * BLOCK_N + n[:, None]) * BLOCK_M + m[None, :])
    m_ok = m < m_real
    total, arrived = split_k_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, m_ok, SPLIT_K, BLOCK_N, BLOCK_M)
    last = is_last(arrived, SPLIT_K, BLOCK_M)
    tl.store(out_ptr + (tile * BLOCK_N + n[:, None]) * BLOCK_M + m[None, :], total, mask=(last & m_ok)[None, :])


@pytest.mark.parametrize(("tiles", "split", "m_real"), [(1, 2, 16), (3, 4, 5), (5, 3, 1)])
def test_the_last_arrival_sums_the_partials_in_split_order(tiles: int, split: int, m_real: int) -> None:
    bn, bm = 16, 16
    parts = torch.randn(tiles, split, bn, bm, generator=torch.Generator().manual_seed(tiles * 10 + split)) * 1e3
    # column 0 sums to a different FP32 value in another order: (1e8 + 1) - 1e8 is 0, (1e8 - 1e8) + 1 is 1
    parts[..., 0] = torch.tensor([1e8, 1.0, -1e8, 0.5])[:split][None, :, None]
    out = torch.full((tiles, bn, bm), float("nan"))
    ws = torch.full((tiles * split * bn * bm,), float("nan"))
    cnt = torch.zeros(COUNTER_SLOTS, dtype=torch.int32)
    _sum_splits_kernel[(tiles, split)](parts, out, ws, cnt, m_real, SPLIT_K=split, BLOCK_N=bn, BLOCK_M=bm)
    want = torch.zeros(tiles, bn, bm)
    for s in range(split):  # FP32, in split order: the order decides the roundings
        want = want + parts[:, s]
    assert torch.equal(out[..., :m_real], want[..., :m_real])
    assert torch.isnan(out[..., m_real:]).all(), "columns past m_real were written"
    assert not cnt.any(), "the counters must be zero again for the next launch or graph replay"


def test_choose_split_k_fills_the_gpu_within_its_bounds() -> None:
    """Enough programs for ~4 an SM, at least min_iters K steps a split, at most 32 splits; none when the tiles
    already fill the GPU or would not fit the counters."""
    device = torch.device("cpu")  # 132 SMs, as the interpreter pretends
    sms = num_sms(device)
    for tiles in (1, 7, 40, 130, 4 * sms - 1):
        for k, block_k in ((2048, 128), (4096, 64), (512, 128), (1000, 64)):
            split, per = choose_split_k(tiles, k, block_k, device)
            assert per % block_k == 0 and split * per >= k > (split - 1) * per, (tiles, k, split, per)
            assert 1 <= split <= 32
            if split > 1:
                assert per // block_k >= 2 and tiles * (split - 1) < 4 * sms, (tiles, k, split, per)
    assert choose_split_k(4 * sms, 4096, 64, device) == (1, 4096)
    assert choose_split_k(COUNTER_SLOTS + 1, 64, 64, device)[0] == 1


def test_counters_are_one_zeroed_buffer_a_device() -> None:
    buf = counters(torch.device("cpu"))
    assert buf is split_k_triton.counters(torch.device("cpu"))
    assert buf.dtype == torch.int32 and buf.numel() == COUNTER_SLOTS and not buf.any()
