"""The worker's control loops: its heartbeat (load and cache summary for the batchers, its
claims kept alive, requests left to other workers looked at again) and the cancel channel.
Both wait out a Redis outage."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.errors import KafkaError

from services.worker.config import WorkerSettings
from services.worker.context import WorkerContext
from services.worker.engine.wire import EngineStats
from services.worker.events import RequestState
from services.worker.intake import Intake
from services.worker.requests import Phase
from shared import registry
from shared.codec import DecodeError, decode, encode
from shared.messages import CancelRequest, WorkerHeartbeat
from shared.model_config import folder_context
from shared.prefix_hash import AFFINITY_DEPTH
from shared.redis_client import initialized
from shared.retry import REDIS_DOWN

log = logging.getLogger("services.worker.service")

HEARTBEAT_MIN_GAP_S = 0.05
CLOSE_TIMEOUT_S = 5.0


class Heartbeat:
    """Advertises load about every second — at once (throttled) when requests finish, so
    batchers see freed capacity quickly — and keeps this worker's claims alive."""

    def __init__(self, ctx: WorkerContext, intake: Intake) -> None:
        self.ctx = ctx
        self.intake = intake
        self._summary: list[int] = []

    async def run(self) -> None:
        ctx = self.ctx
        while True:
            asked_at = time.monotonic()
            try:
                await self.beat()
            except REDIS_DOWN as exc:
                await asyncio.sleep(ctx.redis_dep.failed(exc))
                continue
            ctx.redis_dep.answered(asked_at)
            ctx.nudge.clear()
            try:
                await asyncio.wait_for(ctx.nudge.wait(), ctx.settings.heartbeat_interval_s)
            except TimeoutError:
                pass  # a regular beat
            await asyncio.sleep(HEARTBEAT_MIN_GAP_S)

    async def beat(self) -> None:
        ctx, s = self.ctx, self.ctx.settings
        st = ctx.runner.stats
        partitions = sorted(tp.partition for tp in ctx.consumer.assignment())
        summary = await self._prefix_summary()
        hb = heartbeat_of(s, st, partitions, summary, ctx.metrics.ttft_buckets())
        pipe = ctx.redis.pipeline(transaction=False)
        key = ctx.names.heartbeat(s.worker_id)
        registry.advertise(
            pipe, ctx.names.workers_index, s.worker_id, key, encode(hb), s.heartbeat_ttl_s
        )
        await pipe.execute()
        await self._refresh_claims()
        await self.intake.retry_deferred()
        ctx.metrics.refresh(st, await self._lag())
        ctx.metrics.engine_paused.set(int(ctx.runner.paused))

    async def _refresh_claims(self) -> None:
        running = self.ctx.table.in_phase(Phase.CLAIMED, Phase.RUNNING, Phase.SETTLING)
        if running:
            lost = set(await self.ctx.claims.refresh([st.request_id for st in running]))
            for st in running:
                if st.request_id in lost and st.phase is Phase.RUNNING:
                    self._lost(st)

    def _lost(self, st: RequestState) -> None:
        """Another worker holds the claim of a request running here (ours lapsed while Redis
        was away): stop ours and wait for it, as for any request claimed elsewhere."""
        ctx = self.ctx
        log.warning("claim taken by another worker: stopping", extra={"request_id": st.request_id})
        ctx.metrics.handled_errors.labels("claim_lost").inc()
        ctx.table.move(st, Phase.DEFERRED)
        ctx.retire(st)

    async def _prefix_summary(self) -> list[int]:
        """The KV cache's routing summary from the engine process; the previous one if the
        engine does not answer within a heartbeat."""
        try:
            wait = self.ctx.settings.heartbeat_interval_s
            self._summary = await asyncio.wait_for(self.ctx.runner.kv_summary(256), wait)
        except TimeoutError:
            pass  # a busy engine: the previous summary is a heartbeat old
        return self._summary

    async def _lag(self) -> int:
        """Batches on assigned partitions not yet fetched, plus those fetched but unfinished."""
        consumer = self.ctx.consumer
        unfetched = 0
        for tp in consumer.assignment():
            # A rebalance during an earlier partition's position may have taken this one
            # away: aiokafka's highwater asserts that it is still assigned.
            if tp not in consumer.assignment() or (high := consumer.highwater(tp)) is None:
                continue
            try:
                pos = await asyncio.wait_for(consumer.position(tp), 0.5)
            except (KafkaError, TimeoutError) as exc:  # a rebalance, or Kafka away
                log.debug("no position for %s: %r", tp, exc)
                continue
            unfetched += max(0, high - pos)
        return unfetched + self.ctx.offsets.unfinished_batches()


def heartbeat_of(
    s: WorkerSettings,
    st: EngineStats,
    partitions: list[int],
    summary: list[int],
    ttft: tuple[list[float], list[int]] | None = None,
) -> WorkerHeartbeat:
    """What a worker advertises: its load, its cache summary (``summary``, the engine's
    cached blocks to ``AFFINITY_DEPTH`` deep), how that summary was hashed, and its
    time-to-first-token histogram (``ttft``: bounds and cumulative counts)."""
    le, counts = ttft or ([], [])
    return WorkerHeartbeat(
        worker_id=s.worker_id,
        partitions=partitions,
        # Negative when requests queue beyond the running cap: batchers count it.
        free_slots=s.max_running - st.running - st.waiting,
        free_kv_tokens=st.free_kv_tokens,
        kv_bytes_per_token=st.kv_bytes_per_token,
        running=st.running,
        waiting=st.waiting,
        kv_used_tokens=st.kv_used_blocks * st.block_size,
        prefix_hashes=summary,
        block_size=st.block_size,
        affinity_depth=AFFINITY_DEPTH,
        context_tokens=folder_context(s.model_dir) or 0,
        decoded_tokens=st.decoded_tokens,
        prefilled_tokens=st.prefilled_tokens,
        prefix_hit_tokens=st.prefix_hit_tokens,
        ttft_le=le,
        ttft_counts=counts,
    )


async def listen_for_cancels(ctx: WorkerContext) -> None:
    """Abort requests cancelled on the cancel channel, subscribing again after a Redis
    outage (edges repeat a cancel until its request's final event shows)."""
    while True:
        pubsub = ctx.redis.pubsub()
        try:
            await initialized(ctx.redis)
            await pubsub.subscribe(ctx.names.cancel_channel)
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None:
                    _cancel(ctx, msg["data"])
        except REDIS_DOWN as exc:
            await asyncio.sleep(ctx.redis_dep.failed(exc))
        finally:
            try:
                await asyncio.wait_for(pubsub.aclose(), CLOSE_TIMEOUT_S)
            except REDIS_DOWN as exc:  # TimeoutError among them
                log.debug("closing the cancel subscription: %r", exc)


def _cancel(ctx: WorkerContext, data: bytes) -> None:
    try:
        cancel = decode(CancelRequest, data)
    except DecodeError as exc:
        ctx.metrics.handled_errors.labels("cancel_decode").inc()
        log.warning("undecodable cancel: %s", exc)
        return
    st = ctx.table.get(cancel.request_id)
    if st is not None and st.phase.in_engine:
        ctx.runner.abort(cancel.request_id)
