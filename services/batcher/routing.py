"""Choosing the worker for each request (pure).

Prefix affinity first: a request goes to the worker whose cache summary holds its deepest
leading block, else to its prefix's home worker by rendezvous hashing over live workers
(keyed by the deepest leading block hashed, where prompts differ) —
unless that worker is overloaded: ``tolerance`` or more requests queued beyond its slots,
or ``tolerance`` fewer free slots than the least-loaded worker (so affinity never idles
half the fleet). Then, and for requests without a full leading block, the least-loaded
worker takes it.

Only workers that hash prompts as this batcher does are routed to (``refusal``): a worker
advertising another block size or affinity depth is left out of the view altogether.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared.messages import GenerateRequest, WorkerHeartbeat
from shared.prefix_hash import AFFINITY_DEPTH, block_hashes
from shared.prompts import Prompts, request_token_ids

AFFINITY_CHARS = 2048  # enough text for AFFINITY_DEPTH blocks of tokens


def prefix_hashes(prompts: Prompts, req: GenerateRequest, block_size: int) -> list[int]:
    """The request's leading block hashes as a worker's prefix cache keys its prompt (its
    conversation and tools rendered alike); only the head of the prompt is tokenized."""
    ids = request_token_ids(prompts, req, AFFINITY_CHARS)
    return block_hashes(ids, block_size, AFFINITY_DEPTH)


class RoutingMode(StrEnum):
    """How batches pick a worker: prefix affinity, round robin or least loaded."""

    AFFINITY = "affinity"
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


@dataclass
class WorkerView:
    """A worker as the batcher sees it between heartbeats (capacity spent locally)."""

    hb: WorkerHeartbeat
    free_slots: int
    free_tokens: int
    hashes: frozenset[int]

    @classmethod
    def of(cls, hb: WorkerHeartbeat, in_transit: int = 0, in_transit_tokens: int = 0) -> WorkerView:
        """The worker's advertised room, less what was sent after its heartbeat."""
        return cls(
            hb,
            hb.free_slots - in_transit,
            hb.free_kv_tokens - in_transit_tokens,
            frozenset(hb.prefix_hashes),
        )

    @property
    def worker_id(self) -> str:
        return self.hb.worker_id


class Refusal(StrEnum):
    """Why a live worker is never routed to (the metric's label)."""

    BLOCK_SIZE = "block_size"
    AFFINITY_DEPTH = "affinity_depth"


def refusal(
    hb: WorkerHeartbeat, block_size: int, affinity_depth: int = AFFINITY_DEPTH
) -> Refusal | None:
    """Why this batcher (cutting prompts into ``block_size`` blocks, hashing
    ``affinity_depth`` of them) must not route to the worker of ``hb``, or None. A worker
    that does not advertise a value (0: an older one) is not refused for it."""
    if hb.block_size and hb.block_size != block_size:
        return Refusal.BLOCK_SIZE
    if hb.affinity_depth and hb.affinity_depth != affinity_depth:
        return Refusal.AFFINITY_DEPTH
    return None


def admit(
    heartbeats: Sequence[WorkerHeartbeat], block_size: int, affinity_depth: int = AFFINITY_DEPTH
) -> tuple[list[WorkerHeartbeat], dict[str, Refusal]]:
    """The heartbeats of the workers this batcher may route to, and why each other worker
    is refused (by worker id)."""
    admitted: list[WorkerHeartbeat] = []
    refused: dict[str, Refusal] = {}
    for hb in heartbeats:
        why = refusal(hb, block_size, affinity_depth)
        if why is None:
            admitted.append(hb)
        else:
            refused[hb.worker_id] = why
    return admitted, refused


def _score(key: int, w: WorkerView) -> int:
    """Rendezvous (highest-random-weight) hashing: stable as workers come and go."""
    return zlib.crc32(f"{key}:{w.worker_id}".encode())


def least_loaded(workers: Sequence[WorkerView]) -> WorkerView:
    return max(workers, key=lambda w: (w.free_slots, w.free_tokens, w.worker_id))


class Router:
    """Picks the worker for each request from the live workers' views (pure, no I/O)."""

    def __init__(self, mode: RoutingMode = RoutingMode.AFFINITY, tolerance: int = 0) -> None:
        self.mode = mode
        self.tolerance = tolerance
        self._rr = 0

    def acceptable(self, w: WorkerView, workers: Sequence[WorkerView]) -> bool:
        """Whether affinity may send one more request to ``w``."""
        if w.free_slots > 0 and self.tolerance == 0:
            return True
        best = max(x.free_slots for x in workers)
        return w.free_slots > -self.tolerance and w.free_slots > best - self.tolerance

    def route(self, hashes: Sequence[int], workers: Sequence[WorkerView]) -> WorkerView:
        """The worker for a request whose leading block hashes are ``hashes``."""
        if self.mode is RoutingMode.ROUND_ROBIN:
            open_ = [w for w in workers if w.free_slots > 0] or list(workers)
            self._rr += 1
            return open_[self._rr % len(open_)]
        if self.mode is RoutingMode.AFFINITY and hashes:
            # Workers in the prefix's rendezvous order: the home first, so a copy that
            # spilled to another worker does not pull the prefix's traffic after it. Keyed
            # by the deepest block: chat templates open every prompt alike (a system
            # header, the tools preamble), so the first block would give all one home.
            ranked = sorted(workers, key=lambda w: _score(hashes[-1], w), reverse=True)
            for h in reversed(hashes):  # the deepest cached block wins
                for w in ranked:
                    if h in w.hashes and self.acceptable(w, workers):
                        return w
            if self.acceptable(ranked[0], workers):
                return ranked[0]
        return least_loaded(workers)


def partition_for(worker: WorkerView | None, key: str, num_partitions: int) -> int:
    """A partition owned by ``worker``, or one by stable hash when no worker is known
    (Kafka keeps the batch until a worker owns that partition)."""
    h = zlib.crc32(key.encode())
    if worker is not None and worker.hb.partitions:
        return worker.hb.partitions[h % len(worker.hb.partitions)]
    return h % max(1, num_partitions)
