"""Identical cache misses sent straight to Kafka, coalesced (pure: no I/O, no clock).

The first of identical cacheable misses takes the in-flight marker
(``shared.cache.inflight``) and goes to a worker; one that finds the marker held follows
its holder instead of being queued. The batcher looks at every followed marker now and
then, in one round trip, and hands what it saw (``Seen``) to ``Following.settle``:

- the entry is there: every follower is answered from it, as an exact hit;
- another request holds the marker now (a follower elsewhere took over): follow it;
- the leader ended without storing an answer, or its marker is gone: one follower that
  may lead (its answer will be stored) is handed over, to claim the marker and be
  generated in the leader's place (``handed``); with none that may, all are generated;
- a follower past its deadline (the coalescing wait, or its own request deadline) is
  generated itself.

Followers are never queued while they wait, so they hold no window back; their offsets
stay uncommitted, so a batcher that dies with followers leaves them to be read again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Follower(Generic[T]):
    """A miss waiting for an identical request's answer."""

    item: T
    request_id: str
    may_lead: bool  # its answer would be stored: it may take a failed leader's place
    deadline: float  # past it, it is generated itself


@dataclass(slots=True)
class Group(Generic[T]):
    """The followers of one in-flight marker, and the request they believe holds it."""

    marker: str
    scope: str
    digest: str
    leader: str
    followers: list[Follower[T]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Seen:
    """One look at a group in Redis: the marker's holder, whether the leader has ended
    (its done marker, read before the entry: an answer is stored before it is set), and
    the entry."""

    holder: str | None
    leader_done: bool
    entry: bytes | None


@dataclass(frozen=True, slots=True)
class Handover(Generic[T]):
    """A failed leader's marker, to be claimed by ``candidate`` (replacing ``failed``)."""

    marker: str
    scope: str
    digest: str
    failed: str
    candidate: Follower[T]


@dataclass(slots=True)
class Outcome(Generic[T]):
    """What one look decided: followers to answer from an entry, followers to generate,
    and markers to hand over."""

    answered: list[tuple[T, bytes]] = field(default_factory=list)
    generate: list[T] = field(default_factory=list)
    handovers: list[Handover[T]] = field(default_factory=list)


class Following(Generic[T]):
    """The batcher's followers, grouped by the marker they wait on."""

    def __init__(self) -> None:
        self.groups: dict[str, Group[T]] = {}

    def __len__(self) -> int:
        return sum(len(g.followers) for g in self.groups.values())

    def follow(self, marker: str, scope: str, digest: str, leader: str, f: Follower[T]) -> None:
        """Wait on ``marker``, which ``leader`` holds (as a claim just told)."""
        group = self.groups.get(marker)
        if group is None:
            group = self.groups[marker] = Group(marker, scope, digest, leader)
        group.leader = leader  # the latest claim's word is the freshest
        group.followers.append(f)

    def settle(self, seen: dict[str, Seen], now: float) -> Outcome[T]:
        """Apply one look at each group (keyed by marker; a group not looked at, Redis
        being away, only has its followers' deadlines applied)."""
        out: Outcome[T] = Outcome()
        for group in list(self.groups.values()):
            s = seen.get(group.marker)
            if s is not None:
                self._look(group, s, out)
            out.generate += [f.item for f in group.followers if f.deadline <= now]
            group.followers = [f for f in group.followers if f.deadline > now]
            handing = any(h.marker == group.marker for h in out.handovers)
            if not group.followers and not handing:
                del self.groups[group.marker]
        return out

    def _look(self, group: Group[T], s: Seen, out: Outcome[T]) -> None:
        if s.entry is not None:
            out.answered += [(f.item, s.entry) for f in group.followers]
            group.followers = []
        elif s.holder is not None and s.holder != group.leader:
            group.leader = s.holder  # someone else took the marker over: follow it
        elif s.holder is None or s.leader_done:
            self._hand_over(group, out)

    def _hand_over(self, group: Group[T], out: Outcome[T]) -> None:
        """The leader ended without an answer (or let its marker go): one follower that
        may lead claims its place; with none that may, every follower is generated."""
        candidate = next((f for f in group.followers if f.may_lead), None)
        if candidate is None:
            out.generate += [f.item for f in group.followers]
            group.followers = []
            return
        group.followers.remove(candidate)
        out.handovers.append(
            Handover(group.marker, group.scope, group.digest, group.leader, candidate)
        )

    def handed(self, h: Handover[T], holder: str | None) -> T | None:
        """The claim of ``h`` answered ``holder``: None when the candidate took the
        marker (it is returned, to be generated; the others now follow it), else the
        holder is followed and the candidate waits on with the others."""
        group = self.groups.get(h.marker)
        if group is None:  # its other followers' partitions moved away meanwhile
            group = self.groups[h.marker] = Group(h.marker, h.scope, h.digest, h.failed)
        if holder is None:
            group.leader = h.candidate.request_id
            if not group.followers:
                del self.groups[h.marker]
            return h.candidate.item
        group.leader = holder
        group.followers.insert(0, h.candidate)
        return None

    def remove_if(self, drop: Callable[[T], bool]) -> list[T]:
        """Stop following the items ``drop`` selects (their partitions moved away)."""
        gone: list[T] = []
        for marker, group in list(self.groups.items()):
            gone += [f.item for f in group.followers if drop(f.item)]
            group.followers = [f for f in group.followers if not drop(f.item)]
            if not group.followers:
                del self.groups[marker]
        return gone
