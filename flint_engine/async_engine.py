"""`AsyncEngine`: one background thread drives the engine; asyncio callers submit requests and read streams.

Submissions and aborts are queued to the engine thread and applied between steps; outputs are handed back with
`loop.call_soon_threadsafe`. A request's stream ends with a finished output, or with an exception if the engine
fails: no accepted request is ever left hanging. Leaving a stream early (client disconnect) aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .engine import EngineOverloaded, EngineRequestError, LLMEngine, RequestOutput
from .sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; the request could not be completed."""


@dataclass
class ChoiceOutput:
    """One step's output for one of the request's n choices."""

    index: int
    output: RequestOutput


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    index: int


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # guards _streams and admission counting
        self._pending_admissions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self.last_loop_time = time.monotonic()
        self.dead: BaseException | None = None
        self.paused = threading.Event()  # test hook: set to simulate a wedged engine loop

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flint-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_all(EngineDeadError("the engine is shutting down"))

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None

    def loop_lag(self) -> float:
        """Seconds since the engine loop last came round (small unless wedged or in a very long step)."""
        return time.monotonic() - self.last_loop_time

    # ------------------------------------------------------------------ requests
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise EngineRequestError now, before any streaming starts."""
        self.engine.check_request(prompt_token_ids, params)

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[ChoiceOutput]:
        """Stream outputs of all `params.n` choices; ends when every choice has finished."""
        if self.dead is not None or self._stop.is_set():
            raise EngineDeadError(f"the engine is not running: {self.dead}")
        self.validate(prompt_token_ids, params)
        rid = request_id or f"req-{next(self._ids)}"
        n = params.n
        with self._lock:
            waiting = self.engine.metrics.num_waiting + self._pending_admissions
            if waiting + n > self.engine.engine_config.max_waiting_requests:
                raise EngineOverloaded(f"{waiting} requests are already waiting")
            self._pending_admissions += n
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        child_ids = [rid if n == 1 else f"{rid}-{i}" for i in range(n)]
        with self._lock:
            for i, cid in enumerate(child_ids):
                self._streams[cid] = _Stream(loop, q, i)
        for i, cid in enumerate(child_ids):
            child = params
            if n > 1:
                seed = None if params.seed is None else params.seed + i
                child = dataclasses.replace(params, n=1, seed=seed)
            self._commands.put(("add", cid, list(prompt_token_ids), child))
        self._wake.set()
        remaining = set(child_ids)
        try:
            while remaining:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.output.finished:
                    remaining.discard(item.output.request_id)
        finally:
            if remaining:  # the consumer went away (client disconnect, cancellation): stop the work
                for cid in remaining:
                    self._commands.put(("abort", cid))
                self._wake.set()
            with self._lock:
                for cid in child_ids:
                    self._streams.pop(cid, None)

    async def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    # ------------------------------------------------------------------ engine thread
    def _deliver(self, rid: str, item: object) -> None:
        with self._lock:
            stream = self._streams.get(rid)
        if stream is None:
            return
        payload = ChoiceOutput(stream.index, item) if isinstance(item, RequestOutput) else item
        with contextlib.suppress(RuntimeError):  # the caller's loop has closed
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, payload)

    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, prompt, params = cmd
                with self._lock:
                    self._pending_admissions -= 1
                try:
                    self.engine.add_request(rid, prompt, params)
                except (EngineRequestError, EngineOverloaded) as exc:
                    self._deliver(rid, exc)
            elif cmd[0] == "abort":
                out = self.engine.abort(cmd[1])
                if out is not None:
                    self._deliver(cmd[1], out)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.last_loop_time = time.monotonic()
                while self.paused.is_set() and not self._stop.is_set():
                    time.sleep(0.01)
                self._apply_commands()
                if self.engine.has_unfinished():
                    for out in self.engine.step():
                        self._deliver(out.request_id, out)
                else:
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
        except BaseException as exc:  # keep no request waiting on a dead loop
            log.exception("engine loop died")
            self.dead = exc
            self._fail_all(EngineDeadError(f"the engine loop died: {type(exc).__name__}: {exc}"))

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            rids = list(self._streams)
        for rid in rids:
            self._deliver(rid, exc)
