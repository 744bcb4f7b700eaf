"""Per-request sampling parameters, validated up front so bad values fail with the field's name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .grammar_prefix import GrammarError, compile_grammar
from .json_schema_prefix import SchemaError, compile_schema
from .regex_prefix import RegexError, compile_pattern
from .tool_call_prefix import callable_name, compile_tool_arguments

MAX_SEED = 2**63 - 1
MAX_PRIORITY = 2**31 - 1


class SamplingParamsError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"'{field_name}' {message}")
        self.field = field_name


@dataclass
class SamplingParams:
    """Sampling for one request. `None` means "the checkpoint's default" for temperature/top_p/top_k/min_p."""

    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling (OpenAI's logit_bias)
    allowed_token_ids: tuple[int, ...] | None = None  # sample only among these tokens (vLLM's allowed_token_ids)
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: none; 0: the sampled token only; k: plus the top k
    # Words the output must not contain (vLLM's bad_words; see bad_words.py): needs the engine's tokenizer.
    bad_words: tuple[str, ...] = ()
    # Log-probabilities of the prompt's tokens (from the second on), as `logprobs`: None, 0 or the top k too. Such a
    # request computes its whole prompt (no prefix-cache hit) and its lm_head rows.
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = False
    json_mode: bool = False  # constrain the output to one JSON object (response_format json_object)
    json_schema: dict[str, Any] | None = None  # with json_mode: the object must be an instance of this JSON Schema
    choice: tuple[str, ...] | None = None  # the output is exactly one of these strings (vLLM's guided_choice)
    regex: str | None = None  # the whole output matches this regular expression (vLLM's guided_regex)
    grammar: str | None = None  # the whole output is a sentence of this GBNF or Lark grammar (vLLM's guided_grammar)
    # The token that closes the reasoning the output opens in (</think> where the prompt ends in <think>); None: the
    # output opens outside any reasoning. An output constraint starts after it, and thinking_token_budget counts the
    # tokens before it.
    reasoning_end_token: int | None = None
    # At most this many tokens of reasoning: then reasoning_end_token is forced (vLLM's thinking_token_budget,
    # Anthropic's thinking.budget_tokens); no effect on an output without reasoning (LLM.chat and the API set
    # reasoning_end_token when the thinking is on). The reasoning still counts toward max_tokens.
    thinking_token_budget: int | None = None
    # The output opens inside a tool call, one of these names next (a forced call: tool_choice "required" or named;
    # see tool_call_prefix)
    tool_names: tuple[str, ...] | None = None
    # The offered tools by name, each with the JSON Schema its arguments are held to (OpenAI's strict tools) or None
    # (free): every call the output writes names one of them, and a strict tool's arguments fit its schema.
    tool_schemas: dict[str, dict[str, Any] | None] | None = None
    # Scheduling, not sampling, but it travels with the request: a waiting request of a lower priority value is
    # admitted first and may preempt running requests of higher values for a seat or blocks; under memory pressure
    # the highest value is preempted first (vLLM's request priority); equal priorities keep first-come first-served.
    priority: int = 0
    # Prefix caching, likewise: only requests with the same salt share cached blocks (vLLM's cache_salt), so one
    # tenant cannot learn from another's cache hits (time to first token, cached_tokens) what it sent.
    cache_salt: str | None = None
    # Whether the engine's request metrics (finished requests, latency and length histograms) count this request:
    # a beam search's one-token steps are parts of one client request (their tokens still count as work).
    in_request_metrics: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.bad_words, str):
            self.bad_words = (self.bad_words,)
        self.bad_words = tuple(self.bad_words)
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingParamsError("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if self.temperature is not None and not 0.0 <= self.temperature <= 100.0:
            raise SamplingParamsError("temperature", f"must be in [0, 100], got {self.temperature}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < -1):
            raise SamplingParamsError("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamsError("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SamplingParamsError(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise SamplingParamsError("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty}")
        if self.logit_bias is not None and not all(
            isinstance(t, int) and t >= 0 and isinstance(b, (int, float)) and -100.0 <= b <= 100.0
            for t, b in self.logit_bias.items()
        ):
            raise SamplingParamsError("logit_bias", "must map token ids to values in [-100, 100]")
        if self.allowed_token_ids is not None and not (
            self.allowed_token_ids and all(isinstance(t, int) and t >= 0 for t in self.allowed_token_ids)
        ):
            raise SamplingParamsError("allowed_token_ids", "must be a non-empty list of token ids")
        if self.seed is not None and (not isinstance(self.seed, int) or not -MAX_SEED - 1 <= self.seed <= MAX_SEED):
            raise SamplingParamsError("seed", f"must be a 64-bit integer, got {self.seed!r}")
        if not isinstance(self.n, int) or not 1 <= self.n <= 128:
            raise SamplingParamsError("n", f"must be an integer in [1, 128], got {self.n!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamsError("stop", "must be non-empty strings")
        if not all(isinstance(w, str) and w.strip() for w in self.bad_words):
            raise SamplingParamsError("bad_words", "must be non-blank strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise SamplingParamsError("stop_token_ids", "must be non-negative integers")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingParamsError("min_tokens", f"must be in [0, max_tokens], got {self.min_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 0 <= value <= 20):
                raise SamplingParamsError(name, f"must be in [0, 20], got {value!r}")
        if not isinstance(self.priority, int) or not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise SamplingParamsError("priority", f"must be an integer in [-{MAX_PRIORITY}, {MAX_PRIORITY}]")
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str) and self.cache_salt):
            raise SamplingParamsError("cache_salt", "must be a non-empty string")
        if self.tool_names is not None and not (self.tool_names and all(map(callable_name, self.tool_names))):
            raise SamplingParamsError("tool_names", "must be non-empty names without whitespace or '<'")
        if self.tool_schemas is not None:
            self._check_tool_schemas()
        if self.json_schema is not None:
            if not self.json_mode:
                raise SamplingParamsError("json_schema", "needs json_mode")
            try:
                compile_schema(self.json_schema)
            except SchemaError as exc:
                raise SamplingParamsError("json_schema", f"cannot be enforced: {exc}") from None
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) and c for c in self.choice):
                raise SamplingParamsError("choice", "must be a list of non-empty strings")
            if not self.choice:
                raise SamplingParamsError("choice", "must not be empty")
            self.choice = tuple(self.choice)
        for name, compile_text, error in (
            ("regex", compile_pattern, RegexError),
            ("grammar", compile_grammar, GrammarError),
        ):
            text = getattr(self, name)
            if text is None:
                continue
            if not isinstance(text, str):
                raise SamplingParamsError(name, f"must be a string, got {type(text).__name__}")
            try:
                compile_text(text)
            except error as exc:
                raise SamplingParamsError(name, str(exc)) from None
        given = (
            ("json_mode", self.json_mode),
            ("choice", self.choice),
            ("regex", self.regex),
            ("grammar", self.grammar),
        )
        kinds = [k for k, on in given if on]
        if len(kinds) > 1:
            raise SamplingParamsError(kinds[1], f"cannot be combined with {kinds[0]}: give one output constraint")
        for name in ("tool_names", "tool_schemas"):
            if getattr(self, name) is not None and self.constrained:
                raise SamplingParamsError(name, f"cannot be combined with {kinds[0]}")
        if self.reasoning_end_token is not None and (
            not isinstance(self.reasoning_end_token, int) or self.reasoning_end_token < 0
        ):
            raise SamplingParamsError("reasoning_end_token", f"must be a token id, got {self.reasoning_end_token!r}")
        budget = self.thinking_token_budget
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise SamplingParamsError("thinking_token_budget", f"must be a non-negative integer, got {budget!r}")

    def _check_tool_schemas(self) -> None:
        tools = self.tool_schemas
        if not isinstance(tools, dict) or not tools or not all(map(callable_name, tools)):
            raise SamplingParamsError("tool_schemas", "must map tool names (without whitespace or '<') to schemas")
        for name, schema in tools.items():
            if schema is None:
                continue
            try:
                compile_tool_arguments(schema)
            except SchemaError as exc:
                msg = f"tool {name!r} cannot be held to its schema: {exc}"
                raise SamplingParamsError("tool_schemas", msg) from None
        missing = [n for n in self.tool_names or () if n not in tools]
        if missing:
            raise SamplingParamsError("tool_names", f"names {missing[0]!r}, which tool_schemas does not offer")

    def with_defaults(self, defaults: dict[str, Any]) -> SamplingParams:
        """Fill unset temperature/top_p/top_k/min_p from the checkpoint's generation config."""
        fill = {
            k: defaults[k]
            for k in ("temperature", "top_p", "top_k", "min_p")
            if getattr(self, k) is None and k in defaults
        }
        return dataclasses.replace(self, **fill) if fill else self

    @property
    def constrained(self) -> bool:
        """The output is held to JSON, a choice, a pattern or a grammar."""
        return self.json_mode or self.choice is not None or self.regex is not None or self.grammar is not None

    @property
    def greedy(self) -> bool:
        return self.temperature is not None and self.temperature == 0.0

    def effective(self) -> tuple[float, float, int, float]:
        """(temperature, top_p, top_k, min_p) with unset values at their neutral settings."""
        t = 1.0 if self.temperature is None else self.temperature
        p = 1.0 if self.top_p is None else self.top_p
        k = 0 if self.top_k is None or self.top_k < 0 else self.top_k
        m = 0.0 if self.min_p is None else self.min_p
        return t, p, k, m
