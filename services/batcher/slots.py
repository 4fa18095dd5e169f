"""A worker's free slots shared by every batcher (pure: the rules, no I/O).

A worker advertises its free slots in each heartbeat. Every batcher that sends it requests
reserves slots in one ledger per worker (a Redis hash, updated by ``reservations.LUA``,
which applies these same rules atomically):

- The ledger keeps the newest heartbeat it was shown (its ``at`` is the epoch). A batcher
  holding an older heartbeat is answered from the newer one, never the reverse: a stale
  view cannot bring back slots the worker has since filled.
- A reservation made more than ``margin`` before the epoch's heartbeat has reached the
  worker by then, so the heartbeat counts it and the ledger drops it; younger ones may
  still be in transit and stay reserved (counted twice at worst, never missed).
- A grant is what the epoch's free slots leave after the reservations still held; the
  sum of what all batchers hold never exceeds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Grant:
    """Slots granted to one reservation, and what the worker has left after it."""

    granted: int
    left: int


@dataclass
class SlotLedger:
    """One worker's ledger: the epoch's heartbeat and the reservations it does not count."""

    epoch: float = -1.0
    free: int = 0
    held: dict[str, tuple[float, int]] = field(default_factory=dict)  # token → (at, slots)

    def reserve(
        self, hb_at: float, hb_free: int, now: float, want: int, margin_s: float, token: str
    ) -> Grant:
        """Reserve up to ``want`` slots at ``now`` for a batcher whose view of the worker
        is the heartbeat (``hb_at``, ``hb_free``)."""
        if hb_at > self.epoch:
            self.epoch, self.free = hb_at, hb_free
        cutoff = self.epoch - margin_s
        self.held = {t: (at, n) for t, (at, n) in self.held.items() if at > cutoff}
        used = sum(n for _, n in self.held.values())
        granted = max(0, min(want, self.free - used))
        if granted > 0:
            self.held[token] = (now, granted)
        return Grant(granted, self.free - used - granted)
