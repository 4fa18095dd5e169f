"""The batcher service: a consumer group on the requests topic.

Each tick: fetch what has arrived; send bad messages and expired requests to the
dead-letter topic (the sender gets an error event); queue valid requests fairly; and when
the window policy says so, take as many as the workers have room for, route each to a
worker (prefix affinity), and produce one batch per worker partition. Input offsets are
committed only up to the first request not yet acknowledged by Kafka (acks=all), so a
crash redelivers rather than loses. While the queue is over its limits the consumer is
paused: the backlog stays in Kafka, not in memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from services.batcher.config import BatcherSettings
from services.batcher.fair_queue import FairQueue, Queued
from services.batcher.metrics import BatcherMetrics
from services.batcher.routing import Router, RoutingMode, WorkerView, partition_for
from services.batcher.window import WindowPolicy
from shared import registry, token_stream
from shared.codec import DecodeError, decode, encode
from shared.kafka_io import make_consumer, make_producer
from shared.messages import (
    Batch,
    BatcherStatus,
    DeadLetter,
    GenerateRequest,
    Priority,
    TokenEvent,
    WorkerHeartbeat,
    error_event,
)
from shared.metrics import serve_metrics
from shared.names import Names
from shared.prefix_hash import block_hashes

log = logging.getLogger(__name__)

AFFINITY_BLOCKS = 4  # leading blocks hashed for routing
AFFINITY_CHARS = 2048  # enough text for AFFINITY_BLOCKS blocks of tokens
TRANSIT_MARGIN_S = 0.02  # a batch sent this long before a heartbeat may not be in it yet
SENT_MEMORY_S = 5.0
WORKER_TTL_S = 3.0  # a worker silent this long is gone (its heartbeat key expired too)
# Ticks end by refreshing the worker view, so a request that arrives is routed on a view
# from before it (no Redis round trip on its path) unless that is older than this. Workers
# beat every second, or at most every 50 ms when requests finish; what this batcher sent
# since a beat is subtracted from it.
VIEW_MAX_AGE_S = 0.25
# How long a tick waits for requests when none is queued. An arrival ends the wait at
# once; each idle tick refreshes the view (5 Redis reads a second; an idle batcher took
# 0.018 cores with 50 ms ticks, 0.009 with these).
IDLE_POLL_S = 0.2


@dataclass(slots=True)
class Pending:
    tp: TopicPartition
    offset: int
    request: GenerateRequest


@dataclass(slots=True)
class Rejected:
    """A message that will not be served, with where it came from and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str
    request_id: str | None

    @classmethod
    def of(
        cls, msg: ConsumerRecord[Any, Any], reason: str, detail: str, rid: str | None
    ) -> Rejected:
        return cls(msg.topic, msg.partition, msg.offset, msg.key, msg.value, reason, detail, rid)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: BatcherService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.service.release(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        pass


class BatcherService:
    def __init__(self, settings: BatcherSettings, tokenizer: Any = None) -> None:
        self.settings = settings
        self.names: Names = settings.names
        self.tokenizer = tokenizer
        self.policy = WindowPolicy(
            settings.window_min_ms,
            settings.window_max_ms,
            settings.max_batch_requests,
            settings.target_wait_ms,
        )
        self.router = Router(settings.routing, settings.affinity_tolerance)
        self.redis: aioredis.Redis = aioredis.Redis.from_url(settings.redis_url)
        # Batching is this service's own job: the producer sends at once (no linger).
        self.producer: AIOKafkaProducer = make_producer(
            settings, client_id=settings.batcher_id, linger_ms=0
        )
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings, group_id=self.names.batcher_group, client_id=settings.batcher_id
        )
        self.queue: FairQueue[Pending] = FairQueue(quantum=settings.fair_quantum_tokens)
        self._unacked: dict[TopicPartition, set[int]] = defaultdict(set)  # queued offsets
        self._consumed: dict[TopicPartition, int] = {}  # offset after the last one read
        self._committed: dict[TopicPartition, int] = {}
        self._workers: list[WorkerView] = []
        # What this batcher sent to each worker, and when: a heartbeat older than a send
        # does not count it yet, so the view subtracts it (no over-dispatch between beats).
        self._sent: dict[str, deque[tuple[float, int, int]]] = defaultdict(deque)
        self._workers_at = 0.0
        self._status_at = 0.0
        self._paused = False
        self._stopping = asyncio.Event()
        self.metrics = BatcherMetrics()
        self.batch_sizes: deque[int] = deque(maxlen=100_000)
        # Per request: arrival → dispatch decision (the window's share), and decision →
        # batch acknowledged by Kafka (the hand-off's share).
        self.window_waits_ms: deque[float] = deque(maxlen=100_000)
        self.handoff_ms: deque[float] = deque(maxlen=100_000)

    async def run(self) -> None:
        serve_metrics(self.metrics.registry, self.settings.metrics_port, self.settings.metrics_host)
        await self.producer.start()
        self.consumer.subscribe([self.names.requests], listener=_Rebalance(self))
        await self.consumer.start()
        try:
            while not self._stopping.is_set():
                await self._tick()
            # Graceful stop: hand off what is queued if workers can take it, else leave it
            # to Kafka (uncommitted) for the next batcher.
            with contextlib.suppress(Exception):
                await self._dispatch(await self._load_workers(force=True))
                await self._commit()
        finally:
            await self.consumer.stop()
            await self.producer.stop()
            with contextlib.suppress(Exception):
                pipe = self.redis.pipeline(transaction=False)
                bid = self.settings.batcher_id
                registry.withdraw(
                    pipe, self.names.batchers_index, bid, self.names.batcher_status(bid)
                )
                await pipe.execute()
            await self.redis.aclose()

    def stop(self) -> None:
        self._stopping.set()

    # --- one tick ---------------------------------------------------------------------
    async def _tick(self) -> None:
        poll_ms = 5 if len(self.queue) else int(IDLE_POLL_S * 1000)
        records = await self.consumer.getmany(timeout_ms=poll_ms, max_records=self._fetch_size())
        now = time.time()
        rejected = []
        for tp, msgs in records.items():
            for msg in msgs:
                self._consumed[tp] = msg.offset + 1
                item = self._parse(msg, now)
                if isinstance(item, Rejected):
                    rejected.append(item)
                else:
                    self._enqueue(tp, msg.offset, item, now)
        rejected += self._expire(now)
        if rejected:
            await self._reject(rejected)
        fresh = now - self._workers_at < VIEW_MAX_AGE_S
        workers = self._workers if fresh else await self._load_workers(force=True)
        oldest = self.queue.oldest()
        wait_ms = (now - oldest) * 1000 if oldest is not None else 0.0
        free = sum(w.free_slots for w in workers) if workers else None
        if self.policy.should_dispatch(len(self.queue), wait_ms, free, _saturation(workers)):
            await self._dispatch(workers)
        await self._commit()
        self._apply_backpressure()
        await self._publish_status()
        # The next tick's view, while nothing waits on it: fresh while requests wait for
        # room; otherwise just fresh enough for an arrival during the next poll.
        idle_refresh_s = VIEW_MAX_AGE_S - IDLE_POLL_S
        if len(self.queue) or time.time() - self._workers_at >= idle_refresh_s:
            await self._load_workers()

    def _fetch_size(self) -> int:
        room = self.settings.max_queued_requests - len(self.queue)
        return max(1, min(256, room))

    def _parse(self, msg: ConsumerRecord[Any, Any], now: float) -> GenerateRequest | Rejected:
        """The request with its seed fixed at ingestion, or why it is rejected."""
        try:
            req = decode(GenerateRequest, msg.value or b"").with_seed()
        except DecodeError as exc:
            return Rejected.of(msg, exc.reason, exc.detail, _salvage_request_id(msg.value))
        if req.deadline is not None and req.deadline < now:
            return Rejected.of(
                msg, "deadline_exceeded", "the deadline passed before dispatch", req.request_id
            )
        return req

    def _enqueue(self, tp: TopicPartition, offset: int, req: GenerateRequest, now: float) -> None:
        # The fair queue's cost is a character-based token estimate: tokenizing happens
        # only for what is dispatched (see _affinity), never for the whole backlog.
        cost = req.prompt_chars // 4 + 1 + req.sampling.max_tokens
        prio = 0 if req.priority is Priority.INTERACTIVE else 1
        self.queue.push(Queued(Pending(tp, offset, req), req.tenant, prio, cost, now))
        self._unacked[tp].add(offset)

    def _affinity(self, req: GenerateRequest) -> list[int]:
        """Leading block hashes of the prompt, as the workers' prefix caches key them.
        Only the head of the prompt is tokenized: routing needs no more."""
        if self.tokenizer is None:
            return []
        if req.messages is not None:
            msgs = [m.model_dump() for m in req.messages]
            text = self.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False
            )
            ids = self.tokenizer(text[:AFFINITY_CHARS], add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer((req.prompt or "")[:AFFINITY_CHARS])["input_ids"]
        return block_hashes(ids, self.settings.block_size, AFFINITY_BLOCKS)

    def _expire(self, now: float) -> list[Rejected]:
        """Queued requests whose deadline passed while they waited."""
        gone = self.queue.remove_if(
            lambda q: q.item.request.deadline is not None and q.item.request.deadline < now
        )
        out = []
        for q in gone:
            p = q.item
            self._unacked[p.tp].discard(p.offset)
            rid = p.request.request_id
            out.append(
                Rejected(
                    p.tp.topic,
                    p.tp.partition,
                    p.offset,
                    rid.encode(),
                    encode(p.request),
                    "deadline_exceeded",
                    "the deadline passed while queued",
                    rid,
                )
            )
        return out

    async def _reject(self, rejected: list[Rejected]) -> None:
        """Each rejected message goes to the DLQ with its bytes, reason and origin; where a
        request id can be read, the sender also gets an error event."""
        sends = []
        notify: list[TokenEvent] = []
        for r in rejected:
            dl = DeadLetter(
                reason=r.reason,
                detail=r.detail,
                topic=r.topic,
                partition=r.partition,
                offset=r.offset,
                key=r.key.decode("utf-8", "replace") if r.key else None,
                original_b64=base64.b64encode(r.value or b"").decode(),
                request_id=r.request_id,
            )
            sends.append(await self.producer.send(self.names.requests_dlq, encode(dl), key=r.key))
            if r.request_id is not None:
                seq = (
                    await token_stream.last_published_seq(self.redis, self.names, r.request_id) + 1
                )
                notify.append(error_event(r.request_id, seq, r.reason, r.detail))
        await asyncio.gather(*sends)
        for r in rejected:
            self.metrics.dead_letters.labels(reason=r.reason).inc()
        if notify:
            with contextlib.suppress(Exception):  # e.g. an id whose stream already ended
                await token_stream.publish_events(self.redis, self.names, notify)

    # --- dispatch ---------------------------------------------------------------------
    async def _load_workers(self, force: bool = False) -> list[WorkerView]:
        now = time.time()
        if not force and (now - self._workers_at) * 1000 < self.settings.heartbeat_refresh_ms:
            return self._workers
        self._workers_at = now
        raw = await registry.read_live(
            self.redis, self.names.workers_index, self.names.heartbeat, WORKER_TTL_S
        )
        views = []
        for data in raw:
            with contextlib.suppress(DecodeError):
                if data:
                    hb = decode(WorkerHeartbeat, data)
                    if hb.partitions:
                        views.append(self._view(hb, now))
        self._workers = sorted(views, key=lambda w: w.worker_id)
        return self._workers

    def _view(self, hb: WorkerHeartbeat, now: float) -> WorkerView:
        sent = self._sent[hb.worker_id]
        while sent and sent[0][0] < now - SENT_MEMORY_S:
            sent.popleft()
        since = [(n, tok) for t, n, tok in sent if t > hb.at - TRANSIT_MARGIN_S]
        return WorkerView.of(hb, sum(n for n, _ in since), sum(tok for _, tok in since))

    async def _dispatch(self, workers: list[WorkerView]) -> None:
        """Take what the workers have room for and send one batch per target partition."""
        decided = time.time()
        room = sum(max(0, w.free_slots) for w in workers) if workers else self.policy.max_requests
        # Bulk fills spare capacity only: it leaves `interactive_reserve` slots per worker
        # free, so a chat request never waits behind a bulk backlog for a slot.
        reserve = self.settings.interactive_reserve
        bulk_room = sum(max(0, w.free_slots - reserve) for w in workers) if workers else room
        items = self.queue.pop(min(self.policy.max_requests, room), max_bulk=bulk_room)
        log.debug(
            "dispatch %d of %d queued (room %s)", len(items), len(self.queue) + len(items), room
        )
        if not items:
            return
        groups: dict[int, list[Pending]] = defaultdict(list)
        num_parts = len(await self.producer.partitions_for(self.names.batches))
        now = time.time()
        for q in items:
            target = None
            if workers:
                affine = self.router.mode is RoutingMode.AFFINITY
                hashes = self._affinity(q.item.request) if affine else []
                target = self.router.route(hashes, workers)
                target.free_slots -= 1
                target.free_tokens -= q.cost
                self._sent[target.worker_id].append((now, 1, q.cost))
            groups[partition_for(target, q.item.request.request_id, num_parts)].append(q.item)
        acks = []
        for part, group in groups.items():
            batch = Batch(batcher_id=self.settings.batcher_id, requests=[p.request for p in group])
            acks.append(await self.producer.send(self.names.batches, encode(batch), partition=part))
            self.batch_sizes.append(len(group))
            self.metrics.batch_size.observe(len(group))
        await asyncio.gather(*acks)
        done = time.time()
        for q in items:
            self._unacked[q.item.tp].discard(q.item.offset)
            self.window_waits_ms.append((decided - q.enqueued_at) * 1000)
            self.handoff_ms.append((done - decided) * 1000)
            self.metrics.window.observe(decided - q.enqueued_at)
            self.metrics.handoff.observe(done - decided)
            self.metrics.requests.labels(priority=q.item.request.priority.value).inc()

    async def _commit(self) -> None:
        """Commit, per partition, up to the first record not yet safely handed off."""
        offsets = {
            tp: min(self._unacked[tp]) if self._unacked.get(tp) else nxt
            for tp, nxt in self._consumed.items()
        }
        changed = {tp: o for tp, o in offsets.items() if self._committed.get(tp) != o}
        if changed:
            await self.consumer.commit(changed)
            self._committed.update(changed)

    async def release(self, revoked: set[TopicPartition]) -> None:
        """Partitions are moving to another batcher: commit what is handed off and drop
        the rest of their queue (the new owner reads it again from the commit point)."""
        with contextlib.suppress(Exception):
            await self._commit()
        self.queue.remove_if(lambda q: q.item.tp in revoked)
        for tp in revoked:
            self._unacked.pop(tp, None)
            self._consumed.pop(tp, None)
            self._committed.pop(tp, None)

    # --- backpressure -------------------------------------------------------------------
    def _apply_backpressure(self) -> None:
        s = self.settings
        over = len(self.queue) >= s.max_queued_requests or self.queue.tokens >= s.max_queued_tokens
        under = (
            len(self.queue) <= s.max_queued_requests // 2
            and self.queue.tokens <= s.max_queued_tokens // 2
        )
        parts = list(self.consumer.assignment())
        if over and not self._paused:
            self.consumer.pause(*parts)
            self._paused = True
            log.info("queue full (%d requests): paused consumption", len(self.queue))
        elif self._paused and under:
            self.consumer.resume(*parts)
            self._paused = False

    async def _publish_status(self) -> None:
        now = time.time()
        if now - self._status_at < 0.25:
            return
        self._status_at = now
        m = self.metrics
        m.queue_depth.set(len(self.queue))
        m.queue_tokens.set(self.queue.tokens)
        m.paused.set(int(self._paused))
        oldest = self.queue.oldest()
        wait_ms = (now - oldest) * 1000 if oldest is not None else 0.0
        m.window_ms.set(self.policy.window_ms(_saturation(self._workers), wait_ms))
        m.lag.set(
            sum(
                max(0, (self.consumer.highwater(tp) or nxt) - nxt)
                for tp, nxt in self._consumed.items()
            )
        )
        status = BatcherStatus(
            batcher_id=self.settings.batcher_id,
            queued_requests=len(self.queue),
            queued_tokens=self.queue.tokens,
            paused=self._paused,
        )
        bid = self.settings.batcher_id
        pipe = self.redis.pipeline(transaction=False)
        key = self.names.batcher_status(bid)
        registry.advertise(pipe, self.names.batchers_index, bid, key, encode(status), 3.0)
        await pipe.execute()


def _saturation(workers: list[WorkerView]) -> float:
    """Share of the workers' sequence slots in use (0 when none is known)."""
    cap = sum(w.free_slots + w.hb.running + w.hb.waiting for w in workers)
    if cap <= 0:
        return 0.0
    return 1.0 - sum(max(0, w.free_slots) for w in workers) / cap


def _salvage_request_id(value: bytes | None) -> str | None:
    """A request id from a message that failed validation, if one can be read safely."""
    try:
        obj = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    if (
        isinstance(rid, str)
        and 0 < len(rid) <= 128
        and all(c.isalnum() or c in "._:-" for c in rid)
    ):
        return rid
    return None
