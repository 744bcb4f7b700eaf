"""Triton top-k sampling against `sample_top_k_ref` (interpreter on CPU with small vocabulary chunks, `gpu` on CUDA
at Flint's 150144-token vocabulary). Logits are FP32, which the interpreter runs exactly."""

from __future__ import annotations

import pytest
import torch
import triton
from flint_kernels import sampling_triton
from flint_kernels.sampling import sample_top_k_ref
from flint_kernels.sampling_triton import sample_top_k
from kernel_checks import LaunchSpy

from flint_engine.sampler import SamplingRow, sample

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter sorts slowly: 256-entry chunks keep a case to seconds and still span several chunks."""
    monkeypatch.setattr(sampling_triton, "CHUNK", 256)


def _batch(n: int, vocab: int, k_max: int, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """Mixed rows: greedy, peaked and flat logits, top_k up to k_max, top-p on some rows, min-p on others."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.where(torch.arange(n) % 2 == 0, 4.0, 0.3)[:, None]
    logits = torch.randn(n, vocab, generator=g) * scale
    temperature = torch.rand(n, generator=g) * 1.5 + 0.2
    temperature[::4] = 0.0
    top_k = torch.randint(1, k_max + 1, (n,), generator=g)
    top_k[0] = k_max
    top_p = torch.where(torch.rand(n, generator=g) < 0.3, 1.0, 0.3 + 0.7 * torch.rand(n, generator=g)).float()
    min_p = torch.where(torch.rand(n, generator=g) < 0.5, 0.0, 0.2 * torch.rand(n, generator=g)).float()
    seeds = torch.randint(-(2**62), 2**62, (n,), generator=g)
    steps = torch.randint(0, 100_000, (n,), generator=g)
    args = (logits, temperature, top_k, top_p, min_p, seeds, steps)
    return tuple(a.to(device) for a in args)


def _check(n: int, vocab: int, k_max: int, seed: int, device: str) -> None:
    args = _batch(n, vocab, k_max, seed, device)
    got = sample_top_k(*args, k_max)
    want = sample_top_k_ref(*args, k_max)
    assert got.dtype == torch.int64 and got.shape == (n,)
    # Same token in every row: the draw depends only on (seed, step, token id) and the kept candidates.
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "n,vocab,k_max", [(1, 97, 20), (3, 1000, 20), (1, 2049, 64), (3, 700, 128), (4, 300, 1)], ids=str
)
def test_sample_top_k_interp(small_chunks: None, n: int, vocab: int, k_max: int) -> None:
    _check(n, vocab, k_max, seed=vocab + k_max, device="cpu")


@pytest.mark.parametrize(("chunk", "k_max", "levels"), [(1024, 20, 2), (1024, 64, 1), (256, 128, 0)], ids=str)
def test_chunk_cut_in_levels_interp(monkeypatch: pytest.MonkeyPatch, chunk: int, k_max: int, levels: int) -> None:
    """The chunk's best keys found through sorted rows cut to their best (twice as for Flint's 4096-key chunks, once,
    or not at all): the same tokens as the reference."""
    monkeypatch.setattr(sampling_triton, "RADIX", False)
    monkeypatch.setattr(sampling_triton, "CHUNK", chunk)
    kc = sampling_triton.MIN_KC if k_max <= sampling_triton.MIN_KC else sampling_triton.MAX_K
    assert sampling_triton.chunk_levels(chunk, kc)[1] == levels
    _check(2, chunk + 77, k_max, seed=chunk + k_max, device="cpu")


@pytest.mark.parametrize("k_max", [20, 128])
def test_draw_cuts_the_candidates_in_levels_interp(monkeypatch: pytest.MonkeyPatch, k_max: int) -> None:
    """The draw keeps the best KC of the chunks' candidates through sorted rows cut to their best, twice as for
    Flint's 37 chunks of 32 or 128 candidates, before its sort: the same tokens as the reference."""
    monkeypatch.setattr(sampling_triton, "RADIX", False)
    monkeypatch.setattr(sampling_triton, "CHUNK", 128)  # 18 chunks of a 2200-token vocabulary
    kc = sampling_triton.MIN_KC if k_max <= sampling_triton.MIN_KC else sampling_triton.MAX_K
    assert sampling_triton.chunk_levels(triton.next_power_of_2(18 * kc), kc)[1] == 2
    _check(1, 2200, k_max, seed=k_max, device="cpu")


@pytest.mark.parametrize(
    "n,vocab,k_max,chunk", [(3, 2200, 128, 128), (2, 2200, 20, 128), (1, 97, 64, 256), (2, 700, 64, 256)], ids=str
)
def test_radix_draw_interp(monkeypatch: pytest.MonkeyPatch, n: int, vocab: int, k_max: int, chunk: int) -> None:
    """`_chunk_radix_kernel` and `_draw_radix_kernel` (RADIX): each chunk's best KC keys and then the best KC
    candidates by radix selects, the same draw as `_draw_kernel`'s and the reference's tokens: 18 chunks of
    128 or 32 candidates (KC 32 with FILTER off), fewer real candidates than KC (97 tokens in one chunk of 128 slots:
    the rest padding), and a 64-token top_k on 128-candidate chunks."""
    monkeypatch.setattr(sampling_triton, "RADIX", True)
    monkeypatch.setattr(sampling_triton, "FILTER", False)
    monkeypatch.setattr(sampling_triton, "CHUNK", chunk)
    spies = {name: LaunchSpy(getattr(sampling_triton, name)) for name in ("_chunk_radix_kernel", "_draw_radix_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(sampling_triton, name, spy)
    _check(n, vocab, k_max, seed=vocab + k_max + chunk, device="cpu")
    kc = sampling_triton.MIN_KC if k_max <= sampling_triton.MIN_KC else sampling_triton.MAX_K
    block = min(max(chunk, kc), triton.next_power_of_2(vocab))
    assert spies["_chunk_radix_kernel"].grids == [(n, triton.cdiv(vocab, block))]
    assert spies["_draw_radix_kernel"].grids == [(n,)]


def test_radix_select_finds_the_kth_key_among_near_ties_interp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys that agree in all but their last bits (equal logits: only the token id differs) and -inf logits, where
    the radix select's later passes decide: the same tokens as `_draw_kernel`'s sorted rows (both keep the smaller
    ids of equal values, as torch.argmax does; torch.topk, in the reference, breaks such ties its own way), and
    greedy takes the first of the equal maxima."""
    monkeypatch.setattr(sampling_triton, "FILTER", False)
    monkeypatch.setattr(sampling_triton, "RADIX", False)
    monkeypatch.setattr(sampling_triton, "CHUNK", 256)
    vocab = 1500
    logits = torch.full((3, vocab), 1.0)
    logits[1, ::3] = float("-inf")
    logits[2, 700:] = 2.0
    temperature = torch.tensor([0.0, 1.0, 0.7])
    top_k = torch.tensor([128, 100, 128])
    top_p, min_p = torch.tensor([1.0, 0.9, 1.0]), torch.zeros(3)
    seeds, steps = torch.tensor([3, 4, 5]), torch.tensor([0, 11, 12])
    args = (logits, temperature, top_k, top_p, min_p, seeds, steps)
    sorted_rows = sample_top_k(*args, 128)
    monkeypatch.setattr(sampling_triton, "RADIX", True)
    radix = sample_top_k(*args, 128)
    assert radix.tolist() == sorted_rows.tolist()
    assert radix[0].item() == 0 and radix[1].item() % 3 != 0 and radix[2].item() >= 700


# The sampler's three ways to a row's candidates: sorted rows (FLINT_SAMPLER_RADIX=0 FLINT_SAMPLER_FILTER=0), radix
# selects (FLINT_SAMPLER_FILTER=0), and the default: the filter, with radix selects where it falls back.
MODES = {"sorted_rows": (False, False), "radix": (False, True), "filter": (True, True)}


@pytest.mark.parametrize("mode", list(MODES))
def test_ties_and_banned_tokens_interp(monkeypatch: pytest.MonkeyPatch, small_chunks: None, mode: str) -> None:
    """Greedy takes the first of equal maxima (torch.argmax's rule); a -inf logit is never drawn. With FILTER, in
    one 1024-key chunk: the bound then lies among the -inf keys of the banned rows."""
    filtered, radix = MODES[mode]
    monkeypatch.setattr(sampling_triton, "FILTER", filtered)
    monkeypatch.setattr(sampling_triton, "RADIX", radix)
    if filtered:
        monkeypatch.setattr(sampling_triton, "CHUNK", 1024)
        monkeypatch.setattr(sampling_triton, "FILTER_CAP", 256)
    vocab = 600
    logits = torch.zeros(4, vocab)
    logits[:, 5] = logits[:, 400] = 3.0  # a tie across two chunks
    logits[2:, :] = torch.randn(2, vocab, generator=torch.Generator().manual_seed(1))
    logits[2:, 10:] = float("-inf")  # only ten tokens are allowed
    temperature = torch.tensor([0.0, 0.0, 1.0, 2.0])
    top_k = torch.tensor([1, 1, 20, 20])
    ones, zeros = torch.ones(4), torch.zeros(4)
    seeds, steps = torch.arange(4), torch.arange(4) * 7
    got = sample_top_k(logits, temperature, top_k, ones, zeros, seeds, steps, 20)
    assert got[:2].tolist() == [5, 5]
    assert all(0 <= t < 10 for t in got[2:].tolist())
    assert got.tolist() == sample_top_k_ref(logits, temperature, top_k, ones, zeros, seeds, steps, 20).tolist()


def test_uncovered_calls_take_the_reference() -> None:
    logits = torch.randn(2, 50)
    assert not sampling_triton.supported(logits, sampling_triton.MAX_K + 1)
    assert not sampling_triton.supported(logits.double(), 20)
    assert not sampling_triton.supported(logits, 51)
    assert sampling_triton.supported(logits, 20)  # CPU under the interpreter


def test_sampler_gives_the_same_tokens_with_either_op(small_chunks: None) -> None:
    """`sample` with the Triton op in place of the reference: greedy, sampled and penalised rows in one batch."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 900, generator=g) * 2
    rows = [
        SamplingRow(temperature=0.0, top_p=1.0, top_k=20, min_p=0.0, seed=1, step=0),
        SamplingRow(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, seed=2, step=5),
        SamplingRow(temperature=0.6, top_p=0.8, top_k=40, min_p=0.05, seed=3, step=9),
        SamplingRow(
            temperature=1.0,
            top_p=0.95,
            top_k=20,
            min_p=0.0,
            seed=4,
            step=1,
            presence_penalty=1.5,
            output_ids=[int(logits[3].argmax())],
        ),
        SamplingRow(temperature=1.2, top_p=1.0, top_k=1, min_p=0.0, seed=5, step=2, logprobs=2),
    ]
    ref = sample(logits.clone(), rows)
    fast = sample(logits.clone(), rows, sample_top_k)
    assert fast.token_ids == ref.token_ids
    assert fast.logprobs == ref.logprobs and fast.top_logprobs == ref.top_logprobs
    assert ref.token_ids[4] == int(logits[4].argmax())  # top_k 1 is greedy whatever the temperature


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n,k_max", [(1, 20), (8, 20), (64, 20), (32, 128), (16, 1)], ids=str)
@pytest.mark.parametrize("mode", list(MODES))
def test_sample_top_k_gpu(monkeypatch: pytest.MonkeyPatch, n: int, k_max: int, mode: str) -> None:
    filtered, radix = MODES[mode]
    monkeypatch.setattr(sampling_triton, "FILTER", filtered)
    monkeypatch.setattr(sampling_triton, "RADIX", radix)
    _check(n, 150_144, k_max, seed=n + k_max, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("radix", [False, True], ids=["sorted_rows", "radix"])
def test_chunk_filter_falls_back_on_the_gpu(monkeypatch: pytest.MonkeyPatch, radix: bool) -> None:
    """FILTER at Flint's vocabulary with rows whose chunks all exceed FILTER_CAP keys at the bound (every 32nd
    logit very low) beside ordinary rows, falling back on sorted rows or radix selects: the same tokens as the
    reference."""
    monkeypatch.setattr(sampling_triton, "FILTER", True)
    monkeypatch.setattr(sampling_triton, "RADIX", radix)
    args = _batch(8, 150_144, 20, seed=5, device="cuda")
    args[0][::2, ::32] = -50.0
    assert sample_top_k(*args, 20).tolist() == sample_top_k_ref(*args, 20).tolist()


def _filtered_counts(logits: torch.Tensor, temperature: torch.Tensor, chunk: int, kc: int) -> list[int]:
    """How many keys of each (row, chunk) reach `_chunk_filter_kernel`'s bound: the smallest of kc column maxima."""
    counts = []
    for r in range(logits.shape[0]):
        t = temperature[r].item() or 1.0
        row = logits[r] / t
        for c0 in range(0, row.numel(), chunk):
            part = torch.full((chunk,), float("-inf"))
            part[: min(chunk, row.numel() - c0)] = row[c0 : c0 + chunk]
            tau = part.view(chunk // kc, kc).max(dim=0).values.min()
            counts.append(int((part >= tau).sum()))
    return counts


@pytest.mark.parametrize("radix", [False, True], ids=["sorted_rows", "radix"])
@pytest.mark.parametrize("seed", [0, 1])
def test_chunk_filter_gathers_the_keys_at_the_bound_interp(
    monkeypatch: pytest.MonkeyPatch, seed: int, radix: bool
) -> None:
    """`_chunk_filter_kernel` (FILTER): chunks with at most FILTER_CAP keys at the bound sort only those, the others
    (here a row whose every 32nd logit is very low, so one column's maximum is far below the rest) take the sorted
    rows of the whole chunk, or with RADIX its radix select (`_chunk_filter_radix_kernel`); the same tokens as the
    reference either way."""
    monkeypatch.setattr(sampling_triton, "CHUNK", 1024)
    monkeypatch.setattr(sampling_triton, "FILTER", True)
    monkeypatch.setattr(sampling_triton, "RADIX", radix)
    monkeypatch.setattr(sampling_triton, "FILTER_CAP", 256)
    n, vocab, k_max = 3, 2 * 1024 + 300, 20  # the last chunk ends past the vocabulary
    args = _batch(n, vocab, k_max, seed=seed, device="cpu")
    logits = args[0]
    logits[1, ::32] = -50.0
    counts = _filtered_counts(logits, args[1], 1024, sampling_triton.MIN_KC)
    assert min(counts) >= sampling_triton.MIN_KC
    assert any(c <= 256 for c in counts) and any(c > 256 for c in counts), counts
    got = sample_top_k(*args, k_max)
    assert got.tolist() == sample_top_k_ref(*args, k_max).tolist()


def test_chunk_filter_finds_each_chunks_best_keys_interp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidates themselves: the filtered kernel's KC keys of every chunk are the unfiltered kernel's."""
    monkeypatch.setattr(sampling_triton, "CHUNK", 1024)
    monkeypatch.setattr(sampling_triton, "FILTER_CAP", 256)
    logits = torch.randn(2, 3000, generator=torch.Generator().manual_seed(7))
    logits[1, 1024:2048] = torch.arange(1024.0)  # sorted: the bound is the last 32 keys exactly
    temperature = torch.tensor([0.7, 1.0])
    kc, block = sampling_triton.MIN_KC, 1024
    n_chunks = triton.cdiv(3000, block)
    sub, levels, final = sampling_triton.chunk_levels(block, kc)
    cap_sub, cap_levels, cap_final = sampling_triton.chunk_levels(256, kc)
    want = torch.empty((2, n_chunks, kc), dtype=torch.int64)
    got = torch.empty_like(want)
    gather = torch.empty((2, n_chunks, 256), dtype=torch.int64)
    sampling_triton._chunk_top_kernel[(2, n_chunks)](
        logits, temperature, want, 3000, logits.stride(0), n_chunks, BLOCK=block, KC=kc, SUB=sub, LEVELS=levels,
        FINAL=final,
    )  # fmt: skip
    sampling_triton._chunk_filter_kernel[(2, n_chunks)](
        logits, temperature, got, gather, 3000, logits.stride(0), n_chunks, BLOCK=block, KC=kc, SUB=sub,
        LEVELS=levels, FINAL=final, CAP=256, CAP_SUB=cap_sub, CAP_LEVELS=cap_levels, CAP_FINAL=cap_final,
    )  # fmt: skip
    assert torch.equal(got, want)


@pytest.mark.parametrize("radix", [False, True], ids=["sorted_rows", "radix"])
@pytest.mark.parametrize(
    ("chunk", "vocab", "ordered"), [(128, 2200, False), (128, 1100, False), (64, 2200, True)], ids=str
)
def test_draw_filter_interp(
    monkeypatch: pytest.MonkeyPatch, chunk: int, vocab: int, ordered: bool, radix: bool
) -> None:
    """`_draw_filter_kernel` (FILTER): with at least KC chunks (18 here) the candidates at the KC-th largest chunk
    maximum are gathered and cut; fewer chunks (9), or more candidates there than DRAW_CAP (logits rising with the
    id over 35 chunks: every candidate of the last 31 chunks reaches it), take the sorted rows of all candidates, or
    with RADIX their radix select (`_draw_filter_radix_kernel`). The same tokens as the reference."""
    monkeypatch.setattr(sampling_triton, "CHUNK", chunk)
    monkeypatch.setattr(sampling_triton, "FILTER", True)
    monkeypatch.setattr(sampling_triton, "RADIX", radix)
    args = _batch(3, vocab, 20, seed=vocab + chunk, device="cpu")
    if ordered:
        args[0][:] = torch.linspace(-5.0, 5.0, vocab)
    kc, chunks = sampling_triton.MIN_KC, triton.cdiv(vocab, chunk)
    for r in range(3):  # how many candidates reach the bound, from each chunk's best keys
        scaled = torch.full((chunks * chunk,), float("-inf"))
        scaled[:vocab] = args[0][r] / (args[1][r].item() or 1.0)
        best = scaled.view(chunks, chunk).topk(kc, dim=1).values
        if chunks >= kc:
            reached = int((best >= best[:, 0].topk(kc).values[-1]).sum())
            assert (reached > sampling_triton.DRAW_CAP) == ordered, reached
    got = sample_top_k(*args, 20)
    assert got.tolist() == sample_top_k_ref(*args, 20).tolist()
