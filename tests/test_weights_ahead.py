"""The next layer's weights asked into L2 on a side stream of the decode graphs (op `l2_ahead`, experimental)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flint_kernels import l2_prefetch, tuning
from flint_kernels.configs import WeightsAheadConfig
from flint_kernels.dispatch import select_kernels, with_ops
from flint_kernels.linear import NVFP4Weight

from flint_engine.config import preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import MoEWeights, random_weights
from flint_engine.weights_ahead import CHUNKS, PARTS, WeightsAhead, layer_tensors

CPU = torch.device("cpu")


def _lines(t: torch.Tensor) -> list[int]:
    first = t.data_ptr() // 128
    return list(range(first, (t.data_ptr() + t.numel() * t.element_size() - 1) // 128 + 1))


def test_chunk_table_lists_each_tensors_lines_once_in_short_chunks() -> None:
    tensors = [torch.randn(10000)[3:1003], torch.randn(7, 33, dtype=torch.bfloat16), torch.ones(1, dtype=torch.uint8)]
    table = l2_prefetch.chunk_table([*tensors, torch.randn(0)], CPU, lines=4)
    assert table.dtype == torch.int64 and table.shape[1] == 2
    assert bool((table[:, 0] % 128 == 0).all()) and bool(((table[:, 1] >= 1) & (table[:, 1] <= 4)).all())
    got = [first // 128 + i for first, n in table.tolist() for i in range(n)]
    assert got == [line for t in tensors for line in _lines(t)]  # in order, the empty tensor adds nothing
    with pytest.raises(ValueError, match="strided"):
        l2_prefetch.chunk_table([torch.randn(4, 4).t()], CPU)


@pytest.mark.parametrize("nvfp4", [False, True])
def test_layer_tensors_are_the_static_weights_and_never_the_routed_experts(nvfp4: bool) -> None:
    w = random_weights(preset("tiny"), torch.bfloat16, seed=3, nvfp4_linears=nvfp4)
    moe_layers = 0
    for lw in w.layers:
        parts = {p: {t.data_ptr() for t in layer_tensors(lw, p)} for p in PARTS}
        qkv = [lw.qkv.qweight, lw.qkv.scales, lw.qkv.global_scale] if isinstance(lw.qkv, NVFP4Weight) else [lw.qkv]
        assert parts["qkv"] == {
            t.data_ptr() for t in [*qkv, lw.input_norm, lw.post_norm, lw.q_norm, lw.k_norm, lw.sinks]
        }
        o = [lw.o.qweight, lw.o.scales, lw.o.global_scale] if isinstance(lw.o, NVFP4Weight) else [lw.o]
        assert parts["o"] == {t.data_ptr() for t in o}
        if isinstance(lw.mlp, MoEWeights):
            moe_layers += 1
            assert lw.mlp.router.data_ptr() in parts["mlp"] and len(parts["mlp"]) > 1  # and the shared expert
            experts = [lw.mlp.experts_gate_up, lw.mlp.experts_down]
            stored = [p for e in experts for p in ((e.qweight, e.scales) if isinstance(e, NVFP4Weight) else (e,))]
            assert not {p.data_ptr() for p in stored} & set().union(*parts.values())
    assert moe_layers > 0
    with pytest.raises(ValueError, match="unknown part 'experts'"):
        layer_tensors(w.layers[0], "experts")


def test_each_layers_slice_of_the_shared_tables_is_its_own_chunk_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """One table per set of parts and chunk size holds every layer's chunks; a fork's slice is that layer's alone
    (built here on the CPU, with a stand-in for the side stream)."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: None)
    w = random_weights(preset("tiny"), torch.bfloat16, seed=3, nvfp4_linears=True)
    ahead = WeightsAhead(w, l2_prefetch.no_prefetch)
    for parts in (("qkv",), ("qkv", "o"), ("o", "mlp")):
        for lines in CHUNKS:
            for i, lw in enumerate(w.layers):
                want = l2_prefetch.chunk_table([t for p in parts for t in layer_tensors(lw, p)], CPU, lines)
                assert torch.equal(ahead._layer_table(frozenset(parts), lines, i), want)
    bytes_qkv = ahead.layer_bytes("qkv")
    assert len(bytes_qkv) == len(w.layers) and all(b > 0 for b in bytes_qkv)
    assert WeightsAheadConfig(next_qkv=True, own_o=True, chunk_lines=1024).parts == ("next_qkv", "own_o")


def test_a_cpu_model_has_no_side_stream() -> None:
    w = random_weights(preset("tiny"), torch.float32, seed=3)
    kernels = with_ops(select_kernels(CPU, torch.float32, torch.float32), l2_ahead=l2_prefetch.no_prefetch)
    assert FlintModel(w, kernels).weights_ahead is None


def test_the_shipped_tables_ask_only_for_single_tokens_of_nvfp4_weights() -> None:
    """What the H200 table turns on is what its A/B measured faster: NVFP4 at batch 1 (BF16 and batches 2-8 lost)."""
    table = tuning.load(tuning.TABLES / "nvidia-h200.json")
    on = [e for e in table.ops["weights_ahead"] if any(e.config.values())]
    assert on and all(("nvfp4", "eq", True) in e.when and ("tokens", "max", 1) in e.when for e in on)
    assert not WeightsAheadConfig().parts_on  # off without an entry


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "config",
    [
        {"next_qkv": True, "next_o": True},
        {"next_qkv": True, "own_o": True, "own_mlp": True, "next_mlp": True, "chunk_lines": 4096},
    ],
    ids=["next", "own"],
)
def test_graphs_with_weights_ahead_decode_the_same_tokens(
    config: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Decode graphs captured with the side stream's prefetches (a launch a fork during capture, at every batch
    size here) give the same greedy tokens as graphs without them, and as eager steps."""
    table = tmp_path / "ahead.json"
    table.write_text(json.dumps({"weights_ahead": [{"config": config, "source": "test: every batch size"}]}))
    monkeypatch.setenv(tuning.ENV, str(table))
    dev = torch.device("cuda")
    cfg = preset("tiny").replace(sliding_window=21, max_position_embeddings=512)
    w = random_weights(cfg, torch.bfloat16, dev, seed=11, nvfp4_linears=True)
    fast = select_kernels(dev, torch.bfloat16, torch.bfloat16, "fast")
    forks: list[int] = []

    def launch(chunks: torch.Tensor) -> None:
        forks.append(chunks.shape[0])
        l2_prefetch.prefetch_chunks(chunks)

    prompts = [list(range(3, 3 + n)) for n in (5, 31, 2)]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (40, 25, 33)]

    def run(model: FlintModel, graphs: bool) -> list[list[int]]:
        ec = EngineConfig(
            device="cuda", kv_cache_memory=64 * 2**20, max_num_seqs=4, max_model_len=256, cuda_graphs=graphs,
            prefill_warmup=False, block_size=16,
        )  # fmt: skip
        return [r.output_token_ids for r in LLMEngine(model, None, ec).generate(prompts, params)]

    ahead = FlintModel(w, with_ops(fast, l2_ahead=launch))
    assert ahead.weights_ahead is not None and all(b > 0 for b in ahead.weights_ahead.layer_bytes("qkv", "o"))
    eager = run(ahead, False)
    assert not forks  # eager steps never fork
    assert run(ahead, True) == eager
    assert forks and all(n > 0 for n in forks)  # the captures forked
    layers = len(w.layers)
    # Launches: the next layer's parts before each MLP but the last, and each layer's own at its q|k|v.
    own = ("own_o" in config or "own_mlp" in config) * layers
    assert ahead.weights_ahead.last_forks == layers - 1 + own
