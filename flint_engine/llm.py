"""`LLM`: generation in this process, no server: text completions, and chat through the checkpoint's template with the
thinking and GLM-4.7 tool calls parsed as the API server parses them.

    from flint_engine import LLM, SamplingParams

    llm = LLM()  # the embedded demo model; LLM("flint.gguf", device="cuda") for yours
    [reply] = llm.chat([{"role": "user", "content": "What is 7 + 8?"}], SamplingParams(temperature=0))
    print(reply.reasoning, reply.content)

Every prompt of one call runs in one batch of the engine (`LLMEngine.generate`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from .beam_search import BeamSearch, BeamSettings, ranked
from .engine import LLMEngine
from .engine_config import EngineConfig
from .parsers.chat_output import ChatOutputParser, ParsedMessage
from .parsers.reasoning import THINK_END, THINK_START
from .parsers.tool_calls import ToolCall
from .request import Request
from .sampling_params import SamplingParams
from .tokenizer import FlintTokenizer
from .tool_call_prefix import StrictToolError, held_tool_schemas

Conversation = Sequence[dict[str, Any]]


@dataclass
class Completion:
    """One prompt's continuation."""

    prompt_token_ids: list[int]
    token_ids: list[int]  # the generated tokens, an end-of-sequence token included when one ended the text
    text: str
    finish_reason: str | None  # "stop" or "length"
    # With params.logprobs: per generated token, (its logprob, [(alternative id, logprob), ...]).
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    # With params.prompt_logprobs: per prompt token, (id, logprob, alternatives, rank); None for the first.
    prompt_logprobs: list[tuple[int, float, list[tuple[int, float]], int] | None] | None = None
    cumulative_logprob: float | None = None  # beam search's: the tokens' summed log-probability


@dataclass
class ChatReply:
    """One conversation's assistant turn, split as the API returns it."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", or "tool_calls" when the turn ended in tool calls

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI assistant message (append it to the conversation to continue it)."""
        return ParsedMessage(self.reasoning, self.content, self.tool_calls).to_openai()


class LLM:
    """A checkpoint loaded in this process; `engine` is the `LLMEngine` underneath for finer control."""

    def __init__(self, model: str | None = None, *, progress: bool = True, **config: Any) -> None:
        """`model`: GGUF file, HF directory or random:PRESET[:...] (None: the embedded demo model); `config`: any
        other `EngineConfig` field (device, dtype, max_num_seqs, kv_cache_memory, ...)."""
        self.engine = LLMEngine.from_checkpoint(EngineConfig(model=model, **config), progress=progress)

    @property
    def tokenizer(self) -> FlintTokenizer:
        if self.engine.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer: pass token ids to generate()")
        return self.engine.tokenizer

    def generate(
        self, prompts: str | Sequence[str] | Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Continue each prompt (text, or token ids) as is, without the chat template; with `params.n` > 1 each
        prompt's n completions come one after another."""
        ids = self._prompt_ids(prompts)
        params = params or SamplingParams()
        ids, plist = _choices(ids, [params] * len(ids))
        out = []
        for prompt_ids, req in zip(ids, self.engine.generate(ids, plist)):
            text = self._text(req, params.skip_special_tokens)
            lp = list(req.output_logprobs) if params.logprobs is not None else None
            out.append(
                Completion(prompt_ids, list(req.output_token_ids), text, req.finish_reason, lp, req.prompt_logprobs)
            )
        return out

    def beam_search(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        beam_width: int,
        max_tokens: int,
        *,
        length_penalty: float = 1.0,
        ignore_eos: bool = False,
        min_tokens: int = 0,
    ) -> list[list[Completion]]:
        """Each prompt's `beam_width` continuations of highest score, best first (vLLM's `LLM.beam_search`; scores
        as `flint_engine.beam_search` says). Every live beam of every prompt takes its step in one engine batch."""
        ids = self._prompt_ids(prompts)
        longest = max(len(p) for p in ids)
        if longest + max_tokens > self.engine.max_model_len:
            raise ValueError(
                f"a prompt of {longest} tokens and max_tokens {max_tokens} exceed the model's context of"
                f" {self.engine.max_model_len} tokens"
            )
        ends = frozenset() if ignore_eos else self.engine.eos_token_ids
        settings = BeamSettings(beam_width, length_penalty, max_tokens, min_tokens, ends)
        runs = [BeamSearch(p, settings) for p in ids]
        step = runs[0].step_params()  # (the same settings for every prompt)
        while not all(r.done for r in runs):
            asking = [r for r in runs if not r.done]
            asks = [a for r in asking for a in r.asks()]
            answers = iter(self.engine.generate(asks, [step] * len(asks)))
            for run in asking:
                tops = []
                for req in itertools.islice(answers, len(run.live)):
                    logprob, alts = req.output_logprobs[0]
                    tops.append(ranked(req.output_token_ids[0], logprob, alts))
                run.advance(tops)
        tok = self.engine.tokenizer
        return [
            [
                Completion(
                    prompt_ids,
                    b.tokens,
                    tok.decode(b.text_tokens) if tok is not None else "",
                    "stop" if b.ended else "length",
                    cumulative_logprob=b.logprob,
                )
                for b in run.best()
            ]
            for prompt_ids, run in zip(ids, runs, strict=True)
        ]

    def chat(
        self,
        conversations: Conversation | Sequence[Conversation],
        params: SamplingParams | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool = True,
        continue_final_message: bool = False,
    ) -> list[ChatReply]:
        """Answer one conversation (a list of OpenAI-style messages) or several, each with the next assistant turn
        (with `continue_final_message`, the rest of the final one, an assistant turn begun by the caller).

        `tools` are offered as in the API with tool_choice "auto" (a `strict` tool's calls held to its schema); the
        model's calls come back parsed. With an output constraint (`params.json_mode`, `choice` or `regex`) and
        thinking on, the constraint starts after the thinking, and `params.thinking_token_budget` caps the thinking,
        as in the API. With `params.n` > 1 each conversation's n replies come one after another.
        """
        if len(conversations) == 0:
            raise ValueError("no conversation given")
        many = not isinstance(conversations[0], dict)
        convs: Sequence[Conversation] = conversations if many else [conversations]  # type: ignore[list-item,assignment]
        tools = _checked_tools(tools)
        tok = self.tokenizer
        prompts, thinking = [], []
        for i, conv in enumerate(convs):
            text = tok.apply_chat_template(
                _template_messages(conv, i),
                tools,
                add_generation_prompt=not continue_final_message,
                continue_final_message=continue_final_message,
                enable_thinking=enable_thinking,
            )
            prompts.append(tok.encode(text))
            thinking.append(text.rstrip().endswith(THINK_START))
        base = params or SamplingParams()
        # The parsers need the <think>/<tool_call> tags in the text.
        base = replace(base, skip_special_tokens=False)
        if tools is not None and base.tool_schemas is None and not base.constrained:
            try:
                schemas = held_tool_schemas(tools)
            except StrictToolError as exc:
                raise ValueError(str(exc)) from None
            base = replace(base, tool_schemas=schemas) if schemas is not None else base
        plist = [
            replace(base, reasoning_end_token=tok.token_to_id(THINK_END))
            if think and base.reasoning_end_token is None
            else base
            for think in thinking
        ]
        n = base.n
        prompts, plist = _choices(prompts, plist)
        thinking = [think for think in thinking for _ in range(n)]
        replies = []
        for prompt_ids, think, req in zip(prompts, thinking, self.engine.generate(prompts, plist)):
            parsed = ChatOutputParser(think, tools).parse(self._text(req, False))
            finish = "tool_calls" if parsed.tool_calls else req.finish_reason
            replies.append(
                ChatReply(
                    parsed.reasoning,
                    parsed.content,
                    parsed.tool_calls,
                    prompt_ids,
                    list(req.output_token_ids),
                    finish,
                )
            )
        return replies

    def _prompt_ids(self, prompts: str | Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
        """Prompts (text, or token ids) as token ids."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if len(prompts) == 0:
            raise ValueError("no prompts given")
        return [self.tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]

    def _text(self, req: Request, skip_special_tokens: bool) -> str:
        if self.engine.tokenizer is None:
            return ""
        ids = [t for t in req.output_token_ids if t not in req.eos_token_ids]
        return self.engine.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _choices(prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list[list[int]], list[SamplingParams]]:
    """Each prompt repeated for its `n` choices, seeded as the API seeds them (seed + choice index)."""
    out_prompts, out_params = [], []
    for ids, p in zip(prompts, params):
        for i in range(p.n):
            out_prompts.append(ids)
            out_params.append(replace(p, n=1, seed=None if p.seed is None else p.seed + i) if p.n > 1 else p)
    return out_prompts, out_params


def _template_messages(conv: Conversation, index: int) -> list[dict[str, Any]]:
    """The conversation checked as the API checks it (roles, content, tool calls), in the template's form."""
    from .api.errors import validation_problem
    from .api.protocol import ChatMessage

    if len(conv) == 0:
        raise ValueError(f"conversation {index} is empty")
    out = []
    for j, message in enumerate(conv):
        try:
            out.append(ChatMessage.model_validate(message).for_template())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            problem = validation_problem(first)
            raise ValueError(f"conversation {index}, message {j}{' ' + where if where else ''}: {problem}") from None
    return out


def _checked_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """OpenAI tool definitions checked as the API checks them."""
    from .api.errors import validation_problem
    from .api.protocol import ToolDef

    if tools is None:
        return None
    if len(tools) == 0:
        raise ValueError("tools must not be an empty list")
    try:
        return [ToolDef.model_validate(t).model_dump(exclude_none=True) for t in tools]
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"tools {'.'.join(str(p) for p in first['loc'])}: {validation_problem(first)}") from None
