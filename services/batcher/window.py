"""When the batcher dispatches (pure).

A batch opens with the first queued request and is dispatched as soon as it fills the free
capacity of the workers it targets, or when its window expires. An idle system adds no
wait: if a worker has room for everything queued, dispatch happens at once. What is
dispatched is capped by the workers' free slots: while every worker is full, requests wait
here, in fair order, rather than in the workers' FIFO queues.

The window slides between ``min_ms`` and ``max_ms`` with load: it stretches toward
``max_ms`` as workers saturate (bigger prefill groups, fewer hand-offs) and shrinks back
toward ``min_ms`` as the oldest request's queue wait approaches ``target_wait_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """The sliding window: how long to wait for more requests, from the queue's age and load."""

    min_ms: float = 50.0
    max_ms: float = 100.0
    max_requests: int = 64
    target_wait_ms: float = 200.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_ms <= self.max_ms or self.target_wait_ms <= 0 or self.max_requests < 1:
            raise ValueError("need 0 <= min_ms <= max_ms, target_wait_ms > 0, max_requests >= 1")

    def window_ms(self, saturation: float, oldest_wait_ms: float) -> float:
        """The window for the current load. ``saturation`` in [0, 1]: share of worker
        capacity in use; ``oldest_wait_ms``: how long the oldest queued request waited."""
        s = min(1.0, max(0.0, saturation))
        w = self.min_ms + (self.max_ms - self.min_ms) * s
        pressure = min(1.0, max(0.0, oldest_wait_ms / self.target_wait_ms))
        return max(self.min_ms, w - (w - self.min_ms) * pressure)

    def should_dispatch(
        self, queued: int, oldest_wait_ms: float, free_slots: int | None, saturation: float
    ) -> bool:
        """``free_slots``: room across live workers (None when no worker is known)."""
        if queued == 0:
            return False
        if queued >= self.max_requests:
            return True
        if free_slots is not None and free_slots >= queued:
            return True
        return oldest_wait_ms >= self.window_ms(saturation, oldest_wait_ms)
