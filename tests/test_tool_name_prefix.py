"""tool_choice "required": the model names one of the offered tools (`flint_engine.tool_name_prefix`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.parsers.tool_calls import ToolCallParser
from flint_engine.sampling_params import SamplingParams, SamplingParamsError
from flint_engine.tool_name_prefix import ToolNamePrefix, callable_name

DEMO = Path(__file__).resolve().parent.parent / "flint_engine" / "assets" / "flint-demo.gguf"


def test_prefixes_of_offered_names_only() -> None:
    p = ToolNamePrefix(["search", "search_web", "get_weather"])
    for piece in (b"s", b"search", b"search_w", b"get_", b"get_weather", b"search<arg_key>", b"get_weather\n"):
        assert p.accepts(piece), piece
    for piece in (b"", b"x", b"Search", b"searc h", b"search_x", b"get_weathers", b"\nsearch", b"calculator"):
        assert not p.accepts(piece), piece
    assert not p.done


def test_done_once_a_name_is_followed_by_what_ends_it() -> None:
    names = ["search", "search_web"]
    for pieces, name in (
        ([b"sea", b"rch", b"<arg_key>"], "search"),
        ([b"search", b"_web", b"</tool_call>"], "search_web"),
        ([b"search_web\n"], "search_web"),
    ):
        p = ToolNamePrefix(names)
        for i, piece in enumerate(pieces):
            assert p.accepts(piece)
            p.feed(piece)
            assert p.done == (i == len(pieces) - 1)
        assert p.accepts(b"anything at all") and p.accepts(b"")  # the arguments are the model's
        assert ToolCallParser().extract(f"<tool_call>{p.text.decode()}</tool_call>").calls[0].name == name


def test_random_names_and_splits() -> None:
    """Any split of an offered name plus its end is accepted piece by piece; a byte off any name is refused."""
    rng = random.Random(7)
    alphabet = "abcdefghij_-0123456789"
    for _ in range(200):
        names = ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(rng.randint(1, 5))]
        name = rng.choice(names)
        text = (name + rng.choice(["<arg_key>", "</tool_call>", "\n", " "])).encode()
        cuts = sorted(rng.sample(range(1, len(text)), k=min(3, len(text) - 1)))
        p = ToolNamePrefix(names)
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            assert p.accepts(text[a:b]), (names, text, a, b)
            p.feed(text[a:b])
        assert p.done
        q = ToolNamePrefix(names)
        q.feed(name[:-1].encode())
        bad = [c for c in alphabet if not any(n.startswith(name[:-1] + c) for n in names)]
        if bad:
            assert not q.accepts(rng.choice(bad).encode())


@pytest.mark.parametrize("bad", [(), ("",), ("a b",), ("a<b",), ("ok", "tab\there")])
def test_sampling_params_refuse_names_a_call_cannot_carry(bad: tuple[str, ...]) -> None:
    with pytest.raises(SamplingParamsError, match="tool_names"):
        SamplingParams(tool_names=bad)
    assert SamplingParams(tool_names=("get_weather", "calc-2")).tool_names == ("get_weather", "calc-2")
    assert callable_name("get_weather") and not any(map(callable_name, ("", "a b", "a<b", "x\n", 3)))


def test_the_demo_model_names_an_offered_tool() -> None:
    """The demo model, after `<tool_call>`, names tools it was trained on; constrained, only the offered ones."""
    engine = LLMEngine.from_checkpoint(
        EngineConfig(model=str(DEMO), device="cpu", dtype="float32", kv_cache_memory=32 * 2**20), progress=False
    )
    tok = engine.tokenizer
    offered = ("lookup_stock", "get_weather")
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
        for n in offered
    ]
    names_free, names_constrained = [], []
    for question in ("What is 12 + 30?", "Tell me about black holes", "Weather in Oslo?", "Count to three"):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], tools, add_generation_prompt=True, enable_thinking=False
        )
        ids = tok.encode(prompt + "<tool_call>")
        for seed in (1, 2):
            kw = {"max_tokens": 8, "temperature": 1.0, "top_k": 0, "seed": seed}
            free, constrained = engine.generate(
                [ids, ids], [SamplingParams(**kw), SamplingParams(**kw, tool_names=offered)]
            )
            names_free.append(tok.decode(free.output_token_ids).split("<")[0].split()[0])
            names_constrained.append(tok.decode(constrained.output_token_ids).split("<")[0].split()[0])
    assert set(names_constrained) <= set(offered), names_constrained
    assert not set(names_free) <= set(offered), names_free  # unconstrained, the model names other tools
