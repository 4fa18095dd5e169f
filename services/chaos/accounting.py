"""What each request got, judged from what its client saw: no I/O here.

A request is *completed* when it ended the way it should (``Expect``) with every event
once and none missing; *duplicated* when anything reached it twice (an SSE id, a Kafka
``Completion``); a *stall* is the longest a running stream waited for its next event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise


class Expect(StrEnum):
    """How a request should end."""

    OK = "ok"  # stop or length: the normal answer
    ANSWERED = "answered"  # any final event, an error included (a hostile request)
    ERROR = "error"  # an error event (a request the worker must refuse)
    CANCELLED = "cancelled"  # nobody follows it any more


def meets(expect: Expect, finish: str | None) -> bool:
    """Whether a stream whose final event had ``finish`` (None: it had none) ended as
    ``expect`` says."""
    if finish is None:
        return False
    if expect is Expect.OK:
        return finish in ("stop", "length")
    if expect is Expect.ANSWERED:
        return True
    return finish == expect.value


@dataclass(frozen=True)
class StreamCheck:
    """The ``id:`` values of one stream, checked."""

    events: int
    duplicates: int  # events whose id had come before
    gaps: int  # ids below the highest one that never came
    stall_s: float  # the longest wait for an event while the stream ran


def check_stream(
    events: Sequence[tuple[int, float]], started_at: float, ended_at: float | None = None
) -> StreamCheck:
    """Check a stream's events, each ``(id, arrival time)`` in arrival order. The stall
    counts from ``started_at`` (the response began) to the first event, between events,
    and from the last one to ``ended_at`` when given (the stream ended without one)."""
    ids = [i for i, _ in events]
    unique = set(ids)
    times = [started_at, *(t for _, t in events)]
    if ended_at is not None:
        times.append(ended_at)
    return StreamCheck(
        events=len(ids),
        duplicates=len(ids) - len(unique),
        gaps=max(ids) + 1 - len(unique) if ids else 0,
        stall_s=max((b - a for a, b in pairwise(times)), default=0.0),
    )


@dataclass(frozen=True)
class Outcome:
    """One request's account."""

    completed: bool
    duplicated: bool = False
    stall_s: float = 0.0
    retries: int = 0  # refusals (503, 429) and failed connections before it was taken
    why: str = ""  # what went wrong, when something did
    request_id: str = ""


def stream_outcome(
    check: StreamCheck, finish: str | None, done: bool, expect: Expect, retries: int = 0
) -> Outcome:
    """A streamed request that its client followed to the end (or until it was cut)."""
    problems = []
    if check.gaps:
        problems.append(f"{check.gaps} ids missing")
    if not meets(expect, finish):
        problems.append(f"ended {finish or 'without a final event'} (expected {expect})")
    elif not done:
        problems.append("no [DONE]")
    return Outcome(
        completed=not problems,
        duplicated=check.duplicates > 0,
        stall_s=check.stall_s,
        retries=retries,
        why="; ".join(problems),
    )


def log_outcome(seqs: Sequence[int], finish: str | None, expect: Expect) -> Outcome:
    """A request judged by its replay log: seqs contiguous from 0, ending as expected."""
    if list(seqs) != list(range(len(seqs))):
        return Outcome(completed=False, why=f"replay log seqs not contiguous: {list(seqs)[:8]}")
    if not meets(expect, finish):
        ended = finish or "not ended"
        return Outcome(completed=False, why=f"replay log {ended} (expected {expect})")
    return Outcome(completed=True)


def unfollowed_outcome(
    seqs: Sequence[int], finish: str | None, ended_s: float, grace_s: float
) -> Outcome:
    """A stream nobody follows any more (its edge killed): its worker must cancel it once
    the grace has run out, unless it finished on its own before then. ``ended_s`` is how
    long after the kill its log was seen ended, an upper bound of when it ended: a stream
    seen finished inside the grace was never owed a cancel (a fast machine runs a long
    one to its end first); one that ran past the grace was."""
    if ended_s < grace_s and meets(Expect.OK, finish):
        return log_outcome(seqs, finish, Expect.OK)
    return log_outcome(seqs, finish, Expect.CANCELLED)


def reply_outcome(finishes: Sequence[str], expect: Expect) -> Outcome:
    """A Kafka-reply request, by the ``Completion`` records that came for it (each one's
    finish reason): exactly one is owed."""
    if not finishes:
        return Outcome(completed=False, why="no Completion")
    ok = meets(expect, finishes[0])
    why = "" if ok else f"Completion {finishes[0]} (expected {expect})"
    return Outcome(completed=ok, duplicated=len(finishes) > 1, why=why)


def cut_stream_outcome(check: StreamCheck, log: Outcome) -> Outcome:
    """A stream whose connection was cut on purpose (its edge killed): the ids its client
    saw before the cut, and ``log``, its replay log judged."""
    problems = [f"{check.gaps} ids missing"] if check.gaps else []
    if log.why:
        problems.append(log.why)
    return Outcome(
        completed=not problems,
        duplicated=check.duplicates > 0,
        stall_s=check.stall_s,
        why="; ".join(problems),
        request_id=log.request_id,
    )


def reasons(outcomes: Sequence[Outcome], limit: int = 3) -> list[str]:
    """The most frequent reasons requests were not completed or got something twice, with
    their counts and a request id to look up."""
    counts = Counter(o.why or "duplicated" for o in outcomes if o.why or o.duplicated)
    example = {o.why or "duplicated": o.request_id for o in outcomes if o.request_id}
    return [
        f"{n}× {why}" + (f" (e.g. {example[why]})" if example.get(why) else "")
        for why, n in counts.most_common(limit)
    ]
