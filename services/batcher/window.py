"""When a batch is dispatched (pure).

A batch opens with its first request. It is dispatched at once when the worker it targets
has free slots for all of it (an idle system adds no wait), when it reaches the maximum
size, or when its window expires. The window is bounded by ``min_ms``..``max_ms``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    min_ms: float = 50.0
    max_ms: float = 100.0
    max_requests: int = 64

    def window_ms(self, saturated: bool) -> float:
        """Longer while workers are saturated (bigger groups, fewer hand-offs)."""
        return self.max_ms if saturated else self.min_ms

    def should_dispatch(
        self, size: int, opened_at: float, now: float, free_slots: int | None
    ) -> bool:
        if size == 0:
            return False
        if size >= self.max_requests:
            return True
        if free_slots is not None and free_slots >= size:
            return True
        saturated = free_slots is not None and free_slots <= 0
        return (now - opened_at) * 1000.0 >= self.window_ms(saturated)
