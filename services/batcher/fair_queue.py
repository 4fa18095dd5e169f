"""The batcher's queue (pure): interactive before bulk, and within a priority class tenants
share dispatch fairly by tokens (deficit round-robin), so one tenant's flood cannot starve
another. Bulk requests are taken only when no interactive request waits."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Queued(Generic[T]):
    """One queued item with its tenant, priority, token cost and arrival time."""

    item: T
    tenant: str
    priority: int  # 0 interactive, 1 bulk
    cost: int  # tokens: prompt estimate + max_tokens
    enqueued_at: float


class FairQueue(Generic[T]):
    """Deficit round-robin over tenants, one round-robin per priority class."""

    def __init__(self, quantum: int = 64, classes: int = 2) -> None:
        if quantum < 1:
            raise ValueError("quantum must be at least one token")
        self.quantum = quantum
        self._classes: list[OrderedDict[str, deque[Queued[T]]]] = [
            OrderedDict() for _ in range(classes)
        ]
        self._deficit: dict[tuple[int, str], int] = {}
        self.count = 0
        self.tokens = 0

    def __len__(self) -> int:
        return self.count

    def push(self, q: Queued[T]) -> None:
        tenants = self._classes[q.priority]
        tenants.setdefault(q.tenant, deque()).append(q)
        self.count += 1
        self.tokens += q.cost

    def requeue(self, items: list[Queued[T]]) -> None:
        """Put back requests taken by ``pop`` whose send failed: ahead of the rest of their
        tenants' requests, in the order they were taken."""
        for q in reversed(items):
            self._classes[q.priority].setdefault(q.tenant, deque()).appendleft(q)
            self.count += 1
            self.tokens += q.cost

    def depth_by_class(self) -> list[int]:
        """Requests queued in each priority class, by rank."""
        return [sum(len(d) for d in c.values()) for c in self._classes]

    def oldest(self) -> float | None:
        """When the longest-waiting request was queued."""
        heads = [d[0].enqueued_at for c in self._classes for d in c.values() if d]
        return min(heads) if heads else None

    def pop(
        self, max_items: int, max_tokens: int | None = None, max_bulk: int | None = None
    ) -> list[Queued[T]]:
        """Up to ``max_items`` requests (and about ``max_tokens`` tokens) in fair order, of
        which at most ``max_bulk`` from the classes after the first."""
        out: list[Queued[T]] = []
        budget = max_tokens
        for prio, tenants in enumerate(self._classes):
            limit = (
                max_items if prio == 0 or max_bulk is None else min(max_items, len(out) + max_bulk)
            )
            while tenants and len(out) < limit:
                tenant = next(iter(tenants))
                dq, key = tenants[tenant], (prio, tenant)
                head = dq[0]
                if budget is not None and out and head.cost > budget:
                    return out
                credit = self._deficit.get(key, 0)
                if credit < head.cost:
                    # A new turn: one quantum of credit; too little still, next tenant.
                    credit += self.quantum
                    self._deficit[key] = credit
                    if credit < head.cost:
                        tenants.move_to_end(tenant)
                        continue
                dq.popleft()
                credit -= head.cost
                self._deficit[key] = credit
                self.count -= 1
                self.tokens -= head.cost
                if budget is not None:
                    budget -= head.cost
                out.append(head)
                if not dq:
                    del tenants[tenant]
                    self._deficit.pop(key, None)  # an idle tenant keeps no credit
                elif credit < dq[0].cost:
                    tenants.move_to_end(tenant)  # its turn is over; the rest of its credit stays
        return out

    def remove_if(self, pred: Callable[[Queued[T]], bool]) -> list[Queued[T]]:
        """Take out every queued request matching ``pred`` (expired, revoked, …)."""
        removed: list[Queued[T]] = []
        for prio, tenants in enumerate(self._classes):
            for tenant in list(tenants):
                keep = deque(q for q in tenants[tenant] if not pred(q))
                removed += [q for q in tenants[tenant] if pred(q)]
                if keep:
                    tenants[tenant] = keep
                else:
                    del tenants[tenant]
                    self._deficit.pop((prio, tenant), None)
        self.count -= len(removed)
        self.tokens -= sum(q.cost for q in removed)
        return removed

    def __iter__(self) -> Iterator[Queued[T]]:
        for tenants in self._classes:
            for dq in tenants.values():
                yield from dq
