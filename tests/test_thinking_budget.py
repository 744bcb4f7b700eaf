"""A cap on the reasoning (vLLM's `thinking_token_budget`, Anthropic's `thinking.budget_tokens`): after that many
tokens of thinking `</think>` is forced and the answer follows, in the engine, the Python API and both HTTP APIs."""

from __future__ import annotations

import httpx
from api_fixtures import module_server, tiny_checkpoint, tiny_engine, tiny_server

from flint_engine import LLM, SamplingParams
from flint_engine.parsers.reasoning import THINK_END, TOOL_CALL_START

QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]


server = module_server("budget")


def test_the_engine_forces_the_end_of_the_reasoning_at_the_budget(tmp_path) -> None:
    engine = tiny_engine(tiny_checkpoint(tmp_path))
    end = engine.tokenizer.token_to_id(THINK_END)
    prompt = engine.tokenizer.encode("Hello")
    free, capped, zero = engine.generate(
        [prompt] * 3,
        [
            SamplingParams(max_tokens=24, seed=2, ignore_eos=True, reasoning_end_token=end),
            SamplingParams(max_tokens=24, seed=2, ignore_eos=True, reasoning_end_token=end, thinking_token_budget=5),
            SamplingParams(max_tokens=24, seed=2, ignore_eos=True, reasoning_end_token=end, thinking_token_budget=0),
        ],
    )
    assert end not in free.output_token_ids[:6]  # the random model would go on "thinking"
    assert capped.output_token_ids[:5] == free.output_token_ids[:5] and capped.output_token_ids[5] == end
    assert zero.output_token_ids[0] == end
    # Only one </think> is forced: after it the output runs free to its length.
    assert capped.output_token_ids.count(end) == 1 and len(capped.output_token_ids) == 24
    # A tool call opened inside the reasoning ends it (as the reasoning parser reads it): nothing is forced into it.
    call = engine.tokenizer.token_to_id(TOOL_CALL_START)
    [calling] = engine.generate(
        [prompt],
        SamplingParams(
            max_tokens=6, temperature=0, ignore_eos=True, reasoning_end_token=end, thinking_token_budget=2,
            logit_bias={call: 100.0},
        ),
    )  # fmt: skip
    assert calling.output_token_ids[0] == call and end not in calling.output_token_ids


def test_the_demo_model_answers_after_a_capped_thinking() -> None:
    llm = LLM(device="cpu", dtype="float32", kv_cache_memory=16 * 2**20, progress=False)
    end = llm.tokenizer.token_to_id(THINK_END)
    [full] = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=80))
    [capped] = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=80, thinking_token_budget=4))
    assert full.token_ids.index(end) > 4 and capped.token_ids.index(end) == 4
    assert capped.token_ids[:4] == full.token_ids[:4] and capped.content and capped.finish_reason == "stop"


def test_chat_thinking_token_budget(server) -> None:
    def reasoning(budget: int | None) -> str:
        body = {"model": "flint", "messages": QUESTION, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        if budget is not None:
            body["thinking_token_budget"] = budget
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"].get("reasoning") or ""

    full, capped, none = reasoning(None), reasoning(3), reasoning(0)
    assert full.startswith(capped) and 0 < len(capped) < len(full) and none == ""
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "flint", "messages": QUESTION, "thinking_token_budget": -1},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget"


def test_anthropic_budget_tokens(server) -> None:
    def thinking(spec: dict | None) -> httpx.Response:
        body = {"model": "flint", "messages": QUESTION, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        if spec is not None:
            body["thinking"] = spec
        return httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=60)

    def text_of(r: httpx.Response) -> str:
        assert r.status_code == 200, r.text
        return "".join(b["thinking"] for b in r.json()["content"] if b["type"] == "thinking")

    full = text_of(thinking(None))
    capped = text_of(thinking({"type": "enabled", "budget_tokens": 3}))
    assert full.startswith(capped) and 0 < len(capped) < len(full)
    bad = thinking({"type": "enabled", "budget_tokens": "many"})
    assert bad.status_code == 400 and bad.json()["type"] == "error" and "budget_tokens" in bad.text


def test_server_default_and_effort_budgets(tmp_path) -> None:
    """An operator's caps (`api.thinking_token_budget`, `api.reasoning_effort_budgets`) for requests that name no
    budget: by reasoning effort on all three APIs, else the default; a request's own budget wins."""
    from flint_engine.api.settings import APISettings

    settings = APISettings(thinking_token_budget=2, reasoning_effort_budgets={"low": 0, "high": 40})
    srv = tiny_server(tmp_path, settings)
    try:
        url = srv.base_url

        def chat(**extra) -> str:
            body = {"model": "flint", "messages": QUESTION, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
            r = httpx.post(f"{url}/v1/chat/completions", json={**body, **extra}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"].get("reasoning") or ""

        default, low, high, own = (
            chat(),
            chat(reasoning_effort="low"),
            chat(reasoning_effort="high"),
            chat(thinking_token_budget=5),
        )
        assert low == "" and 0 < len(default) < len(own) < len(high)
        assert high.startswith(own) and own.startswith(default)
        assert chat(reasoning_effort="medium") == default  # an effort without a budget: the server's default
        body = {"model": "flint", "input": QUESTION, "max_output_tokens": 60, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/responses", json={**body, "reasoning": {"effort": "low"}}, timeout=60)
        assert r.status_code == 200 and all(i["type"] != "reasoning" for i in r.json()["output"]), r.text
        msg = {"model": "flint", "messages": QUESTION, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/messages", json={**msg, "output_config": {"effort": "high"}}, timeout=60)
        thinking = "".join(b["thinking"] for b in r.json()["content"] if b["type"] == "thinking")
        assert thinking == high
    finally:
        srv.stop()
