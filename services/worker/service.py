"""The worker service: Kafka batches in, engine steps, token events out to Redis.

The engine runs in a process of its own (``EngineProcess``); this service's event loop
feeds it and publishes its outputs. One part per concern, sharing one ``WorkerContext``
(and in it one table of the requests the worker holds, each in one ``Phase``): ``Intake``
claims and starts what the batches topic brings, ``Output`` publishes each step's events
for all sequences in one Redis write, ``Settler`` settles ended requests (completions and
dead letters to Kafka, then done markers, then offset commits), ``Heartbeat`` advertises
load and keeps claims alive, ``listen_for_cancels`` aborts cancelled requests.

Hand-off guarantees: a batch's offset is committed only when all its requests are settled;
a request's stream is written by one worker at a time (a claim in Redis that expires when
its worker dies; the engine may start while the claim is taken, and a request claimed
elsewhere is aborted with nothing published); a redelivered request skips the events
already in its replay log, and one whose done marker exists is never generated again. The
done marker is written only once everything the request owes (its final event, its Kafka
completion, its dead letter) is acknowledged.

Failure model: a failure that belongs to one request ends that request (an error event at
its next seq, a dead letter); a request that was running during two worker crashes is
quarantined as a poison; Redis or Kafka going away is waited out with backoff (token events
buffered in order, the engine paused when the buffer is full), never a reason to exit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import TopicPartition

from services.worker.config import WorkerSettings
from services.worker.context import WorkerContext
from services.worker.control import Heartbeat, listen_for_cancels
from services.worker.intake import Intake
from services.worker.output import Output
from services.worker.requests import Phase
from services.worker.runtime import EngineProcess
from services.worker.settle import Settler
from shared import registry
from shared.consumer_flow import Rebalance
from shared.kafka_io import start_consumer, unless_stopped
from shared.metrics import serve_metrics
from shared.retry import REDIS_DOWN
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SHUTDOWN_STEP_S = 5.0
# Requests a revoked partition takes away (settling ones finish here).
_HELD = (Phase.CLAIMING, Phase.CLAIMED, Phase.RUNNING, Phase.DEFERRED)


class WorkerService:
    """A decode worker in the ``tw.batches`` consumer group: its parts, their lifecycle, and
    handing requests back when partitions move."""

    def __init__(self, settings: WorkerSettings, runner: EngineProcess, tokenizer: Any) -> None:
        self.ctx = ctx = WorkerContext.build(settings, runner, tokenizer)
        self.output = Output(ctx)
        self.intake = Intake(ctx, self.output)
        self.settler = Settler(ctx)
        self.heartbeat = Heartbeat(ctx, self.intake)
        self._stopping = asyncio.Event()
        self._revoking: set[int] = set()  # revoked in a rebalance not yet assigned

    async def run(self) -> None:
        """Serve until ``stop()``; then drain gracefully (see ``_shutdown``)."""
        ctx = self.ctx
        s = ctx.settings
        serve_metrics(
            ctx.metrics.registry,
            s.metrics_port,
            s.metrics_host,
            readiness=lambda: {"redis": ctx.redis_dep.up, "kafka": ctx.kafka_dep.up},
        )
        await ctx.runner.attach()
        if not await unless_stopped(self._start_kafka(), self._stopping):
            await self._close_unstarted()
            return
        consume = asyncio.create_task(self.intake.run(), name="consume")
        others = [
            asyncio.create_task(self.output.run(), name="publish"),
            asyncio.create_task(self.settler.run(), name="settle"),
            asyncio.create_task(self.heartbeat.run(), name="heartbeat"),
            asyncio.create_task(listen_for_cancels(ctx), name="cancels"),
        ]
        stop = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait(
                [consume, *others, stop], return_when=asyncio.FIRST_COMPLETED
            )
            for t in done:
                if t is not stop and t.exception():
                    raise t.exception()  # type: ignore[misc]
            await cancel_and_wait(consume, within_s=SHUTDOWN_STEP_S)
            await self._drain()
        finally:
            # Bounded: a client library that ignores cancellation must not keep a stopping
            # worker (and its partitions) hostage.
            await cancel_and_wait(consume, *others, stop, within_s=SHUTDOWN_STEP_S)
            await asyncio.to_thread(ctx.runner.stop)
            await asyncio.wait_for(self._shutdown(), timeout=3 * SHUTDOWN_STEP_S)

    async def _start_kafka(self) -> None:
        """Start the producer, the probe and the consumer, however long Kafka keeps this
        worker out (away, or refusing its login)."""
        ctx = self.ctx
        await ctx.producer.start()
        ctx.kafka_probe.start()
        ctx.consumer.subscribe(
            [ctx.names.batches],
            listener=Rebalance(self._revoked, self._assigned),
        )
        await start_consumer(ctx.consumer, ctx.settings.kafka)

    async def _close_unstarted(self) -> None:
        """Stopped while Kafka kept it out: nothing was taken, so nothing to hand back."""
        ctx = self.ctx
        await asyncio.to_thread(ctx.runner.stop)
        await ctx.kafka_probe.stop()
        await ctx.consumer.stop()
        await ctx.producer.stop()
        await ctx.publisher.aclose()
        await ctx.claims.aclose()
        await ctx.redis.aclose()

    def stop(self) -> None:
        self._stopping.set()

    async def _drain(self) -> None:
        """Stop taking work and let running requests finish, and be settled, for a bounded
        time."""
        ctx = self.ctx
        deadline = time.monotonic() + ctx.settings.drain_timeout_s
        if ctx.table.engine_count:
            ctx.idle.clear()
            try:
                await asyncio.wait_for(ctx.idle.wait(), ctx.settings.drain_timeout_s)
            except TimeoutError:
                log.info(
                    "drain: %d requests still running, handing them back", ctx.table.engine_count
                )
        try:
            await asyncio.wait_for(ctx.finals.join(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("drain: ended requests not settled in time; they are redelivered")

    async def _shutdown(self) -> None:
        """Hand back what did not finish (its batches stay uncommitted, so the group
        redelivers them), commit what did, and leave the group."""
        ctx = self.ctx
        await self.hand_back(sorted({st.partition for st in ctx.table.in_phase(*_HELD)}))
        await self.settler.commit()
        await ctx.consumer.stop()
        await ctx.kafka_probe.stop()
        await ctx.producer.stop()
        pipe = ctx.redis.pipeline(transaction=False)
        wid = ctx.settings.worker_id
        registry.withdraw(pipe, ctx.names.workers_index, wid, ctx.names.heartbeat(wid))
        try:
            await pipe.execute()
        except REDIS_DOWN as exc:  # the heartbeat key expires on its own
            log.warning("could not withdraw the heartbeat: %r", exc)
        await ctx.publisher.aclose()
        await ctx.claims.aclose()
        await ctx.redis.aclose()

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        """A rebalance begins: commit what is settled. The requests of the revoked
        partitions run on until the new assignment says which partitions went elsewhere:
        every partition is revoked in a rebalance, and most come back."""
        await self.settler.commit()
        self._revoking |= {tp.partition for tp in revoked}

    async def _assigned(self, assigned: list[TopicPartition]) -> None:
        """The rebalance's outcome: hand back the requests of the partitions that went
        elsewhere; those of the partitions kept were never stopped (their batches come
        again from the last commit, and their requests are recognised as running)."""
        now = time.time()
        for tp in assigned:
            self.ctx.assigned_at[tp.partition] = now
        kept = {tp.partition for tp in assigned}
        log.info("assigned partitions %s", sorted(kept))
        gone, self._revoking = sorted(self._revoking - kept), set()
        if gone:  # settled offsets were committed at the revocation; no longer ours now
            await self.hand_back(gone, commit=False)

    async def hand_back(self, partitions: list[int], *, commit: bool = True) -> None:
        """Stop generating the unfinished requests of ``partitions`` (revoked or shutting
        down) without a final event: their next owner continues their streams. After an
        engine failure their claims count as a crashed attempt (poison accounting)."""
        ctx = self.ctx
        if commit:
            await self.settler.commit()
        mine = []
        for part in partitions:
            ctx.offsets.drop_partition(part)
            for st in ctx.table.of_partition(part):
                if st.phase not in _HELD:
                    continue  # settling: it finishes here whoever owns the partition next
                ctx.table.drop(st)
                if st.phase.in_engine:
                    ctx.retire(st)
                if st.phase is not Phase.DEFERRED:
                    mine.append(st.request_id)
        if not mine:
            return
        how = "crashed" if ctx.runner.error is not None else "handed_back"
        try:
            await ctx.claims.release(mine, how)
        except REDIS_DOWN as exc:  # the claims expire on their own
            log.warning("could not release %d claims: %r", len(mine), exc)
        log.info("handed back %d unfinished requests (%s)", len(mine), how)
