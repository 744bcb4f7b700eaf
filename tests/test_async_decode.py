"""`async_decode`: the engine launches the next decode step before reading this one's tokens. Checked on CPU through
decode "graphs" whose replay reruns the reference model on the graphs' static buffers (`tests/graph_replay.py`), so
everything the engine does around them is real: the same tokens and finish reasons as one step at a time, rows of
requests that stop or are aborted meanwhile dropped, requests arriving meanwhile admitted, no block leaked."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from api_fixtures import DEMO, WEATHER_SCHEMA
from graph_replay import HostReplay

from flint_engine.api.prometheus import render
from flint_engine.config import preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import random_weights


@pytest.fixture(scope="module")
def model() -> FlintModel:
    return FlintModel(random_weights(preset("tiny"), torch.float32, seed=21))  # window 7: it moves as we decode


def engine_on(model: FlintModel, async_decode: bool, graphs: bool = True, max_num_seqs: int = 4) -> LLMEngine:
    ec = EngineConfig(
        kv_cache_memory=8 * 2**20, max_num_seqs=max_num_seqs, max_num_batched_tokens=64, block_size=4,
        cuda_graphs=False, async_decode=async_decode,
    )  # fmt: skip
    engine = LLMEngine(model, None, ec)
    if graphs:
        replay = HostReplay(model, engine.cache, max_batch=4, max_context=128)
        replay.capture()
        engine.runner.graphs = replay
    return engine


PROMPTS = [[5, 9, 2, 7, 1], [3] * 9, [11, 4], [8, 8, 1, 6, 2, 9, 4]]


def params(stop_token: int | None = None) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=21, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=17, temperature=0.9, top_k=5, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=19, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_token or 0]),
        SamplingParams(max_tokens=12, temperature=0.7, top_k=9, seed=5, min_tokens=6, ignore_eos=True),
    ]


def outputs(engine: LLMEngine, ps: list[SamplingParams]) -> list[tuple[list[int], str | None]]:
    reqs = engine.generate(PROMPTS, ps)
    assert engine.kv.all_free()
    return [(r.output_token_ids, r.finish_reason) for r in reqs]


def test_async_decode_gives_the_same_tokens(model: FlintModel) -> None:
    free_run = outputs(engine_on(model, False, graphs=False), params())
    stop = free_run[2][0][6]  # request 2 then stops at its 7th token, the others go on
    want = outputs(engine_on(model, False, graphs=False), params(stop))
    assert want[2][1] == "stop" and len(want[2][0]) <= 7
    assert outputs(engine_on(model, False), params(stop)) == want  # graphs, one step at a time
    ahead = engine_on(model, True)
    assert outputs(ahead, params(stop)) == want
    assert ahead.steps_ahead > 10
    snap = ahead.metrics.snapshot()  # (and /metrics: flint:decode_steps_ahead_total beside flint:engine_steps_total)
    assert snap["decode_steps_ahead_total"] == ahead.steps_ahead < snap["engine_steps_total"]
    assert b"flint:decode_steps_ahead_total %d.0" % ahead.steps_ahead in render([({}, snap)])


def test_a_request_ending_by_length_leaves_the_others_ahead(model: FlintModel) -> None:
    """A request whose next token is its last (max_tokens) is left out of the step launched ahead; the others' rows
    go ahead without it, their input tokens picked from the device."""
    ps = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (4, 9, 14, 20)]
    want = outputs(engine_on(model, False, graphs=False), ps)
    engine = engine_on(model, True)
    widths: list[tuple[int, int]] = []  # (rows in flight, rows launched ahead of them)
    launch_ahead = engine._launch_ahead

    def spy(prev):  # type: ignore[no-untyped-def]
        ahead = launch_ahead(prev)
        if ahead is not None:
            widths.append((len(prev.chunks), len(ahead.chunks)))
        return ahead

    engine._launch_ahead = spy  # type: ignore[method-assign]
    assert outputs(engine, ps) == want
    assert {(4, 3), (3, 2), (2, 1)} <= set(widths)  # each shorter request's last step: the others went ahead


def test_a_full_server_still_launches_ahead(model: FlintModel) -> None:
    """With every sequence slot taken, requests waiting for one (a saturated server) do not stop the steps ahead;
    each is admitted when a slot frees, and the tokens are those of one step at a time."""
    ps = params()
    want = outputs(engine_on(model, False, graphs=False, max_num_seqs=2), ps)
    engine = engine_on(model, True, max_num_seqs=2)
    seen_waiting_ahead = []
    step = engine.step

    def watched() -> list:
        out = step()
        if engine.scheduler.waiting and engine._ahead is not None:
            seen_waiting_ahead.append(len(engine.scheduler.waiting))
        return out

    engine.step = watched  # type: ignore[method-assign]
    assert outputs(engine, ps) == want
    assert seen_waiting_ahead  # steps went ahead while requests waited for a slot


def test_an_outranking_arrival_stops_the_steps_ahead_for_its_preemption(model: FlintModel) -> None:
    """One slot held by a priority-1 request decoding ahead: a priority-0 arrival takes it at the next schedule (no
    step goes ahead while it waits), and both requests' tokens are those of one step at a time."""
    low = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, priority=1)
    high = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    runs = {}
    for async_decode, graphs in ((False, False), (True, True)):
        engine = engine_on(model, async_decode, graphs=graphs, max_num_seqs=1)
        reqs = [engine.add_request("low", PROMPTS[0], low)]
        while len(reqs[0].output_token_ids) < 6:
            engine.step()
        reqs.append(engine.add_request("high", PROMPTS[1], high))
        if async_decode:
            assert engine.steps_ahead > 0
        ahead_before = engine.steps_ahead
        while engine.has_unfinished() and not reqs[1].is_finished:
            engine.step()
            if async_decode and engine.scheduler.would_preempt():
                assert engine._ahead is None
        assert len(reqs[0].output_token_ids) < 20 and reqs[0].num_preemptions == 1  # overtaken mid-answer
        while engine.has_unfinished():
            engine.step()
        if async_decode:
            assert engine.steps_ahead > ahead_before  # the resumed request went ahead again
        assert engine.kv.all_free()
        runs[async_decode] = [r.output_token_ids for r in reqs]
    assert runs[True] == runs[False]


def test_aborts_and_arrivals_while_a_step_is_ahead(model: FlintModel) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    want = {r.request_id: r.output_token_ids for r in _run(engine_on(model, False, graphs=False), greedy)}
    engine = engine_on(model, True)
    got = {r.request_id: r.output_token_ids for r in _run(engine, greedy)}
    assert got["a"] == want["a"] and got["late"] == want["late"]
    assert got["b"] == want["b"][: len(got["b"])] and len(got["b"]) < 16  # nothing after the abort
    assert engine.steps_ahead > 5 and engine.kv.all_free()


def _run(engine: LLMEngine, greedy: SamplingParams) -> list:
    """Two requests; b aborted after its 4th token (with a step ahead in flight when async); a third arrives."""
    reqs = [engine.add_request("a", PROMPTS[0], greedy), engine.add_request("b", PROMPTS[1], greedy)]
    aborted = added = False
    while engine.has_unfinished():
        engine.step()
        if not aborted and len(reqs[1].output_token_ids) >= 4:
            if engine.engine_config.async_decode:
                assert engine._ahead is not None  # the abort lands while the next step is in flight
            engine.abort("b")
            aborted = True
        if aborted and not added and len(reqs[0].output_token_ids) >= 8:
            reqs.append(engine.add_request("late", PROMPTS[2], greedy))
            added = True
    return reqs


def test_logprobs_are_read_with_the_tokens_ahead(model: FlintModel) -> None:
    """Rows that ask for logprobs (the drawn token's and the top ones) are drawn on the device and read with their
    tokens, so they go ahead: the same tokens and logprobs as one step at a time, where the host samples them."""
    ps = [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=18, temperature=0.8, top_k=7, seed=9, ignore_eos=True, logprobs=0),
        SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),  # none asked
        SamplingParams(max_tokens=14, temperature=1.0, top_k=5, seed=2, ignore_eos=True, logprobs=5),
    ]
    want = engine_on(model, False, graphs=False).generate(PROMPTS, ps)
    engine = engine_on(model, True)
    got = engine.generate(PROMPTS, ps)
    assert engine.steps_ahead > 10 and engine.kv.all_free()
    for w, g, p in zip(want, got, ps):
        assert g.output_token_ids == w.output_token_ids
        if p.logprobs is None:
            assert g.output_logprobs == []
            continue
        assert len(g.output_logprobs) == len(g.output_token_ids)
        for (wl, wtop), (gl, gtop) in zip(w.output_logprobs, g.output_logprobs):
            assert gl == pytest.approx(wl, abs=1e-5) and gl < 0
            assert [i for i, _ in gtop] == [i for i, _ in wtop] and len(gtop) == p.logprobs
            assert [v for _, v in gtop] == pytest.approx([v for _, v in wtop], abs=1e-5)


def test_biases_allowed_ids_and_bans_go_ahead(model: FlintModel) -> None:
    """logit_bias, allowed_token_ids and min_tokens' bans are applied on the device (ids uploaded once), so those
    requests go ahead: the same tokens as one step at a time, where the host applies them."""
    free = engine_on(model, False, graphs=False).generate(PROMPTS[:1], SamplingParams(max_tokens=8, temperature=0.0))
    favourite = free[0].output_token_ids[2]
    ps = [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logit_bias={favourite: -100.0, 7: 3.0}),
        SamplingParams(max_tokens=18, temperature=0.9, top_k=6, seed=1, ignore_eos=True, allowed_token_ids=[4, 9, 30]),
        SamplingParams(max_tokens=16, temperature=0.0, min_tokens=12, stop_token_ids=[favourite]),
        SamplingParams(max_tokens=14, temperature=1.0, top_k=9, seed=8, ignore_eos=True, logit_bias={favourite: 5.0}),
    ]
    want = outputs(engine_on(model, False, graphs=False), ps)
    engine = engine_on(model, True)
    assert outputs(engine, ps) == want
    assert engine.steps_ahead > 10
    assert favourite not in want[0][0] and set(want[1][0]) <= {4, 9, 30} and len(want[2][0]) >= 12


def test_penalties_go_ahead_counting_the_token_not_read_yet(model: FlintModel) -> None:
    """Presence, frequency and repetition penalties are applied on the device, a step launched ahead counting the
    token it is fed (not yet read on the host): the same tokens as one step at a time."""
    ps = [
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, presence_penalty=1.2),
        SamplingParams(max_tokens=22, temperature=0.9, top_k=8, seed=3, ignore_eos=True, frequency_penalty=2.0),
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, repetition_penalty=1.4),
        # token 7 favoured until its count outweighs its bias: when it stops turns on counting the token just fed
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logit_bias={7: 30.0}, frequency_penalty=2.0),
    ]
    want = outputs(engine_on(model, False, graphs=False), ps)
    unpenalised = [
        dataclasses.replace(p, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0) for p in ps
    ]
    free = outputs(engine_on(model, False, graphs=False), unpenalised)
    assert all(free[i] != want[i] for i in range(4))  # each penalty changed its request's tokens
    assert 5 < want[3][0].count(7) < 20, want[3]
    engine = engine_on(model, True)
    assert outputs(engine, ps) == want
    assert engine.steps_ahead > 10


def test_a_thinking_budget_spent_as_the_reasoning_ends_forces_nothing_more(model: FlintModel) -> None:
    """A step launched ahead cannot know whether the token before it closed the reasoning; where the thinking budget
    runs out at that step, it is not launched ahead (else the end of the reasoning would be forced a second time)."""
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    [free] = engine_on(model, False, graphs=False).generate(PROMPTS[:1], greedy)
    ids = free.output_token_ids
    k = next(i for i in range(4, len(ids)) if ids[i] not in ids[:i])  # written once, at k: the model's own end
    ps = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, reasoning_end_token=ids[k], thinking_token_budget=k + 1
    )
    want = outputs(engine_on(model, False, graphs=False), [ps])
    engine = engine_on(model, True)
    assert outputs(engine, [ps]) == want
    assert want[0][0] == ids  # the model closed its reasoning itself, at the budget's last token: nothing forced
    assert engine.steps_ahead > 3


def test_the_serving_setting_reaches_the_engine() -> None:
    from flint_serve.settings import ServeSettings

    assert ServeSettings().engine_config(gpu=True).async_decode is True
    assert ServeSettings(async_decode=False).engine_config(gpu=True).async_decode is False


def demo_engine(async_decode: bool, max_num_seqs: int = 4) -> LLMEngine:
    ec = EngineConfig(
        model=str(DEMO), device="cpu", dtype="float32", kv_cache_memory=32 * 2**20, cuda_graphs=False,
        async_decode=async_decode, max_num_seqs=max_num_seqs,
    )  # fmt: skip
    engine = LLMEngine.from_checkpoint(ec, progress=False)
    if async_decode:
        replay = HostReplay(engine.model, engine.cache, max_batch=4, max_context=512)
        replay.capture()
        engine.runner.graphs = replay
    return engine


def test_strict_tool_calls_go_ahead_outside_a_call_and_are_held_inside() -> None:
    """Requests with a strict tool decode ahead while they reason; the row drawn free under the token that opened a
    call is dropped and drawn again under the call's rules, so the tokens are those of one step at a time (the demo
    model, free, names `search` after thinking it will call it)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    runs = {}
    for async_decode in (False, True):
        engine = demo_engine(async_decode)
        tok = engine.tokenizer
        prompts, ps = [], []
        for question in ("Weather in Oslo?", "Tell me about Paris", "What is 12 + 30?"):
            text = tok.apply_chat_template([{"role": "user", "content": question}], tools, add_generation_prompt=True)
            prompts.append(tok.encode(text))
            ps.append(SamplingParams(max_tokens=80, temperature=0.0, tool_schemas={"get_weather": WEATHER_SCHEMA}))
        prompts.append(prompts[1])  # sampled, seeded (top-k: a row the device draws alone)
        ps.append(SamplingParams(max_tokens=80, temperature=1.0, top_k=20, seed=2, tool_schemas=ps[0].tool_schemas))
        reqs = engine.generate(prompts, ps)
        assert engine.kv.all_free()
        runs[async_decode] = [r.output_token_ids for r in reqs]
        if async_decode:
            assert engine.steps_ahead > 10
            assert engine.rows_redone >= 1  # a call opened under a step launched ahead (the others wait for it)
        texts = [tok.decode(ids) for ids in runs[async_decode]]
        assert sum("<tool_call>get_weather<arg_key>city" in t for t in texts) == 3, texts
        assert "search" in texts[1]  # it thought of another tool: held to the offered one
    assert runs[True] == runs[False]


def chat_prompt(tok, question: str, thinking: bool) -> list[int]:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": question}]
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking))


def test_bad_words_go_ahead_their_bans_set_off_on_the_device() -> None:
    """A bad word of several tokens is banned at its last token where the output ends with the rest: in a step
    launched ahead the token before is not read, so that ban is set off on the device by the token it is fed. The
    demo model greets with "Hello!" ("Hello" then "!"): banned, it writes something else, the same ahead or not."""
    runs = {}
    for async_decode in (False, True):
        engine = demo_engine(async_decode)
        tok = engine.tokenizer
        prompts = [chat_prompt(tok, q, True) for q in ("Hi", "Hi", "What is 12 + 30?")]
        ps = [
            SamplingParams(max_tokens=40, temperature=0.0, bad_words=["Hello!"]),
            SamplingParams(max_tokens=40, temperature=0.0),
            SamplingParams(max_tokens=40, temperature=0.0, bad_words=["asks", "23"]),
        ]
        reqs = engine.generate(prompts, ps)
        runs[async_decode] = [r.output_token_ids for r in reqs]
        texts = [tok.decode(ids) for ids in runs[async_decode]]
        assert "Hello!" in texts[1] and "Hello!" not in texts[0], texts
        assert "asks" not in texts[2] and "23" not in texts[2], texts
        if async_decode:
            assert engine.steps_ahead > 10
    assert runs[True] == runs[False]


def test_constraints_after_the_reasoning_go_ahead_while_it_lasts() -> None:
    """Requests with an output constraint after their thinking decode ahead while they reason; the row drawn free
    under the token that ended the reasoning is dropped and drawn again under the constraint. Among them one whose
    turn ends inside its "reasoning" (its end token is one the model does not write): the host writes the end of the
    reasoning in that token's place, and the step ahead, fed the device's token, is decoded again from the host's."""
    think_end = "</think>"
    runs = {}
    for async_decode in (False, True):
        engine = demo_engine(async_decode)
        tok = engine.tokenizer
        end = tok.token_to_id(think_end)

        choice = ("yes", "no")
        ps = [
            SamplingParams(max_tokens=60, temperature=0.0, choice=choice, reasoning_end_token=end),
            SamplingParams(max_tokens=60, temperature=1.0, top_k=20, seed=4, json_mode=True, reasoning_end_token=end),
            # thinking off in the prompt: the model answers and ends its turn while the engine counts it as reasoning
            SamplingParams(max_tokens=60, temperature=0.0, choice=choice, reasoning_end_token=end),
            SamplingParams(max_tokens=40, temperature=0.0),  # free
        ]
        questions = [("Is 7 + 8 = 15?", True), ("What is 12 + 30?", True), ("What is 2 + 2?", False), ("Hi", True)]
        prompts = [chat_prompt(tok, q, thinking) for q, thinking in questions]
        reqs = engine.generate(prompts, ps)
        assert engine.kv.all_free()
        runs[async_decode] = [r.output_token_ids for r in reqs]
        texts = [tok.decode(ids) for ids in runs[async_decode]]
        for i in (0, 2):  # (2: the end of its turn read as the end of its reasoning)
            assert texts[i].rsplit(think_end, 1)[1].removesuffix("<|user|>") in choice, texts[i]
        assert think_end not in texts[2].rsplit(think_end, 1)[0], texts[2]  # the model wrote no end of reasoning
        if async_decode:
            assert engine.steps_ahead > 10
            assert engine.rows_redone >= 2
    assert runs[True] == runs[False]


def test_mixed_traffic_with_every_kind_of_request_goes_ahead_to_the_same_tokens() -> None:
    """Twelve requests through four sequence slots (arrivals wait for a slot), each asking for something the device
    now does or the host redoes: strict and plain tools, JSON and a choice after the thinking, logprobs, penalties,
    a bias, allowed ids, min_tokens, bad words; greedy and seeded. The tokens and logprobs are those of one step at a
    time."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    questions = [
        "Weather in Oslo?",
        "Tell me about Paris",
        "What is 12 + 30?",
        "Hi",
        "Is 7 + 8 = 15?",
        "What is 2 + 2?",
    ]
    rng = random.Random(7)
    kinds = [
        {"tool_schemas": {"get_weather": WEATHER_SCHEMA}},
        {"tool_schemas": {"get_weather": None}},
        {"json_mode": True},
        {"choice": ("yes", "no")},
        {"logprobs": 3},
        {"presence_penalty": 1.0, "frequency_penalty": 0.5},
        {"repetition_penalty": 1.3, "logit_bias": {30: 2.0}},
        {"min_tokens": 12},
        {"bad_words": ["Hello!", "asks"]},
        {"logprobs": 0, "bad_words": ["23"]},
        {"allowed_token_ids": list(range(100, 400))},
        {},
    ]
    runs = {}
    for async_decode in (False, True):
        engine = demo_engine(async_decode)
        tok = engine.tokenizer
        end = tok.token_to_id("</think>")
        rng.seed(7)
        prompts, ps = [], []
        for i, extra in enumerate(kinds):
            messages = [{"role": "user", "content": questions[i % len(questions)]}]
            text = tok.apply_chat_template(
                messages, tools if "tool_schemas" in extra else None, add_generation_prompt=True
            )
            prompts.append(tok.encode(text))
            sampled = rng.random() < 0.5
            how = {"temperature": 1.0, "top_k": 20, "seed": i} if sampled else {"temperature": 0.0}
            if "json_mode" in extra or "choice" in extra:
                extra = {**extra, "reasoning_end_token": end}
            ps.append(SamplingParams(max_tokens=48, **how, **extra))
        reqs = engine.generate(prompts, ps)
        assert engine.kv.all_free()
        runs[async_decode] = [(r.output_token_ids, [lp for lp, _ in r.output_logprobs]) for r in reqs]
        if async_decode:
            assert engine.steps_ahead > 30 and engine.rows_redone >= 1
    for (ids, lps), (ids2, lps2) in zip(runs[False], runs[True]):
        assert ids2 == ids
        assert lps2 == pytest.approx(lps, abs=1e-5)
