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
from flint_engine.weights import random_weights


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("nvfp4", [False, True])
def test_prompt_logprobs_fused_equal_plain_on_the_gpu(nvfp4: bool) -> None:
    """A 300-token prompt (two lm_head passes, one of them across a 128-token chunk edge) with the top 3: the same
    tokens' logprobs within BF16 rounding of the logits (0.05), the first None, the top-1 the same where it leads
    clearly."""
    dev = torch.device("cuda")
    cfg = preset("tiny").replace(max_position_embeddings=1024)
    w = random_weights(cfg, torch.bfloat16, dev, seed=3, nvfp4_linears=nvfp4)
    prompt = [(13 * i + 5) % cfg.vocab_size for i in range(300)]
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    got = {}
    for name, kernels in (("fused", select_kernels(dev, torch.bfloat16, torch.bfloat16, "fast")), ("plain", REFERENCE)):
        ec = EngineConfig(kv_cache_memory=64 * 2**20, max_num_batched_tokens=128, cuda_graphs=False)
        [req] = LLMEngine(FlintModel(w, kernels), None, ec).generate([prompt], params)
        got[name] = req.prompt_logprobs
    fused, plain = got["fused"], got["plain"]
    assert fused[0] is None and plain[0] is None and len(fused) == len(plain) == len(prompt)
    for f, p in zip(fused[1:], plain[1:]):
        assert f[0] == p[0] and abs(f[1] - p[1]) < 0.05
        if p[2][0][1] - p[2][1][1] > 0.2:
            assert f[2][0][0] == p[2][0][0]
