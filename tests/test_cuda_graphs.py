"""The decode-graph runner's bookkeeping (static buffers, buckets, padding rows), checked on CPU.

CUDA graphs need a GPU, so the "graph" here replays the same model call on the same static buffers; what is tested
is everything around the capture: copying each step into the buffers, bucket choice, padding rows that must not
write, and results identical to eager decoding. The fused kernels run in Triton's interpreter (float32), because
the reference attention reads host-side lengths that a replayed graph cannot update.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from flint_kernels import fast
from flint_kernels.dispatch import REFERENCE

from flint_engine.config import preset
from flint_engine.cuda_graphs import DecodeGraphs, _Graph
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import random_weights


class ReplayOnCPU(DecodeGraphs):
    """Capture = remember the call on the static batch; replay = run it again on whatever the buffers hold."""

    def capture(self) -> None:
        for ctx in self.context_buckets:
            for b in self.batch_buckets:
                batch = self._static_batch(b, ctx)
                logits = self.model.compute_logits(self.model.forward(batch, self.cache))

                def replay(batch=batch, out=logits) -> None:
                    out.copy_(self.model.compute_logits(self.model.forward(batch, self.cache)))

                self.graphs[(b, ctx)] = _Graph(SimpleNamespace(replay=replay), batch, logits)  # type: ignore[arg-type]


def test_graph_runner_decodes_like_eager() -> None:
    cfg = preset("tiny").replace(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256
    )
    w = random_weights(cfg, torch.float32, seed=7)
    model = FlintModel(w, fast.fast_kernels(REFERENCE))
    prompts = [list(range(3, 3 + n)) for n in (5, 11, 2)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ec = EngineConfig(kv_cache_memory=4 * 2**20, max_num_seqs=4, max_num_batched_tokens=32, cuda_graphs=False)
    eager = [r.output_token_ids for r in LLMEngine(model, None, ec).generate(prompts, params)]
    engine = LLMEngine(model, None, ec)
    graphs = ReplayOnCPU(model, engine.cache, max_batch=4, max_context=64)
    graphs.capture()
    assert graphs.batch_buckets == (1, 2, 4) and graphs.context_buckets == (64,)
    assert graphs.self_check() < 1e-6
    engine.runner.graphs = graphs
    used = []
    original = graphs.run
    graphs.run = lambda batch: used.append(batch.num_seqs) or original(batch)  # type: ignore[method-assign]
    replayed = [r.output_token_ids for r in engine.generate(prompts, params)]
    assert replayed == eager
    assert used and max(used) == 3  # three sequences decoded through the 4-row bucket with one padding row
    assert engine.kv.all_free()
