"""Long prompts and chunks of full layers on cuDNN's attention (`attention_cudnn`), the sinks added from its
log-sum-exp, a cached prefix in segments merged by their log-sum-exps.

On the CPU `attend_ref` stands in for cuDNN (same contract: output without sinks and the log-sum-exp, causal or not),
so the sinks, the zero padding, the prefix segments and their merge, the gather from the shuffled NaN-filled cache and
the split of a batch between cuDNN and the Triton kernel (interpreter, fp32) are checked against
`paged_attention_ref`; cuDNN itself runs on the GPU (`-m gpu`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_cases import Case, check_attention, rel_err
from flint_kernels import attention_cudnn as ac
from flint_kernels import attention_triton as at
from flint_kernels.configs import AttentionPrefillConfig
from kernel_checks import poison_torch_empty

HAS_CUDA = torch.cuda.is_available()
# A prompt at the front, one in the middle, a chunk after a cached prefix, decodes and a sequence with no query.
MIXED = [(40, 40), (37, 5), (5, 1), (33, 33), (100, 30), (9, 0), (1, 1)]


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    poison_torch_empty(monkeypatch)


def test_cudnn_sequences_from_the_threshold_with_whole_segments_of_prefix() -> None:
    case = Case(MIXED, 8, 2, 16, None)
    assert ac.cudnn_sequences(case.meta, 33, segment=0) == [0, 3]  # fresh prompts only
    assert ac.cudnn_sequences(case.meta, 34, segment=0) == [0]
    assert ac.cudnn_sequences(case.meta, 0, segment=0) == [0, 3, 6]  # never a sequence without queries
    assert ac.cudnn_sequences(case.meta, 30, segment=35) == [0, 3, 4]  # 30 queries after 2 segments of 35
    assert ac.cudnn_sequences(case.meta, 30, segment=70) == [0, 3, 4]
    assert ac.cudnn_sequences(case.meta, 30, segment=40) == [0, 3]  # 70 keys are not whole 40-key segments
    assert ac.cudnn_sequences(case.meta, 5, segment=32) == [0, 1, 3]  # 5 queries after 32; 30 after 70: no


@pytest.mark.parametrize("pad", [1, 16, 256])
def test_prompt_attention_adds_each_heads_sink(pad: int) -> None:
    """One prompt through `attend_ref`: zero padding at the end changes nothing under the causal mask."""
    case = Case([(45, 45)], 8, 2, 32, None, block_size=4)
    out = ac.prompt_attention(case.q, case.k_cache, case.v_cache, case.table[0], case.sinks, case.scale,
                              ac.attend_ref, pad=pad)  # fmt: skip
    check_attention(out, case.ref(), 1e-5)


@pytest.mark.parametrize("segments", [1, 2, 3, 4])
@pytest.mark.parametrize("into_batch", [False, True])
def test_chunk_after_a_prefix_merges_its_segments(segments: int, into_batch: bool) -> None:
    """A chunk of 45 queries after whole 16-key segments: its own keys causally, each segment whole, the parts merged
    (by `merge_ref`, or by the Triton launches into a slice of the batch output)."""
    prefix = 16 * segments
    case = Case([(prefix + 45, 45)], 8, 2, 32, None, block_size=4)
    calls: list[tuple[int, int, bool]] = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> tuple:
        calls.append((q.shape[2], k.shape[2], causal))
        return ac.attend_ref(q, k, v, scale, causal)

    dst = torch.full((50, 8, 32), float("nan"))[2:47] if into_batch else None
    out = ac.prompt_attention(case.q, case.k_cache, case.v_cache, case.table[0], case.sinks, case.scale, attend,
                              pad=16, dst=dst, prefix=prefix, segment=16)  # fmt: skip
    check_attention(out, case.ref(), 1e-5)
    assert calls == [(48, 48, True)] + [(48, 16, False)] * segments
    with pytest.raises(ValueError, match="whole number"):
        ac.prompt_attention(case.q, case.k_cache, case.v_cache, case.table[0], case.sinks, case.scale, attend,
                            prefix=prefix, segment=prefix + 1)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_merge_kernel_against_merge_ref(dtype: torch.dtype, with_sinks: bool) -> None:
    """Two parts (strided, as cuDNN's views) merged in one launch: into an FP32 state, or with the sinks into a slice
    of the batch output; never in place."""
    g = torch.Generator().manual_seed(5)
    h, n, d = 8, 37, 32
    a, b = (torch.randn(1, h, n + 5, d, generator=g).to(dtype)[0].transpose(0, 1)[:n] for _ in "ab")
    la, lb = (torch.randn(h, n + 5, generator=g)[:, :n] * 4 for _ in "ab")
    sinks = torch.randn(h, generator=g) * 2 if with_sinks else None
    ref, ref_lse = ac.merge_ref(a, la, b, lb, sinks)
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    if with_sinks:
        batch = torch.full((n + 10, h, d), float("nan"), dtype=dtype)
        ac.merge_into(a, la, b, lb, batch[4 : n + 4], sinks=sinks)
        check_attention(batch[4 : n + 4], ref.to(dtype), tol)
        assert batch[:4].isnan().all() and batch[n + 4 :].isnan().all()
    else:
        state, state_lse = a.float().contiguous(), la.clone()
        dst, dst_lse = torch.empty_like(state), torch.empty_like(state_lse)
        ac.merge_into(state, state_lse, b, lb, dst, dst_lse)  # FP32 part, as the engine's later segments
        check_attention(dst, ref, 1e-6)
        assert (dst_lse - ref_lse).abs().max().item() < 1e-5
        with pytest.raises(AssertionError, match="in place"):
            ac.merge_into(state, state_lse, b, lb, state, state_lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_sinks_kernel_writes_the_rows_into_the_batch_output(dtype: torch.dtype) -> None:
    """The Triton launch against `add_sinks`, from a strided [H, n, D] output into a slice of a larger one."""
    g = torch.Generator().manual_seed(4)
    h, n, d = 8, 37, 32
    out = torch.randn(1, h, n + 5, d, generator=g).to(dtype)[0].transpose(0, 1)[:n]  # cuDNN's [n, H, D] view
    lse = torch.randn(h, n + 5, generator=g)[:, :n] * 3
    sinks = torch.randn(h, generator=g) * 2
    batch = torch.full((n + 10, h, d), float("nan"), dtype=dtype)
    ac.add_sinks_into(out, lse, sinks, batch[4 : n + 4])
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    check_attention(batch[4 : n + 4], ac.add_sinks(out, lse, sinks), tol)
    assert batch[:4].isnan().all() and batch[n + 4 :].isnan().all()


def test_batch_splits_between_cudnn_and_the_triton_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh prompts and a chunk after whole segments from the threshold on the sinkless kernel, every other row on
    the Triton kernel."""
    monkeypatch.setattr(ac, "SEGMENT", 35)
    case = Case(MIXED, 8, 2, 32, None, block_size=4)
    calls: list[tuple[int, int, bool]] = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> tuple:
        calls.append((q.shape[2], k.shape[2], causal))
        return ac.attend_ref(q, k, v, scale, causal)

    on_cudnn = ac.cudnn_sequences(case.meta, 30)
    assert on_cudnn == [0, 3, 4]
    out = torch.full_like(case.q, float("nan"))
    out = at._prefill_with_cudnn(*case.args()[:-1], on_cudnn, out, attend)
    check_attention(out, case.ref(), 1e-4)
    # each padded to PAD rows; the chunk of 30 after 70 keys: its own keys, then two segments
    assert calls == [(256, 256, True), (256, 256, True), (256, 256, True), (256, 35, False), (256, 35, False)]


def test_covers_only_cuda_half_precision() -> None:
    case = Case([(16, 16)], 8, 2, 32, None)
    assert not ac.covers(case.q, case.k_cache, case.v_cache)  # fp32 (and here maybe the CPU)
    half = case.q.half()
    assert not ac.covers(half, case.k_cache.half(), case.v_cache.float())


# --------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cudnn_prompts_in_a_mixed_batch_gpu(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """Flint's heads: two fresh prompts (one not a multiple of PAD) on cuDNN beside chunks and decodes on Triton."""
    seqs = [(3000, 1000), (4100, 4100), (2000, 1), (777, 777), (600, 77), (5, 1)]
    case = Case(seqs, 32, 4, 128, None, dtype, device="cuda")
    assert ac.covers(case.q, case.k_cache, case.v_cache)
    cudnn = ac.CUDNN_ATTENTION
    lengths: list[int] = []

    def spy(q: torch.Tensor, *args: object, **kwargs: object) -> tuple:
        lengths.append(q.shape[2])
        return cudnn(q, *args, **kwargs)

    monkeypatch.setattr(ac, "CUDNN_ATTENTION", spy)
    cfg = dataclasses.replace(at.prefill_config(case.q.shape[0], None, case.q.device), cudnn_min_tokens=700)
    out = at.paged_attention_prefill(*case.args(), config=cfg)
    assert lengths == [4352, 1024]  # padded to multiples of PAD
    monkeypatch.setenv("FLINT_CUDNN_ATTENTION", "0")
    assert not ac.covers(case.q, case.k_cache, case.v_cache)
    check_attention(at.paged_attention_prefill(*case.args(), config=cfg), case.ref(), 1e-2)
    assert len(lengths) == 2
    monkeypatch.delenv("FLINT_CUDNN_ATTENTION")
    check_attention(out, case.ref(), 1e-2)
    plain = at.paged_attention_prefill(*case.args(), config=AttentionPrefillConfig())
    assert len(lengths) == 2
    check_attention(plain, case.ref(), 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cudnn_chunks_after_a_prefix_in_a_mixed_batch_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flint's heads, BF16, 1024-key segments: a chunk after 3 segments and fresh prompts on cuDNN, a chunk after a
    prefix that is not whole segments on Triton, beside decodes."""
    monkeypatch.setattr(ac, "SEGMENT", 1024)
    seqs = [(3000, 1000), (4100, 4100), (3 * 1024 + 900, 900), (2000, 1), (777, 777), (600, 77), (5, 1)]
    case = Case(seqs, 32, 4, 128, None, torch.bfloat16, device="cuda")
    cudnn = ac.CUDNN_ATTENTION
    calls: list[tuple[int, int, bool]] = []

    def spy(q: torch.Tensor, k: torch.Tensor, *args: object, **kwargs: object) -> tuple:
        calls.append((q.shape[2], k.shape[2], bool(args[4])))  # (v, bias, lse, dropout, is_causal, ...)
        return cudnn(q, k, *args, **kwargs)

    monkeypatch.setattr(ac, "CUDNN_ATTENTION", spy)
    cfg = dataclasses.replace(at.prefill_config(case.q.shape[0], None, case.q.device), cudnn_min_tokens=700)
    out = at.paged_attention_prefill(*case.args(), config=cfg)
    assert calls == [(4352, 4352, True), (1024, 1024, True), (1024, 1024, False), (1024, 1024, False),
                     (1024, 1024, False), (1024, 1024, True)]  # fmt: skip
    check_attention(out, case.ref(), 1e-2)
    plain = at.paged_attention_prefill(*case.args(), config=AttentionPrefillConfig())
    check_attention(plain, case.ref(), 1e-2)
    assert rel_err(out, plain) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cudnn_chunk_after_two_8k_segments_gpu() -> None:
    """The engine's shape: a 5,000-token chunk after 16,384 cached tokens (two SEGMENT calls, two merges)."""
    case = Case([(2 * ac.SEGMENT + 5000, 5000)], 32, 4, 128, None, torch.bfloat16, device="cuda")
    cfg = dataclasses.replace(at.prefill_config(5000, None, case.q.device), cudnn_min_tokens=4096)
    out = at.paged_attention_prefill(*case.args(), config=cfg)
    plain = at.paged_attention_prefill(*case.args(), config=AttentionPrefillConfig())
    ref = case.ref()
    check_attention(out, ref, 1e-2)
    assert rel_err(out, ref) < 2 * rel_err(plain, ref) + 1e-3  # within the Triton kernel's own error


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("causal", [True, False])
def test_cudnn_matches_the_sinkless_reference_gpu(causal: bool) -> None:
    """cuDNN's output and log-sum-exp against `attend_ref` at Flint's heads, GQA as is; without the mask over more
    keys than queries (a prefix segment)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    m = 1024 if causal else 2048
    q = torch.randn(1, 32, 1024, 128, generator=g, device="cuda").bfloat16()
    k, v = (torch.randn(1, 4, m, 128, generator=g, device="cuda").bfloat16() for _ in range(2))
    out, lse = ac.cudnn_attend(q, k, v, 128**-0.5, causal)
    ref_out, ref_lse = ac.attend_ref(q, k, v, 128**-0.5, causal)
    assert lse.shape == ref_lse.shape
    assert (lse - ref_lse).abs().max().item() < 1e-2
    assert ((out.float() - ref_out.float()).abs().max() / ref_out.float().abs().max()).item() < 1e-2


def test_prompt_lengths_follow_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The padded lengths the warm-up builds cuDNN plans for: from the threshold's to max_tokens' bucket."""
    assert at.cudnn_prompt_lengths(8192, torch.device("cpu")) == []  # no table here: never cuDNN
    monkeypatch.setattr(at, "prefill_config", lambda t, *a, **k: AttentionPrefillConfig(cudnn_min_tokens=1000))
    assert at.cudnn_prompt_lengths(2000, torch.device("cpu")) == [1024, 1280, 1536, 1792, 2048]
    assert at.cudnn_prompt_lengths(999, torch.device("cpu")) == []
    assert at.prepare_cudnn_plans(2000, 8, 2, 32, torch.float16, torch.device("cpu")) == []  # no cuDNN on the CPU


def test_a_failing_cudnn_leaves_the_prompts_to_the_triton_kernel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """cuDNN raising (a GPU or shape it does not take): one warning, the right output, cuDNN not asked again."""
    case = Case(MIXED, 8, 2, 32, None, block_size=4)
    asked: list[int] = []

    def broken(*args: object, **kwargs: object) -> tuple:
        asked.append(1)
        raise RuntimeError("cuDNN Frontend error: no valid execution plans")

    failures: list[str] = []
    monkeypatch.setattr(ac, "_failures", failures)
    monkeypatch.setattr(ac, "CUDNN_ATTENTION", broken)
    monkeypatch.setattr(ac, "covers", lambda *args: not failures)  # as on a GPU, until cuDNN fails
    cfg = AttentionPrefillConfig(cudnn_min_tokens=33)
    for _ in range(2):
        check_attention(at.paged_attention_prefill(*case.args(), config=cfg), case.ref(), 1e-4)
    assert asked == [1] and len(failures) == 1 and "cuDNN attention failed" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_prepare_builds_the_tables_plans_gpu() -> None:
    """The warm-up's plans: each padded length from the table's threshold to the largest step (H200: 4096-8192)."""
    cuda = torch.device("cuda")
    lengths = at.prepare_cudnn_plans(8192, 32, 4, 128, torch.bfloat16, cuda)
    assert lengths == at.cudnn_prompt_lengths(8192, cuda)
    if "H200" in torch.cuda.get_device_name():
        assert lengths == list(range(4096, 8193, 256))
