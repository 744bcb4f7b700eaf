"""Triton paged attention (decode split-KV and varlen prefill) against `paged_attention_ref`.

Caches hold NaN everywhere no live key is (slots past a sequence's end, slots and whole blocks behind a sliding
window, spare blocks), physical blocks are shuffled, and sliding block tables carry -1 for freed blocks: any read
outside the live range would turn the output into NaN. Outputs and split partials are allocated NaN-poisoned.
Split decode merges in the launch (last arriver): the tests check the shared arrival counters are left zero, that
repeated calls are bit-identical and that the merge launch runs only when asked for or when the counters run out.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_cases import Case, check_attention
from flint_kernels import attention_triton as at
from flint_kernels.attention import AttnMeta, paged_attention_ref
from flint_kernels.split_k_triton import counters
from kernel_checks import LaunchSpy, poison_torch_empty

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor the kernels allocate starts as NaN (floats) or -77 (ints), so unwritten elements show."""
    poison_torch_empty(monkeypatch)


@pytest.fixture
def merge_spy(monkeypatch: pytest.MonkeyPatch) -> LaunchSpy:
    """Counts launches of the merge kernel (`AttentionDecodeConfig.combine_launch`, or counters run out)."""
    spy = LaunchSpy(at._decode_merge_kernel)
    monkeypatch.setattr(at, "_decode_merge_kernel", spy)
    return spy


def _counters_zero(device: torch.device) -> bool:
    return not counters(device).any().item()


FP32_TOL = 1e-4
BF16_TOL = 1e-2

SHAPES = [(16, 2, 128), (4, 2, 32), (8, 4, 16)]  # (Hq, Hkv, D): GQA 8 and GQA 2, head_dim 128 / 32 / 16


# ------------------------------------------------------------------------------------------------------ decode
@pytest.mark.parametrize(("hq", "hkv", "d"), SHAPES)
@pytest.mark.parametrize("window", [7, None])
def test_decode_interp(poison: None, hq: int, hkv: int, d: int, window: int | None) -> None:
    case = Case([(37, 1), (5, 1), (100, 1), (1, 1), (16, 1)], hq, hkv, d, window)
    if window is not None:
        assert case.freed > 0
    check_attention(at.paged_attention(*case.args()), case.ref(), FP32_TOL)


def test_decode_planned_for_a_graphs_batch_bucket_interp(poison: None) -> None:
    """`AttnMeta.plan_seqs`: a step of 3 sequences planned for 16 (a decode graph's bucket, which pads the batch with
    one-key rows) takes the padded launch's split count, whose occupancy bound differs from its own, and gives its
    rows' bits exactly."""
    case = Case([(6000, 1), (90, 1), (5, 1)], 4, 2, 32, None)
    hkv, dev = 2, case.q.device
    own, planned = (at.decode_num_splits(6000, None, n, hkv, dev) for n in (3, 16))
    assert own != planned  # else the test shows nothing
    pad = 13
    g = torch.Generator().manual_seed(5)
    q = torch.cat([case.q, torch.randn(pad, *case.q.shape[1:], generator=g)])
    filler = case.table[2:3].expand(pad, -1)  # the 5-key sequence's blocks, read for one key each
    table = torch.cat([case.table, filler])
    meta = AttnMeta.build(list(range(3 + pad + 1)), case.meta.seq_lens + [1] * pad, dev)
    padded = at.paged_attention(q, case.k_cache, case.v_cache, table, meta, case.sinks, case.scale, None)
    plan = dataclasses.replace(case.meta, plan_seqs=3 + pad)
    out = at.paged_attention(case.q, case.k_cache, case.v_cache, case.table, plan, case.sinks, case.scale, None)
    assert torch.equal(out, padded[:3])
    check_attention(out, case.ref(), FP32_TOL)
    unplanned = at.paged_attention(*case.args())
    assert not torch.equal(unplanned, out)  # its own split count rounds otherwise


def test_decode_window_513_interp(poison: None) -> None:
    """Contexts just inside, at and across Flint's 513-key window (freed blocks behind it), block size 4."""
    case = Case([(600, 1), (513, 1), (514, 1), (20, 1)], 16, 2, 32, 513, block_size=4)
    assert case.freed > 0
    check_attention(at.paged_attention(*case.args()), case.ref(), FP32_TOL)


def test_decode_long_context_splits_interp(poison: None, merge_spy: LaunchSpy) -> None:
    """3000 keys: the heuristic picks several splits, merged in one launch; matches the reference and one split."""
    case = Case([(3000, 1), (1100, 1)], 16, 2, 16, None)
    splits = at.decode_num_splits(case.meta.max_seq_len, None, 2, 2, case.q.device)
    assert splits > 1
    ref = case.ref()
    check_attention(at.paged_attention(*case.args()), ref, FP32_TOL)
    assert merge_spy.launches == 0 and _counters_zero(case.q.device)
    check_attention(at.paged_attention_decode(*case.args(), num_splits=1), ref, FP32_TOL)


# (context, queries): 3 key tiles, a sequence without a query, one tile; a window of 7 leaves every sequence one tile.
SPLIT_SEQS = [(300, 1), (10, 0), (5, 1)]


# 64 splits (MAX_SPLITS) only without a window: the interpreter spends ~5 ms a program.
@pytest.mark.parametrize(("num_splits", "window"), [(2, 7), (2, None), (8, 7), (8, None), (64, None)])
def test_decode_forced_splits_interp(poison: None, merge_spy: LaunchSpy, num_splits: int, window: int | None) -> None:
    """Mixed lengths, a sequence without a query, more splits than key tiles (a graph captured for long contexts
    replayed on short ones: empty splits). One launch; counters left zero; a repeat is bit-identical.
    """
    case = Case(SPLIT_SEQS, 8, 2, 32, window, block_size=8)
    out = at.paged_attention_decode(*case.args(), num_splits=num_splits)
    check_attention(out, case.ref(), FP32_TOL)
    assert merge_spy.launches == 0
    assert _counters_zero(case.q.device)
    assert torch.equal(at.paged_attention_decode(*case.args(), num_splits=num_splits), out)
    assert _counters_zero(case.q.device)


@pytest.mark.parametrize(("slots", "launches"), [(6, 0), (5, 1)])
def test_decode_counter_slots_fallback_interp(
    poison: None, merge_spy: LaunchSpy, monkeypatch: pytest.MonkeyPatch, slots: int, launches: int
) -> None:
    """3 sequences x 2 KV heads need 6 counters: with fewer the splits are merged by a second launch, to the same
    bits."""
    case = Case(SPLIT_SEQS, 8, 2, 32, None, block_size=8)
    in_launch = at.paged_attention_decode(*case.args(), num_splits=8)
    assert merge_spy.launches == 0
    monkeypatch.setattr(at, "COUNTER_SLOTS", slots)
    out = at.paged_attention_decode(*case.args(), num_splits=8)
    check_attention(out, case.ref(), FP32_TOL)
    assert merge_spy.launches == launches and torch.equal(out, in_launch)
    assert _counters_zero(case.q.device)


@pytest.mark.parametrize(("num_splits", "window"), [(2, None), (8, 7), (8, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_merge_launch_interp(
    poison: None, merge_spy: LaunchSpy, num_splits: int, window: int | None, dtype: torch.dtype
) -> None:
    """`combine_launch`: the splits merged by a launch of their own, one program a (sequence, KV head), the same
    bits as the last-arriving split's merge (a sequence without a query left alone); no counter touched."""
    case = Case(SPLIT_SEQS, 8, 2, 32, window, dtype=dtype, block_size=8)
    base = at.decode_config(case.meta.max_seq_len, window, 3, case.q.device)
    fused = at.paged_attention_decode(*case.args(), num_splits=num_splits, config=base)
    assert merge_spy.launches == 0
    cfg = dataclasses.replace(base, combine_launch=True)
    out = at.paged_attention_decode(*case.args(), num_splits=num_splits, config=cfg)
    assert merge_spy.grids == [(3, 2)]
    assert torch.equal(out, fused)
    check_attention(out, case.ref(), FP32_TOL if dtype == torch.float32 else BF16_TOL)
    assert _counters_zero(case.q.device)


def test_decode_fp16_interp(poison: None) -> None:
    case = Case([(70, 1), (9, 1)], 16, 2, 32, None, dtype=torch.float16)
    check_attention(at.paged_attention(*case.args()), case.ref(), BF16_TOL)


# --------------------------------------------------------------------------------------------- prefill / mixed
MIXED = [(37, 5), (5, 1), (100, 30), (20, 20), (90, 1), (1, 1)]


@pytest.mark.parametrize(("hq", "hkv", "d"), SHAPES)
@pytest.mark.parametrize("window", [7, None])
def test_prefill_mixed_interp(poison: None, hq: int, hkv: int, d: int, window: int | None) -> None:
    """Prefill chunks at the end of longer contexts, whole prompts and decodes in one batch."""
    case = Case(MIXED, hq, hkv, d, window)
    check_attention(at.paged_attention(*case.args()), case.ref(), FP32_TOL)


@pytest.mark.parametrize("block_m", [16, 64])
def test_prefill_tile_sizes_interp(poison: None, block_m: int) -> None:
    case = Case(MIXED, 8, 4, 32, 7, block_size=4)
    check_attention(at.paged_attention_prefill(*case.args(), block_m=block_m), case.ref(), FP32_TOL)


@pytest.mark.parametrize("window", [7, None])
def test_prefill_longest_first_interp(poison: None, window: int | None) -> None:
    """Query tiles launched last-first: each program does the same work, so the same bits."""
    case = Case(MIXED, 8, 4, 32, window, block_size=4)
    cfg = at.prefill_config(case.meta.max_query_len, window, case.q.device)
    plain = at.paged_attention_prefill(*case.args(), block_m=16, config=dataclasses.replace(cfg, longest_first=False))
    late = at.paged_attention_prefill(*case.args(), block_m=16, config=dataclasses.replace(cfg, longest_first=True))
    assert torch.equal(late, plain)
    check_attention(late, case.ref(), FP32_TOL)


@pytest.mark.parametrize("window", [7, 60, 67, 68, 69])
def test_prefill_edge_masks_at_their_bound_interp(poison: None, window: int) -> None:
    """The tiles after the causal diagonal's first take only the causal mask when the window holds all of them
    (window >= BLOCK_N + BLOCK_Q: 64 + 4 here), else every mask; the tiles before the unmasked ones only the
    window's. Windows far under, just under, at and over that bound (taking the causal mask alone at 7 or 60 fails),
    chunks after a prefix and whole prompts."""
    case = Case([(300, 120), (200, 200), (90, 1)], 8, 2, 16, window, block_size=4)
    cfg = at.prefill_config(case.meta.max_query_len, window, case.q.device)
    assert cfg.block_n == 64
    out = at.paged_attention_prefill(*case.args(), block_m=16, config=cfg)
    check_attention(out, case.ref(), FP32_TOL)


def test_prefill_window_513_interp(poison: None) -> None:
    """A chunk whose queries straddle the window edge, with freed blocks behind it."""
    case = Case([(700, 40), (530, 20), (10, 10)], 8, 1, 16, 513, block_size=32)
    assert case.freed > 0
    check_attention(at.paged_attention(*case.args()), case.ref(), FP32_TOL)


def test_zero_query_sequences_and_decode_batch_through_prefill_interp(poison: None) -> None:
    """Sequences with no new query are skipped; a pure decode batch through the prefill kernel also matches."""
    case = Case([(10, 0), (37, 1), (3, 0), (50, 4)], 8, 2, 32, None)
    check_attention(at.paged_attention(*case.args()), case.ref(), FP32_TOL)
    dec = Case([(37, 1), (5, 1), (64, 1)], 8, 2, 32, 7)
    check_attention(at.paged_attention_prefill(*dec.args()), dec.ref(), FP32_TOL)


@pytest.mark.parametrize("seqs", [MIXED, [(37, 1), (5, 1), (64, 1)]], ids=["mixed", "decode"])
def test_results_into_out_interp(poison: None, seqs: list[tuple[int, int]]) -> None:
    """With `out` (the rows of a larger [T, Hq * D] buffer, as the step graphs pass it), the prefill and the decode
    kernels and the reference write their result there, equal to the one they allocate, and nothing past it; an `out`
    of the wrong shape is refused."""
    case = Case(seqs, 8, 2, 32, 7)
    t = case.q.shape[0]
    for op in (at.paged_attention, paged_attention_ref):
        want = op(*case.args())
        buf = torch.full((t + 4, 8 * 32), float("nan"))
        got = op(*case.args(), out=buf[:t].view(t, 8, 32))
        assert got.data_ptr() == buf.data_ptr() and torch.equal(got, want) and buf[t:].isnan().all()
        with pytest.raises(ValueError, match="out is"):
            op(*case.args(), out=torch.empty((t, 8, 16)))


def test_unsupported_falls_back_to_reference() -> None:
    case = Case([(9, 3)], 4, 2, 8, None)  # head_dim 8 is below tl.dot's minimum
    assert torch.equal(at.paged_attention(*case.args()), case.ref())


# --------------------------------------------------------------------------------------------------------- GPU
def _random_lengths(n: int, lo: int, hi: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("max_ctx", [1000, 5000])
@pytest.mark.parametrize("window", [513, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_gpu(poison: None, batch: int, max_ctx: int, window: int | None, dtype: torch.dtype) -> None:
    seqs = [(c, 1) for c in _random_lengths(batch, 1, max_ctx, batch + max_ctx)]
    case = Case(seqs, 32, 4, 128, window, dtype, device="cuda")
    check_attention(at.paged_attention(*case.args()), case.ref(), BF16_TOL if dtype == torch.bfloat16 else FP32_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_32k_gpu(poison: None, dtype: torch.dtype) -> None:
    case = Case([(32768, 1), (30001, 1)], 32, 4, 128, None, dtype, device="cuda")
    assert at.decode_num_splits(32768, None, 2, 4, case.q.device) > 1
    check_attention(at.paged_attention(*case.args()), case.ref(), BF16_TOL if dtype == torch.bfloat16 else FP32_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("num_splits", [2, 8, 64])
@pytest.mark.parametrize("window", [513, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_forced_splits_gpu(
    poison: None, monkeypatch: pytest.MonkeyPatch, num_splits: int, window: int | None, dtype: torch.dtype
) -> None:
    """In-launch merge under real concurrency: mixed lengths (some shorter than the splits), a sequence without a
    query; counters left zero, repeats bit-identical, and the two-launch fallback gives the same bits."""
    lens = _random_lengths(40, 1, 6000, num_splits)
    seqs = [(c, 0 if i == 3 else 1) for i, c in enumerate(lens)]
    case = Case(seqs, 32, 4, 128, window, dtype, device="cuda")
    tol = BF16_TOL if dtype == torch.bfloat16 else FP32_TOL
    out = at.paged_attention_decode(*case.args(), num_splits=num_splits)
    check_attention(out, case.ref(), tol)
    for _ in range(3):
        assert torch.equal(at.paged_attention_decode(*case.args(), num_splits=num_splits), out)
    assert _counters_zero(case.q.device)
    monkeypatch.setattr(at, "COUNTER_SLOTS", 0)
    assert torch.equal(at.paged_attention_decode(*case.args(), num_splits=num_splits), out)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 4, 128), (4, 2, 32), (8, 4, 16)])
@pytest.mark.parametrize("window", [7, 513, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_mixed_gpu(poison: None, hq: int, hkv: int, d: int, window: int | None, dtype: torch.dtype) -> None:
    seqs = [(3000, 1000), (777, 777), (2000, 1), (600, 77), (5, 1), (1500, 1)]
    case = Case(seqs, hq, hkv, d, window, dtype, device="cuda")
    check_attention(at.paged_attention(*case.args()), case.ref(), BF16_TOL if dtype == torch.bfloat16 else FP32_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("window", [513, None])
def test_prefill_longest_first_gpu(poison: None, window: int | None) -> None:
    seqs = [(3000, 1000), (2048, 2048), (600, 77), (5, 1)]
    case = Case(seqs, 32, 4, 128, window, torch.bfloat16, device="cuda")
    cfg = at.prefill_config(case.meta.max_query_len, window, case.q.device)
    plain = at.paged_attention_prefill(*case.args(), config=dataclasses.replace(cfg, longest_first=False))
    late = at.paged_attention_prefill(*case.args(), config=dataclasses.replace(cfg, longest_first=True))
    assert torch.equal(late, plain)
    check_attention(late, case.ref(), BF16_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("batch", "max_ctx"), [(1, 1000), (8, 5000), (32, 1000)])
@pytest.mark.parametrize("window", [513, None])
@pytest.mark.parametrize("prefetch", [1, 4])
def test_decode_prefetch_is_bit_identical_gpu(poison: None, batch: int, max_ctx: int, window: int | None,
                                              prefetch: int) -> None:  # fmt: skip
    """Key tiles requested into L2 before the PDL wait change nothing but timing: the same bits as without."""
    g = torch.Generator().manual_seed(batch + max_ctx)
    ctxs = torch.randint(1, max_ctx + 1, (batch,), generator=g).tolist()
    case = Case([(c, 1) for c in ctxs], 32, 4, 128, window, dtype=torch.bfloat16, device="cuda")
    base = at.decode_config(case.meta.max_seq_len, window, batch, case.q.device)
    plain = at.paged_attention_decode(*case.args(), config=dataclasses.replace(base, prefetch=0))
    early = at.paged_attention_decode(*case.args(), config=dataclasses.replace(base, prefetch=prefetch))
    assert torch.equal(early, plain)
    check_attention(early, case.ref(), BF16_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("batch", "max_ctx"), [(1, 1000), (4, 1000), (16, 5000)])
@pytest.mark.parametrize("window", [513, None])
def test_decode_merge_launch_gpu(poison: None, batch: int, max_ctx: int, window: int | None) -> None:
    """`combine_launch` on the GPU (PDL between the two launches), in and out of a CUDA graph: the same bits as
    the in-launch merge, with a sequence without a query."""
    g = torch.Generator().manual_seed(7 * batch + max_ctx)
    ctxs = torch.randint(1, max_ctx + 1, (batch,), generator=g).tolist()
    ctxs[0] = max_ctx
    seqs = [(c, 0 if i == 1 else 1) for i, c in enumerate(ctxs)]
    case = Case(seqs, 32, 4, 128, window, dtype=torch.bfloat16, device="cuda")
    base = at.decode_config(case.meta.max_seq_len, window, batch, case.q.device)
    splits = max(2, at.decode_num_splits(case.meta.max_seq_len, window, batch, 4, case.q.device, base))
    cfg = dataclasses.replace(base, combine_launch=True)
    fused = at.paged_attention_decode(*case.args(), num_splits=splits, config=base)
    out = at.paged_attention_decode(*case.args(), num_splits=splits, config=cfg)
    assert torch.equal(out, fused)
    check_attention(out, case.ref(), BF16_TOL)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed = at.paged_attention_decode(*case.args(), num_splits=splits, config=cfg)
    for _ in range(2):
        graphed.fill_(float("nan"))
        graph.replay()
        assert torch.equal(graphed, out)
    assert _counters_zero(case.q.device)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("window", [513, None])
def test_decode_cuda_graph_replay_gpu(window: int | None) -> None:
    """Capture once with a context bound, then replay with new lengths written into the same device tensors."""
    bound = 4096
    # Every block stays live (no window at build time), so shorter replayed contexts still have their keys.
    case = Case([(bound, 1)] * 4, 32, 4, 128, None, torch.bfloat16, device="cuda")
    static_meta = AttnMeta.build([0, 1, 2, 3, 4], [bound] * 4, "cuda")
    args = (case.q, case.k_cache, case.v_cache, case.table, static_meta, case.sinks, case.scale, window)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        at.paged_attention(*args)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = at.paged_attention(*args)
    for lens in ([1, 4096, 700, 2049], [4096, 3, 514, 1000]):
        static_meta.seq_lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        case.q.copy_(torch.randn_like(case.q))
        graph.replay()
        host_meta = AttnMeta.build([0, 1, 2, 3, 4], lens, "cuda")
        ref = paged_attention_ref(
            case.q, case.k_cache, case.v_cache, case.table, host_meta, case.sinks, case.scale, window
        )
        check_attention(out, ref, BF16_TOL)
    assert _counters_zero(case.q.device)
