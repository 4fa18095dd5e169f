"""Stopping background tasks when a cancel can be lost.

A cancel does not always end a task here. On Python 3.11, ``asyncio.wait_for`` returns its
inner call's result instead of raising when the cancel arrives as that call completes,
and redis-py sends and reads through it: a loop of Redis calls, cancelled, went on in
about a third of the tries (a throwaway script against the test Redis). aiokafka's
consumer close awaits its own cancelled tasks under ``suppress(CancelledError)``, losing
a cancel that lands there. A stop that cancels once and waits can then wait for ever (an
edge still ran 90 s after SIGTERM, its batch collector reading on; another, its load
watcher polling on). ``cancel_and_wait`` cancels again until the tasks have ended, within
a bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

STOP_S = 10.0  # how long a stop waits before it leaves a task behind
RECANCEL_S = 0.2  # how often a task still running is cancelled again


async def cancel_and_wait(
    *tasks: asyncio.Future[Any] | None, within_s: float = STOP_S
) -> set[asyncio.Future[Any]]:
    """Cancel ``tasks`` (None ones skipped) and wait until each has ended, cancelling
    those still running again every ``RECANCEL_S``; after ``within_s``, give up on the
    rest: they are returned (and logged). Exceptions the tasks ended with are taken, as
    ``gather(..., return_exceptions=True)`` does, and not raised. A task's own clean-up
    (a ``finally`` that awaits) is cancelled too when it takes longer than ``RECANCEL_S``:
    for tasks whose clean-up is best effort, as the services' background loops are."""
    pending = {t for t in tasks if t is not None and not t.done()}
    deadline = time.monotonic() + within_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning(
                "%d task(s) still running %.0f s after they were cancelled: left behind (%s)",
                len(pending),
                within_s,
                ", ".join(sorted(_name(t) for t in pending)),
            )
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    for ended in tasks:
        if ended is not None and ended.done() and not ended.cancelled():
            ended.exception()  # taken: not reported as never retrieved
    return pending


def _name(task: asyncio.Future[Any]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else repr(task)
