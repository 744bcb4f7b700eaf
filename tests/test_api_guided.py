"""vLLM's choice, regex and grammar constraints through the HTTP API (`guided_choice`, `guided_regex`,
`guided_grammar`, `structured_outputs`),
on chat (after the thinking) and text completions (from the first token), streamed and not; and an engine step
that holds a request whose pattern nothing continues, beside one that has no constraint."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import regex
from api_fixtures import module_server, tiny_checkpoint, tiny_engine

from flint_engine.sampling_params import SamplingParams

MSG = [{"role": "user", "content": "Is the sky blue?"}]
CHOICES = ["yes", "no", "maybe not"]
PATTERN = r"[0-9]{3}-[a-z]{2}"
# A recursive grammar (sums of numbers and bracketed sums), and the same language as a recursive pattern (the oracle).
GRAMMAR = 'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]{1,3} | "(" expr ")"'
GRAMMAR_PATTERN = r"(?P<e>(?P<t>[0-9]{1,3}|\((?&e)\))(\+(?&t))*)"
BOUNDED = regex.compile(r"\([0-9]{1,3}(\+[0-9]{1,3}){0,3}\)")


server = module_server("guided")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "flint", **body}, timeout=120)


def chat_answers(server, extra: dict, thinking: bool, seeds: range = range(4)) -> list[tuple[str, str]]:
    out = []
    for seed in seeds:
        body = {"messages": MSG, "max_tokens": 120, "seed": seed, "top_k": 5, **extra}
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
        r = post(server, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        out.append((choice["message"].get("content") or "", choice["finish_reason"]))
    return out


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("spelling", ["guided_choice", "structured_outputs"])
def test_chat_answers_one_of_the_choices(server, spelling: str, thinking: bool) -> None:
    extra = {"guided_choice": CHOICES} if spelling == "guided_choice" else {"structured_outputs": {"choice": CHOICES}}
    answers = chat_answers(server, extra, thinking)
    for content, finish in answers:
        if finish == "stop":
            assert content in CHOICES
        else:  # out of tokens (in the thinking, or inside "maybe not"): a prefix of a choice
            assert finish == "length" and any(c.startswith(content) for c in CHOICES)
    assert sum(finish == "stop" for _, finish in answers) >= 2, answers


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize(
    ("field", "key", "spec", "oracle", "stops"),
    [
        ("guided_regex", "regex", PATTERN, PATTERN, 2),
        # (sums go on as long as the model likes: fewer of the random model's answers stop)
        ("guided_grammar", "grammar", GRAMMAR, GRAMMAR_PATTERN, 1),
    ],
    ids=["regex", "grammar"],
)
def test_chat_answer_matches_the_pattern_or_grammar(
    server, field: str, key: str, spec: str, oracle: str, stops: int, thinking: bool
) -> None:
    for extra in ({field: spec}, {"structured_outputs": {key: spec}}):
        answers = chat_answers(server, extra, thinking)
        for content, finish in answers:
            if finish == "stop":
                assert regex.fullmatch(oracle, content), content
            else:
                assert finish == "length" and regex.fullmatch(oracle, content, partial=True), content
        assert sum(finish == "stop" for _, finish in answers) >= stops, answers


def test_streamed_choices_equal_the_whole_answer(client) -> None:
    kw = dict(model="flint", messages=MSG, max_tokens=120, seed=7, n=2)
    extra = {"guided_choice": CHOICES, "top_k": 5, "chat_template_kwargs": {"enable_thinking": False}}
    whole = client.chat.completions.create(**kw, extra_body=extra)
    parts: dict[int, str] = {}
    for chunk in client.chat.completions.create(**kw, extra_body=extra, stream=True):
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
    assert [parts[i] for i in range(2)] == [c.message.content for c in whole.choices]
    assert all(c.message.content in CHOICES and c.finish_reason == "stop" for c in whole.choices)


def test_completions_hold_the_constraint_from_the_first_token(server) -> None:
    for extra, ok in (
        ({"guided_choice": ["Paris", "London"]}, lambda t: t in ("Paris", "London")),
        ({"guided_regex": PATTERN}, lambda t: regex.fullmatch(PATTERN, t)),
        # (a grammar of short sentences: the random model stops once one is whole)
        ({"guided_grammar": 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [0-9]{1,3}'}, lambda t: BOUNDED.fullmatch(t)),
        # (the same language in Lark, vLLM's other grammar syntax)
        ({"guided_grammar": 'start: "(" NUM ("+" NUM)~0..3 ")"\nNUM: /[0-9]{1,3}/'}, lambda t: BOUNDED.fullmatch(t)),
        ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}}, None),
    ):
        r = post(server, "/v1/completions", {"prompt": "The capital", "max_tokens": 60, "seed": 3, "n": 2, **extra})
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            if ok is None:  # the JSON schema: an object with an integer "a" at most, or a prefix of one
                assert choice["text"].lstrip().startswith("{")
                if choice["finish_reason"] == "stop":
                    assert set(json.loads(choice["text"])) <= {"a"}
            else:
                assert choice["finish_reason"] == "stop" and ok(choice["text"]), choice


def test_constrained_logprobs_are_the_tokens_taken(server) -> None:
    """Each token's logprob is the one the model gave the token the constraint let through (the random model's own
    favourite is refused at most steps), as the model reads that token back as part of a prompt."""
    body = {"prompt": "The capital", "max_tokens": 8, "temperature": 0, "logprobs": 0, "guided_choice": CHOICES}
    r = post(server, "/v1/completions", {**body, "return_token_ids": True})
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert choice["text"] in CHOICES
    ids = choice["prompt_token_ids"] + choice["token_ids"]
    scored = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}).json()
    read_back = [row[str(t)]["logprob"] for row, t in zip(scored["choices"][0]["prompt_logprobs"], ids) if row]
    n = len(choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(read_back[-n:], abs=2e-3)


def test_constraints_refused_with_a_forced_tool_call(server) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for extra, param in (
        ({"guided_choice": ["a"]}, "guided_choice"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"guided_grammar": 'root ::= "a"+'}, "guided_grammar"),
    ):
        body = {"messages": MSG, "tools": tools, "tool_choice": "required", **extra}
        r = post(server, "/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "forced tool_choice" in r.json()["error"]["message"]


def test_a_pattern_nothing_continues_ends_its_output_not_the_step(tmp_path) -> None:
    """`ab\\bc` can never match past "ab" (no word boundary between two letters): the sampler finds no token, and
    that request ends there ("stop") while the unconstrained one in the same steps runs to its length."""
    engine = tiny_engine(tiny_checkpoint(tmp_path))
    tok = engine.tokenizer
    stuck, free = engine.generate(
        [tok.encode("Hello"), tok.encode("Hello")],
        [SamplingParams(max_tokens=12, seed=1, regex=r"ab\bc"), SamplingParams(max_tokens=12, seed=1)],
    )
    assert stuck.finish_reason == "stop" and tok.decode(stuck.output_token_ids[:-1]) == "ab"
    assert stuck.output_token_ids[-1] in engine.eos_token_ids
    assert free.finish_reason == "length" and len(free.output_token_ids) == 12
