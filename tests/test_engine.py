"""The engine: continuous batching, chunked prefill, hybrid KV cache, prefix caching, preemption, sampling."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from flint_engine.checkpoint import load_checkpoint
from flint_engine.checkpoint.gguf_writer import write_gguf
from flint_engine.checkpoint.random_tensors import random_provider
from flint_engine.config import FULL, SLIDING, FlintConfig, preset
from flint_engine.engine import EngineOverloaded, EngineRequestError, LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.kv_cache_plan import plan_kv_cache
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams, SamplingParamsError
from flint_engine.tokenizer import build_default_tokenizer

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _checkpoint(tmp: Path, cfg: FlintConfig, seed: int) -> Path:
    tok = build_default_tokenizer(cfg.vocab_size)
    cfg = cfg.replace(
        bos_token_id=tok.bos_token_id, eos_token_id=tuple(tok.eos_token_ids), pad_token_id=tok.pad_token_id
    )
    path = tmp / f"m{seed}.gguf"
    write_gguf(path, cfg, random_provider(cfg, seed), fmt="bf16", tokenizer=tok, progress=False)
    return path


@pytest.fixture(scope="module")
def window7(tmp_path_factory: pytest.TempPathFactory):
    ck = load_checkpoint(_checkpoint(tmp_path_factory.mktemp("w7"), preset("tiny"), 1), torch.float32, progress=False)
    return ck


@pytest.fixture(scope="module")
def window513(tmp_path_factory: pytest.TempPathFactory):
    cfg = preset("tiny").replace(
        num_hidden_layers=3, layer_types=(FULL, SLIDING, SLIDING), mlp_only_layers=(0,), sliding_window=513
    )
    return load_checkpoint(_checkpoint(tmp_path_factory.mktemp("w513"), cfg, 2), torch.float32, progress=False)


def make_engine(ck, full_blocks: int | None = None, **kw) -> LLMEngine:
    """An engine on the checkpoint; `full_blocks` shrinks the full-attention pool to force memory pressure."""
    ec = EngineConfig(**{"kv_cache_memory": 32 * 2**20, "max_num_batched_tokens": 64, **kw})
    plan = plan_kv_cache(ck.config, ec.kv_cache_memory, ec.block_size, ec.max_num_seqs, ec.prefill_tokens(False))
    if full_blocks is not None:
        plan = dataclasses.replace(plan, num_full_blocks=full_blocks)
    return LLMEngine(FlintModel(ck.weights), ck.tokenizer, ec, ck.generation_defaults, kv_plan=plan)


def reference_greedy(model: FlintModel, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model.forward_sequences([seq])[0][-1].argmax()))
    return seq[len(prompt) :]


def run_staggered(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], join_at: list[int]):
    """Add request i at engine step join_at[i]; run to completion."""
    reqs: dict[int, object] = {}
    step = 0
    while len(reqs) < len(prompts) or engine.has_unfinished():
        for i, at in enumerate(join_at):
            if at == step and i not in reqs:
                reqs[i] = engine.add_request(f"r{i}", prompts[i], params[i])
        engine.step()
        step += 1
    return [reqs[i] for i in range(len(prompts))]


@pytest.mark.parametrize("chunk", [5, 64, 512])
def test_concurrent_greedy_equals_alone_and_full_forward(window513, chunk: int) -> None:
    ck = window513
    gen = random.Random(chunk)
    lens = [1, 9, 40, 515, 600]  # two cross the 513-key window
    prompts = [[gen.randrange(ck.config.vocab_size) for _ in range(n)] for n in lens]
    n_out = [6, 3, 12, 8, 5]
    params = [SamplingParams(max_tokens=m, **GREEDY) for m in n_out]
    engine = make_engine(ck, max_num_batched_tokens=chunk)
    together = run_staggered(engine, prompts, params, join_at=[0, 3, 1, 0, 7])
    model = engine.model
    for p, m, r in zip(prompts, n_out, together):
        alone = make_engine(ck, max_num_batched_tokens=chunk).generate([p], SamplingParams(max_tokens=m, **GREEDY))[0]
        assert r.output_token_ids == alone.output_token_ids
        assert r.output_token_ids == reference_greedy(model, p, m)
        assert r.finish_reason == "length"
    assert engine.kv.all_free()


def _step_tokens(engine: LLMEngine) -> list[int]:
    """Record the tokens each engine step schedules."""
    sizes: list[int] = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        sizes.append(out.num_tokens)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return sizes


def test_prefill_only_steps_take_the_idle_budget_and_decoding_steps_the_small_one(window513) -> None:
    """A long prompt alone runs in idle_prefill_tokens chunks; once a request is generating, every step keeps to
    max_num_batched_tokens (its inter-token gaps); the tokens are the reference's either way."""
    ck = window513
    gen = random.Random(7)
    long = [gen.randrange(ck.config.vocab_size) for _ in range(600)]
    short = [gen.randrange(ck.config.vocab_size) for _ in range(5)]
    engine = make_engine(ck, max_num_batched_tokens=16, idle_prefill_tokens=256)
    assert engine.prefill_tokens == 256 and engine.scheduler.idle_prefill_tokens == 256
    sizes = _step_tokens(engine)
    alone = engine.generate([long], SamplingParams(max_tokens=3, **GREEDY))[0]
    assert sizes == [256, 256, 88, 1, 1]  # 600 prompt tokens in idle chunks, then the two decode steps
    assert alone.output_token_ids == reference_greedy(engine.model, long, 3)

    engine = make_engine(ck, max_num_batched_tokens=16, idle_prefill_tokens=256)
    sizes = _step_tokens(engine)
    first = engine.add_request("decoding", short, SamplingParams(max_tokens=60, **GREEDY))
    engine.step()  # the short prompt's prefill: it generates from here on
    second = engine.add_request("long", long, SamplingParams(max_tokens=3, **GREEDY))
    while engine.has_unfinished():
        engine.step()
    assert sizes[0] == 5 and max(sizes[1:]) <= 16  # the long prompt's chunks shrink beside a decoding request
    assert first.output_token_ids == reference_greedy(engine.model, short, 60)
    assert second.output_token_ids == reference_greedy(engine.model, long, 3)
    assert engine.kv.all_free()


def test_idle_prefill_budget_resolution() -> None:
    """None: 8192 on the fused GPU path, max_num_batched_tokens elsewhere; never below max_num_batched_tokens."""
    assert EngineConfig().prefill_tokens(fused_gpu=True) == 8192
    assert EngineConfig().prefill_tokens(fused_gpu=False) == 2048
    assert EngineConfig(max_num_batched_tokens=16384).prefill_tokens(fused_gpu=True) == 16384
    assert EngineConfig(idle_prefill_tokens=4096).prefill_tokens(fused_gpu=False) == 4096
    assert EngineConfig(idle_prefill_tokens=1000).prefill_tokens(fused_gpu=True) == 2048
    with pytest.raises(ValueError, match="idle_prefill_tokens"):
        EngineConfig(idle_prefill_tokens=0)


def test_window_edge_with_small_window(window7) -> None:
    ck = window7
    prompts = [list(range(3, 3 + n)) for n in (6, 7, 8, 20)]
    engine = make_engine(ck, max_num_batched_tokens=3)
    out = engine.generate(prompts, SamplingParams(max_tokens=10, **GREEDY))
    for p, r in zip(prompts, out):
        assert r.output_token_ids == reference_greedy(engine.model, p, 10)


@pytest.mark.parametrize("idle", [None, 256])
def test_preempted_request_resumes_with_same_output(window7, idle: int | None) -> None:
    """Also with prefill-only steps of 256 tokens (all six prompts in one step, then preemptions while decoding)."""
    ck = window7
    gen = random.Random(3)
    prompts = [[gen.randrange(ck.config.vocab_size) for _ in range(30)] for _ in range(6)]
    params = SamplingParams(max_tokens=40, **GREEDY)
    # A cache too small for all six at once forces preemptions.
    tight = make_engine(ck, full_blocks=20, max_num_seqs=6, idle_prefill_tokens=idle)  # 320 tokens for 6 x 70
    roomy = make_engine(ck)
    got = tight.generate(prompts, params)
    want = roomy.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert any(r.num_preemptions for r in got)
    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in want]
    assert tight.kv.all_free()


@pytest.mark.parametrize("idle", [None, 96])
def test_no_block_leak_after_random_requests_aborts_and_preemptions(window7, idle: int | None) -> None:
    ck = window7
    engine = make_engine(ck, full_blocks=24, max_num_seqs=16, max_num_batched_tokens=32, idle_prefill_tokens=idle)
    rng = random.Random(0)
    live: list[str] = []
    added = 0
    finished = 0
    while added < 600 or engine.has_unfinished():
        for _ in range(rng.randint(0, 4)):
            if added >= 600:
                break
            prompt = [rng.randrange(ck.config.vocab_size) for _ in range(rng.randint(1, 40))]
            sp = SamplingParams(max_tokens=rng.randint(1, 12), temperature=rng.choice([0.0, 0.8]), seed=added)
            try:
                engine.add_request(f"q{added}", prompt, sp)
                live.append(f"q{added}")
            except EngineOverloaded:
                pass
            added += 1
        if live and rng.random() < 0.3:
            engine.abort(live.pop(rng.randrange(len(live))))
        for out in engine.step():
            if out.finished:
                finished += 1
    assert engine.scheduler.num_preemptions > 0
    assert finished > 300
    assert engine.kv.all_free()
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting


def test_prefix_cache_skips_the_shared_prefix(window513) -> None:
    ck = window513
    gen = random.Random(9)
    shared = [gen.randrange(ck.config.vocab_size) for _ in range(700)]  # longer than the 513 window
    first = [*shared, 5, 6, 7]
    second = [*shared, 11, 12, 13, 14]
    sp = SamplingParams(max_tokens=6, **GREEDY)
    engine = make_engine(ck, max_num_batched_tokens=256)
    engine.generate([first], sp)
    before = engine.metrics.computed_tokens
    r2 = engine.generate([second], sp)[0]
    computed = engine.metrics.computed_tokens - before
    assert r2.cached_prompt_tokens == 688  # whole 16-token blocks of the shared prefix
    assert computed == len(second) - r2.cached_prompt_tokens + sp.max_tokens - 1
    uncached = make_engine(ck, enable_prefix_caching=False).generate([second], sp)[0]
    assert r2.output_token_ids == uncached.output_token_ids
    snap = engine.metrics.snapshot()
    assert snap["prefix_cache_hits_total"] == 688
    assert engine.kv.all_free()


def test_prefix_cache_needs_the_sliding_window_blocks(window513) -> None:
    """Full-attention blocks alone are not a hit: the window's sliding blocks must still be cached."""
    ck = window513
    shared = [i % 300 + 1 for i in range(600)]
    engine = make_engine(ck, max_num_batched_tokens=256)
    engine.generate([[*shared, 1]], SamplingParams(max_tokens=1, **GREEDY))
    engine.kv.sliding.reset_prefix_cache()
    r = engine.generate([[*shared, 2]], SamplingParams(max_tokens=1, **GREEDY))[0]
    assert r.cached_prompt_tokens == 0


def test_seeded_sampling_is_independent_of_the_batch(window7) -> None:
    ck = window7
    prompt = list(range(10, 30))
    sp = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    alone = make_engine(ck).generate([prompt], sp)[0].output_token_ids
    others = [list(range(40, 40 + n)) for n in (3, 17, 33)]
    crowd = make_engine(ck, max_num_batched_tokens=8).generate(
        [*others, prompt], [SamplingParams(max_tokens=15, temperature=0.7, seed=i) for i in range(3)] + [sp]
    )
    assert crowd[-1].output_token_ids == alone
    different_seed = make_engine(ck).generate([prompt], SamplingParams(max_tokens=20, temperature=1.0, seed=1))[0]
    assert different_seed.output_token_ids != alone


def test_stop_strings_and_tokens(window7) -> None:
    ck = window7
    tok = ck.tokenizer
    engine = make_engine(ck)
    prompt = tok.encode("stop here")
    free = engine.generate([prompt], SamplingParams(max_tokens=30, **GREEDY))[0]
    text = tok.decode(free.output_token_ids)
    # pick a stop string from the middle of the greedy text, spanning a token boundary where possible
    stop = text[len(text) // 3 : len(text) // 3 + 3]
    assert stop
    outs = []
    for include in (False, True):
        eng = make_engine(ck)
        r = eng.add_request(
            "s", prompt, SamplingParams(max_tokens=30, stop=[stop], include_stop_str_in_output=include, **GREEDY)
        )
        chunks = []
        while eng.has_unfinished():
            chunks += [o.new_text for o in eng.step()]
        outs.append("".join(chunks))
        assert r.finish_reason == "stop" and r.stop_reason == stop
    cut = text.index(stop)
    assert outs[0] == text[:cut]
    assert outs[1] == text[: cut + len(stop)]
    stop_id = free.output_token_ids[4]
    r = make_engine(ck).generate([prompt], SamplingParams(max_tokens=30, stop_token_ids=[stop_id], **GREEDY))[0]
    assert r.output_token_ids == free.output_token_ids[: free.output_token_ids.index(stop_id) + 1]
    assert r.finish_reason == "stop" and r.stop_reason == stop_id


def test_eos_bans_before_min_tokens_and_ignore_eos(window7) -> None:
    ck = window7
    engine = make_engine(ck)
    req = engine.add_request("e", [1, 2, 3], SamplingParams(max_tokens=5, min_tokens=3, temperature=0.0))
    assert req.eos_token_ids == frozenset(ck.tokenizer.eos_token_ids)
    assert set(engine._sampling_row(req).banned_ids) == set(req.eos_token_ids)
    req.output_token_ids += [7, 7, 7]
    assert engine._sampling_row(req).banned_ids == ()
    ignoring = engine.add_request("i", [1, 2, 3], SamplingParams(max_tokens=5, min_tokens=3, **GREEDY))
    assert engine._sampling_row(ignoring).banned_ids == ()


def test_finishes_on_eos(window7) -> None:
    """With EOS as the only allowed continuation (every other token banned), the request stops on it."""
    ck = window7
    eos = min(ck.tokenizer.eos_token_ids)
    engine = make_engine(ck)
    req = engine.add_request("e", [1, 2, 3], SamplingParams(max_tokens=5, temperature=0.0))
    original = engine._sampling_row

    def only_eos(r):
        row = original(r)
        row.banned_ids = tuple(t for t in range(ck.config.vocab_size) if t != eos)
        return row

    engine._sampling_row = only_eos
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert req.output_token_ids == [eos] and req.finish_reason == "stop" and req.stop_reason == eos
    assert outs[-1].new_text == ""  # the end-of-turn token is not part of the text


def test_logprobs_match_the_model(window7) -> None:
    ck = window7
    prompt = [4, 5, 6, 7]
    engine = make_engine(ck)
    engine.add_request("lp", prompt, SamplingParams(max_tokens=4, logprobs=3, **GREEDY))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert len(outs) == 4
    seq = list(prompt)
    for o in outs:
        (tid, lp, top) = o.new_logprobs[0]
        ref = torch.log_softmax(engine.model.forward_sequences([seq])[0][-1], -1)
        assert abs(lp - ref[tid].item()) < 1e-4
        assert [t for t, _ in top] == ref.topk(3).indices.tolist()
        assert tid == top[0][0]  # greedy picks the top token
        seq.append(tid)
    # Offline use reads the same log-probabilities off the finished request.
    [req] = make_engine(ck).generate([prompt], SamplingParams(max_tokens=4, logprobs=3, **GREEDY))
    assert req.output_logprobs == [(o.new_logprobs[0][1], o.new_logprobs[0][2]) for o in outs]


def test_penalties_against_a_simple_reference() -> None:
    from flint_engine.sampler import SamplingRow, apply_penalties

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    row = SamplingRow(
        1.0,
        1.0,
        0,
        0.0,
        0,
        0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=2.0,
        output_ids=[3, 3, 1],
        prompt_ids=[0],
    )
    got = apply_penalties(logits.clone(), [row])[0]
    want = torch.tensor([2.0 / 2, (-1.0 - 0.25 - 0.5) * 2, 0.5, (3.0 - 0.5 - 0.5) / 2, -2.0])
    torch.testing.assert_close(got, want)


def test_truncation_top_k_top_p_min_p() -> None:
    from flint_engine.sampler import truncation_mask

    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    keep = truncation_mask(logits, torch.tensor([3]), torch.tensor([0.7]), torch.tensor([0.0]))
    assert keep.tolist() == [[True, True, False, False]]
    keep = truncation_mask(logits, torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.25]))
    assert keep.tolist() == [[True, True, True, False]]
    keep = truncation_mask(logits, torch.tensor([1]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert keep.tolist() == [[True, False, False, False]]


def test_sampling_follows_the_distribution() -> None:
    from flint_engine.sampler import SamplingRow, sample

    probs = torch.tensor([0.6, 0.3, 0.1])
    counts = torch.zeros(3)
    for step in range(3000):
        r = sample(torch.log(probs)[None].clone(), [SamplingRow(1.0, 1.0, 0, 0.0, seed=7, step=step)])
        counts[r.token_ids[0]] += 1
    assert torch.allclose(counts / counts.sum(), probs, atol=0.03)


def test_request_validation(window7) -> None:
    ck = window7
    engine = make_engine(ck, max_model_len=64)
    with pytest.raises(EngineRequestError, match="maximum context length is 64"):
        engine.add_request("a", list(range(60)), SamplingParams(max_tokens=10))
    with pytest.raises(EngineRequestError, match="outside the vocabulary"):
        engine.add_request("b", [10**6], SamplingParams(max_tokens=1))
    with pytest.raises(EngineRequestError, match="empty"):
        engine.add_request("c", [], SamplingParams(max_tokens=1))
    # n choices are n requests (AsyncEngine, the API and LLM make them); one request never silently drops n - 1.
    with pytest.raises(EngineRequestError, match="one sequence"):
        engine.add_request("n", [1, 2], SamplingParams(max_tokens=1, n=2))
    with pytest.raises(EngineRequestError, match="stop_token_ids names token id"):
        engine.add_request("s", [1, 2], SamplingParams(max_tokens=1, stop_token_ids=[10**6]))
    assert not engine.requests
    small = make_engine(ck, full_blocks=2)
    with pytest.raises(EngineRequestError, match="KV cache holds at most 32"):
        small.add_request("d", list(range(30)), SamplingParams(max_tokens=10))
    with pytest.raises(SamplingParamsError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(SamplingParamsError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    busy = make_engine(ck, max_waiting_requests=2)
    busy.add_request("x", [1], SamplingParams(max_tokens=1))
    busy.add_request("y", [1], SamplingParams(max_tokens=1))
    with pytest.raises(EngineOverloaded):
        busy.add_request("z", [1], SamplingParams(max_tokens=1))


def test_abort_frees_blocks_at_once(window7) -> None:
    engine = make_engine(window7)
    engine.add_request("a", list(range(50)), SamplingParams(max_tokens=100, **GREEDY))
    engine.step()
    engine.step()
    assert not engine.kv.all_free()
    out = engine.abort("a")
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert engine.kv.all_free()
    assert engine.metrics.snapshot()["request_success_total"]["abort"] == 1


def test_activation_reserve_counts_the_expert_copy_of_long_prefills() -> None:
    """From DEQUANT_MIN_TOKENS tokens a step the fused MoE may copy one layer's experts to BF16: kept free too."""
    from flint_kernels.configs import DEQUANT_MIN_TOKENS

    from flint_engine.config import preset
    from flint_engine.kv_cache_plan import activation_reserve

    cfg = preset("full")
    short = activation_reserve(cfg, 8, DEQUANT_MIN_TOKENS - 1)
    long = activation_reserve(cfg, 8, DEQUANT_MIN_TOKENS)
    copy = 2 * 3 * cfg.num_experts * cfg.moe_intermediate_size * cfg.hidden_size
    assert copy > 1.5e9  # Flint's 256 experts of 3 x 512 x 2048
    assert long - short == copy + 96 * 1024
    # BF16 experts are never copied: nothing extra to keep free.
    bf16 = activation_reserve(cfg, 8, DEQUANT_MIN_TOKENS, nvfp4_experts=False)
    assert bf16 - short == 96 * 1024
    # A GPU whose table starts the copies earlier (the H200's: 3072 tokens) reserves from there.
    early = activation_reserve(cfg, 8, 3072, dequant_min_tokens=3072)
    assert early - activation_reserve(cfg, 8, 3072) == copy
    # Step graphs hold a step's activations of their largest bucket in their pool, beside the eager steps'.
    graphs = activation_reserve(cfg, 8, 8192, graph_tokens=4096)
    assert graphs - activation_reserve(cfg, 8, 8192) == 4096 * 96 * 1024


def test_steps_on_the_twins_that_decode_nvfp4_in_registers_need_no_copy() -> None:
    """Where the table runs NVFP4 experts of steps up to N tokens on launches that decode them in registers, the
    copies (and the memory kept for them) start above N; with no upper bound they never start."""
    import dataclasses

    from flint_kernels.configs import MoEPaths
    from flint_kernels.moe_triton import copies_min_tokens

    base = MoEPaths(decode_max_tokens=64, shared_fold_max_tokens=8, dequant_min_tokens=2048)
    assert copies_min_tokens(base) == 2048
    assert copies_min_tokens(dataclasses.replace(base, tma_nvfp4_min_tokens=256, tma_nvfp4_max_tokens=4096)) == 4097
    assert copies_min_tokens(dataclasses.replace(base, tma_nvfp4_min_tokens=256, tma_nvfp4_max_tokens=1024)) == 2048
    assert copies_min_tokens(dataclasses.replace(base, tma_nvfp4_min_tokens=4096)) == 2048  # copies first
    assert copies_min_tokens(dataclasses.replace(base, tma_nvfp4_min_tokens=256)) > 2**40
    # The H200's table: every grouped step on the twins, so no step budget keeps a copy's memory free.
    assert copies_min_tokens(_h200_paths()) > 2**40


def test_token_times_are_stamped_once_the_tokens_are_on_the_host(window7, monkeypatch) -> None:
    """On a GPU the model step only queues kernels; the sampler's copy of the tokens to the host waits for them. The
    first-token and inter-token times (TTFT, ITL metrics) must be taken after that copy, not before it."""
    import time

    from flint_engine.token_readback import TokenReadback

    done: list[float] = []
    real = TokenReadback.tolist

    def tolist(self: TokenReadback) -> list[int]:
        time.sleep(0.002)  # stands for the wait for the GPU before the tokens are on the host
        done.append(time.monotonic())
        return real(self)

    monkeypatch.setattr(TokenReadback, "tolist", tolist)
    engine = make_engine(window7)
    req = engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=3, **GREEDY))
    engine.step()
    assert req.first_token_time is not None and req.first_token_time >= done[0]
    engine.step()
    assert req.last_token_time >= done[1] > req.first_token_time


def _h200_paths():
    """NVFP4's `moe.paths` of the H200's shipped table."""
    from pathlib import Path

    from flint_kernels import tuning
    from flint_kernels.configs import MoEPaths

    table = tuning.load(Path(__file__).resolve().parents[1] / "kernels" / "tuning" / "nvidia-h200.json")
    entry = next(e for e in table.ops["moe.paths"] if e.matches({"nvfp4": True}))
    return MoEPaths(**entry.config)
