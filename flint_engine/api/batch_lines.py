"""OpenAI's batch file format: the input lines checked before any request runs, and the output records.

An input line is `{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}`; an output
record is `{"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
"body": {...}}, "error": null}`, where a request the API refused keeps its status code and OpenAI-shaped error body,
as OpenAI's batch output does. Records are written as requests finish, so they are matched by `custom_id`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The generation endpoints a batch line may name (OpenAI's batch API takes these three among others).
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
# How many of a file's problems the error message lists.
_LISTED = 20


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based line number in the input file
    custom_id: str
    url: str
    body: dict[str, Any]


class BatchFileError(ValueError):
    """The input file has lines that are not valid batch requests: (line number, problem) each."""

    def __init__(self, found: list[tuple[int, str]]) -> None:
        self.found = found
        self.problems = [f"line {n}: {what}" for n, what in found]
        shown = self.problems[:_LISTED]
        more = f"\n... and {len(found) - _LISTED} more" if len(found) > _LISTED else ""
        super().__init__(f"{len(found)} problem(s) in the batch file:\n" + "\n".join(shown) + more)


def _line_problem(data: Any, model_name: str, urls: tuple[str, ...]) -> str | None:
    if not isinstance(data, dict):
        return "a line must be a JSON object"
    cid = data.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return "custom_id must be a non-empty string"
    if data.get("method") != "POST":
        return f'method must be "POST", got {data.get("method")!r}'
    if data.get("url") not in urls:
        return f"url must be one of {', '.join(urls)}, got {data.get('url')!r}"
    body = data.get("body")
    if not isinstance(body, dict):
        return "body must be a JSON object (the request the url would take)"
    if body.get("stream"):
        return "stream is not supported in a batch (each record holds the whole response)"
    if body.get("background"):
        return "background is not supported in a batch (each record holds the whole response)"
    model = body.get("model")
    if model is not None and model != model_name:
        return f"body.model is {model!r}, but the model served here is {model_name!r} (--model-name)"
    return None


def read_batch_lines(
    lines: Iterable[str], model_name: str, endpoint: str | None = None, max_requests: int | None = None
) -> list[BatchLine]:
    """Every request of a batch file, or BatchFileError listing each bad line (blank lines are skipped); with
    `endpoint`, every line's url must be it (a Batch API batch names one)."""
    found: list[BatchLine] = []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append((number, f"not valid JSON ({exc.msg})"))
            continue
        problem = _line_problem(data, model_name, BATCH_URLS if endpoint is None else (*BATCH_URLS, endpoint))
        if problem is None and endpoint is not None and data["url"] != endpoint:
            problem = f"url {data['url']!r} is not the batch's endpoint {endpoint!r}"
        if problem is not None:
            problems.append((number, problem))
            continue
        cid = data["custom_id"]
        if cid in seen:
            problems.append((number, f"custom_id {cid!r} is also on line {seen[cid]} (each must be unique)"))
            continue
        if max_requests is not None and len(found) == max_requests:
            problems.append((number, f"a batch holds at most {max_requests} requests"))
            break
        seen[cid] = number
        found.append(BatchLine(number, cid, data["url"], data["body"]))
    if problems:
        raise BatchFileError(problems)
    return found


def output_record(custom_id: str, status: int, body: Any, request_id: str) -> dict[str, Any]:
    """One output line: the API's response (or its error) to the request `custom_id`."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def recorded_ids(lines: Iterable[str]) -> tuple[list[str], set[str]]:
    """An earlier output file's whole records (its text lines, e.g. all but a last line cut short by a crash) and the
    custom_ids they answer."""
    kept: list[str] = []
    ids: set[str] = set()
    for text in lines:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("custom_id"), str) and "response" in data:
            kept.append(text if text.endswith("\n") else text + "\n")
            ids.add(data["custom_id"])
    return kept, ids
