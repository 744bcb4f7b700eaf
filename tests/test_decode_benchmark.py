"""benchmarks/decode.py's chunked prefill: the chunks the engine would run give the whole prompt's logits."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from flint_engine.config import preset
from flint_engine.kv_cache import KVCache
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
