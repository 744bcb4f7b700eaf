"""AsyncEngine: streams from a background engine thread, n choices, abort on disconnect, failure isolation."""

from __future__ import annotations

import asyncio
import time

import pytest
from test_engine import GREEDY, make_engine, window7  # noqa: F401  (fixture re-use)

from flint_engine.async_engine import AsyncEngine, EngineDeadError
from flint_engine.engine import EngineOverloaded, EngineRequestError
from flint_engine.sampling_params import SamplingParams


@pytest.fixture
def engine(window7):  # noqa: F811
    e = AsyncEngine(make_engine(window7))
    e.start()
    yield e
    e.shutdown()


async def collect(engine: AsyncEngine, prompt: list[int], params: SamplingParams, rid: str | None = None):
    per_choice: dict[int, list] = {}
    async for item in engine.generate(prompt, params, rid):
        per_choice.setdefault(item.index, []).append(item.output)
    return per_choice


def test_stream_matches_the_sync_engine(engine: AsyncEngine, window7) -> None:  # noqa: F811
    prompt = window7.tokenizer.encode("hello there")
    params = SamplingParams(max_tokens=8, **GREEDY)
    outs = asyncio.run(collect(engine, prompt, params))[0]
    tokens = [t for o in outs for t in o.new_token_ids]
    want = make_engine(window7).generate([prompt], params)[0]
    assert tokens == want.output_token_ids
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert "".join(o.new_text for o in outs) == window7.tokenizer.decode(tokens)


def test_n_choices_use_consecutive_seeds(engine: AsyncEngine, window7) -> None:  # noqa: F811
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=40, n=3)
    choices = asyncio.run(collect(engine, prompt, params))
    assert sorted(choices) == [0, 1, 2]
    for i in range(3):
        single = SamplingParams(max_tokens=6, temperature=1.0, seed=40 + i)
        want = make_engine(window7).generate([prompt], single)[0].output_token_ids
        assert [t for o in choices[i] for t in o.new_token_ids] == want


def test_leaving_the_stream_aborts_and_frees_blocks(engine: AsyncEngine) -> None:
    async def go() -> None:
        agen = engine.generate(list(range(40)), SamplingParams(max_tokens=500, **GREEDY), "gone")
        await agen.__anext__()
        await agen.aclose()  # what a disconnecting HTTP client does to the stream

    asyncio.run(go())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if engine.engine.kv.all_free() and not engine.engine.requests:
            break
        time.sleep(0.01)
    assert engine.engine.kv.all_free()
    snap = engine.engine.metrics.snapshot()
    assert snap["num_requests_running"] == 0 and snap["request_success_total"]["abort"] == 1


def test_bad_requests_fail_before_streaming(engine: AsyncEngine) -> None:
    async def first(prompt, params):
        async for _ in engine.generate(prompt, params):
            break

    with pytest.raises(EngineRequestError, match="maximum context length"):
        asyncio.run(first([1] * 10, SamplingParams(max_tokens=10**6)))
    with pytest.raises(EngineRequestError, match="empty"):
        asyncio.run(first([], SamplingParams(max_tokens=1)))


def test_overload_is_rejected(window7) -> None:  # noqa: F811
    e = AsyncEngine(make_engine(window7, max_waiting_requests=2))  # not started: nothing drains the queue

    async def go() -> None:
        agens = [e.generate([1, 2], SamplingParams(max_tokens=2)) for _ in range(2)]
        for a in agens:
            task = asyncio.ensure_future(a.__anext__())
            await asyncio.sleep(0)
            task.cancel()
        with pytest.raises(EngineOverloaded):
            async for _ in e.generate([1, 2], SamplingParams(max_tokens=2)):
                pass

    asyncio.run(go())


def test_a_failing_step_fails_only_its_requests(engine: AsyncEngine) -> None:
    runner = engine.engine.runner
    original = runner.execute
    calls = {"n": 0}

    def flaky(chunks):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated CUDA error")
        return original(chunks)

    runner.execute = flaky
    first = asyncio.run(collect(engine, [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY)))[0]
    assert first[-1].finish_reason == "error" and first[-1].error
    second = asyncio.run(collect(engine, [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY)))[0]
    assert second[-1].finish_reason == "length"
    assert engine.engine.kv.all_free()


def test_dead_loop_fails_waiting_streams(window7) -> None:  # noqa: F811
    e = AsyncEngine(make_engine(window7))

    def boom():
        raise SystemError("engine thread crashed")

    e.engine.step = boom
    e.start()

    async def go() -> None:
        with pytest.raises(EngineDeadError):
            async for _ in e.generate([1, 2], SamplingParams(max_tokens=3)):
                pass

    asyncio.run(go())
    assert not e.is_running
    asyncio.run(go())  # later requests are refused at once
    e.shutdown()


def test_concurrent_streams(engine: AsyncEngine, window7) -> None:  # noqa: F811
    prompts = [[i, i + 1, i + 2] for i in range(1, 40, 3)]

    async def go():
        return await asyncio.gather(*[collect(engine, p, SamplingParams(max_tokens=5, **GREEDY)) for p in prompts])

    results = asyncio.run(go())
    ref = make_engine(window7).generate(prompts, SamplingParams(max_tokens=5, **GREEDY))
    for got, want in zip(results, ref):
        assert [t for o in got[0] for t in o.new_token_ids] == want.output_token_ids
