"""The feed of the edge's dashboard page: one snapshot of the running system a second, read
by ``tokenwire status``'s own ``Collector``, and a few minutes of chart points.

One feed serves every open page of this edge: it reads while at least one page listens
and rests when none does (the history it gathered stays). Each point holds tokens/s and
KV use per worker, the batchers' queue depth, and the fleet's time-to-first-token p50/p99
over the last ``TTFT_SPAN_S`` (the workers' histogram buckets summed, so the quantiles are
the fleet's, not an average of the workers')."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from services.ops.status import Collector, Snapshot, quantile, ttft_span
from shared.settings import CommonSettings
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
QUIET_S = 10.0  # a listener hears at least this often (an SSE comment keeps proxies open)
HISTORY_POINTS = 300  # five minutes at one a second
TTFT_SPAN_S = 10.0  # a second holds too few first tokens for a p99


def chart_point(snap: Snapshot, ttft: tuple[float | None, float | None]) -> dict[str, Any]:
    """What the charts plot for one snapshot (live members only)."""
    workers = [w for w in snap.workers if w["state"] == "live"]
    return {
        "at": snap.at,
        "tokens_per_s": {w["id"]: w["tokens_per_s"] for w in workers},
        "kv_used_pct": {w["id"]: w["kv_used_pct"] for w in workers},
        "queue_depth": sum(b["queued_requests"] for b in snap.batchers if b["state"] == "live"),
        "ttft_p50_ms": ttft[0],
        "ttft_p99_ms": ttft[1],
    }


def fleet_ttft(
    now: dict[str, dict[str, Any]], then: dict[str, dict[str, Any]]
) -> tuple[float | None, float | None]:
    """Time-to-first-token p50 and p99 (ms) of the first tokens between two readings of the
    workers' heartbeats (``then``: the earlier, by worker id); a worker's buckets count
    only where both readings have the same bounds."""
    total: list[int] = []
    le: list[float] = []
    for wid, hb in now.items():
        span = ttft_span(hb, then.get(wid))
        if span is None or (total and hb["ttft_le"] != le):
            continue
        le = hb["ttft_le"]
        total = [a + b for a, b in zip(total, span, strict=True)] if total else span
    p50, p99 = quantile(0.5, le, total), quantile(0.99, le, total)
    return (
        None if p50 is None else round(1000 * p50, 1),
        None if p99 is None else round(1000 * p99, 1),
    )


def _slim(snap: Snapshot) -> dict[str, Any]:
    """The status JSON without the raw records (prefix hashes, histogram buckets): the page
    shows the rows' own fields."""
    out = snap.as_json()
    for kind in ("workers", "batchers", "edges"):
        out[kind] = [{k: v for k, v in row.items() if k != "record"} for row in out[kind]]
    return out


class DashboardFeed:
    """Reads a snapshot every ``INTERVAL_S`` while pages listen; ``listen`` yields the
    history first, then each new snapshot."""

    def __init__(self, settings: CommonSettings, redis: aioredis.Redis) -> None:
        self._collector = Collector(settings, redis)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self._beats: deque[tuple[float, dict[str, dict[str, Any]]]] = deque()
        self.latest: dict[str, Any] | None = None
        self._listeners = 0
        self._tick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def listen(self) -> AsyncIterator[dict[str, Any] | None]:
        """Events for one page: ``{"history": [...], "interval_s": ...}`` first, then
        ``{"status": ..., "point": ...}`` each second (``None`` after ``QUIET_S`` without
        one), until the caller stops iterating."""
        self._listeners += 1
        try:
            self._ensure_reading()
            yield {"history": list(self.history), "interval_s": INTERVAL_S}
            if self.latest is not None:
                yield self.latest
            while True:
                tick = self._tick
                try:
                    await asyncio.wait_for(tick.wait(), QUIET_S)
                except TimeoutError:
                    self._ensure_reading()
                    yield None
                    continue
                if self.latest is not None:
                    yield self.latest
        finally:
            self._listeners -= 1

    def _ensure_reading(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="edge-dashboard")
            self._task.add_done_callback(_report)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await self._collector.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._listeners > 0:
            started = loop.time()
            snap = await self._collector.snapshot()
            beats = {w["id"]: w["record"] for w in snap.workers if w["state"] == "live"}
            self._beats.append((snap.at, beats))
            while len(self._beats) > 1 and self._beats[1][0] <= snap.at - TTFT_SPAN_S:
                self._beats.popleft()
            point = chart_point(snap, fleet_ttft(beats, self._beats[0][1]))
            self.history.append(point)
            self.latest = {"status": _slim(snap), "point": point}
            self._tick.set()
            self._tick = asyncio.Event()
            await asyncio.sleep(max(0.0, INTERVAL_S - (loop.time() - started)))


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("dashboard feed stopped (a listener restarts it)", exc_info=task.exception())
