"""Choosing the worker for each request (pure).

Prefix affinity first: a request goes to the worker whose cache summary holds its deepest
leading block, else to its prefix's home worker by rendezvous hashing over live workers —
unless that worker is overloaded (no free slot and already ``allowance`` requests queued
beyond them), in which case the least-loaded worker takes it. Requests without a full
leading block go to the least-loaded worker.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared.messages import WorkerHeartbeat


class RoutingMode(StrEnum):
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


def _rendezvous(key: int, workers: Sequence[WorkerView]) -> WorkerView:
    return max(workers, key=lambda w: zlib.crc32(f"{key}:{w.worker_id}".encode()))


def least_loaded(workers: Sequence[WorkerView]) -> WorkerView:
    return max(workers, key=lambda w: (w.free_slots, w.free_tokens, w.worker_id))


class Router:
    def __init__(self, mode: RoutingMode = RoutingMode.AFFINITY, allowance: int = 0) -> None:
        self.mode = mode
        self.allowance = allowance  # requests a worker may queue beyond its free slots
        self._rr = 0

    def has_room(self, w: WorkerView) -> bool:
        return w.free_slots + self.allowance > 0

    def route(self, hashes: Sequence[int], workers: Sequence[WorkerView]) -> WorkerView:
        """The worker for a request whose leading block hashes are ``hashes``."""
        if self.mode is RoutingMode.ROUND_ROBIN:
            self._rr += 1
            return workers[self._rr % len(workers)]
        if self.mode is RoutingMode.AFFINITY and hashes:
            for h in reversed(hashes):
                holders = [w for w in workers if h in w.hashes and self.has_room(w)]
                if holders:
                    return least_loaded(holders)
            home = _rendezvous(hashes[0], workers)
            if self.has_room(home):
                return home
        return least_loaded(workers)


def partition_for(worker: WorkerView | None, key: str, num_partitions: int) -> int:
    """A partition owned by ``worker``, or one by stable hash when no worker is known
    (Kafka keeps the batch until a worker owns that partition)."""
    h = zlib.crc32(key.encode())
    if worker is not None and worker.hb.partitions:
        return worker.hb.partitions[h % len(worker.hb.partitions)]
    return h % max(1, num_partitions)
