"""Continuous batching with chunked prefill: every step mixes the running sequences' next tokens (decode, or the
next chunk of a long prompt) with new requests admitted first-come first-served, under a token budget. The budget
is larger in steps where no running request is generating yet (prefill-only), so a long prompt on an idle engine
takes fewer, more efficient chunks without lengthening anyone's inter-token gaps.

Requests carry a priority (`SamplingParams.priority`, lower first; 0 unless asked): the queue is ordered by it, then
by arrival, and a step's token budget goes to the running requests of the lowest values first, so a batch job's
requests (the Batch API sends them at `api.batch_priority`) yield to interactive ones without a second engine.
A waiting request that finds no seat or too few blocks takes them from running requests of a higher priority value
(the highest first, the most recently admitted among equals), as vLLM's priority scheduling does; requests of equal
priority never preempt each other, so without priorities nothing changes.

When blocks run out, a running request is preempted: of those not yet given this step's tokens, the one of the
highest priority value, the most recently admitted among equals. Its blocks are released (they stay in the prefix
cache) and it goes back to the head of its priority's place in the queue, to be recomputed from its prompt plus the
tokens it already generated, so it resumes exactly where it left off.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .kv_cache_manager import KVCacheManager, chain_root
from .request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    request: Request
    num_tokens: int  # new tokens computed this step, starting at request.num_computed_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(
        self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, idle_prefill_tokens: int = 0
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.idle_prefill_tokens = max(max_num_batched_tokens, idle_prefill_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # for lack of blocks
        self.num_priority_preemptions = 0  # for a waiting request of a lower priority value

    def add(self, req: Request) -> None:
        self._enqueue(req, ahead=False)

    def _enqueue(self, req: Request, ahead: bool) -> None:
        """Into the queue by priority: behind the requests of its priority (`ahead`: in front of them, as a
        preempted request that had been admitted before them)."""
        p = req.params.priority
        i = len(self.waiting)
        while i > 0 and (
            self.waiting[i - 1].params.priority > p or (ahead and self.waiting[i - 1].params.priority == p)
        ):
            i -= 1
        self.waiting.insert(i, req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def has_free_seat(self) -> bool:
        """Whether a waiting request could be admitted by the next schedule (a sequence slot is free; the KV
        blocks are checked when it is)."""
        return bool(self.waiting) and len(self.running) < self.max_num_seqs

    def _preempt(self, req: Request, out: SchedulerOutput, for_priority: bool = False) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        if for_priority:
            self.num_priority_preemptions += 1
        else:
            self.num_preemptions += 1
        self._enqueue(req, ahead=True)
        out.preempted.append(req)

    def _last_of_highest(self, eligible: Callable[[Request], bool]) -> Request | None:
        """Of the running requests `eligible` picks, the one of the highest priority value, the most recently
        admitted among equals: who is preempted first."""
        victim = None
        for r in self.running:  # admission order: a later equal replaces an earlier one
            if eligible(r) and (victim is None or r.params.priority >= victim.params.priority):
                victim = r
        return victim

    def _victim(self, scheduled: set[str]) -> Request | None:
        """The running request to preempt for blocks: one not yet given this step's tokens."""
        return self._last_of_highest(lambda r: r.request_id not in scheduled)

    def _outranked(self, req: Request) -> Request | None:
        """The running request `req` may preempt for a seat or blocks: one of a higher priority value than its own."""
        return self._last_of_highest(lambda r: r.params.priority > req.params.priority)

    def would_preempt(self) -> bool:
        """Whether the next schedule would preempt a running request for the first waiting one (no seat is free and
        a running request has a higher priority value)."""
        return (
            bool(self.waiting)
            and len(self.running) >= self.max_num_seqs
            and self._outranked(self.waiting[0]) is not None
        )

    def _make_room(self, req: Request, out: SchedulerOutput) -> int | None:
        """Preempt the running request `req` outranks (`_outranked`), taking back this step's tokens if it was given
        them; returns those tokens (for the step's budget), or None if no running request is outranked."""
        victim = self._outranked(req)
        if victim is None:
            return None
        chunk = next((c for c in out.chunks if c.request is victim), None)
        if chunk is not None:
            out.chunks.remove(chunk)
        self._preempt(victim, out, for_priority=True)
        return chunk.num_tokens if chunk is not None else 0

    def step_budget(self) -> int:
        """Tokens this step may compute: max_num_batched_tokens while a running request is generating (the step's
        length is its inter-token latency), else the larger budget of prefill-only steps."""
        if any(r.output_token_ids for r in self.running):
            return self.max_num_batched_tokens
        return self.idle_prefill_tokens

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.step_budget()
        scheduled: set[str] = set()
        # Lowest priority values first (a stable sort: admission order among equals, as without priorities).
        for req in sorted(self.running, key=lambda r: r.params.priority):
            if budget <= 0:
                break
            if req not in self.running:  # preempted below to make room
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            while not self.kv.can_allocate(req.request_id, req.num_computed_tokens, n):
                victim = self._victim(scheduled)
                if victim is None:
                    break
                self._preempt(victim, out)
                if victim is req:
                    break
            if req not in self.running or not self.kv.can_allocate(req.request_id, req.num_computed_tokens, n):
                continue
            self.kv.allocate(req.request_id, req.num_computed_tokens, n)
            out.chunks.append(ScheduledChunk(req, n))
            scheduled.add(req.request_id)
            budget -= n
        if out.preempted:
            return out  # memory is tight: let the running requests drain before admitting more
        while self.waiting and budget > 0:
            req = self.waiting[0]
            if len(self.running) >= self.max_num_seqs:
                freed = self._make_room(req, out)
                if freed is None:
                    break
                budget += freed
                continue
            tokens = req.all_token_ids
            # A request that wants its prompt's log-probabilities computes the whole prompt: a cached prefix has no
            # logits.
            root = chain_root(req.params.cache_salt)
            cached, hashes = (0, []) if req.prompt_logprobs is not None else self.kv.find_prefix(tokens, root)
            n = min(len(tokens) - cached, budget)
            if not self.kv.can_allocate(req.request_id, cached, n, hashes):
                freed = self._make_room(req, out)
                if freed is None:
                    break  # first come, first served: later requests wait behind this one
                budget += freed
                continue
            self.waiting.popleft()
            self.kv.prefix_queries += len(tokens)
            self.kv.prefix_hits += cached
            self.kv.start(req.request_id, hashes, root)
            self.kv.allocate(req.request_id, cached, n)
            if req.num_preemptions == 0:
                req.cached_prompt_tokens = cached
            req.num_computed_tokens = cached
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            out.chunks.append(ScheduledChunk(req, n))
            budget -= n
        return out

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted request and release its blocks at once."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        req.status = RequestStatus.FINISHED
