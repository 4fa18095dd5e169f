"""Choosing a worker partition for a batch (pure)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from shared.messages import WorkerHeartbeat


def pick_worker(workers: Sequence[WorkerHeartbeat], size: int) -> WorkerHeartbeat | None:
    """The worker with the most free sequence slots among those holding partitions."""
    live = [w for w in workers if w.partitions]
    if not live:
        return None
    return max(live, key=lambda w: (w.free_slots, w.free_kv_tokens, w.worker_id))


def pick_partition(worker: WorkerHeartbeat | None, key: str, num_partitions: int) -> int:
    """A partition of the chosen worker, or one by stable hash when no worker is known
    (Kafka keeps the batch until a worker owns that partition)."""
    h = zlib.crc32(key.encode())
    if worker is not None:
        return worker.partitions[h % len(worker.partitions)]
    return h % max(1, num_partitions)
