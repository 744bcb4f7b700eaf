"""Replica choice: prefix-cache affinity, falling back to power-of-two least-loaded.

Agents resend the whole conversation every turn, so the replica that served the previous turn holds its prefix
in its KV cache (both layer kinds). The router remembers which replica each prompt block (16 tokens, hashed in a
chain exactly as the engine's prefix cache does) was sent to, and sends a request to the replica holding the
longest run of its leading blocks, unless that replica is much busier than the least-loaded one. Otherwise it
samples two replicas and takes the less loaded (Ray Serve's default policy).
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from flint_engine.kv_cache_manager import block_hashes, chain_root

log = logging.getLogger("flint_serve.request_router")

BLOCK = 16


def prefix_hashes(
    token_ids: list[int], cache_salt: str | None = None, max_blocks: int = 256, block: int = BLOCK
) -> list[int]:
    """Chained hashes of the prompt's leading whole blocks under its cache salt (the engine's prefix-cache keys)."""
    return block_hashes(token_ids, min(len(token_ids) // block, max_blocks), block, chain_root(cache_salt))


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, imbalance: int = 8, min_match_blocks: int = 2, capacity: int = 500_000) -> None:
        self.imbalance = imbalance
        self.min_match_blocks = min_match_blocks
        self.capacity = capacity
        self.owner: OrderedDict[int, ReplicaID] = OrderedDict()  # block hash -> replica, least recent first
        self.affinity_hits = 0
        self.routed = 0

    @staticmethod
    def _hashes(pending: PendingRequest | None) -> list[int]:
        if pending is None:
            return []
        hashes = pending.kwargs.get("prefix_hashes")
        if hashes is None and len(pending.args) > 3:
            hashes = pending.args[3]
        return list(hashes or [])

    def _load(self, r: RunningReplica) -> int:
        q = self.replica_queue_len_cache.get(r.replica_id)
        if q is None:
            stats = r.routing_stats or {}
            q = int(stats.get("num_running", 0)) + int(stats.get("num_waiting", 0))
        return q

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        hashes = self._hashes(pending_request)
        by_id = {r.replica_id: r for r in candidate_replicas}
        best, best_len = None, 0
        first = self.owner.get(hashes[0]) if hashes else None
        if first is not None and first in by_id:
            # The longest run of leading blocks last sent to one replica is what its prefix cache likely holds.
            best = by_id[first]
            while best_len < len(hashes) and self.owner.get(hashes[best_len]) == first:
                best_len += 1
        if best is not None and best_len >= self.min_match_blocks:
            least = min(self._load(r) for r in candidate_replicas)
            if self._load(best) <= least + self.imbalance:
                self.affinity_hits += 1
                others = [r for r in candidate_replicas if r is not best]
                return [[best], others] if others else [[best]]
        if len(candidate_replicas) <= 2:
            return [list(candidate_replicas)]
        return [random.sample(candidate_replicas, 2)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: object) -> None:
        self.routed += 1
        for h in self._hashes(pending_request):
            self.owner[h] = replica_id
            self.owner.move_to_end(h)
        while len(self.owner) > self.capacity:
            self.owner.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for h in [h for h, r in self.owner.items() if r == replica_id]:
            del self.owner[h]
