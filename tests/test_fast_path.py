"""The fused op table inside the whole model: on CPU, Triton's interpreter runs the kernels in float32, and the
model's logits must match the plain path op by op and all ops together."""

from __future__ import annotations

import pytest
import torch
from flint_kernels import fast
from flint_kernels.dispatch import REFERENCE, with_ops
from kernel_checks import norm_prologue_table

from flint_engine.config import FULL, SLIDING, preset
from flint_engine.forward_batch import ForwardBatch, fresh_sequences_batch
from flint_engine.kv_cache import KVCache
from flint_engine.model import FlintModel
from flint_engine.weights import as_float32, random_weights

# Three layers: a dense one and two MoE ones, sliding and full attention (the interpreter runs every op slowly).
CFG = preset("tiny").replace(
    hidden_size=128, num_attention_heads=8, num_key_value_heads=1, head_dim=32,
    num_hidden_layers=3, layer_types=(SLIDING, FULL, SLIDING), mlp_only_layers=(0,),
)  # fmt: skip
SEQS = [list(range(5, 30)), [3, 4, 5], list(range(100, 109))]


@pytest.fixture(scope="module")
def setup():
    w = random_weights(CFG, torch.float32, seed=3)
    return w, FlintModel(w).forward_sequences(SEQS), fast.fast_kernels(REFERENCE)


def test_logits_sequence_by_sequence_to_the_host_equal_the_batch_logits(setup) -> None:
    w, ref, _ = setup
    got = FlintModel(w).forward_sequences(SEQS, to_host=True)
    assert [t.device.type for t in got] == ["cpu"] * 3
    assert _rel(got, ref) < 1e-6  # (the lm_head's matmul over fewer rows may sum in another order)


def _rel(out: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(out, ref))


@pytest.mark.parametrize(
    "op", ["rms_norm", "add_rms_norm", "qk_norm_rope_write", "attention", "router", "silu_and_mul"]
)
def test_each_fused_op_in_the_model(setup, op: str) -> None:
    w, ref, fk = setup
    out = FlintModel(w, with_ops(REFERENCE, **{op: getattr(fk, op)})).forward_sequences(SEQS)
    assert _rel(out, ref) < 1e-5


def test_the_fast_router_is_prepared_once_per_moe_layer_when_the_model_is_built(setup) -> None:
    """Building a model with the fused table hands every MoE layer's FP32 router weight to the router op, which
    keeps its BF16 split (for the many-token kernel) as long as the weight lives."""
    from flint_kernels import router_triton

    w, _, fk = setup
    assert fk.prepare_router is router_triton.prepare
    routers = [layer.mlp.router for layer in w.layers if hasattr(layer.mlp, "router")]
    assert routers
    for r in routers:
        router_triton._splits.pop(id(r), None)
    FlintModel(w, fk)
    for r in routers:
        got = router_triton._split_of(r)
        assert got is not None and torch.equal(got, router_triton.split_weight(r))
    assert FlintModel(w).kernels.prepare_router is None  # the plain path keeps nothing


def test_attention_side_ops_together(setup) -> None:
    w, ref, fk = setup
    ops = {
        op: getattr(fk, op)
        for op in ("rms_norm", "add_rms_norm", "qk_norm_rope_write", "attention", "router", "silu_and_mul")
    }
    assert _rel(FlintModel(w, with_ops(REFERENCE, **ops)).forward_sequences(SEQS), ref) < 1e-5


@pytest.mark.parametrize("nvfp4", [False, True])
def test_every_fused_op_together(nvfp4: bool) -> None:
    """All nine ops fused at once (MoE, GEMV and lm_head included), dense and NVFP4 (W4A16) weights."""
    seqs = [list(range(5, 16)), [3, 4, 5]]  # short: the interpreter runs the GEMV/MoE kernels slowly
    w = random_weights(CFG, torch.float32, seed=5, nvfp4_linears=nvfp4)
    ref = FlintModel(w).forward_sequences(seqs)
    # (Each op alone against its reference: the tests above and tests/test_kernels_*.py.)
    assert _rel(FlintModel(w, fast.fast_kernels(REFERENCE)).forward_sequences(seqs), ref) < 1e-5


def test_a_failing_kernel_falls_back_to_its_reference(caplog) -> None:
    calls = {"fast": 0, "ref": 0}

    def broken(*a):
        calls["fast"] += 1
        raise RuntimeError("PassManager::run failed")

    def ref(*a):
        calls["ref"] += 1
        return sum(a)

    g = fast._guarded("linear", broken, ref)
    assert g(1, 2) == 3 and g(3, 4) == 7
    assert calls == {"fast": 1, "ref": 2}  # tried once, then the reference for good
    assert "using the PyTorch reference" in caplog.text


def test_fast_ops_env_selects_ops(monkeypatch) -> None:
    monkeypatch.setenv("FLINT_FAST_OPS", "attention,rms_norm")
    k = fast.fast_kernels(REFERENCE)
    assert k.attention is not REFERENCE.attention and k.rms_norm is not REFERENCE.rms_norm
    assert k.moe is REFERENCE.moe and k.linear is REFERENCE.linear
    monkeypatch.setenv("FLINT_FAST_OPS", "attention,atention")
    with pytest.raises(ValueError, match="unknown fused ops \\['atention'\\]"):
        fast.fast_kernels(REFERENCE)
    only = fast.fast_kernels(REFERENCE, ("moe",))  # an explicit list wins over the variable
    assert only.moe is not REFERENCE.moe and only.attention is REFERENCE.attention
    monkeypatch.delenv("FLINT_FAST_OPS")
    default = fast.fast_kernels(REFERENCE)  # the experimental ops are off by default
    assert default.linear_add_rms_norm is None and default.moe_add_rms_norm is None and default.qkv_attention is None
    assert default.add_rms_norm_router is not None
    monkeypatch.setenv("FLINT_FAST_OPS", "all,linear_add_rms_norm")
    k = fast.fast_kernels(REFERENCE)
    assert k.linear_add_rms_norm is not None and k.moe is not REFERENCE.moe
    monkeypatch.setenv("FLINT_FAST_OPS", "all,-add_rms_norm_router,-moe")  # "-op" drops one (A/B runs)
    k = fast.fast_kernels(REFERENCE)
    assert k.add_rms_norm_router is None and k.moe is REFERENCE.moe and k.attention is not REFERENCE.attention
    assert k.qkv_attention is None  # experimental: off unless named
    assert fast.parse_ops("moe,-moe,router") == ("router",)
    with pytest.raises(ValueError, match="unknown fused op 'qkv_atention'"):
        fast.parse_ops("all,-qkv_atention")


@pytest.mark.parametrize(
    ("nvfp4", "seqs"), [(True, [[11]]), (False, [[11], [12], [13]])], ids=["one-token-nvfp4", "three-tokens-dense"]
)
def test_norm_epilogues_in_the_model(nvfp4: bool, seqs: list[list[int]]) -> None:
    """Every op fused plus the experimental ones that end in the residual add and the next norm: the o projection
    and dense down (one token, M == 1) and the MoE's down launch (decode-sized batches)."""
    w = random_weights(CFG, torch.float32, seed=7, nvfp4_linears=nvfp4)
    ref = FlintModel(w).forward_sequences(seqs)
    ops = (*fast.OPS, *fast.EXPERIMENTAL_OPS)
    assert _rel(FlintModel(w, fast.fast_kernels(REFERENCE, ops)).forward_sequences(seqs), ref) < 1e-5


@pytest.mark.parametrize("nvfp4", [False, True])
def test_float32_copy_evaluates_the_same_weights_without_bf16_rounding(nvfp4: bool) -> None:
    """`as_float32` (the yardstick of benchmarks/fast_path_accuracy.py): exact upcasts, NVFP4 codes shared, and the
    BF16 model's logits within BF16 rounding of the FP32 evaluation."""
    w = random_weights(CFG, torch.bfloat16, seed=7, nvfp4_linears=nvfp4)
    w32 = as_float32(w)
    assert w32.dtype == torch.float32 and w.dtype == torch.bfloat16  # the original is untouched
    qkv, qkv32 = w.layers[0].qkv, w32.layers[0].qkv
    if nvfp4:
        assert qkv32 is qkv
    else:
        assert qkv32.dtype == torch.float32 and torch.equal(qkv32, qkv.float())
    gold = FlintModel(w32).forward_sequences(SEQS)
    assert all(g.dtype == torch.float32 for g in gold)
    assert 1e-5 < _rel(FlintModel(w).forward_sequences(SEQS), gold) < 6e-2  # BF16 rounding through 3 layers


@pytest.mark.parametrize(
    "op", ["qkv_attention", "add_rms_norm_router", "add_rms_norm_linear", "qkv_attention,add_rms_norm_linear"]
)
def test_decode_step_with_a_one_launch_op(op: str) -> None:
    """A decode batch of three tokens through the model with one of the ops that do two ops' work in one launch at
    decode (`qkv_attention`: Q/K norm, RoPE, the cache write and attention; `add_rms_norm_router`: the residual add,
    the post-attention norm and the router; `add_rms_norm_linear`: the residual add and the input norm inside the
    qkv projection, one launch at one token, composed here at three): the same hidden states as the plain path, and
    the same keys and values in the cache. The newest tokens' slots start as NaN, so a key or value not written
    would show. The last case composes two of them, as `FLINT_FAST_OPS=all,qkv_attention,add_rms_norm_linear` does."""
    w = random_weights(CFG, torch.float32, seed=9)
    seqs = [list(range(5, 30)), [3, 4, 5], list(range(100, 117))]
    prefill, nblocks = fresh_sequences_batch(seqs, 16)
    last = [b - 1 for b in prefill.query_start[1:]]
    decode = ForwardBatch(
        input_ids=prefill.input_ids[last],
        positions=prefill.positions[last],
        query_start=list(range(len(seqs) + 1)),
        seq_lens=prefill.seq_lens,
        full_block_tables=prefill.full_block_tables,
        sliding_block_tables=prefill.sliding_block_tables,
        full_slots=prefill.full_slots[last],
        sliding_slots=prefill.sliding_slots[last],
        logits_indices=torch.arange(len(seqs)),
    )
    outs, caches = [], []
    fused = fast.fast_kernels(REFERENCE)
    for kernels in (REFERENCE, with_ops(REFERENCE, **{o: getattr(fused, o) for o in op.split(",")})):
        cache = KVCache(CFG, nblocks, nblocks, 16, torch.float32, "cpu")
        FlintModel(w).forward(prefill, cache)  # every position's K/V, by the plain path
        for i in range(len(CFG.layer_types)):
            k_cache, v_cache, _ = cache.layer(i)
            for c in (k_cache, v_cache):
                c.view(-1, *c.shape[2:])[decode.full_slots] = float("nan")
        outs.append(FlintModel(w, kernels).forward(decode, cache))
        caches.append(cache)
    assert ((outs[1] - outs[0]).norm() / outs[0].norm()).item() < 1e-5
    for i in range(len(CFG.layer_types)):
        (k0, v0, _), (k1, v1, _) = caches[0].layer(i), caches[1].layer(i)
        assert not k1.isnan().any() and not v1.isnan().any()
        # Layer 0's V is a copy of the same projection; later layers' inputs differ by the kernels' FP32 rounding.
        assert torch.allclose(k1, k0, rtol=1e-5, atol=1e-5) and torch.allclose(v1, v0, rtol=1e-5, atol=1e-5)
        if i == 0:
            assert torch.equal(v1, v0)


@pytest.mark.parametrize(("nvfp4", "split_layer"), [(False, None), (True, None), (False, 2)])
def test_one_token_decode_with_the_norm_inside_the_qkv_projection(
    nvfp4: bool, split_layer: int | None, monkeypatch, tmp_path
) -> None:
    """`add_rms_norm_linear` at one token (its one-launch path, turned on by a table) through the model, every layer
    after the first: the plain path's hidden state, dense and NVFP4 weights; also with one layer's qkv stored as
    separate parts (a mixed-format checkpoint), whose input norm then runs as its own op again."""
    norm_prologue_table(monkeypatch, tmp_path)
    w = random_weights(CFG, torch.float32, seed=11, nvfp4_linears=nvfp4)
    if split_layer is not None:
        qkv = w.layers[split_layer].qkv
        w.layers[split_layer].qkv = (qkv[:100].clone(), qkv[100:].clone())
    seq = list(range(40, 60))
    prefill, nblocks = fresh_sequences_batch([seq], 16)
    decode = ForwardBatch(
        input_ids=prefill.input_ids[-1:],
        positions=prefill.positions[-1:],
        query_start=[0, 1],
        seq_lens=prefill.seq_lens,
        full_block_tables=prefill.full_block_tables,
        sliding_block_tables=prefill.sliding_block_tables,
        full_slots=prefill.full_slots[-1:],
        sliding_slots=prefill.sliding_slots[-1:],
        logits_indices=torch.arange(1),
    )
    fused = with_ops(
        REFERENCE, add_rms_norm_linear=fast.fast_kernels(REFERENCE, ("add_rms_norm_linear",)).add_rms_norm_linear
    )
    outs = []
    for kernels in (REFERENCE, fused):
        cache = KVCache(CFG, nblocks, nblocks, 16, torch.float32, "cpu")
        FlintModel(w).forward(prefill, cache)
        outs.append(FlintModel(w, kernels).forward(decode, cache))
    assert ((outs[1] - outs[0]).norm() / outs[0].norm()).item() < 1e-5
