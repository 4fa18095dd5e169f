"""Every request a worker holds, each in one phase, with explicit transitions (pure: no
torch, no I/O).

A request arrives with a batch. It may start at once (``CLAIMING``: in the engine, its
outputs held until its claim answers; then ``RUNNING``). Otherwise its claim decides:
this worker's (``CLAIMED``: being started; then ``RUNNING``, or ended at once — cancelled,
failing, a poison — in ``SETTLING``), or another live worker's (``DEFERRED`` until that one
ends it or its claim lapses, then ``CLAIMED``). A running request ends in ``SETTLING``
(its final event built; its completion, dead letter and done marker follow), or goes back
to ``DEFERRED`` when another worker took its claim. It leaves the table when it is
settled, withdrawn (claimed elsewhere while CLAIMING), finished elsewhere, or handed back
(its partition revoked)."""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Generic, Protocol, TypeVar


class Phase(Enum):
    """Where a request held by this worker is: its claim being taken, claimed, running in the engine, deferred (claimed elsewhere), or settling its results."""

    CLAIMING = "claiming"
    CLAIMED = "claimed"
    RUNNING = "running"
    DEFERRED = "deferred"
    SETTLING = "settling"

    @property
    def in_engine(self) -> bool:
        return self in (Phase.CLAIMING, Phase.RUNNING)


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.CLAIMING: frozenset({Phase.RUNNING}),
    Phase.CLAIMED: frozenset({Phase.RUNNING, Phase.SETTLING}),
    Phase.RUNNING: frozenset({Phase.SETTLING, Phase.DEFERRED}),
    Phase.DEFERRED: frozenset({Phase.CLAIMED}),
    Phase.SETTLING: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A request was moved to a phase its current one does not lead to (a bug)."""


class Tracked(Protocol):
    """What the request table needs of a held request: its id, phase and partition."""

    phase: Phase
    partition: int

    @property
    def request_id(self) -> str: ...


T = TypeVar("T", bound=Tracked)


class RequestTable(Generic[T]):
    """The requests of one worker by id; phases change only through ``move``."""

    def __init__(self) -> None:
        self._by_id: dict[str, T] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, request_id: str) -> T | None:
        return self._by_id.get(request_id)

    def add(self, item: T) -> None:
        if item.request_id in self._by_id:
            raise IllegalTransition(f"{item.request_id} is already held ({item.phase.value})")
        self._by_id[item.request_id] = item

    def move(self, item: T, phase: Phase) -> None:
        if self._by_id.get(item.request_id) is not item:
            raise IllegalTransition(f"{item.request_id} is not held")
        if phase not in TRANSITIONS[item.phase]:
            raise IllegalTransition(
                f"{item.request_id}: {item.phase.value} does not lead to {phase.value}"
            )
        item.phase = phase

    def drop(self, item: T) -> bool:
        """Remove ``item`` (settled, withdrawn or handed back); False if not held."""
        if self._by_id.get(item.request_id) is not item:
            return False
        del self._by_id[item.request_id]
        return True

    def in_phase(self, *phases: Phase) -> list[T]:
        return [it for it in self._by_id.values() if it.phase in phases]

    def in_engine(self) -> Iterator[T]:
        return (it for it in self._by_id.values() if it.phase.in_engine)

    @property
    def engine_count(self) -> int:
        return sum(1 for _ in self.in_engine())

    def of_partition(self, partition: int) -> list[T]:
        return [it for it in self._by_id.values() if it.partition == partition]
