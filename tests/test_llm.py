"""`flint_engine.LLM`: generation in this process, with the chat template and the API's parsers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flint_engine import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from demo_corpus import samples, score  # noqa: E402
from eval_demo import openai_messages  # noqa: E402

SEED = 424_242  # held out from the demo model's training batches and from tools/eval_demo.py


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(device="cpu", dtype="float32", kv_cache_memory=32 * 2**20, progress=False)


def test_chat_answers_arithmetic_and_tool_prompts(llm: LLM) -> None:
    """The demo model's held-out prompts, each alone in its own call and all in one batch: the same greedy tokens,
    and the answers (reasoning, content, parsed tool calls) are right as the API's evaluation scores them."""
    cases = samples(SEED, 4, kind="arith", thinking=True) + samples(SEED + 1, 4, kind="tool", thinking=True)
    greedy = SamplingParams(temperature=0, max_tokens=96)
    right = 0
    for sample in cases:
        [alone] = llm.chat(openai_messages(sample), greedy, tools=sample.tools)
        calls = [c.to_openai() for c in alone.tool_calls]
        right += score(sample, alone.reasoning, alone.content, calls)
        assert alone.reasoning, sample.prompt_messages
        if calls:
            assert alone.finish_reason == "tool_calls" and alone.to_openai()["tool_calls"] == calls
            assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)
    assert right >= 7, f"{right} of {len(cases)} right"
    # Same greedy tokens in one batch (each conversation with its own tools is a separate call's job: no tools here).
    arith = [openai_messages(s) for s in cases[:4]]
    batch = llm.chat(arith, greedy)
    assert [r.token_ids for r in batch] == [llm.chat(c, greedy)[0].token_ids for c in arith]


def test_thinking_off_and_json_mode(llm: LLM) -> None:
    question = [{"role": "user", "content": "What is 3 + 4?"}]
    [off] = llm.chat(question, SamplingParams(temperature=0, max_tokens=32), enable_thinking=False)
    assert off.reasoning is None and off.content
    # Structured output starts after the thinking, as in the API: the content is an instance of the schema whatever
    # the demo model (never trained on JSON) would rather say.
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    for seed in range(2):
        params = SamplingParams(seed=seed, max_tokens=300, json_mode=True, json_schema=schema)
        [js] = llm.chat(question, params)
        assert js.finish_reason == "stop" and js.reasoning, js
        assert json.loads(js.content)["color"] in ("red", "green")


def test_choice_and_regex_after_the_thinking(llm: LLM) -> None:
    """The demo model thinks as usual, then answers under the constraint; raw generation is held from the first
    token."""
    question = [{"role": "user", "content": "What is 3 + 4?"}]
    [pick] = llm.chat(question, SamplingParams(temperature=0, max_tokens=200, choice=("seven", "7", "eight")))
    assert pick.finish_reason == "stop" and pick.reasoning and pick.content in ("seven", "7", "eight"), pick
    [number] = llm.chat(question, SamplingParams(temperature=0, max_tokens=200, regex=r"[0-9]+ exactly"))
    assert number.finish_reason == "stop" and number.reasoning and number.content.endswith(" exactly"), number
    assert number.content.split()[0].isdigit()
    [raw] = llm.generate("3 + 4 =", SamplingParams(temperature=0, max_tokens=20, choice=("yes", "no")))
    assert raw.finish_reason == "stop" and raw.text in ("yes", "no")


def test_generate_continues_text_and_ids(llm: LLM) -> None:
    [a, b] = llm.generate(["Hello", llm.tokenizer.encode("Hello")], SamplingParams(temperature=0, max_tokens=6))
    assert a.prompt_token_ids == b.prompt_token_ids and a.token_ids == b.token_ids
    assert a.finish_reason == "length" and len(a.token_ids) == 6
    assert a.text == llm.tokenizer.decode(a.token_ids) and a.text


@pytest.mark.parametrize(
    ("conversations", "tools", "says"),
    [
        ([], None, "no conversation"),
        ([[]], None, "conversation 0 is empty"),
        ([{"role": "robot", "content": "x"}], None, "message 0 role"),
        ([{"role": "user"}], None, "a user message needs content"),
        ([{"role": "user", "content": "x"}], [], "tools must not be an empty list"),
        ([{"role": "user", "content": "x"}], [{"type": "function", "function": {"name": "a b"}}], "whitespace"),
    ],
)
def test_bad_input_is_a_value_error(llm: LLM, conversations: list, tools: list | None, says: str) -> None:
    with pytest.raises(ValueError, match=says) as e:
        llm.chat(conversations, tools=tools)
    assert "Value error" not in str(e.value)


def test_n_choices_come_one_after_another(llm: LLM) -> None:
    """n > 1: each prompt's choices in a row, seeded as the API seeds them (seed + index), so choice i equals a
    single-choice request with seed + i."""
    convs = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": "Count to three."}]]
    many = llm.chat(convs, SamplingParams(n=3, seed=11, max_tokens=24))
    assert len(many) == 6
    for k, conv in enumerate(convs):
        for i in range(3):
            [one] = llm.chat(conv, SamplingParams(seed=11 + i, max_tokens=24))
            assert many[3 * k + i].token_ids == one.token_ids
    texts = llm.generate(["Hello", "The"], SamplingParams(n=2, seed=3, max_tokens=5))
    assert [t.prompt_token_ids for t in texts] == [llm.tokenizer.encode(p) for p in ("Hello", "Hello", "The", "The")]


def test_generate_refuses_no_prompts(llm: LLM) -> None:
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([])


def test_generate_returns_logprobs_and_prompt_logprobs(llm: LLM) -> None:
    """A prompt scored as lm-evaluation-harness scores it: the continuation's tokens' log-probabilities summed from
    prompt_logprobs, and the generated tokens' logprobs (greedy: each the top alternative)."""
    [c] = llm.generate("What is 7 + 8?", SamplingParams(temperature=0, max_tokens=3, logprobs=1, prompt_logprobs=1))
    assert c.prompt_logprobs is not None and c.prompt_logprobs[0] is None
    assert [e[0] for e in c.prompt_logprobs[1:]] == c.prompt_token_ids[1:]
    assert all(e[1] <= 0.0 and len(e[2]) == 1 and e[2][0][1] >= e[1] for e in c.prompt_logprobs[1:])
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    assert all(top[0][0] == t and top[0][1] == lp for t, (lp, top) in zip(c.token_ids, c.logprobs))


def test_beam_search_finds_the_best_scored_beams(llm: LLM) -> None:
    """One beam is greedy decoding; three are distinct, best first, each scored by its tokens' log-probabilities as
    the model gives them when it reads the beam back as a prompt; two prompts search in the same batches."""
    prompt = llm.tokenizer.encode("What is 7 + 8?")
    other = llm.tokenizer.encode("Name a colour.")
    [greedy] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    [[one]] = llm.beam_search([prompt], 1, 6, ignore_eos=True)
    assert one.token_ids == greedy.token_ids and one.finish_reason == "length"
    beams, others = llm.beam_search([prompt, other], 3, 6, ignore_eos=True)
    assert len({tuple(b.token_ids) for b in beams}) == 3 and len(others) == 3
    logprobs = [b.cumulative_logprob for b in beams]
    assert logprobs == sorted(logprobs, reverse=True)
    for b in beams:
        [read] = llm.generate([prompt + b.token_ids], SamplingParams(max_tokens=1, prompt_logprobs=0))
        total = sum(read.prompt_logprobs[len(prompt) + i][1] for i in range(len(b.token_ids)))
        assert total == pytest.approx(b.cumulative_logprob, abs=1e-3)
    ended = [b for b in llm.beam_search([prompt], 3, 40)[0] if b.finish_reason == "stop"]
    eos = llm.engine.eos_token_ids
    assert ended and all(b.token_ids[-1] in eos and not set(b.token_ids[:-1]) & eos for b in ended)


def test_beam_search_refuses_what_cannot_fit(llm: LLM) -> None:
    with pytest.raises(ValueError, match="exceed the model's context"):
        llm.beam_search("hi", 2, llm.engine.max_model_len)
    with pytest.raises(ValueError, match="beam width must be 1 to 10"):
        llm.beam_search("hi", 11, 4)


def test_chat_continues_an_assistant_turn_begun_by_the_caller(llm: LLM) -> None:
    """`continue_final_message`: given the first tokens of the demo model's own greedy answer as the assistant's
    turn, the model writes the rest of that same answer."""
    question = [{"role": "user", "content": "What is 12 + 9?"}]
    greedy = SamplingParams(temperature=0, max_tokens=32)
    [whole] = llm.chat(question, greedy, enable_thinking=False)
    tok = llm.engine.tokenizer
    ids = [t for t in whole.token_ids if t not in tok.eos_token_ids]
    assert len(ids) >= 2, whole
    begun = tok.decode(ids[:1])
    turn = [*question, {"role": "assistant", "content": begun}]
    [rest] = llm.chat(turn, greedy, enable_thinking=False, continue_final_message=True)
    assert begun + rest.content == whole.content


def test_strict_tools_held_to_their_schema(llm: LLM) -> None:
    """A strict tool's calls fit its schema, as through the API; a strict schema that cannot be held is a ValueError."""
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Oslo", "Lisbon"]}, "days": {"type": "integer", "maximum": 2}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    question = [{"role": "user", "content": "What's the weather in Tokyo for 5 days?"}]
    greedy = SamplingParams(temperature=0, max_tokens=96)
    args = []
    for strict in (False, True):
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": schema, "strict": strict}}
        [reply] = llm.chat(question, greedy, tools=[tool])
        args.append(json.loads(reply.tool_calls[0].arguments))
    assert args[0] == {"city": "Tokyo", "days": 5}  # what the demo model calls with, unheld
    assert args[1]["city"] in ("Oslo", "Lisbon") and args[1]["days"] <= 2 and set(args[1]) == {"city", "days"}
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": 1}}}
    bad["function"]["strict"] = True
    with pytest.raises(ValueError, match="tool 0 \\(f\\) is strict"):
        llm.chat(question, greedy, tools=[bad])
