"""`flint generate`: answer prompts with a checkpoint in this process, no server.

Each prompt is a user message put through the checkpoint's chat template (or, with `--raw`, text completed as is);
all prompts run as one batch of the engine. The thinking and the answer are printed apart, as the API returns them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .sampling_params import SamplingParams, SamplingParamsError


def add_parser(sub: Any) -> None:
    g = sub.add_parser("generate", help="answer prompts in this process, no server (the chat template, or --raw)")
    g.add_argument("prompts", nargs="+", help="user messages; each is answered on its own, all in one batch")
    g.add_argument("--model", help="GGUF file, HF directory or random:PRESET[:...] (default: the embedded demo model)")
    g.add_argument("--raw", action="store_true", help="complete each prompt's text as is, without the chat template")
    g.add_argument("--system", help="a system message before each prompt")
    g.add_argument("--no-thinking", action="store_true", help="answer without a thinking block")
    g.add_argument("--max-tokens", type=int, default=256, help="thinking counts toward it (default 256)")
    g.add_argument("--temperature", type=float, help="default: the checkpoint's (Flint: 1.0); 0 is greedy")
    g.add_argument("--top-p", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--seed", type=int)
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    g.add_argument("--thinking-budget", type=int, help="at most this many tokens of thinking, then </think>")
    constraint = g.add_mutually_exclusive_group()
    constraint.add_argument("--choice", action="append", help="the answer is one of these (repeat the option)")
    constraint.add_argument("--regex", help="the whole answer matches this regular expression")
    constraint.add_argument(
        "--grammar", metavar="FILE", help="the whole answer is a sentence of this GBNF or Lark grammar"
    )
    g.add_argument("--json", action="store_true", help="one JSON object a prompt (reasoning, content, tokens, finish)")
    g.set_defaults(func=cmd_generate)


def _conversation(args: argparse.Namespace, prompt: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": args.system}] if args.system else []
    return [*system, {"role": "user", "content": prompt}]


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import EngineRequestError
    from .llm import LLM

    grammar = None
    if args.grammar is not None:
        try:
            grammar = Path(args.grammar).read_text(encoding="utf-8")
        except OSError as exc:
            print(f"error: cannot read the grammar: {exc}", file=sys.stderr)
            return 2
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            skip_special_tokens=args.raw,
            choice=tuple(args.choice) if args.choice else None,
            regex=args.regex,
            grammar=grammar,
            thinking_token_budget=args.thinking_budget,
        )
    except SamplingParamsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    llm = LLM(args.model, device=args.device, dtype=args.dtype, progress=not args.json)
    if llm.engine.tokenizer is None:
        print("error: this checkpoint has no tokenizer, so it cannot take text prompts", file=sys.stderr)
        return 1
    try:
        if args.raw:
            answers = [(None, c.text, c) for c in llm.generate(args.prompts, params)]
        else:
            convs = [_conversation(args, p) for p in args.prompts]
            replies = llm.chat(convs, params, enable_thinking=not args.no_thinking)
            answers = [(r.reasoning, r.content, r) for r in replies]
    except (EngineRequestError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for prompt, (reasoning, content, out) in zip(args.prompts, answers):
        if args.json:
            record = {
                "prompt": prompt,
                "reasoning": reasoning,
                "content": content,
                "completion_tokens": len(out.token_ids),
                "finish_reason": out.finish_reason,
            }
            print(json.dumps(record, ensure_ascii=False))
            continue
        if len(args.prompts) > 1:
            print(f"### {prompt}")
        if reasoning:
            print(f"[thinking] {reasoning.strip()}")
        print((content or "").strip() if not args.raw else content)
    return 0
