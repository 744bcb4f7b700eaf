"""`flint run-batch`: answer a file of requests in OpenAI's batch format with a checkpoint in this process, no server.

    flint run-batch -i requests.jsonl -o results.jsonl --model flint-nvfp4.gguf

Each input line names a url (/v1/chat/completions, /v1/completions or /v1/responses) and the body that endpoint
takes; each output record holds the status and body the HTTP API would have answered, in the order requests finish
(match them by custom_id). The whole file is checked before the model loads. `--resume` continues an output file a
stopped run left, skipping the requests it already answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .api.batch_lines import BatchFileError, BatchLine, read_batch_lines, recorded_ids
from .byte_size import parse_byte_size


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "run-batch", help="answer a JSONL file of requests in OpenAI's batch format in this process, no server"
    )
    b.add_argument("-i", "--input", required=True, help="batch file (JSONL, one request a line); - for stdin")
    b.add_argument("-o", "--output", required=True, help="results (JSONL, one record a request); - for stdout")
    b.add_argument("--model", help="GGUF file, HF directory or random:PRESET[:...] (default: the embedded demo model)")
    b.add_argument("--model-name", default="flint", help="the name request bodies may give as `model` (flint)")
    b.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    b.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    b.add_argument("--max-num-seqs", type=int, help="sequences a step (default: the engine's, 64)")
    b.add_argument("--max-model-len", type=int)
    b.add_argument("--kv-cache-memory", type=parse_byte_size, help="bytes, or a size such as 8GiB")
    b.add_argument(
        "--concurrency", type=int, help="requests in flight at once (default: twice max-num-seqs, to keep steps full)"
    )
    again = b.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="keep an existing output's records, answer the rest")
    again.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    b.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    b.set_defaults(func=cmd_run_batch)


def _read_input(path: str, model_name: str) -> list[BatchLine]:
    if path == "-":
        return read_batch_lines(sys.stdin, model_name)
    with open(path, encoding="utf-8") as f:
        return read_batch_lines(f, model_name)


def _pending(lines: list[BatchLine], args: argparse.Namespace) -> tuple[list[BatchLine], int]:
    """The lines still to answer and how many an existing output already answers (rewriting that output to its whole
    records under --resume). Raises FileExistsError when an output exists and neither flag says what to do."""
    if args.output == "-" or not os.path.exists(args.output):
        return lines, 0
    if args.overwrite:
        return lines, 0
    if not args.resume:
        raise FileExistsError(
            f"{args.output} exists: --resume to answer only the requests it lacks, --overwrite to replace it"
        )
    with open(args.output, encoding="utf-8") as f:
        kept, done = recorded_ids(f)
    # A record cut short by a stop would corrupt the next one appended after it: keep whole records only.
    tmp = Path(args.output + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(args.output)
    remaining = [line for line in lines if line.custom_id not in done]
    return remaining, len(lines) - len(remaining)


@contextmanager
def _records(path: str, append: bool) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdout
        return
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        yield f


def cmd_run_batch(args: argparse.Namespace) -> int:
    from .api.app import build_app
    from .api.backend import LocalBackend
    from .api.batch_runner import run_batch
    from .api.settings import APISettings
    from .async_engine import AsyncEngine
    from .engine import LLMEngine
    from .engine_config import EngineConfig

    try:
        lines = _read_input(args.input, args.model_name)
        todo, skipped = _pending(lines, args)
    except (BatchFileError, FileExistsError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if skipped:
        print(f"run-batch: {skipped} of {len(lines)} requests already answered in {args.output}", file=sys.stderr)
    if not todo:
        print(f"run-batch: nothing to do ({len(lines)} requests in {args.input})", file=sys.stderr)
        return 0
    if args.concurrency is not None and args.concurrency < 1:
        print(f"error: --concurrency must be >= 1, got {args.concurrency}", file=sys.stderr)
        return 2
    fields: dict[str, Any] = {"model": args.model, "device": args.device, "dtype": args.dtype}
    for name in ("max_num_seqs", "max_model_len", "kv_cache_memory"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    try:
        config = EngineConfig(**fields)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = LLMEngine.from_checkpoint(config, progress=not args.no_progress)
    concurrency = args.concurrency or 2 * engine.engine_config.max_num_seqs
    async_engine = AsyncEngine(engine)
    async_engine.start()
    api_log = logging.getLogger("flint_engine.api")
    level = api_log.level
    if not getattr(args, "verbose", False):  # a line a request is noise beside the batch's progress bar
        api_log.setLevel(logging.WARNING)
    backend = LocalBackend(async_engine, args.model_name)
    try:
        app = build_app(backend, APISettings(model_name=args.model_name))
        with _records(args.output, append=skipped > 0) as out:

            def write(record: dict[str, Any]) -> None:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()  # a stopped run keeps every record written so far (--resume)

            summary = asyncio.run(run_batch(app, todo, write, concurrency, progress=not args.no_progress))
    finally:
        api_log.setLevel(level)  # as it was: a caller in the same process (the Python API, tests) keeps its logs
        async_engine.shutdown()
        backend.release()
    print(f"run-batch: {summary.line()}", file=sys.stderr)
    return 0
