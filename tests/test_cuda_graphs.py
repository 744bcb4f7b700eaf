"""The decode-graph runner's bookkeeping (static buffers, buckets, padding rows, the per-step copies), checked on CPU.

CUDA graphs need a GPU, so the "graph" here (`tests/graph_replay.py`) reruns the reference model on whatever the
static buffers hold; what is tested is everything around the capture: copying each step into the buffers, bucket
choice, padding rows that must not write, block tables copied only when they change, and results identical to
eager decoding. On a GPU, the last test runs real graphs.
"""

from __future__ import annotations

import pytest
import torch
from flint_kernels.dispatch import select_kernels
from graph_replay import HostReplay

from flint_engine import cuda_graphs
from flint_engine.config import FULL, SLIDING, preset
from flint_engine.cuda_graphs import DecodeRows
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import random_weights


def test_graph_runner_decodes_like_eager() -> None:
    cfg = preset("tiny").replace(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
        num_hidden_layers=3, layer_types=(SLIDING, FULL, SLIDING), mlp_only_layers=(0,),
    )  # fmt: skip
    w = random_weights(cfg, torch.float32, seed=7)
    model = FlintModel(w)
    prompts = [list(range(3, 3 + n)) for n in (5, 11, 2)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ec = EngineConfig(kv_cache_memory=4 * 2**20, max_num_seqs=4, max_num_batched_tokens=32, cuda_graphs=False)
    eager = [r.output_token_ids for r in LLMEngine(model, None, ec).generate(prompts, params)]
    engine = LLMEngine(model, None, ec)
    graphs = HostReplay(model, engine.cache, max_batch=4, max_context=64)
    graphs.capture()
    assert graphs.batch_buckets == (1, 2, 4) and graphs.context_buckets == (64,)
    assert graphs.self_check() < 1e-6
    engine.runner.graphs = graphs
    used, table_copies = [], []
    original, copy_tables = graphs.run_rows, graphs._copy_tables
    graphs.run_rows = lambda rows, *a: used.append(len(rows.seq_lens)) or original(rows, *a)  # type: ignore[method-assign]
    graphs._copy_tables = lambda *a: table_copies.append(1) or copy_tables(*a)  # type: ignore[method-assign]
    replayed = [r.output_token_ids for r in engine.generate(prompts, params)]
    assert replayed == eager
    assert used and max(used) == 3  # three sequences decoded through the 4-row bucket with one padding row
    # The block tables go in when a sequence joins, leaves or grows a block, not every step.
    assert 0 < len(table_copies) < len(used)
    assert engine.kv.all_free()


def test_context_buckets() -> None:
    assert cuda_graphs.context_buckets(5000) == (1024, 4096, 5000)
    assert cuda_graphs.context_buckets(256) == (256,)
    got = [cuda_graphs.context_bucket(n, 5000) for n in (1, 1024, 1025, 4096, 4097, 5000)]
    assert got == [1024, 1024, 4096, 4096, 5000, 5000]
    assert cuda_graphs.batch_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert [cuda_graphs.batch_bucket(n, 20) for n in (1, 3, 9, 16, 17, 20)] == [1, 4, 16, 16, 20, 20]


def test_eager_decode_steps_carry_the_graphs_buckets() -> None:
    """`align_eager_decode` (the engine sets it where the fused path runs on a GPU): a decode-only step's attention
    metadata carries the context and batch a decode graph is captured for, so decode attention takes the graph's
    table entry and key splits (another split count rounds differently and can change a greedy token; the GPU test
    below; `test_decode_planned_for_a_graphs_batch_bucket_interp`); steps with a prompt chunk keep their own
    longest sequence and count, and without the setting every step does."""
    cfg = preset("tiny").replace(max_position_embeddings=256)
    model = FlintModel(random_weights(cfg, torch.float32, seed=3))
    prompts = [list(range(3, 3 + n)) for n in (5, 31, 12)]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    ec = EngineConfig(kv_cache_memory=8 * 2**20, max_num_seqs=4, max_model_len=256, cuda_graphs=False)

    def steps(align: bool) -> tuple[list[list[int]], list[tuple[bool, int, int]]]:
        engine = LLMEngine(model, None, ec)
        if align:
            engine.runner.align_eager_decode(engine.max_context, ec.max_num_seqs)
        seen: list[tuple[bool, int, int, int, int]] = []  # (decode only, longest, max_seq_len, sequences, plan)
        forward = model.forward

        def spy(batch, cache):  # type: ignore[no-untyped-def]
            a = batch.attn
            seen.append((a.max_query_len == 1, max(batch.seq_lens), a.max_seq_len, len(a.seq_lens), a.plan_seqs))
            return forward(batch, cache)

        model.forward = spy  # type: ignore[method-assign]
        try:
            out = [r.output_token_ids for r in engine.generate(prompts, params)]
        finally:
            del model.forward
        return out, seen

    plain, own = steps(False)
    aligned, seen = steps(True)
    assert aligned == plain  # the reference attention reads no split count: the same tokens
    assert all(m == longest and plan == 0 for _, longest, m, _, plan in own)
    assert any(s[0] for s in seen) and any(not s[0] for s in seen)
    assert all(m == (256 if d else longest) for d, longest, m, _, _ in seen), seen
    assert all(plan == (cuda_graphs.batch_bucket(n, 4) if d else 0) for d, _, _, n, plan in seen), seen
    assert any(s[0] and s[3] == 3 and s[4] == 4 for s in seen), seen  # 3 sequences planned as the 4-row graph


def test_a_grown_sequence_copies_only_its_new_table_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sequence's tables only grow at their end, so a new block costs a copy of the new entries, not of the whole
    row (a 32K-token row has 2048); a new sequence in the row copies it whole."""
    model = FlintModel(random_weights(preset("tiny"), torch.float32, seed=3))
    engine = LLMEngine(model, None, EngineConfig(kv_cache_memory=4 * 2**20, max_num_seqs=2, cuda_graphs=False))
    graphs = HostReplay(model, engine.cache, max_batch=1, max_context=64)
    graphs.capture()
    bs = engine.cache.block_size
    copied: list[list[int]] = []
    real_host_for = cuda_graphs.host_for
    monkeypatch.setattr(cuda_graphs, "host_for", lambda t, dev: copied.append(t.tolist()) or real_host_for(t, dev))

    def step(full: list[int], sliding: list[int], key: tuple[int, int]) -> None:
        pos = len(full) * bs - 1
        slot = lambda table: table[-1] * bs + bs - 1  # noqa: E731
        rows = DecodeRows([5], [pos], [slot(full)], [slot(sliding)], [pos + 1], [full], [sliding], (key,))
        graphs.run_rows(rows)

    step([3, 4], [5, 6], (7, 0))
    assert copied == [[3, 4], [5, 6]]
    step([3, 4, 9], [-1, 6, 10], (7, 1))  # one block more; the window passed block 0
    assert copied[2:] == [[9], [10]]
    tables = graphs.graphs[(1, 64)].batch
    assert tables.full_block_tables[0, :3].tolist() == [3, 4, 9]
    assert tables.sliding_block_tables[0, 1:3].tolist() == [6, 10]
    step([3, 4, 9], [-1, 6, 10], (7, 1))  # unchanged: nothing copied
    assert len(copied) == 4
    step([3, 4, 9], [-1, 6, 10], (8, 0))  # another sequence in the row: whole rows
    assert copied[4:] == [[3, 4, 9], [-1, 6, 10]]


def test_single_token_steps_with_a_prompt_chunk_go_through_the_graphs() -> None:
    """A step of one token per sequence is not always all decode: with a small budget a prompt's chunk can be one
    token that is not its last. Such steps run on the graphs too, and only the sampled rows' logits come back."""
    model = FlintModel(random_weights(preset("tiny"), torch.float32, seed=2))
    prompts = [[(7 * i + 3 * j) % 300 for j in range(n)] for i, n in enumerate((3, 9, 6, 12))]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    def run(graphs: bool) -> tuple[list[list[int]], list[tuple[int, int]]]:
        ec = EngineConfig(kv_cache_memory=8 * 2**20, max_num_seqs=4, max_num_batched_tokens=3, cuda_graphs=False)
        engine = LLMEngine(model, None, ec)
        shapes: list[tuple[int, int]] = []  # (chunks, sampled) of each step on the graphs
        if graphs:
            replay = HostReplay(model, engine.cache, max_batch=4, max_context=64)
            replay.capture()
            engine.runner.graphs = replay
            decode_rows = engine.runner.decode_rows

            def spy(chunks: list, ahead: int = 0) -> tuple | None:
                out = decode_rows(chunks, ahead)
                if out is not None:
                    shapes.append((len(chunks), len(out[1])))
                return out

            engine.runner.decode_rows = spy  # type: ignore[method-assign]
        return [r.output_token_ids for r in engine.generate(prompts, params)], shapes

    want, _ = run(False)
    got, shapes = run(True)
    assert got == want
    assert any(sampled < chunks for chunks, sampled in shapes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_decoding_equals_eager_on_the_gpu() -> None:
    """Real CUDA graphs fed by `run_rows` (two copies a step, the block tables only when they change) give the eager
    fused path's tokens, across block boundaries, sequences joining and leaving, and the sliding window moving; and
    so does `async_decode`, where each step's input tokens come from the step before on the device."""
    dev = torch.device("cuda")
    cfg = preset("tiny").replace(sliding_window=21, max_position_embeddings=512)
    w = random_weights(cfg, torch.bfloat16, dev, seed=11)
    model = FlintModel(w, select_kernels(dev, torch.bfloat16, torch.bfloat16, "fast"))
    prompts = [list(range(3, 3 + n)) for n in (5, 31, 2, 17)]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (60, 25, 47, 9)]

    def run(graphs: bool, async_decode: bool = False) -> list[list[int]]:
        ec = EngineConfig(
            device="cuda", kv_cache_memory=64 * 2**20, max_num_seqs=4, max_model_len=256, cuda_graphs=graphs,
            prefill_warmup=False, block_size=16, async_decode=async_decode,
        )  # fmt: skip
        engine = LLMEngine(model, None, ec)
        assert (engine.runner.graphs is not None) == graphs
        out = [r.output_token_ids for r in engine.generate(prompts, params)]
        assert engine.kv.all_free() and (engine.steps_ahead > 0) == async_decode
        return out

    eager = run(False)
    assert run(True) == eager
    assert run(True, async_decode=True) == eager  # each step launched before the last one's tokens are read


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_logprobs_read_with_the_tokens_on_the_gpu() -> None:
    """Logprobs drawn on the GPU beside the tokens (copied to pinned memory with them) read the same eager and with
    steps launched ahead on CUDA graphs, and agree with the tokens: a greedy token is its row's top logprob. A bias
    and min_tokens' ban applied there hold too."""
    dev = torch.device("cuda")
    cfg = preset("tiny").replace(sliding_window=21, max_position_embeddings=512)
    model = FlintModel(
        random_weights(cfg, torch.bfloat16, dev, seed=12), select_kernels(dev, torch.bfloat16, torch.bfloat16, "fast")
    )
    prompts = [list(range(3, 3 + n)) for n in (5, 31, 2, 9)]
    params = [
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=30, temperature=0.9, top_k=8, seed=4, ignore_eos=True, logprobs=0),
        SamplingParams(max_tokens=35, temperature=0.0, ignore_eos=True),
        # a bias and min_tokens' ban on the device: token 5 is banned for 10 tokens, then its bias wins and stops
        SamplingParams(max_tokens=30, temperature=0.0, logit_bias={5: 100.0}, min_tokens=10, stop_token_ids=[5]),
    ]

    def run(graphs: bool) -> list:
        ec = EngineConfig(
            device="cuda", kv_cache_memory=64 * 2**20, max_num_seqs=4, max_model_len=256, cuda_graphs=graphs,
            prefill_warmup=False, block_size=16, async_decode=graphs,
        )  # fmt: skip
        engine = LLMEngine(model, None, ec)
        reqs = engine.generate(prompts, params)
        assert engine.kv.all_free() and (engine.steps_ahead > 20) == graphs
        return [(r.output_token_ids, r.output_logprobs) for r in reqs]

    eager, ahead = run(False), run(True)
    for (ids, lps), (ids2, lps2), p in zip(eager, ahead, params):
        assert ids2 == ids and len(lps2) == len(lps) == (len(ids) if p.logprobs is not None else 0)
        for (lp, top), (lp2, top2) in zip(lps, lps2):
            assert lp2 == pytest.approx(lp, abs=1e-3) and lp < 0 and len(top2) == p.logprobs
            assert [t for t, _ in top2] == [t for t, _ in top]
        if p.logprobs:  # greedy: the token's logprob is its row's best (the ids may differ only at a tie)
            assert all(top[0][1] == lp for lp, top in lps)
    biased = eager[3][0]
    assert len(biased) == 11 and biased[-1] == 5 and 5 not in biased[:10]
