"""Prompt log-probabilities on the GPU's fused path (its lm_head kernels over 256-row passes, BF16 and NVFP4) against
the plain PyTorch path on the same weights. No API imports: the device's image runs this file alone."""

from __future__ import annotations

import pytest
import torch
from flint_kernels.dispatch import REFERENCE, select_kernels

from flint_engine.config import preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import as_float32, random_weights


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("nvfp4", [False, True])
def test_prompt_logprobs_fused_as_close_to_fp32_as_plain_on_the_gpu(nvfp4: bool) -> None:
    """A 300-token prompt (two lm_head passes, one of them across a 128-token chunk edge) with the top 3, through
    the fused path, the plain path and an FP32 evaluation of the same weights (the yardstick of
    benchmarks/fast_path_accuracy.py, since the two BF16 paths round differently): the fused path's logprobs are as
    close to FP32's as the plain path's (within twice its largest difference, plus 0.02), position by position."""
    dev = torch.device("cuda")
    cfg = preset("tiny").replace(max_position_embeddings=1024)
    w = random_weights(cfg, torch.bfloat16, dev, seed=3, nvfp4_linears=nvfp4)
    prompt = [(13 * i + 5) % cfg.vocab_size for i in range(300)]
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    models = {
        "fused": FlintModel(w, select_kernels(dev, torch.bfloat16, torch.bfloat16, "fast")),
        "plain": FlintModel(w, REFERENCE),
        "fp32": FlintModel(as_float32(w), REFERENCE),
    }
    got = {}
    for name, model in models.items():
        ec = EngineConfig(kv_cache_memory=64 * 2**20, max_num_batched_tokens=128, cuda_graphs=False)
        [req] = LLMEngine(model, None, ec).generate([prompt], params)
        got[name] = req.prompt_logprobs
    for name in ("fused", "plain"):
        assert got[name][0] is None and len(got[name]) == len(prompt)
        assert [e[0] for e in got[name][1:]] == prompt[1:]

    def worst(name: str) -> float:
        return max(abs(a[1] - b[1]) for a, b in zip(got[name][1:], got["fp32"][1:]))

    fused, plain = worst("fused"), worst("plain")
    print(f"largest logprob difference from FP32: fused {fused:.4f}, plain {plain:.4f}")
    assert fused <= 2 * plain + 0.02
