"""Prefill and mixed steps in pieces around attention (`flint_engine.step_graphs`), checked on CPU.

CUDA graphs need a GPU, so here each "captured" piece is the function it was made from, rerun on whatever the
bucket's static buffers hold, as a replay would: what is tested is the split of the forward into pieces, the static
buffers each piece reads and writes, bucket choice, padding rows that must not write, and results equal to the eager
forward. On a GPU, the last test captures real graphs.
"""

from __future__ import annotations

import pytest
import torch
from flint_kernels.dispatch import REFERENCE, select_kernels, with_ops

from flint_engine.config import FULL, SLIDING, preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.forward_batch import ForwardBatch
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams
from flint_engine.step_graphs import StepGraphs
from flint_engine.weights import random_weights

CFG = preset("tiny").replace(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
    num_hidden_layers=3, layer_types=(SLIDING, FULL, SLIDING), mlp_only_layers=(0,), sliding_window=7,
)  # fmt: skip


class HostPieces(StepGraphs):
    """Pieces "captured" as themselves: a replay reruns the piece's ops on the static buffers."""

    def _capture_piece(self, fn):
        self.captured = getattr(self, "captured", 0) + 1
        return fn


def _engine(model: FlintModel, **kw) -> LLMEngine:
    ec = EngineConfig(kv_cache_memory=4 * 2**20, max_num_seqs=4, max_num_batched_tokens=32, cuda_graphs=False, **kw)
    return LLMEngine(model, None, ec)


def _mixed_batch(engine: LLMEngine, prompts: list[list[int]]) -> ForwardBatch:
    """One step that prefills each prompt from scratch into blocks the cache manager hands out."""
    from flint_engine.request import Request
    from flint_engine.scheduler import ScheduledChunk

    chunks = []
    for i, p in enumerate(prompts):
        req = Request(f"r{i}", p, SamplingParams(max_tokens=1), 0, frozenset())
        engine.kv.allocate(req.request_id, 0, len(p))
        chunks.append(ScheduledChunk(req, len(p)))
    return engine.runner.build_batch(chunks)[0]


def test_pieces_give_the_eager_forward_and_write_the_same_cache() -> None:
    model = FlintModel(random_weights(CFG, torch.float32, seed=5))
    prompts = [list(range(3, 3 + n)) for n in (9, 2, 13)]  # 24 tokens: the 32-token bucket, 8 padding rows
    eager_engine, piece_engine = _engine(model), _engine(model)
    want = model.forward(_mixed_batch(eager_engine, prompts), eager_engine.cache)
    graphs = HostPieces(model, piece_engine.cache, max_tokens=32)
    graphs.capture()
    assert graphs.buckets == (16, 32) and graphs.captured == 2 * (CFG.num_hidden_layers + 1)
    batch = _mixed_batch(piece_engine, prompts)
    assert graphs.covers(batch) and not graphs.covers(_mixed_batch(_engine(model), [list(range(33))]))
    got = graphs.run(batch)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The same K/V in both caches, and the padding rows wrote nowhere (scratch block 0 aside, nothing else moved).
    caches = [(c.full_k, c.full_v, c.sliding_k, c.sliding_v) for c in (eager_engine.cache, piece_engine.cache)]
    for a, b in zip(*caches):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert graphs.self_check() < 1e-5


def test_engine_on_step_graphs_generates_like_eager() -> None:
    model = FlintModel(random_weights(CFG, torch.float32, seed=7))
    prompts = [list(range(3, 3 + n)) for n in (5, 20, 2, 40)]  # the 40-token prompt runs in two chunks
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    # A second round shares the first prompts' cached blocks: its chunks start after a cached prefix.
    again = [[*p, 7, 8, 9] for p in prompts]
    eager_engine = _engine(model)
    eager = [r.output_token_ids for r in eager_engine.generate(prompts, params)]
    eager_again = [r.output_token_ids for r in eager_engine.generate(again, params)]
    engine = _engine(model)
    graphs = HostPieces(model, engine.cache, max_tokens=16)
    graphs.capture()
    engine.runner.step_graphs = graphs
    ran: list[int] = []
    original = graphs.run
    graphs.run = lambda batch: ran.append(batch.num_tokens) or original(batch)  # type: ignore[method-assign]
    assert [r.output_token_ids for r in engine.generate(prompts, params)] == eager
    assert [r.output_token_ids for r in engine.generate(again, params)] == eager_again
    assert engine.metrics.snapshot()["prefix_cache_hits_total"] > 0
    # Steps of up to 16 tokens went through the pieces (decode steps too: no decode graphs here); longer ones did not.
    assert ran and max(ran) <= 16
    assert engine.kv.all_free()


def test_step_graphs_need_attention_as_its_own_op() -> None:
    model = FlintModel(random_weights(CFG, torch.float32, seed=1), with_ops(REFERENCE, qkv_attention=lambda *a: None))
    with pytest.raises(ValueError, match="attention as an op of its own"):
        StepGraphs(model, _engine(FlintModel(random_weights(CFG, torch.float32, seed=1))).cache)


def test_step_graphs_setting_reaches_the_engine() -> None:
    from flint_serve.settings import ServeSettings

    assert EngineConfig().step_graphs and ServeSettings().engine_config(False).step_graphs
    assert not ServeSettings(step_graphs=False).engine_config(True).step_graphs
    engine = _engine(FlintModel(random_weights(CFG, torch.float32, seed=1)), step_graphs=True)
    assert engine.runner.step_graphs is None  # CPU: no graphs, every step eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_step_graphs_replay_like_eager() -> None:
    """Real CUDA graphs on the fused kernels: a mixed step (two prompts and two decode rows) through the pieces
    against the eager forward, and the engine's greedy tokens with and without them."""
    cfg = CFG.replace(hidden_size=256, num_attention_heads=8, head_dim=32, max_position_embeddings=512)
    dev = torch.device("cuda")
    model = FlintModel(
        random_weights(cfg, torch.bfloat16, dev, seed=3), select_kernels(dev, torch.bfloat16, torch.bfloat16)
    )

    def engine(step_graphs: bool) -> LLMEngine:
        ec = EngineConfig(
            device="cuda", kv_cache_memory=64 * 2**20, max_num_seqs=4, max_num_batched_tokens=64,
            step_graphs=step_graphs, precompile_kernels=False,
        )  # fmt: skip
        return LLMEngine(model, None, ec)

    on, off = engine(True), engine(False)
    assert on.runner.step_graphs is not None and off.runner.step_graphs is None
    prompts = [[(7 * i + j) % cfg.vocab_size for j in range(n)] for i, n in enumerate((37, 3, 90, 12))]
    want = model.forward(_mixed_batch(off, prompts[:2]), off.cache).float()
    got = on.runner.step_graphs.run(_mixed_batch(on, prompts[:2])).float()
    assert (got - want).norm() / want.norm() < 2e-2
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    fresh_on, fresh_off = engine(True), engine(False)
    a = [r.output_token_ids for r in fresh_on.generate(prompts, params)]
    b = [r.output_token_ids for r in fresh_off.generate(prompts, params)]
    agree = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / sum(len(r) for r in a)
    assert agree >= 0.9  # BF16 near-ties may part a sequence; a broken replay agrees on almost nothing


def test_graphs_that_fail_or_differ_are_not_used(caplog: pytest.LogCaptureFixture) -> None:
    """The runner keeps captured graphs only when the capture works and replays like the eager forward."""
    from flint_engine.model_runner import _checked

    class Fake:
        def __init__(self, error: float, fails: bool = False) -> None:
            self.error, self.fails = error, fails

        def capture(self) -> None:
            if self.fails:
                raise RuntimeError("operation not permitted when stream is capturing")

        def self_check(self) -> float:
            return self.error

    good = Fake(1e-4)
    assert _checked(lambda: good, 1e-3, "decode graphs", "decoding without graphs") is good
    assert _checked(lambda: Fake(0.5), 1e-3, "decode graphs", "decoding without graphs") is None
    assert _checked(lambda: Fake(0.0, fails=True), 1e-3, "step graphs", "steps run eagerly") is None
    assert "differ from the eager forward" in caplog.text and "capture failed; steps run eagerly" in caplog.text
