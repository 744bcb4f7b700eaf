"""benchmarks/decode.py's chunked prefill: the chunks the engine would run give the whole prompt's logits; its
fast-vs-plain check sizes the KV cache by the batch."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType, SimpleNamespace

import pytest
import torch

from flint_engine.config import preset
from flint_engine.engine_config import EngineConfig
from flint_engine.kv_cache import KVCache
from flint_engine.kv_cache_plan import KVCacheTooSmall, plan_kv_cache
from flint_engine.model import FlintModel
from flint_engine.weights import random_weights


@pytest.fixture
def decode(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    """benchmarks/decode.py as a module."""
    return benchmark_script("decode")


@pytest.mark.parametrize("chunk", [16, 24, 69])
def test_chunked_prefill_gives_the_whole_prompts_logits(decode: ModuleType, chunk: int) -> None:
    """A 70-token prompt (window 7) in chunks on and off block edges, the last chunk one token or many."""
    cfg = preset("tiny")
    model = FlintModel(random_weights(cfg, torch.float32, seed=5))
    ids = torch.randint(0, cfg.vocab_size, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    bs = 16
    blocks = -(-len(ids) // bs)

    def last_logits(batches: list) -> torch.Tensor:
        cache = KVCache(cfg, blocks, blocks, bs, torch.float32, "cpu")
        for b in batches[:-1]:
            model.forward(b, cache)
        return model.compute_logits(model.forward(batches[-1], cache)[-1:])

    whole = decode.prefill_batches(ids, bs, torch.device("cpu"))
    chunks = decode.prefill_batches(ids, bs, torch.device("cpu"), chunk)
    assert len(whole) == 1 and len(chunks) == -(-len(ids) // chunk)
    assert [b.seq_lens[0] for b in chunks] == [min(len(ids), (i + 1) * chunk) for i in range(len(chunks))]
    torch.testing.assert_close(last_logits(chunks), last_logits(whole), rtol=1e-5, atol=1e-5)


def test_profile_families_name_the_kernels_of_a_step(decode: ModuleType) -> None:
    """Kernel names from H200 profiles (twenty-first session) land in their family, not in "other"."""
    assert decode.family("_nvfp4_mma_rows_kernel") == "gemv/gemm"
    assert decode.family("_nvfp4_mma_vec_kernel") == "gemv/gemm"
    assert decode.family("_linear_kernel") == "gemv/gemm"
    assert decode.family("_moe_gate_up_mma_vec_kernel") == "moe"
    assert decode.family("_moe_down_mma_vec_kernel") == "moe"
    assert decode.family("_decode_kernel") == "attention"
    assert decode.family("_router_tiles_kernel") == "router"
    assert decode.family("_qk_norm_rope_write_kernel") == "norm"
    assert decode.family("Memset (Device)") == "other"


def test_fast_path_check_holds_the_sliding_windows_of_its_batch(benchmark_script: Callable[[str], ModuleType]) -> None:
    """The fast-vs-plain check's engines size their KV cache by the batch: at full size a fixed 2 GiB held the
    sliding windows of ~28 sequences, and a batch-32 check failed to start (thirty-fifth session, H200)."""
    accuracy = benchmark_script("fast_path_accuracy")
    cfg = preset("full")
    model = SimpleNamespace(config=cfg)
    with pytest.raises(KVCacheTooSmall):
        plan_kv_cache(cfg, 2 * 2**30, 16, 32, EngineConfig(max_num_seqs=32).prefill_tokens(True))
    for seqs in (1, 8, 32, 64, 128):
        budget = accuracy.kv_budget(model, seqs)
        plan = plan_kv_cache(cfg, budget, 16, seqs, EngineConfig(max_num_seqs=seqs).prefill_tokens(True))
        assert plan.num_full_blocks * plan.full_block_bytes > 2 * 2**30 - plan.full_block_bytes


def test_the_floor_counts_what_a_step_reads_not_the_ready_forms_beside_it(decode: ModuleType) -> None:
    """`step_bytes` (the bandwidth floor's bytes) is the same with an NVFP4 weight's ready scales and codes made: the
    MMA kernels read those instead of its own bytes, not as well; at one token it is below the weights' total (the
    experts no token routes to, the embedding's other rows)."""
    from flint_kernels import nvfp4_mma_codes, nvfp4_mma_scales

    cfg = preset("tiny")
    weights = random_weights(cfg, torch.float32, seed=3, nvfp4_linears=True)
    before = [decode.step_bytes(cfg, weights, b, 64) for b in (1, 4)]
    for w in weights.nvfp4_weights():
        nvfp4_mma_scales.make_ready(w)
        nvfp4_mma_codes.make_ready(w)
    assert sum(w.extra_nbytes for w in weights.nvfp4_weights()) > 0
    assert [decode.step_bytes(cfg, weights, b, 64) for b in (1, 4)] == pytest.approx(before, rel=1e-12)
    assert before[0] < before[1] and before[0] < weights.nbytes()


def test_the_reserve_decides_which_kv_caches_fit_beside_the_weights(decode: ModuleType) -> None:
    """BF16 Flint on an 80 GB H100 (~74.1 GiB of weights in 79.6 GiB): the default 6 GiB reserve leaves no room for
    any cache (the fortieth and forty-second sessions' "KV cache would not fit"), 2 GiB leaves batch 1 at 1K; 64
    sequences of 32K (56 GiB of full-layer KV, 2.7 GiB of sliding slots) fit only on a card with that much to spare."""
    cfg = preset("full")
    plans = [(1, 1024), (8, 1024), (64, 32768)]
    beside_bf16 = (79.6 - 74.1) * 2**30
    assert decode.plans_that_fit(cfg, plans, 16, beside_bf16 - 6 * 2**30) == []
    assert decode.plans_that_fit(cfg, plans, 16, beside_bf16 - 2 * 2**30) == [(1, 1024), (8, 1024)]
    full_kv = 64 * 32768 * cfg.kv_bytes_per_token(2)
    assert 55 * 2**30 < full_kv < 57 * 2**30
    assert decode.plans_that_fit(cfg, plans, 16, full_kv + 2 * 2**30) == [(1, 1024), (8, 1024)]
    assert decode.plans_that_fit(cfg, plans, 16, full_kv + 3 * 2**30) == plans


def test_the_fast_vs_plain_check_says_each_phase_as_it_ends(decode: ModuleType, capsys: pytest.CaptureFixture) -> None:
    """The same model on both sides agrees everywhere, and the check prints each phase (a device call cut short by
    its limit then says how far it got)."""
    cfg = preset("tiny")
    model = FlintModel(random_weights(cfg, torch.float32, seed=3))
    result = decode.check_fast_vs_plain(model, model, cfg, torch.device("cpu"), 3, 2, 16)
    assert result["greedy_token_agreement"] == 1.0 and result["forced_token_agreement"] == 1.0
    assert result["forced_differ_beyond_tie"] == 0 and result["prefill_argmax_agreement"] == 1.0
    phases = [line for line in capsys.readouterr().out.splitlines() if line.startswith("check 2 sequences:")]
    assert len(phases) == 3 and "plain path's 3 greedy steps" in phases[1]
