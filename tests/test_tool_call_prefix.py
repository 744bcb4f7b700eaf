"""Tool calls held to the offered tools (`flint_engine.tool_call_prefix`): tool_choice "required" names an offered
tool; a strict tool's arguments fit its schema, as the tool-call parser reads them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from api_fixtures import WEATHER_SCHEMA

from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.json_schema_prefix import SchemaError
from flint_engine.output_constraint import token_filter
from flint_engine.parsers.tool_calls import ToolCallParser
from flint_engine.sampling_params import SamplingParams, SamplingParamsError
from flint_engine.tool_call_prefix import (
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    VALUE_CLOSE,
    VALUE_OPEN,
    ToolCallPrefix,
    callable_name,
    compile_tool_arguments,
    tool_call_prefix,
)

DEMO = Path(__file__).resolve().parent.parent / "flint_engine" / "assets" / "flint-demo.gguf"


def names_only(names: list[str]) -> ToolCallPrefix:
    """tool_choice "required" over tools that are not strict: the name held, the rest free."""
    p = tool_call_prefix(tuple(names), None)
    assert p is not None
    return p


def test_prefixes_of_offered_names_only() -> None:
    p = names_only(["search", "search_web", "get_weather"])
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
        p = names_only(names)
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
        p = names_only(names)
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            assert p.accepts(text[a:b]), (names, text, a, b)
            p.feed(text[a:b])
        assert p.done
        q = names_only(names)
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


# ----------------------------------------------------------------------------------------------- strict tools
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2, "pattern": "^[A-Z]"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": ["string", "null"], "enum": ["c", "f", None]},
        "note": {"type": "string"},
        "where": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "exact": {"type": "boolean"},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = {"get_weather": WEATHER, "calculator": None}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": s or {"type": "object"}}} for n, s in TOOLS.items()
]
TAGS_IN_ORDER = [CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE]
RAW = {"city", "note", "unit"}  # written raw by the chat template (strings; `unit` may also be null)


def held(opened: bool = True) -> ToolCallPrefix:
    p = tool_call_prefix(("get_weather",) if opened else None, TOOLS)
    assert p is not None
    return p


def call_pieces(name: str, args: dict, rng: random.Random) -> list[bytes]:
    """The call as the chat template writes it (tags as whole pieces, the text between them cut at random)."""

    def cut(text: str) -> list[bytes]:
        data = text.encode()
        if len(data) < 2:
            return [data] if data else []
        cuts = sorted(rng.sample(range(1, len(data)), k=min(3, len(data) - 1)))
        return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]

    pieces = cut(name)
    for key, value in args.items():
        raw = value if key in RAW and isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        pieces += [KEY_OPEN, *cut(key), KEY_CLOSE, VALUE_OPEN, *cut(raw), VALUE_CLOSE]
    return [*pieces, CALL_CLOSE]


def random_args(rng: random.Random) -> dict:
    letters = 'abcxyz "\\\n\té数<>/'
    args = {
        "city": rng.choice("ABCOP") + "".join(rng.choices(letters, k=rng.randint(1, 12))),
        "days": rng.randint(1, 7),
    }
    optional = {
        "unit": rng.choice(["c", "f", None]),
        "note": "".join(rng.choices(letters, k=rng.randint(0, 20))),
        "where": {"lat": round(rng.uniform(-90, 90), 3), "lon": rng.randint(-180, 180)},
        "tags": [rng.choice(["a", "b c", "</"]) for _ in range(rng.randint(0, 3))],
        "exact": rng.random() < 0.5,
    }
    args.update({k: v for k, v in optional.items() if rng.random() < 0.5})
    keys = list(args)
    rng.shuffle(keys)
    return {k: args[k] for k in keys}


def test_strict_calls_as_the_template_writes_them_are_held_and_parse_to_their_arguments() -> None:
    rng = random.Random(11)
    parser = ToolCallParser(tools=OPENAI_TOOLS)
    for _ in range(150):
        args = random_args(rng)
        p = held()
        for piece in call_pieces("get_weather", args, rng):
            assert p.active and p.accepts(piece), (args, piece)
            assert p.feed(piece)
        assert not p.active and p.can_end and not p.done  # between calls: free, a later call held again
        text = "<tool_call>" + b"".join(call_pieces("get_weather", args, rng)).decode()
        (call,) = parser.extract(text).calls
        assert json.loads(call.arguments) == args


GOOD = [b"get_weather", KEY_OPEN, b"city", KEY_CLOSE, VALUE_OPEN, b"Oslo", VALUE_CLOSE]


@pytest.mark.parametrize(
    ("before", "refused"),
    [
        ([], b"search"),  # not an offered tool
        ([b"get_weather"], b"\n"),  # nothing between the tags
        ([b"get_weather"], CALL_CLOSE),  # the required parameters first
        ([b"get_weather", KEY_OPEN], b"town"),  # not a declared parameter
        ([*GOOD, KEY_OPEN], b"city"),  # given already
        (GOOD, CALL_CLOSE),  # `days` is required
        (GOOD[:5], b"oslo"),  # the city's pattern: a capital first
        ([*GOOD[:5], b"O"], VALUE_CLOSE),  # minLength 2
        ([*GOOD[:5], b"Os"], b"lo</arg_value>"),  # a tag's text inside a value: the parser would end it there
        ([*GOOD[:5], b"Os</arg_"], b"value>"),  # ... also across pieces
        ([*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN], b"8"),  # maximum 7
        ([*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN], b"0"),  # minimum 1
        ([*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN, b"1"], b".5"),  # an integer
        ([*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN], b" 3"),  # values compact, as the template writes them
        ([*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN, b"3"], b" "),
        ([*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN], b'"3"'),
        ([*GOOD, KEY_OPEN, b"unit", KEY_CLOSE, VALUE_OPEN], b"x"),  # c, f or null
        ([*GOOD, KEY_OPEN, b"unit", KEY_CLOSE, VALUE_OPEN, b"nul"], VALUE_CLOSE),
        ([*GOOD, KEY_OPEN, b"where", KEY_CLOSE, VALUE_OPEN, b'{"lat": 1'], b"}"),  # lon is required
        ([*GOOD, KEY_OPEN, b"where", KEY_CLOSE, VALUE_OPEN, b'{"lat": 1e999, "lon": 2}'], VALUE_CLOSE),  # infinite
        ([*GOOD, KEY_OPEN, b"tags", KEY_CLOSE, VALUE_OPEN, b'["a", "b", "c"'], b', "d"'),  # maxItems 3
        ([*GOOD, KEY_OPEN, b"exact", KEY_CLOSE, VALUE_OPEN], b"True"),  # JSON's true
        (GOOD, b"<|user|>"),  # another special token's text
    ],
)
def test_what_a_strict_call_refuses(before: list[bytes], refused: bytes) -> None:
    p = held()
    for piece in before:
        assert p.accepts(piece), piece
        assert p.feed(piece)
    assert not p.accepts(refused)
    assert not p.feed(refused) and p.done  # a piece fed against the rules ends the hold, never fails the request


def test_free_between_calls_a_free_tool_free_and_each_later_call_held() -> None:
    p = held(opened=False)
    assert not p.active and p.accepts(b"any text <think> at all") and p.can_end
    for piece in (b"Let me check. ", CALL_OPEN):
        p.feed(piece)
    assert p.active and not p.accepts(b"search") and p.accepts(b"calc")
    for piece in (b"calculator", KEY_OPEN):
        assert p.accepts(piece) and p.feed(piece)
    for piece in (b"whatever", KEY_CLOSE, VALUE_OPEN, b"1+1 </arg_value>", VALUE_CLOSE):
        assert not p.active  # a tool that is not strict: its arguments are the model's
        assert p.accepts(piece) and p.feed(piece)
    p.feed(CALL_CLOSE)
    p.feed(b"\n")
    p.feed(CALL_OPEN)
    assert p.active and p.accepts(b"get_weather") and not p.accepts(b"x")


@pytest.mark.parametrize(
    ("parameters", "why"),
    [
        ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "string or integer"),
        ({"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": True}, "declared"),
        ({"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 2}}}, "multipleOf"),
        ({"type": "object", "properties": {"a</arg_key>": {"type": "string"}}}, "tag"),
        ({"type": "object", "properties": {" x": {"type": "string"}}}, "blanks"),
        ("not a schema", "JSON Schema"),
    ],
)
def test_strict_schemas_that_cannot_be_enforced_are_refused(parameters, why: str) -> None:
    with pytest.raises(SchemaError, match=why):
        compile_tool_arguments(parameters)
    with pytest.raises(SamplingParamsError, match="tool_schemas"):
        SamplingParams(tool_schemas={"f": parameters})


def test_sampling_params_check_the_held_tools() -> None:
    assert SamplingParams(tool_schemas=TOOLS, tool_names=("get_weather",)).tool_schemas == TOOLS
    with pytest.raises(SamplingParamsError, match="tool_names"):
        SamplingParams(tool_schemas=TOOLS, tool_names=("search",))
    with pytest.raises(SamplingParamsError, match="tool_schemas"):
        SamplingParams(tool_schemas=TOOLS, json_mode=True)


def fits_city_days(args: dict) -> bool:
    return set(args) == {"city", "days"} and args["city"] in ("Oslo", "Lisbon") and args["days"] in (1, 2, 3)


def test_the_demo_model_held_to_a_strict_tool() -> None:
    """The demo model, forced to call get_weather, writes other tools and values out of the schema when free; held
    to the strict schema, every call parses to arguments that fit it."""
    engine = LLMEngine.from_checkpoint(
        EngineConfig(model=str(DEMO), device="cpu", dtype="float32", kv_cache_memory=32 * 2**20), progress=False
    )
    tok = engine.tokenizer
    schema = WEATHER_SCHEMA
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]
    parser = ToolCallParser(tools=tools)
    free_fit, held_fit = [], []
    for question in ("Weather in Oslo?", "What's the weather in Tokyo for 5 days?", "What is 12 + 30?"):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], tools, add_generation_prompt=True, enable_thinking=False
        )
        ids = tok.encode(prompt + "<tool_call>")
        for seed in (1, 2):
            kw = {"max_tokens": 40, "temperature": 1.0, "top_k": 0, "seed": seed}
            strict = {"tool_names": ("get_weather",), "tool_schemas": {"get_weather": schema}}
            free, constrained = engine.generate([ids, ids], [SamplingParams(**kw), SamplingParams(**kw, **strict)])
            for out, fit in ((free, free_fit), (constrained, held_fit)):
                calls = parser.extract("<tool_call>" + tok.decode(out.output_token_ids)).calls
                fit.append(
                    len(calls) == 1
                    and calls[0].name == "get_weather"
                    and fits_city_days(json.loads(calls[0].arguments))
                )
    assert all(held_fit), held_fit
    assert not all(free_fit), free_fit  # unheld, the model calls other tools or leaves the schema


def test_the_sampler_filter_judges_tags_whole_and_agrees_with_each_token_checked() -> None:
    """The engine's filter (`token_filter`: ASCII openings answered once a step) with the tags as whole special
    tokens: the same tokens as each one checked whole, in every state of a strict call."""
    rng = random.Random(3)
    words = ["".join(rng.choices('abcOLsxyz019 "\\<>/_-{}[]:,.é', k=rng.randint(1, 6))).encode() for _ in range(3000)]
    pieces = [*TAGS_IN_ORDER, b"<|user|>", *dict.fromkeys([bytes([b]) for b in range(128)] + words)]
    tags, other_special, stop = set(range(len(TAGS_IN_ORDER))), {len(TAGS_IN_ORDER)}, len(pieces)
    states = [
        [],
        [b"get_weather"],
        [b"get_weather", KEY_OPEN, b"da"],
        [*GOOD[:5], b"Os"],
        [*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN, b"1"],
        [*GOOD, KEY_OPEN, b"where", KEY_CLOSE, VALUE_OPEN, b'{"lat": 1'],
        [*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN, b"2", VALUE_CLOSE],
    ]
    for before in states:
        p = held()
        for piece in before:
            assert p.feed(piece)
        filtered = token_filter(p, pieces.__getitem__, {stop}, other_special, tags)
        allowed = [t for t in range(len(pieces)) if filtered(t)]
        assert allowed == [t for t, piece in enumerate(pieces) if t not in other_special and p.accepts(piece)]
        assert allowed and filtered(stop) == p.can_end
    p = held()
    for piece in [*GOOD, KEY_OPEN, b"days", KEY_CLOSE, VALUE_OPEN, b"1"]:
        p.feed(piece)
    filtered = token_filter(p, pieces.__getitem__, {stop}, other_special, tags)
    assert filtered(TAGS_IN_ORDER.index(VALUE_CLOSE)) and not filtered(pieces.index(b"<"))


# Strings bounded, so that a random model (which picks `</arg_value>` about once in a vocabulary's worth of tokens
# where any text may go on) ends its values within the budget.
BOUNDED_WEATHER = {
    **WEATHER,
    "properties": {
        **WEATHER["properties"],
        "city": {**WEATHER["properties"]["city"], "maxLength": 8},
        "note": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
    },
}
FUZZ_SCHEMAS = [
    BOUNDED_WEATHER,
    {
        "type": "object",
        "properties": {
            "op": {"enum": ["add", "sub", "mul"]},
            "a": {"type": "number", "minimum": -10, "maximum": 10},
            "b": {"type": "integer", "exclusiveMinimum": 0, "maximum": 99},
            "label": {"type": ["string", "null"], "maxLength": 5},
        },
        "required": ["op", "a", "b", "label"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]},
                "maxItems": 2,
            },
            "mode": {"const": "fast"},
            "code": {"type": "string", "pattern": "^[a-f0-9]{2,4}$"},
        },
        "required": ["mode", "code"],
    },
]


@pytest.mark.parametrize("schema", FUZZ_SCHEMAS, ids=["weather", "calc", "nested"])
def test_a_random_model_held_to_strict_schemas_writes_only_valid_calls(tmp_path: Path, schema: dict) -> None:
    """Soundness: a random-weight model sampled at temperature 1 under the constraint writes calls whose parsed
    arguments validate against the schema (jsonschema), whatever it would rather write."""
    import jsonschema
    from api_fixtures import tiny_checkpoint, tiny_engine

    engine = tiny_engine(tiny_checkpoint(tmp_path))
    tok = engine.tokenizer
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    parser = ToolCallParser(tools=tools)
    prompt = tok.encode("<|user|>call f<|assistant|></think><tool_call>")
    params = [
        SamplingParams(max_tokens=200, temperature=1.0, top_k=0, seed=s, tool_names=("f",), tool_schemas={"f": schema})
        for s in range(12)
    ]
    whole = 0
    for out in engine.generate([prompt] * len(params), params):
        text = "<tool_call>" + tok.decode(out.output_token_ids)
        if "</tool_call>" not in text:
            assert out.finish_reason == "length", text  # cut by max_tokens inside a value, never left the rules
            continue
        calls = parser.extract(text).calls  # (after the first, the model may open more: each one held too)
        assert calls, text
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schema)
        whole += len(calls)
    assert whole >= 6, whole
