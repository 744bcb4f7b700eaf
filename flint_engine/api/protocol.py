"""OpenAI-compatible request and response models (pydantic). Unknown request fields are ignored."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from ..grammar_prefix import GrammarError, compile_grammar
from ..json_schema_prefix import SchemaError, compile_schema
from ..regex_prefix import RegexError, compile_pattern
from ..sampling_params import MAX_PRIORITY
from ..tool_call_prefix import callable_name

MAX_LOGIT_BIAS = 300  # as OpenAI's API
# bad_words: a guard on the host work they add to each step of the request
MAX_BAD_WORDS, MAX_BAD_WORD_CHARS = 100, 200
# guided_choice: enough for a label set or an enum; each choice is a prefix check per candidate token (bisected).
MAX_CHOICES = 1024
MAX_CHOICE_BYTES = 65536  # all choices together, UTF-8
MAX_CACHE_SALT = 1024  # characters: a salt is a secret of ~43 (vLLM's advice: 256 bits in base64), not a document
STRUCTURED_OUTPUTS = (
    "json",
    "json_object",
    "choice",
    "regex",
    "grammar",
)  # vLLM's structured_outputs keys honoured here


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Lenient(BaseModel):
    """Request models: extra fields are accepted and ignored, as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore")


# ------------------------------------------------------------------------------------------------ messages
class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    # "function": OpenAI's deprecated function result (a tool result named by the function it answers)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    function_call: FunctionCall | None = None  # OpenAI's deprecated form of one tool call

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and (self.tool_calls or self.function_call)):
            raise ValueError(f"a {self.role} message needs content")
        return self

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v: Any) -> Any:
        # Without this, a non-text part fails every branch of the union and pydantic reports the branches' names.
        if isinstance(v, list):
            for part in v:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"content part type {kind!r} is not supported: Flint reads text only"
                        if isinstance(kind, str)
                        else "content parts must be objects with a 'type'"
                    )
        return v

    def text(self) -> str | None:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content

    def for_template(self) -> dict[str, Any]:
        # OpenAI's deprecated function messages are tool messages to the template, and a call the assistant made
        # with `function_call` its one tool call.
        out: dict[str, Any] = {"role": "tool" if self.role == "function" else self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        calls = self.tool_calls or ([ToolCallIn(function=self.function_call)] if self.function_call else [])
        if calls:
            out["tool_calls"] = [tc.model_dump() for tc in calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        return out


class FunctionDef(Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _parseable_name(cls, v: str) -> str:
        # A GLM-4.7 call's name ends at the first whitespace or "<": any other name could not be called.
        if not callable_name(v):
            raise ValueError("function names must not contain whitespace or '<'")
        return v

    @field_validator("parameters")
    @classmethod
    def _schema_object(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        t = v.get("type", "object")
        if t != "object":
            raise ValueError("tool parameters must be a JSON Schema of type 'object'")
        props = v.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(p, dict) for p in props.values()):
            raise ValueError("tool parameters 'properties' must map names to JSON Schema objects")
        return v


class ToolDef(Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoiceFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"] = "function"
    function: NamedToolChoiceFunction


class AllowedTools(Lenient):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(Lenient):
    """OpenAI's `allowed_tools` tool choice: every tool stays in the prompt (so a conversation's prefix is cached
    whatever the turn allows), and the model may call only these (`auto`: or answer in text; `required`: one of
    them)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.function.name for t in self.allowed_tools.tools))


class StreamOptions(Lenient):
    include_usage: bool = True
    continuous_usage_stats: bool = False


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------------ requests
def _checked_choices(choice: Any) -> list[str]:
    """guided_choice as a list of non-empty strings within the limits (ValueError naming the problem)."""
    if not isinstance(choice, list) or not choice:
        raise ValueError("guided_choice must be a non-empty list of strings")
    for i, c in enumerate(choice):
        if not isinstance(c, str) or not c:
            raise ValueError(f"guided_choice[{i}] must be a non-empty string, got {c!r}")
    if len(choice) > MAX_CHOICES:
        raise ValueError(f"guided_choice holds at most {MAX_CHOICES} strings, got {len(choice)}")
    size = sum(len(c.encode()) for c in choice)
    if size > MAX_CHOICE_BYTES:
        raise ValueError(f"guided_choice is {size} bytes; at most {MAX_CHOICE_BYTES} are allowed")
    return choice


def _compiles(text: Any, field: str, what: str, compile_text: Callable[[str], Any], error: type[Exception]) -> str:
    """`text` if it is a string `compile_text` takes, else a ValueError naming `field`."""
    if not isinstance(text, str):
        raise ValueError(f"{field} must be a string ({what})")
    try:
        compile_text(text)
    except error as exc:
        raise ValueError(f"{field}: {exc}") from None
    return text


class SamplingFields(Lenient):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = Field(default=None, min_length=1)  # vLLM's: sample only these tokens
    # vLLM's: lower values are scheduled first (the server's api.min_request_priority bounds how low); without it,
    # OpenAI's service_tier "flex" (slower, for work that can wait) runs at api.flex_priority, any other tier at 0
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # vLLM extensions this server does not implement: refused (400) rather than silently ignored like unknown fields.
    # vLLM's: the prompt's tokens' log-probabilities with the top k (non-streamed answers)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    # vLLM's: words the output must not contain (see flint_engine/bad_words.py)
    bad_words: list[str] | None = Field(default=None, max_length=MAX_BAD_WORDS)
    # vLLM's: keep only the prompt's last k tokens (-1: the model's context length), cutting from the left, or its
    # first k with truncation_side "right"
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    # vLLM's beam search (flint_engine/api/beam_search.py): `n` beams
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's token tracing: the prompt's and each choice's token ids beside the text (streamed: the prompt's with
    # a choice's first chunk, each chunk's own ids with it), and logprobs' tokens spelled "token_id:<id>"
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    # vLLM's: only requests with the same salt share prefix-cache blocks (see docs/security.md)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT)
    # Output constraints: vLLM's guided_* fields and structured_outputs (its newer spelling of them), and
    # response_format (OpenAI's, on chat; vLLM reads it on text completions too). At most one is given; a JSON one
    # is read into response_format, so the handlers look at response_format, guided_choice and guided_regex only.
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_choice: list[str] | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None  # a GBNF or Lark grammar (flint_engine/grammar_prefix.py, lark_grammar.py)
    structured_outputs: dict[str, Any] | None = None
    # vLLM extensions this server does not implement, each of which would change the answer if ignored: refused.
    logits_processors: Any = None
    logprob_token_ids: Any = None
    repetition_detection: Any = None
    prompt_embeds: Any = None
    guided_whitespace_pattern: Any = None

    @field_validator(
        "logits_processors", "logprob_token_ids", "repetition_detection", "prompt_embeds", "guided_whitespace_pattern"
    )
    @classmethod
    def _not_implemented(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None:
            raise ValueError(f"{info.field_name} is not supported by this server")
        return v

    @field_validator("guided_grammar")
    @classmethod
    def _grammar(cls, v: str | None) -> str | None:
        # Here as well as with the other constraints: an error of this field names it as the param.
        return (
            v if v is None else _compiles(v, "guided_grammar", "a GBNF or Lark grammar", compile_grammar, GrammarError)
        )

    @field_validator("bad_words")
    @classmethod
    def _bad_words(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not all(w.strip() and len(w) <= MAX_BAD_WORD_CHARS for w in v):
            raise ValueError(f"bad_words must be non-blank strings of at most {MAX_BAD_WORD_CHARS} characters")
        return v

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("truncate_prompt_tokens must be -1 (the context length) or a positive number of tokens")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias holds at most {MAX_LOGIT_BIAS} tokens, got {len(v)}")
        for key, bias in v.items():
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids (integers as strings), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}")
        return v

    @model_validator(mode="after")
    def _checks(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is not supported with stream")
        return self

    @model_validator(mode="after")
    def _output_constraint(self) -> SamplingFields:
        spec = self.structured_outputs or {}
        other = sorted(k for k, v in spec.items() if k not in STRUCTURED_OUTPUTS and v is not None and v is not False)
        if other:
            raise ValueError(
                f"structured_outputs {', '.join(other)} is not supported (json, json_object, choice, regex and grammar"
                " are)"
            )
        schema = self.guided_json if self.guided_json is not None else spec.get("json")
        wants_object = bool(spec.get("json_object"))
        choice = self.guided_choice if self.guided_choice is not None else spec.get("choice")
        pattern = self.guided_regex if self.guided_regex is not None else spec.get("regex")
        grammar = self.guided_grammar if self.guided_grammar is not None else spec.get("grammar")
        given = [
            name
            for name, on in (
                ("response_format", self.response_format is not None and self.response_format.type != "text"),
                ("a JSON constraint", schema is not None or wants_object),
                ("a choice", choice is not None),
                ("a regex", pattern is not None),
                ("a grammar", grammar is not None),
            )
            if on
        ]
        if len(given) > 1:
            raise ValueError(f"give one output constraint, got {' and '.join(given)}")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError:
                raise ValueError("guided_json must be a JSON Schema (an object, or its JSON text)") from None
        if schema is not None and not isinstance(schema, dict):
            raise ValueError("guided_json must be a JSON Schema (an object, or its JSON text)")
        if schema is not None:
            self.response_format = ResponseFormat(type="json_schema", json_schema={"name": "guided", "schema": schema})
        elif wants_object:
            self.response_format = ResponseFormat(type="json_object")
        if self.response_format is not None and self.response_format.type == "json_schema":
            fmt = self.response_format.json_schema or {}
            if not isinstance(fmt.get("schema"), dict):
                raise ValueError("response_format 'json_schema' needs json_schema.schema (a JSON Schema object)")
            try:
                compile_schema(fmt["schema"])
            except SchemaError as exc:
                raise ValueError(f"response_format json_schema cannot be enforced: {exc}") from None
        if choice is not None:
            self.guided_choice = _checked_choices(choice)
        if pattern is not None:
            self.guided_regex = _compiles(pattern, "guided_regex", "a regular expression", compile_pattern, RegexError)
        if grammar is not None:
            self.guided_grammar = _compiles(
                grammar, "guided_grammar", "a GBNF or Lark grammar", compile_grammar, GrammarError
            )
        return self

    def json_constraint(self) -> tuple[bool, dict[str, Any] | None]:
        """(JSON mode on, its schema or None) from response_format."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return False, None
        return True, (fmt.json_schema or {}).get("schema") if fmt.type == "json_schema" else None

    def token_biases(self) -> dict[int, float] | None:
        """logit_bias with integer token ids (None when empty)."""
        return {int(k): float(b) for k, b in self.logit_bias.items()} if self.logit_bias else None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def _settle_continuation(req: ChatCompletionRequest | TokenizeRequest) -> None:
    """`continue_final_message` turns `add_generation_prompt` off unless the request set it too (vLLM asks the
    client to say so; both true is refused)."""
    if req.continue_final_message:
        if req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        req.add_generation_prompt = False


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    # vLLM's: at most this many tokens of thinking, then </think> is forced (ignored with the thinking off).
    thinking_token_budget: int | None = Field(default=None, ge=0)
    add_generation_prompt: bool = True
    # vLLM's: the prompt ends inside the final message (an assistant turn begun by the client, which the model goes
    # on with) instead of opening a new turn; `echo` puts that message's text before the answer's.
    continue_final_message: bool = False
    echo: bool = False
    include_reasoning: bool = True  # vLLM's: false leaves the thinking out of the answer (it still runs and counts)
    add_special_tokens: bool = False  # vLLM's: the tokenizer's own special tokens (BOS) before the templated prompt
    documents: list[dict[str, str]] | None = None  # vLLM's: handed to the chat template (for templates that read it)
    chat_template: str | None = None  # vLLM's: this request's own template (only with api.trust_request_chat_template)
    modalities: list[str] | None = None
    # OpenAI's deprecated function calling: `functions` are tools, `function_call` the tool choice ("none", "auto" or
    # {"name": ...}), and the answer's call comes back as `message.function_call` (one call, finish_reason
    # "function_call").
    functions: list[FunctionDef] | None = Field(default=None, min_length=1)
    function_call: Literal["none", "auto"] | NamedToolChoiceFunction | None = None
    # OpenAI fields this server cannot honour: refused (400) rather than ignored, since ignoring them changes what the
    # client gets (no audio, no web search).
    audio: Any = None
    web_search_options: Any = None

    @field_validator("audio", "web_search_options")
    @classmethod
    def _not_offered(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None:
            raise ValueError(f"{info.field_name} is not supported")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_output_only(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(m != "text" for m in v):
            raise ValueError("only the 'text' modality is supported")
        return v

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, v: Any) -> Any:
        # A clear message instead of pydantic's report on each branch of the union.
        if isinstance(v, str) and v not in ("none", "auto", "required"):
            raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {v!r}")
        if isinstance(v, dict) and v.get("type") not in (None, "function", "allowed_tools"):
            raise ValueError(f"tool_choice type must be 'function' or 'allowed_tools', got {v.get('type')!r}")
        return v

    @model_validator(mode="after")
    def _legacy_functions(self) -> ChatCompletionRequest:
        """`functions` and `function_call` read as the tools and tool choice they stand for."""
        if self.function_call is not None and self.functions is None:
            raise ValueError("function_call needs functions")
        if self.functions is None:
            return self
        if self.tools is not None or self.tool_choice is not None:
            raise ValueError("send either tools and tool_choice or the deprecated functions and function_call")
        self.tools = [ToolDef(function=f) for f in self.functions]
        call = self.function_call
        self.tool_choice = NamedToolChoice(function=call) if isinstance(call, NamedToolChoiceFunction) else call
        self.parallel_tool_calls = False  # a function_call answer holds one call
        return self

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.tools is not None and len(self.tools) == 0:
            raise ValueError("tools must not be an empty list")
        offered = {t.function.name for t in self.tools or []}
        if isinstance(self.tool_choice, NamedToolChoice):
            if self.tool_choice.function.name not in offered:
                raise ValueError(f"tool_choice names '{self.tool_choice.function.name}', which is not in tools")
        elif isinstance(self.tool_choice, AllowedToolsChoice):
            missing = [n for n in self.tool_choice.names() if n not in offered]
            if missing:
                raise ValueError(f"tool_choice allows '{missing[0]}', which is not in tools")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        _settle_continuation(self)
        return self

    def echoed(self) -> str:
        """With `echo`, the text the answer's content begins with: the final message's, where it is the
        assistant's (the turn the answer goes on with), else nothing."""
        last = self.messages[-1]
        return (last.text() or "") if self.echo and last.role == "assistant" else ""

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _completion_checks(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (it must equal n)")
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TokenizeRequest(Lenient):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # as on chat (add_generation_prompt then off unless set)
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        _settle_continuation(self)
        return self


class DetokenizeRequest(Lenient):
    model: str | None = None
    tokens: list[int]


# ------------------------------------------------------------------------------------------------ responses
class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TopLogprob(Strict):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(Strict):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(Strict):
    content: list[TokenLogprob] | None = None


class FunctionCallOut(Strict):
    name: str
    arguments: str


class ToolCallOut(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(Strict):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    function_call: FunctionCallOut | None = None  # the answer to a request in OpenAI's deprecated `functions`

    @model_serializer(mode="wrap")
    def _content_always(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The chat response leaves out None fields, but OpenAI's message always has content (null beside tool calls
        # or when the limit cut the thinking), and typed clients read a missing key as another thing than null.
        out = handler(self)
        out.setdefault("content", None)
        return out


class ChatChoice(Strict):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids: every token the choice generated


class PromptTokensDetails(Strict):
    cached_tokens: int = 0


class Usage(Strict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatCompletionResponse(Strict):
    id: str = Field(default_factory=lambda: _id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None  # vLLM's, when asked for
    service_tier: str | None = None  # OpenAI's: the tier it ran at, where the request named one
    prompt_token_ids: list[int] | None = None  # vLLM's, with return_token_ids


class CompletionLogprobs(Strict):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(Strict):
    """vLLM's entry of `prompt_logprobs`, keyed by token id."""

    logprob: float
    rank: int
    decoded_token: str


class CompletionChoice(Strict):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None  # vLLM's, when asked for
    # vLLM's, with return_token_ids: the choice's prompt and generated tokens
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    def _token_ids_when_asked(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The completions answer keeps its None fields (OpenAI's logprobs: null), but not these two where nobody
        # asked for them.
        out = handler(self)
        for key in ("prompt_token_ids", "token_ids"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


class CompletionResponse(Strict):
    id: str = Field(default_factory=lambda: _id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(Strict):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "flint-serve"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(Strict):
    object: Literal["list"] = "list"
    data: list[ModelCard]
