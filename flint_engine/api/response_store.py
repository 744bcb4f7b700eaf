"""Stored responses of OpenAI's Responses API (`store`, `previous_response_id`, `GET /v1/responses/{id}`).

    <root>/<response id>.json   the response object, the request's own input items, the response it continued from
                                and its owner; the file's last write is the response's clock (expiry, heartbeat)
    <root>/<response id>.events a streamed background response's events, one JSON object a line, as they were sent

A background response (`background_responses`) is saved as it starts (`queued`), with its request, rewritten every
`HEARTBEAT_S` while it runs, and last when it ends; `<response id>.running` is beside it meanwhile. One whose runner
stopped writing (its process gone) is run again by the router that finds it (`on_stale`), or reads as `failed`. A
cancel made through any process is a marker file beside it (`<response id>.cancel`), which its runner polls. A
streamed one also appends its events to `<response id>.events`, which any process's stream of it reads from.

A response keeps only its own turn; a `previous_response_id` chain is read back oldest first (each response's input
items, then its output items), so a conversation of n turns takes n files of one turn each. Responses belong to the
API key that made them (its hash; "" without keys): another key's id answers 404. They expire after `ttl_s`, and
past `max_bytes` the oldest go first; both are swept, on a thread, at most once a minute as responses
are saved.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import APIError
from .json_files import read_json, write_json
from .record_sweep import SweptRecords

log = logging.getLogger(__name__)

# A running background response's record is rewritten this often; one not rewritten for STALE_S lost its runner.
HEARTBEAT_S = 5.0
STALE_S = 30.0
RUNNING = frozenset({"queued", "in_progress"})
# A background response whose runner stopped is run again by another (or the next) router at most this many times.
MAX_ATTEMPTS = 3
# The longest `previous_response_id` chain read back (a guard: each turn is one file read).
MAX_CHAIN = 10_000


def _not_found(response_id: str, param: str = "response_id") -> APIError:
    if param == "previous_response_id":  # a 400, as OpenAI answers it (Codex CLI resends the whole turn on its code)
        return APIError(
            400, f"Previous response with id '{response_id}' not found.", param, "previous_response_not_found"
        )
    return APIError(404, f"Response with id '{response_id}' not found.", param, "response_not_found")


def stored_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as a stored response lists them (OpenAI's input item shapes): each with an id (`msg_...` and the
    like where it had none), a message's text as a list of parts."""
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
    out = []
    for item in items:
        kind = item.get("type", "message")
        item = {"id": f"{prefixes.get(kind, 'item')}_{uuid.uuid4().hex}", **item} if "id" not in item else dict(item)
        if kind == "message":
            item["type"] = "message"
            if isinstance(item.get("content"), str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": item["content"]}]
            item.setdefault("status", "completed")
        out.append(item)
    return out


class ResponseStore(SweptRecords):
    beside = (".cancel", ".events", ".running", *(f".claim-{n}" for n in range(1, MAX_ATTEMPTS + 1)))
    kind = "stored responses"
    # Called with a running response's id and record when its runner is found gone; True: a runner took it over
    # (`background_responses`), else it is failed.
    on_stale: Callable[[str, dict[str, Any]], bool] | None = None

    def cancel_marker(self, response_id: str) -> Path:
        return self.root / f"{response_id}.cancel"

    def _events_path(self, response_id: str) -> Path:
        return self.root / f"{response_id}.events"

    def append_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        """Add a streamed background response's events to its log (begun by the first call)."""
        lines = "".join(json.dumps(event, ensure_ascii=False) + "\n" for event in events)
        with self._events_path(response_id).open("a", encoding="utf-8") as f:
            f.write(lines)

    def streamed(self, response_id: str) -> bool:
        return self._events_path(response_id).exists()

    def read_events(self, response_id: str, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The events logged after byte `offset` (whole lines only: one being written waits for the next read), and
        the offset after them."""
        try:
            with self._events_path(response_id).open("rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:  # deleted meanwhile
            return [], offset
        end = data.rfind(b"\n") + 1
        return [json.loads(line) for line in data[:end].splitlines() if line], offset + end

    def save(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        previous_id: str | None,
        owner: str,
        **extra: Any,
    ) -> None:
        """Keep a response with its own input items (`stored_items`): a finished one, or a background one as it runs
        (with `extra`: its request and attempt, to run it again). The file's last write is its clock: it expires
        `ttl_s` after, and a running one not rewritten for `STALE_S` lost its runner."""
        record = {
            "response": response,
            "input_items": input_items,
            "previous_response_id": previous_id,
            "owner": owner,
            **extra,
        }
        write_json(self._path(response["id"]), record)
        self.maybe_sweep()

    def running_marker(self, response_id: str) -> Path:
        """Beside a background response while it is queued or in progress: a router finds the ones to take over
        without reading every record."""
        return self.root / f"{response_id}.running"

    def claim(self, response_id: str, attempt: int) -> bool:
        """Whether this process is the one to run `attempt` of a response (a file only one can create)."""
        try:
            (self.root / f"{response_id}.claim-{attempt}").open("x").close()
        except FileExistsError:
            return False
        return True

    def claim_abandoned(self, response_id: str, attempt: int) -> bool:
        """Whether `attempt`'s claim is older than STALE_S: its router stopped before it saved the response as its
        own (the caller saw the record stale, still at an earlier attempt)."""
        try:
            return self.clock() - (self.root / f"{response_id}.claim-{attempt}").stat().st_mtime > STALE_S
        except FileNotFoundError:
            return False

    def stale_running(self) -> list[str]:
        """The background responses whose runner stopped writing (by the running markers and the records' times)."""
        now, out = self.clock(), []
        for marker in self.root.glob("*.running"):
            try:
                written = self._path(marker.stem).stat().st_mtime
            except FileNotFoundError:  # finished and swept, or deleted
                marker.unlink(missing_ok=True)
                continue
            if now - written > STALE_S:
                out.append(marker.stem)
        return out

    def stale_record(self, response_id: str) -> dict[str, Any] | None:
        """A record `stale_running` named, whatever its owner."""
        record = read_json(self._path(response_id))
        return record if record is not None and record["response"]["status"] in RUNNING else None

    def fail_stale(self, response_id: str, record: dict[str, Any]) -> None:
        response = record["response"]
        response["status"] = "failed"
        response["error"] = {"code": "server_error", "message": "the server stopped before this response finished"}
        write_json(self._path(response_id), record)
        self.cancel_marker(response_id).unlink(missing_ok=True)
        self.running_marker(response_id).unlink(missing_ok=True)

    def _record(self, response_id: str, owner: str, param: str = "response_id") -> dict[str, Any]:
        found = self._owned(response_id, owner)
        if found is None:
            raise _not_found(response_id, param)
        record, written = found
        if record["response"]["status"] in RUNNING and self.clock() - written > STALE_S:
            if self.on_stale is not None and self.on_stale(response_id, record):
                again = self._owned(response_id, owner)  # (as the runner that took it over saved it)
                return again[0] if again is not None else record
            self.fail_stale(response_id, record)
        return record

    def response(self, response_id: str, owner: str) -> dict[str, Any]:
        return self._record(response_id, owner)["response"]

    def input_items(self, response_id: str, owner: str) -> list[dict[str, Any]]:
        """The response's own input items, in the order they were sent."""
        return self._record(response_id, owner)["input_items"]

    def delete(self, response_id: str, owner: str) -> dict[str, Any]:
        self._record(response_id, owner)
        self._remove(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    def history(self, response_id: str, owner: str) -> list[dict[str, Any]]:
        """The conversation up to and with `response_id`, oldest first: each turn's input items, then its output."""
        turns: list[list[dict[str, Any]]] = []
        param, next_id = "previous_response_id", response_id
        while next_id is not None:
            if len(turns) >= MAX_CHAIN:
                raise APIError(400, f"the conversation is longer than {MAX_CHAIN} responses", param)
            record = self._record(next_id, owner, param)
            if record["response"]["status"] in RUNNING:
                raise APIError(
                    400, f"response {next_id} is still {record['response']['status']}: wait for it to finish", param
                )
            turns.append(record["input_items"] + record["response"]["output"])
            next_id = record.get("previous_response_id")
        return [item for turn in reversed(turns) for item in turn]
