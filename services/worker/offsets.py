"""Which batch offsets may be committed (pure).

A batch's offset is committable only when every request in it has finished, and offsets
are committed contiguously per partition: a crash redelivers every unfinished batch."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class OffsetTracker:
    """Owns the batches taken per partition and which of their requests are unsettled: the offsets that may be committed."""

    _pending: dict[int, dict[int, set[str]]] = field(default_factory=lambda: defaultdict(dict))
    _owner: dict[str, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    _committed: dict[int, int] = field(default_factory=dict)
    _unsent: dict[int, int] = field(default_factory=dict)  # positions whose commit failed

    def add(self, partition: int, offset: int, request_ids: list[str]) -> None:
        """A batch arrived; ``request_ids`` are the requests still to finish in it."""
        self._pending[partition][offset] = set(request_ids)
        for rid in request_ids:
            # The same id may sit in two batches (a batcher re-sent after a crash).
            self._owner[rid].add((partition, offset))

    def done(self, request_id: str) -> None:
        for part, off in self._owner.pop(request_id, ()):
            self._pending[part][off].discard(request_id)

    def committable(self) -> dict[int, int]:
        """Partition → next offset to commit, for partitions whose position advanced (or
        whose last commit failed)."""
        out = dict(self._unsent)
        self._unsent.clear()
        for part, batches in self._pending.items():
            nxt = None
            for off in sorted(batches):
                if batches[off]:
                    break
                del batches[off]
                nxt = off + 1
            if nxt is not None and nxt > self._committed.get(part, -1):
                self._committed[part] = nxt
                out[part] = nxt
        return out

    def not_committed(self, offsets: dict[int, int]) -> None:
        """A commit of ``offsets`` (from ``committable``) failed: offer them again."""
        for part, off in offsets.items():
            if self._committed.get(part) == off:
                self._unsent[part] = off

    def drop_partition(self, partition: int) -> list[str]:
        """Forget a revoked partition; returns its unfinished request ids."""
        batches = self._pending.pop(partition, {})
        self._committed.pop(partition, None)
        self._unsent.pop(partition, None)
        rids = sorted({rid for ids in batches.values() for rid in ids})
        for rid in rids:
            places = self._owner.get(rid, set())
            places -= {(partition, off) for off in batches}
            if not places:
                self._owner.pop(rid, None)
        return rids

    def unfinished(self) -> int:
        return len(self._owner)

    def unfinished_batches(self) -> int:
        return sum(1 for batches in self._pending.values() for ids in batches.values() if ids)
