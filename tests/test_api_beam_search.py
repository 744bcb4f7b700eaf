"""Beam search (vLLM's `use_beam_search`, `flint_engine/api/beam_search.py`): on a toy model whose log-probabilities
are known, it finds what greedy decoding misses, accounts each beam's log-probability and ends beams as asked; then
through the HTTP API on a tiny random Flint: one beam is the greedy answer, streamed beams equal the whole ones, and
what beam search does not combine with is refused."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
import pytest
from api_fixtures import module_server

from flint_engine.api.beam_search import beam_events, search
from flint_engine.beam_search import BeamSettings
from flint_engine.engine import RequestOutput
from flint_engine.sampling_params import SamplingParams

# A toy model over tokens 0-4: the next token's distribution depends on the last token (row) only. After the prompt's
# last token 0, token 1 is likelier than 2, but 1 leads only to flat rows while 2 leads to a sure token 3.
TABLE = {
    0: [0.01, 0.50, 0.45, 0.02, 0.02],
    1: [0.20, 0.20, 0.20, 0.20, 0.20],
    2: [0.01, 0.01, 0.01, 0.96, 0.01],
    3: [0.01, 0.01, 0.01, 0.01, 0.96],
    4: [0.25, 0.10, 0.25, 0.15, 0.25],
}


class ToyBackend:
    tokenizer = None
    eos_token_ids = frozenset({4})

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    async def generate(self, ids: list[int], params: SamplingParams, request_id: str) -> AsyncIterator:
        self.asked.append(list(ids))
        logps = [math.log(p) for p in TABLE[ids[-1]]]
        ranked = sorted(range(5), key=lambda t: -logps[t])[: params.logprobs]
        top = [(t, logps[t]) for t in ranked]
        out = RequestOutput(request_id, [ranked[0]], "", True, "length", new_logprobs=[(ranked[0], top[0][1], top)])
        yield SimpleNamespace(index=0, output=out)


def settings(width: int, max_tokens: int, ends: frozenset[int] = frozenset(), min_tokens: int = 0) -> BeamSettings:
    return BeamSettings(width, 1.0, max_tokens, min_tokens, ends)


def logprob_of(tokens: list[int], last: int = 0) -> float:
    total = 0.0
    for t in tokens:
        total += math.log(TABLE[last][t])
        last = t
    return total


def test_one_beam_is_greedy_and_two_find_what_greedy_misses() -> None:
    [greedy] = asyncio.run(search(ToyBackend(), [0], settings(1, 2), "r"))
    assert greedy.tokens == [1, 0]  # the likelier first token, then the flat row's first (ties keep token order)
    beams = asyncio.run(search(ToyBackend(), [0], settings(2, 2), "r"))
    assert beams[0].tokens == [2, 3] and beams[0].logprob > greedy.logprob
    for b in beams:
        assert b.logprob == pytest.approx(logprob_of(b.tokens))
    assert [b.logprob for b in beams] == sorted((b.logprob for b in beams), reverse=True)


def test_beams_end_on_end_tokens_after_min_tokens() -> None:
    backend = ToyBackend()
    beams = asyncio.run(search(backend, [0], settings(3, 4, ends=frozenset({4})), "r"))
    ended = [b for b in beams if b.ended]
    assert ended and all(b.tokens[-1] == 4 for b in ended)
    assert all(4 not in b.tokens[:-1] for b in beams)  # no beam runs on past an end
    assert max(len(a) for a in backend.asked) <= 1 + 3  # the prompt and at most max_tokens - 1 tokens asked after
    late = asyncio.run(search(ToyBackend(), [0], settings(3, 4, ends=frozenset({4}), min_tokens=3), "r"))
    assert all(len(b.tokens) >= 4 for b in late if b.ended)  # an end only once 3 tokens are out


def test_beam_events_are_finished_choices_per_prompt() -> None:
    async def gather() -> list:
        return [ev async for ev in beam_events(ToyBackend(), [[0], [3]], [settings(2, 2)] * 2, "r", True)]

    events = asyncio.run(gather())
    assert [ev.index for ev in events] == [0, 1, 2, 3]
    assert all(ev.finished and ev.finish_reason == "length" and ev.completion_tokens == 2 for ev in events)
    assert [events[2].token_ids, events[3].token_ids] == [[4, 0], [4, 2]]  # the second prompt's (tied) best two


server = module_server("beams")


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", json={"model": "flint", **body}, timeout=120)


BASE = {"prompt": "The capital of", "max_tokens": 6, "ignore_eos": True}


def test_one_beam_is_the_greedy_answer(server) -> None:
    greedy = post(server, {**BASE, "temperature": 0})
    beam = post(server, {**BASE, "use_beam_search": True, "n": 1})
    assert beam.status_code == 200, beam.text
    assert beam.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_beams_streamed_equal_the_whole_answer(server) -> None:
    whole = post(server, {**BASE, "use_beam_search": True, "n": 3})
    assert whole.status_code == 200, whole.text
    body = whole.json()
    texts = [c["text"] for c in body["choices"]]
    assert len(set(texts)) == 3 and all(c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 18
    streamed: dict[int, str] = {}
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/completions",
        json={"model": "flint", **BASE, "use_beam_search": True, "n": 3, "stream": True},
        timeout=120,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    streamed[c["index"]] = streamed.get(c["index"], "") + c["text"]
    assert [streamed[i] for i in range(3)] == texts


def test_beam_steps_are_work_not_requests_in_the_engines_metrics(server) -> None:
    """A beam search's one-token steps run as engine requests, but the engine's request metrics (finished requests,
    time to first token, lengths) do not count them; their tokens still count as generated."""
    m = server.engine.engine.metrics
    before = (sum(m.finished.values()), m.ttft.count, m.e2e.count, m.generation_tokens)
    r = post(server, {**BASE, "use_beam_search": True, "n": 2})
    assert r.status_code == 200, r.text
    after = (sum(m.finished.values()), m.ttft.count, m.e2e.count, m.generation_tokens)
    assert after[:3] == before[:3]
    assert after[3] - before[3] == 1 + 2 * 5  # a token a live beam a step: the first step has the prompt alone
    post(server, {**BASE, "temperature": 0})  # an ordinary request still counts
    assert sum(m.finished.values()) == after[0] + 1 and m.ttft.count == after[1] + 1


def test_each_prompt_has_its_beams(server) -> None:
    r = post(
        server, {**BASE, "prompt": ["The capital of", "Once upon a time there was"], "use_beam_search": True, "n": 2}
    )
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    alone = post(server, {**BASE, "prompt": "Once upon a time there was", "use_beam_search": True, "n": 2}).json()
    assert [c["text"] for c in choices[2:]] == [c["text"] for c in alone["choices"]]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 11}, "n"),
        ({"stop": ["x"]}, "stop"),
        ({"logprobs": 2}, "logprobs"),
        ({"guided_regex": "[a-z]+"}, "guided_*"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
    ],
)
def test_what_beam_search_does_not_combine_with_is_refused(server, extra: dict, param: str) -> None:
    r = post(server, {**BASE, "use_beam_search": True, "n": 2, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def chat(server, body: dict) -> httpx.Response:
    ask = {"model": "flint", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "ignore_eos": True}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json={**ask, **body}, timeout=120)


def test_beam_search_on_chat_parses_each_beam(server) -> None:
    """On chat the beams run over the templated prompt and each is parsed as an answer (thinking, then content)."""
    for thinking in (True, False):
        kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}}
        greedy = chat(server, {**kwargs, "temperature": 0}).json()["choices"][0]["message"]
        one = chat(server, {**kwargs, "use_beam_search": True}).json()["choices"][0]["message"]
        assert one == greedy
        beams = chat(server, {**kwargs, "use_beam_search": True, "n": 3}).json()["choices"]
        assert len({json.dumps(c["message"], sort_keys=True) for c in beams}) == 3
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = chat(server, {"use_beam_search": True, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
