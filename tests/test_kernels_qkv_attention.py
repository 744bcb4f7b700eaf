"""Triton `qkv_attention` (Q/K norm + RoPE + cache write inside the decode attention launch) against its reference.

Decode batches run the one-launch kernel; the CPU interpreter checks it in fp32/fp16, the `gpu` tests in BF16 and
FP32 on CUDA. The cache starts as NaN wherever nothing was written, so a newest key or value the kernel failed to
write (or wrote to the wrong slot) shows in both the output and the cache comparison.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from flint_kernels import attention_triton as at
from flint_kernels.attention import AttnMeta
from flint_kernels.qkv_attention import qkv_attention_ref
from flint_kernels.qkv_attention_triton import qkv_attention
from flint_kernels.rope import rope_cos_sin
from kernel_checks import LaunchSpy, poison_torch_empty, rel_err

HAS_CUDA = torch.cuda.is_available()
EPS = 1e-6


class DecodeCase:
    """Sequences with one new token each over a shuffled paged cache: positions before the newest are filled, the
    newest token's slot is NaN until the op writes it; sliding-window tables have -1 behind the window."""

    def __init__(
        self,
        ctxs: list[int],
        hq: int,
        hkv: int,
        d: int,
        window: int | None,
        rope: bool,
        dtype: torch.dtype,
        device: str,
        block_size: int = 16,
        seed: int = 0,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        need = [-(-ctx // block_size) for ctx in ctxs]
        num_blocks = sum(need) + 3
        perm = torch.randperm(num_blocks, generator=g).tolist()
        k = torch.full((num_blocks, block_size, hkv, d), float("nan"))
        v = k.clone()
        table = torch.full((len(ctxs), max(need) + 2), -1, dtype=torch.int32)
        slots = []
        for s, ctx in enumerate(ctxs):
            lo = 0 if window is None else max(0, ctx - window)
            for b in range(need[s]):
                phys = perm.pop()
                if (b + 1) * block_size <= lo:
                    continue  # behind the window: freed
                table[s, b] = phys
                first, last = max(lo - b * block_size, 0), min(ctx - 1 - b * block_size, block_size)
                if last > first:
                    k[phys, first:last] = torch.randn(last - first, hkv, d, generator=g)
                    v[phys, first:last] = torch.randn(last - first, hkv, d, generator=g)
            newest = ctx - 1
            slots.append(int(table[s, newest // block_size]) * block_size + newest % block_size)
        t = len(ctxs)
        self.qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 2).to(device, dtype)
        self.q_norm = (torch.randn(d, generator=g) * 0.3 + 1).to(device)
        self.k_norm = (torch.randn(d, generator=g) * 0.3 + 1).to(device)
        positions = torch.tensor([c - 1 for c in ctxs], device=device)
        self.cos_sin = rope_cos_sin(positions, d, 10000.0, dtype) if rope else None
        self.k_cache = k.to(device, dtype)
        self.v_cache = v.to(device, dtype)
        self.slots = torch.tensor(slots, dtype=torch.int64, device=device)
        self.table = table.to(device)
        self.meta = AttnMeta.build(list(range(t + 1)), ctxs, device)
        self.sinks = (torch.randn(hq, generator=g) * 2).to(device)
        self.hq, self.hkv, self.scale, self.window = hq, hkv, d**-0.5, window

    def run(self, op, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        return op(
            self.qkv, self.q_norm, self.k_norm, EPS, self.cos_sin, k_cache, v_cache, self.slots, self.hq, self.hkv,
            self.table, self.meta, self.sinks, self.scale, self.window,
        )  # fmt: skip


def _check(case: DecodeCase, out_tol: float, cache_tol: float) -> None:
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    ref = case.run(qkv_attention_ref, k_ref, v_ref)
    out = case.run(qkv_attention, case.k_cache, case.v_cache)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) < out_tol
    # Every slot the reference wrote is written, nothing else: the NaN patterns agree.
    assert torch.equal(case.k_cache.isnan(), k_ref.isnan()) and torch.equal(case.v_cache.isnan(), v_ref.isnan())
    written = ~k_ref.isnan()
    assert torch.equal(case.v_cache[written], v_ref[written])  # V is copied as it comes
    assert rel_err(case.k_cache[written], k_ref[written]) < cache_tol


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    poison_torch_empty(monkeypatch)


@pytest.fixture
def decode_spy(monkeypatch: pytest.MonkeyPatch) -> LaunchSpy:
    spy = LaunchSpy(at._decode_kernel)
    monkeypatch.setattr(at, "_decode_kernel", spy)
    return spy


# Mixed contexts: a 1-token sequence, lengths on and off the block size, one past the window.
CTXS = [1, 16, 37, 300]


@pytest.mark.parametrize(("hq", "hkv", "d"), [(16, 2, 128), (4, 2, 32), (8, 4, 16)])
@pytest.mark.parametrize(("window", "rope"), [(7, True), (None, False), (None, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_qkv_attention_decode_interp(
    decode_spy: LaunchSpy, hq: int, hkv: int, d: int, window: int | None, rope: bool, dtype: torch.dtype
) -> None:
    case = DecodeCase(CTXS, hq, hkv, d, window, rope, dtype, "cpu")
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    _check(case, tol, tol)
    assert decode_spy.launches == 1  # the reference's launch does not count: it is PyTorch


@pytest.mark.parametrize("num_splits", [2, 8])
def test_qkv_attention_forced_splits_interp(monkeypatch: pytest.MonkeyPatch, num_splits: int) -> None:
    """The newest position may fall in any split; only the split that holds it writes K/V, before its reads."""
    real = at.paged_attention_decode

    def forced(*args, **kwargs):
        return real(*args, **{**kwargs, "num_splits": num_splits})

    monkeypatch.setattr("flint_kernels.qkv_attention_triton.paged_attention_decode", forced)
    _check(DecodeCase([300, 5, 129, 64], 8, 2, 32, None, True, torch.float32, "cpu", seed=1), 1e-5, 1e-5)
    _check(DecodeCase([300, 5, 129, 64], 8, 2, 32, 100, True, torch.float32, "cpu", seed=2), 1e-5, 1e-5)


def test_qkv_attention_prefill_batch_takes_two_launches_interp(decode_spy: LaunchSpy) -> None:
    """A batch with a multi-token query runs Q/K norm + RoPE + write, then prefill attention (not the decode kernel)."""
    case = DecodeCase([40, 9], 4, 2, 32, None, True, torch.float32, "cpu")
    # Turn it into a prefill batch: the first sequence gets its last 3 tokens as queries.
    g = torch.Generator().manual_seed(5)
    blocks = case.table[0, :3].tolist()
    extra = [blocks[p // 16] * 16 + p % 16 for p in (37, 38)]
    for slot in extra:
        case.k_cache.view(-1, 2, 32)[slot] = float("nan")
        case.v_cache.view(-1, 2, 32)[slot] = float("nan")
    case.slots = torch.tensor([*extra, int(case.slots[0]), int(case.slots[1])])
    case.qkv = torch.randn(4, 8 * 32, generator=g) * 2
    case.cos_sin = rope_cos_sin(torch.tensor([37, 38, 39, 8]), 32, 10000.0, torch.float32)
    case.meta = AttnMeta.build([0, 3, 4], [40, 9], "cpu")
    _check(case, 1e-5, 1e-5)
    assert decode_spy.launches == 0


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("max_ctx", [600, 5000])
@pytest.mark.parametrize(("window", "rope"), [(513, True), (None, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qkv_attention_decode_gpu(
    decode_spy: LaunchSpy, batch: int, max_ctx: int, window: int | None, rope: bool, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(batch + max_ctx)
    ctxs = torch.randint(1, max_ctx + 1, (batch,), generator=g).tolist()
    ctxs[0] = max_ctx
    case = DecodeCase(ctxs, 32, 4, 128, window, rope, dtype, "cuda")
    # BF16: the reference rounds the normalised probabilities, the kernel the unnormalised ones (module docstring
    # of attention_triton); the written keys are the norm's and RoPE's BF16 roundings, as the separate kernel's.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    _check(case, tol, 1e-5 if dtype == torch.float32 else 4e-3)
    assert decode_spy.launches == 1


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("window", "rope"), [(513, True), (None, False)])
def test_qkv_attention_matches_two_launches_gpu(window: int | None, rope: bool) -> None:
    """BF16: the one-launch op gives the two-launch Triton path's output and cache (Flint's shapes, batch 8)."""
    from flint_kernels.qk_norm_rope_triton import qk_norm_rope_write

    case = DecodeCase([1000, 3, 513, 514, 77, 4000, 20, 900], 32, 4, 128, window, rope, torch.bfloat16, "cuda")
    k2, v2 = case.k_cache.clone(), case.v_cache.clone()
    q = qk_norm_rope_write(case.qkv, case.q_norm, case.k_norm, EPS, case.cos_sin, k2, v2, case.slots, case.hq, case.hkv)
    two = at.paged_attention(q, k2, v2, case.table, case.meta, case.sinks, case.scale, case.window)
    one = case.run(qkv_attention, case.k_cache, case.v_cache)
    same = (one == two).float().mean().item()
    assert same >= 0.999, same
    written = ~k2.isnan()
    assert (case.k_cache[written] == k2[written]).float().mean().item() >= 0.999
    assert torch.equal(case.v_cache[written], v2[written])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("window", [513, None])
def test_qkv_attention_with_prefetch_gpu(monkeypatch: pytest.MonkeyPatch, window: int | None) -> None:
    """Key tiles requested into L2 before the PDL wait, the newest key written by the launch itself: the same
    output and cache bits as without the prefetch (BF16, Flint's shapes, batch 8)."""
    ctxs = [1000, 3, 513, 514, 77, 4000, 20, 900]
    plain = DecodeCase(ctxs, 32, 4, 128, window, True, torch.bfloat16, "cuda")
    early = DecodeCase(ctxs, 32, 4, 128, window, True, torch.bfloat16, "cuda")
    out_plain = plain.run(qkv_attention, plain.k_cache, plain.v_cache)
    config = at.decode_config
    monkeypatch.setattr(at, "decode_config", lambda *a, **k: dataclasses.replace(config(*a, **k), prefetch=2))
    out_early = early.run(qkv_attention, early.k_cache, early.v_cache)
    assert torch.equal(out_early, out_plain)
    assert torch.equal(early.k_cache.nan_to_num(7.0), plain.k_cache.nan_to_num(7.0))
    assert torch.equal(early.v_cache.nan_to_num(7.0), plain.v_cache.nan_to_num(7.0))
