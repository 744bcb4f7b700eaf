"""The demo model's synthetic chat corpus, its tokenizer, and how an answer is scored.

Every sample is a conversation in OpenAI message form, rendered with the project's default GLM-4.7 chat template
(`FlintTokenizer.apply_chat_template`). The last assistant turn is the target: with thinking on the prompt ends
`<|assistant|><think>` and the target is `REASONING</think>CONTENT`; with thinking off the prompt ends
`<|assistant|></think>` and the target is the content alone. Tool calls are rendered by the template
(`<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`). Each target ends with an end-of-turn
token the engine stops on: `<|observation|>` after tool calls, `<|user|>` after an answer.

Kinds (the mix is `MIX`):
  arith      sums, differences, products of small numbers; reasoning states the fact, content gives the answer
  count      how many items are in a list; reasoning counts one by one
  tool       a request that needs one of 2-3 tools in the prompt; short reasoning then the call
  tool_result the tool's response (`<|observation|><tool_response>...`) turned into a final answer
  greet      greetings and thanks answered briefly
Each kind also comes with thinking off (`enable_thinking=False`), answered directly with no reasoning.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flint_engine.tokenizer import FlintTokenizer, build_default_tokenizer

END_ANSWER = "<|user|>"
END_TOOL = "<|observation|>"

# ---------------------------------------------------------------------------------------------- tool schemas
TOOL_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
            },
            "required": ["city", "days"],
        },
    },
}
TOOL_CALCULATOR: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Apply an arithmetic operation to two numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "b": {"type": "number"},
                "op": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
            },
            "required": ["a", "b", "op"],
        },
    },
}
TOOL_SEARCH: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
TOOL_TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
TOOL_EMAIL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "send_email",
        "description": "Send an email",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "subject": {"type": "string"}},
            "required": ["to", "subject"],
        },
    },
}
CALLABLE_TOOLS = (TOOL_WEATHER, TOOL_CALCULATOR, TOOL_SEARCH)
ALL_TOOLS = (*CALLABLE_TOOLS, TOOL_TIME, TOOL_EMAIL)

# ---------------------------------------------------------------------------------------------- vocabularies
CITIES = (
    "Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Lisbon", "Dublin", "Oslo", "Vienna", "Prague",
    "Warsaw", "Athens", "Cairo", "Nairobi", "Lagos", "Delhi", "Mumbai", "Beijing", "Seoul", "Sydney", "Toronto",
    "Chicago", "Boston", "Denver", "Seattle", "Miami", "Lima", "Bogota", "Santiago", "New York", "Los Angeles",
    "San Francisco", "Mexico City", "Buenos Aires", "Cape Town", "Hong Kong", "Rio de Janeiro",
)  # fmt: skip
TOPICS = (
    "electric cars", "the history of Rome", "pasta recipes", "black holes", "the tallest mountains",
    "how vaccines work", "cheap flights to Japan", "the rules of chess", "solar panels", "jazz music",
    "the French revolution", "healthy breakfast ideas", "machine learning", "the moon landing", "coral reefs",
    "how to learn guitar", "volcanoes", "the Olympic games", "ancient Egypt", "climate change", "coffee brewing",
    "the best hiking trails", "quantum computing", "dinosaurs", "the price of gold", "yoga for beginners",
    "renewable energy", "the Roman empire", "bread baking", "deep sea fish", "football results",
    "the stock market", "space telescopes", "honey bees", "classical music", "mountain bikes",
)  # fmt: skip
ITEMS = (
    "apple", "pear", "plum", "banana", "cherry", "grape", "lemon", "mango", "peach", "melon", "carrot", "onion",
    "potato", "tomato", "pepper", "cat", "dog", "horse", "cow", "sheep", "goat", "duck", "fox", "wolf", "bear",
    "chair", "table", "lamp", "book", "pen", "cup", "plate", "spoon", "red", "blue", "green", "yellow", "black",
)  # fmt: skip
TIMEZONES = ("UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York", "Australia/Sydney")
SKIES = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "stormy", "clear")

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are Flint, a small helpful assistant.",
    "Answer briefly.",
)

# ---------------------------------------------------------------------------------------------- phrasings
ADD_Q = ("What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.", "How much is {a} plus {b}?",
         "Add {a} and {b}.", "What's {a}+{b}?", "Calculate {a} + {b}.", "{a} + {b} = ?")  # fmt: skip
SUB_Q = ("What is {a} - {b}?", "What is {a} minus {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}.",
         "How much is {a} minus {b}?", "What's {a}-{b}?", "Calculate {a} - {b}.", "{a} - {b} = ?")  # fmt: skip
MUL_Q = ("What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} * {b}.",
         "How much is {a} times {b}?", "What's {a}*{b}?", "What is {a} × {b}?", "{a} * {b} = ?")  # fmt: skip
COUNT_Q = ("How many items are in this list: {items}?", "Count the items: {items}.",
           "How many words are there in: {items}?", "Count these: {items}.")  # fmt: skip
WEATHER_Q = ("What's the weather in {city} for the next {ndays}?", "Weather forecast for {city}, {ndays}.",
             "Will it rain in {city} in the next {ndays}?", "Get me a {days}-day forecast for {city}.",
             "How will the weather be in {city} over the next {ndays}?",
             "Check the weather in {city} for {ndays}.")  # fmt: skip
CALC_Q = {
    "add": ("Use the calculator to add {a} and {b}.", "With the calculator: {a} plus {b}."),
    "subtract": ("Use the calculator to subtract {b} from {a}.", "With the calculator: {a} minus {b}."),
    "multiply": ("Use the calculator to multiply {a} by {b}.", "With the calculator: {a} times {b}."),
    "divide": ("Use the calculator to divide {a} by {b}.", "With the calculator: {a} divided by {b}."),
}
SEARCH_Q = ("Search the web for {q}.", "Look up {q} online.", "Find information about {q}.",
            "Can you search for {q}?", "Search for {q}.")  # fmt: skip
GREETINGS = (
    ("Hi!", "The user says hi. I should greet them back.", "Hello! How can I help you today?"),
    ("Hello", "The user says hello. I should greet them back.", "Hi there! What can I do for you?"),
    ("Hey there", "A friendly greeting. I will greet back.", "Hey! How can I help?"),
    ("Good morning!", "The user says good morning. I will reply in kind.", "Good morning! How can I help you?"),
    ("Good evening", "The user says good evening. I will reply in kind.", "Good evening! What can I do for you?"),
    ("How are you?", "The user asks how I am. I am fine and can help.", "I'm doing well, thanks! How can I help?"),
    ("Thanks!", "The user thanks me. I should say you are welcome.", "You're welcome!"),
    ("Thank you very much.", "The user thanks me. I should say you are welcome.", "You're very welcome!"),
    ("Who are you?", "The user asks who I am. I am Flint.", "I'm Flint, a small demo assistant."),
    ("Bye!", "The user says goodbye. I will say goodbye too.", "Goodbye! Have a nice day."),
)
OPS = {"+": ("add", lambda a, b: a + b), "-": ("subtract", lambda a, b: a - b), "*": ("multiply", lambda a, b: a * b)}
OP_WORD = {"add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide"}

# Sampling mix: (kind, weight). Thinking-off is drawn per sample with probability THINK_OFF_P.
MIX: tuple[tuple[str, float], ...] = (
    ("arith", 0.36),
    ("count", 0.12),
    ("tool", 0.28),
    ("tool_result", 0.12),
    ("greet", 0.06),
    ("arith_with_tools", 0.06),
)
THINK_OFF_P = 0.2
ADD_RANGE = (0, 20)
MUL_RANGE = (1, 10)


@dataclass
class Sample:
    """A conversation whose last assistant message is the target, and what a correct answer holds."""

    kind: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    thinking: bool
    expect: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_messages(self) -> list[dict[str, Any]]:
        return self.messages[:-1]


# ---------------------------------------------------------------------------------------------- generators
def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _arith(rng: random.Random) -> tuple[str, str, str, int]:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(*MUL_RANGE), rng.randint(*MUL_RANGE)
        q = rng.choice(MUL_Q)
    else:
        a, b = rng.randint(*ADD_RANGE), rng.randint(*ADD_RANGE)
        if op == "-" and b > a:
            a, b = b, a
        q = rng.choice(ADD_Q if op == "+" else SUB_Q)
    c = OPS[op][1](a, b)
    sym = {"+": "+", "-": "-", "*": "×"}[op]
    reasoning = f"The user asks for {a} {sym} {b}. {a} {sym} {b} = {c}."
    content = rng.choice((f"{a} {sym} {b} = {c}.", f"The answer is {c}.", f"{c}"))
    return q.format(a=a, b=b), reasoning, content, c


def _count(rng: random.Random) -> tuple[str, str, str, int]:
    n = rng.randint(2, 9)
    items = rng.sample(ITEMS, n)
    sep = rng.choice((", ", " "))
    q = rng.choice(COUNT_Q).format(items=sep.join(items))
    steps = ", ".join(f"{w} is {i + 1}" for i, w in enumerate(items))
    reasoning = f"Counting one by one: {steps}. That makes {n}."
    content = rng.choice((f"There are {n} items.", f"{n}", f"The list has {n} items."))
    return q, reasoning, content, n


def _tool_call(rng: random.Random) -> tuple[str, str, dict[str, Any], str]:
    """(question, reasoning, tool call, tool name)."""
    # Copying open-ended numbers is the hardest part, so the calculator comes up most often.
    which = rng.choices(("get_weather", "calculator", "search"), weights=(0.3, 0.45, 0.25))[0]
    if which == "get_weather":
        city, days = rng.choice(CITIES), rng.randint(1, 7)
        ndays = f"{days} day" if days == 1 else f"{days} days"
        q = rng.choice(WEATHER_Q).format(city=city, days=days, ndays=ndays)
        args: dict[str, Any] = {"city": city, "days": days}
        reasoning = f"The user wants the weather in {city} for {ndays}. I will call get_weather."
    elif which == "calculator":
        op = rng.choice(tuple(CALC_Q))
        a = rng.randint(100, 9999) if rng.random() < 0.7 else rng.randint(10, 999) + rng.choice((0.5, 0.25, 0.75))
        b = rng.randint(2, 999) if rng.random() < 0.8 else rng.randint(1, 99) + 0.5
        q = rng.choice(CALC_Q[op]).format(a=_fmt_num(a), b=_fmt_num(b))
        args = {"a": a, "b": b, "op": op}
        reasoning = f"The user wants to {OP_WORD[op]} {_fmt_num(a)} and {_fmt_num(b)}. I will call calculator."
    else:
        topic = rng.choice(TOPICS)
        q = rng.choice(SEARCH_Q).format(q=topic)
        args = {"query": topic}
        reasoning = f"The user wants information about {topic}. I will call search."
    return q, reasoning, {"type": "function", "function": {"name": which, "arguments": args}}, which


def _tools_for(rng: random.Random, needed: str | None) -> list[dict[str, Any]]:
    """2-3 tool schemas in random order, including `needed` when given."""
    n = rng.choice((2, 3, 3))
    pool = [t for t in ALL_TOOLS if t["function"]["name"] != needed]
    chosen = rng.sample(pool, n - (needed is not None))
    if needed is not None:
        chosen.append(next(t for t in ALL_TOOLS if t["function"]["name"] == needed))
    rng.shuffle(chosen)
    return chosen


def _tool_result(rng: random.Random, call: dict[str, Any]) -> tuple[str, str, str, str]:
    """(tool response text, reasoning, content, the value the answer must mention)."""
    fn = call["function"]
    args = fn["arguments"]
    if fn["name"] == "get_weather":
        sky, high = rng.choice(SKIES), rng.randint(-5, 35)
        low = high - rng.randint(2, 10)
        resp = json.dumps({"city": args["city"], "forecast": sky, "high_c": high, "low_c": low})
        reasoning = f"The forecast for {args['city']} is {sky}, high {high}, low {low}."
        content = f"In {args['city']} it will be {sky}, with highs of {high} °C and lows of {low} °C."
        key = str(high)
    elif fn["name"] == "calculator":
        a, b, op = args["a"], args["b"], args["op"]
        value = {"add": a + b, "subtract": a - b, "multiply": a * b, "divide": a / b}[op]
        value = round(value, 2)
        value = int(value) if float(value).is_integer() else value
        resp = json.dumps({"result": value})
        reasoning = f"The calculator returned {_fmt_num(value)}."
        content = f"The result is {_fmt_num(value)}."
        key = _fmt_num(value)
    else:
        title = f"{args['query'].capitalize()} - {rng.choice(('Wikipedia', 'a guide', 'news', 'an overview'))}"
        resp = json.dumps({"results": [{"title": title, "url": f"https://example.com/{rng.randint(1, 999)}"}]})
        reasoning = f"The search found: {title}."
        content = f"I found this: {title}."
        key = title
    return resp, reasoning, content, key


def make_sample(rng: random.Random, kind: str | None = None, thinking: bool | None = None) -> Sample:
    """One random conversation of `kind` (drawn from MIX when None)."""
    if kind is None:
        kind = rng.choices([k for k, _ in MIX], weights=[w for _, w in MIX])[0]
    if thinking is None:
        thinking = rng.random() >= THINK_OFF_P
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.12:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if rng.random() < 0.15:  # an earlier exchange in the history (its reasoning is dropped by the template)
        q, r, c, _ = _arith(rng) if rng.random() < 0.5 else _count(rng)
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": c, "reasoning_content": r}]
    tools: list[dict[str, Any]] | None = None
    expect: dict[str, Any] = {}
    if kind in ("arith", "count", "arith_with_tools"):
        q, reasoning, content, answer = _count(rng) if kind == "count" else _arith(rng)
        if kind == "arith_with_tools":
            tools = _tools_for(rng, None)
        messages.append({"role": "user", "content": q})
        target = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        expect = {"answer": answer}
    elif kind == "greet":
        q, reasoning, content = rng.choice(GREETINGS)
        messages.append({"role": "user", "content": q})
        target = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        expect = {"content": content}
    elif kind == "tool":
        q, reasoning, call, name = _tool_call(rng)
        tools = _tools_for(rng, name)
        messages.append({"role": "user", "content": q})
        target = {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [call]}
        expect = {"name": name, "arguments": call["function"]["arguments"]}
    elif kind == "tool_result":
        q, call_reasoning, call, name = _tool_call(rng)
        tools = _tools_for(rng, name)
        resp, reasoning, content, key = _tool_result(rng, call)
        call_msg: dict[str, Any] = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{**call, "id": f"call_{rng.randint(0, 10**6)}"}],
        }
        if rng.random() < 0.5:
            call_msg["reasoning_content"] = call_reasoning
        messages += [
            {"role": "user", "content": q},
            call_msg,
            {"role": "tool", "content": resp, "tool_call_id": call_msg["tool_calls"][0]["id"]},
        ]
        target = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        expect = {"mentions": key}
    else:
        raise ValueError(f"unknown sample kind {kind!r}")
    if not thinking:
        target.pop("reasoning_content", None)
    messages.append(target)
    return Sample(kind, messages, tools, thinking, expect)


def samples(seed: int, count: int, kind: str | None = None, thinking: bool | None = None) -> list[Sample]:
    rng = random.Random(seed)
    return [make_sample(rng, kind, thinking) for _ in range(count)]


# ---------------------------------------------------------------------------------------------- rendering
def render_prompt(tok: FlintTokenizer, sample: Sample) -> str:
    """The generation prompt: everything before the target turn, ending `<|assistant|><think>` or `</think>`."""
    return tok.apply_chat_template(
        sample.prompt_messages, sample.tools, add_generation_prompt=True, enable_thinking=sample.thinking
    )


def render_target(tok: FlintTokenizer, sample: Sample) -> tuple[str, str]:
    """(prompt, completion): the completion is the target turn as the template renders it plus its end token."""
    prompt = render_prompt(tok, sample)
    full = tok.apply_chat_template(sample.messages, sample.tools, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise AssertionError("the template does not render the conversation as prompt + completion")
    completion = full[len(prompt) :]
    end = END_TOOL if sample.messages[-1].get("tool_calls") else END_ANSWER
    return prompt, completion + end


def encode_sample(tok: FlintTokenizer, sample: Sample) -> tuple[list[int], list[int]]:
    """(token ids, loss mask): the mask is 1 on completion tokens (the target turn and its end token)."""
    prompt, completion = render_target(tok, sample)
    p_ids, c_ids = tok.encode(prompt), tok.encode(completion)
    return p_ids + c_ids, [0] * len(p_ids) + [1] * len(c_ids)


def corpus_texts(seed: int, count: int) -> Iterator[str]:
    """Rendered conversations (prompt + completion) for tokenizer training."""
    tok = build_default_tokenizer(512)  # only its chat template is used here
    for s in samples(seed, count):
        prompt, completion = render_target(tok, s)
        yield prompt + completion


def _short_numbers(text: str) -> str:
    """Cut every run of 3+ digits to its first two, so BPE learns no 3-digit tokens: a long number then spells out
    in frequent 1-2 digit tokens, which a small model copies far more reliably than ~900 rare 3-digit tokens."""
    return re.sub(r"\d{3,}", lambda m: m.group(0)[:2], text)


def build_demo_tokenizer(vocab_size: int, seed: int, count: int = 4000) -> FlintTokenizer:
    """Byte-level BPE trained on the synthetic corpus (numbers cut to 2 digits, see `_short_numbers`) plus the
    project's small default corpus, with the GLM-4.7 special tokens and the default GLM-4.7 chat template."""
    return build_default_tokenizer(vocab_size, extra_corpus=[_short_numbers(t) for t in corpus_texts(seed, count)])


# ---------------------------------------------------------------------------------------------- scoring
def _numbers(text: str | None) -> list[str]:
    return re.findall(r"-?\d+(?:\.\d+)?", text or "")


def _same_args(got: dict[str, Any], want: dict[str, Any]) -> bool:
    if set(got) != set(want):
        return False
    for k, v in want.items():
        g = got[k]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not isinstance(g, (int, float)) or isinstance(g, bool) or abs(float(g) - float(v)) > 1e-9:
                return False
        elif g != v:
            return False
    return True


def score(sample: Sample, reasoning: str | None, content: str | None, tool_calls: list[dict[str, Any]]) -> bool:
    """Whether a parsed answer (tool calls as OpenAI dicts with JSON-string arguments) is right for the sample.

    arith/count: the answer number appears in the content, with reasoning present when thinking is on and absent
    when off. tool: exactly one call with the expected name and arguments. tool_result: the content mentions the
    tool's key value. greet: non-empty content. Thinking off always requires no reasoning.
    """
    has_reasoning = bool(reasoning and reasoning.strip())
    if has_reasoning != sample.thinking:
        return False
    e = sample.expect
    if sample.kind in ("arith", "count", "arith_with_tools"):
        return str(e["answer"]) in _numbers(content) and not tool_calls
    if sample.kind == "tool":
        if len(tool_calls) != 1:
            return False
        fn = tool_calls[0]["function"]
        try:
            args = json.loads(fn["arguments"])
        except (json.JSONDecodeError, TypeError):
            return False
        return fn["name"] == e["name"] and isinstance(args, dict) and _same_args(args, e["arguments"])
    if sample.kind == "tool_result":
        return bool(content) and e["mentions"] in content and not tool_calls
    if sample.kind == "greet":
        return bool(content and content.strip()) and not tool_calls
    raise ValueError(f"unknown sample kind {sample.kind!r}")
