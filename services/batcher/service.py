"""The batcher service: a consumer group on the requests topic.

Each tick: fetch what has arrived; send bad messages and expired requests to the
dead-letter topic (the sender gets an error event); queue valid requests fairly; and when
the window policy says so, take as many as the workers have room for, route each to a
worker (prefix affinity), and produce the batches of each worker partition, each under
the bus's message limit. Input offsets are committed only up to the first request not yet
acknowledged by Kafka (acks=all), so a crash redelivers rather than loses. While the queue
is over its limits the consumer is paused: the backlog stays in Kafka, not in memory.

Dependencies come and go (see links.py). While Redis is away nothing is dispatched (there
is no view of the workers) and error events wait; a batch Kafka did not take goes back to
the queue; a commit failed by a rebalance is tried again. None of it stops the batcher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
)
from aiokafka.structs import ConsumerRecord

from services.batcher.cache import Asked, KafkaCache
from services.batcher.coalesce import Follower, Following, Handover
from services.batcher.config import BatcherSettings
from services.batcher.fair_queue import FairQueue, Queued
from services.batcher.grounding import Grounder
from services.batcher.links import (
    Gate,
    RedisAway,
    RedisLink,
    kafka_failed,
    note_kafka_error,
)
from services.batcher.metrics import BatcherMetrics
from services.batcher.rejects import Rejected, Rejects
from services.batcher.reservations import SlotReserver
from services.batcher.routing import (
    Refusal,
    Router,
    RoutingMode,
    WorkerView,
    admit,
    partition_for,
    prefix_hashes,
)
from services.batcher.sizing import pack, request_room
from services.batcher.sources import Sources
from services.batcher.window import WindowPolicy
from shared import registry
from shared.codec import DecodeError, decode, encode
from shared.consumer_flow import Backpressure, Rebalance
from shared.dead_letters import dead_letter
from shared.kafka_io import (
    KafkaProbe,
    RenewingProducer,
    make_consumer,
    start_consumer,
    unless_stopped,
)
from shared.messages import (
    Batch,
    BatcherStatus,
    GenerateRequest,
    Priority,
    WorkerHeartbeat,
    seed_of,
)
from shared.metrics import serve_metrics
from shared.names import Names
from shared.prefix_hash import AFFINITY_DEPTH
from shared.prompts import Prompts
from shared.retrieval.store import RetrievalError
from shared.retry import Dependency

log = logging.getLogger(__name__)

TRANSIT_MARGIN_S = 0.02  # a batch sent this long before a heartbeat may not be in it yet
SENT_MEMORY_S = 5.0
# Ticks end by refreshing the worker view, so a request that arrives is routed on a view
# from before it (no Redis round trip on its path) unless that is older than this. Workers
# beat every second, or at most every 50 ms when requests finish; what this batcher sent
# since a beat is subtracted from it.
VIEW_MAX_AGE_S = 0.25
# How long a tick waits for requests when none is queued. An arrival ends the wait at
# once; each idle tick refreshes the view, so an idle batcher reads Redis 5 times a second.
IDLE_POLL_S = 0.2
# A cache hit's completion not acknowledged within this is left to a worker to settle.
HIT_SEND_TIMEOUT_S = 5.0
# How often the markers that coalesced misses follow are looked at (one round trip for
# all of them): a follower is answered at most this long after its leader's answer lands.
FOLLOW_POLL_S = 0.02


@dataclass(slots=True)
class Pending:
    """A consumed request waiting in the batcher: where it came from on Kafka, and its encoded size."""

    tp: TopicPartition
    offset: int
    request: GenerateRequest
    size: int  # bytes of the encoded request, as a batch will carry it
    client_seeded: bool = False  # its producer chose its seed (not derived from its id)

    def rejected(self, reason: str, detail: str) -> Rejected:
        rid = self.request.request_id
        letter = dead_letter(
            reason=reason,
            detail=detail,
            topic=self.tp.topic,
            partition=self.tp.partition,
            offset=self.offset,
            key=rid,
            value=encode(self.request),
            request_id=rid,
        )
        return Rejected(letter)


Waiting = tuple[Pending, Asked]  # a coalesced miss: the request and its cache lookup
STATUS_TTL_S = 3.0  # a batcher's status (and its place among the live batchers) lasts this
Routed = tuple[WorkerView | None, Queued[Pending]]  # a request and its worker, if known


class BatcherService:
    """The batcher: consumes requests, queues them fairly, closes sliding windows into batches routed to workers, dead-letters what it cannot serve, and rides out Kafka and Redis outages."""

    def __init__(self, settings: BatcherSettings, tokenizer: Prompts | None = None) -> None:
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
        self.metrics = BatcherMetrics()
        self.redis = RedisLink(settings.redis, self.metrics.dependencies)
        self.kafka = Gate(Dependency("kafka", log, self.metrics.dependencies))
        # Batching is this service's own job: the producer sends at once (no linger).
        self.producer = RenewingProducer(
            settings,
            client_id=settings.batcher_id,
            linger_ms=0,
            request_timeout_ms=settings.kafka_request_timeout_ms,
        )
        self.sources = Sources(self.names, settings.sources)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings, group_id=self.names.batcher_group, client_id=settings.batcher_id
        )
        # Sends report Kafka's state too, but a send waits out an outage (up to the request
        # timeout before it counts as one): the probe reports it within seconds, sending or
        # not, and its end as soon as a broker answers.
        self.kafka_probe = KafkaProbe(
            self.producer, [self.names.batches, self.names.requests_dlq], self.kafka
        )
        self.rejects = Rejects(self.producer, self.kafka, self.redis, self.names, self.metrics)
        self.grounder = Grounder(settings, tokenizer, self.metrics.retrieval)
        self.cache = KafkaCache(settings, settings.model_dir, self.metrics.registry)
        # Misses identical to a request being generated, waiting for its answer.
        self.following: Following[Waiting] = Following()
        self._watched_at = 0.0
        self._request_room = request_room(settings.batcher_id)
        self.queue: FairQueue[Pending] = FairQueue(
            quantum=settings.fair_quantum_tokens, classes=len(Priority)
        )
        # Offsets read but not yet safe: queued, in a batch not yet acknowledged, or
        # rejected with a dead letter or error event still to send.
        self._unacked: dict[TopicPartition, set[int]] = defaultdict(set)
        self._consumed: dict[TopicPartition, int] = {}  # offset after the last one read
        self._committed: dict[TopicPartition, int] = {}
        self._workers: list[WorkerView] = []
        self._refused: dict[str, Refusal] = {}  # live workers never routed to, and why
        self._view_ok = False  # False while Redis is away: no view, no dispatch
        # What this batcher sent to each worker, and when: a heartbeat older than a send
        # does not count it yet, so the view subtracts it (no over-dispatch between beats).
        self._sent: dict[str, deque[tuple[float, int, int]]] = defaultdict(deque)
        # Slots are reserved in a ledger all batchers share; what a worker had left at
        # this batcher's last reservation caps its view until the next heartbeat.
        self.reserver = SlotReserver(
            self.names,
            settings.batcher_id,
            settings.slot_hold_ms / 1000,
            max(SENT_MEMORY_S, 2 * settings.heartbeat_ttl_s),
        )
        self._left: dict[str, tuple[float, int]] = {}  # worker id → (heartbeat at, left)
        # Other batchers seen alive at this batcher's last status: with none, no other
        # batcher can fill a worker behind this one's back, so the ledger (whose hold keeps
        # slots reserved up to TW_SLOT_HOLD_MS after a heartbeat already counts them) is
        # skipped and the heartbeat view with its in-transit sends alone decides.
        self._peers = 1  # unknown until the first status: the ledger applies
        self._workers_at = 0.0
        self._status_at = 0.0
        self._bad_heartbeat_logged_at = 0.0
        self.backpressure = Backpressure(self.consumer)
        self._stopping = asyncio.Event()
        self.batch_sizes: deque[int] = deque(maxlen=100_000)
        # Per request: arrival → dispatch decision (the window's share), and decision →
        # batch acknowledged by Kafka (the hand-off's share).
        self.window_waits_ms: deque[float] = deque(maxlen=100_000)
        self._window_ms = 0.0  # the window applied now, as last computed for the gauges
        self.handoff_ms: deque[float] = deque(maxlen=100_000)

    async def run(self) -> None:
        serve_metrics(
            self.metrics.registry,
            self.settings.metrics_port,
            self.settings.metrics_host,
            readiness=lambda: {"redis": self.redis.up, "kafka": self.kafka.up},
        )
        started = await unless_stopped(self._start_kafka(), self._stopping)
        try:
            while started and not self._stopping.is_set():
                await self._tick()
            if started:
                await self._hand_off()
        finally:
            await self.kafka_probe.stop()
            await self.consumer.stop()
            await self.producer.stop()
            await self._withdraw()
            await self.redis.aclose()

    async def _start_kafka(self) -> None:
        """Start the producer, the probe and the consumer, however long Kafka keeps this
        batcher out (away, or refusing its login)."""
        await self.producer.start()
        self.kafka_probe.start()
        self.consumer.subscribe(
            self.sources.topics, listener=Rebalance(lambda revoked: self.release(set(revoked)))
        )
        await start_consumer(self.consumer, self.settings.kafka)

    def stop(self) -> None:
        self._stopping.set()

    async def _hand_off(self) -> None:
        """Graceful stop: hand off what is queued if workers can take it, else leave it to
        Kafka (uncommitted) for the next batcher."""
        workers = await self._load_workers(force=True)
        if workers is not None:
            await self._dispatch(workers)
        await self._flush_rejects()
        await self._commit()

    async def _withdraw(self) -> None:
        bid = self.settings.batcher_id
        index, key = self.names.batchers_index, self.names.batcher_status(bid)

        async def withdraw(client: aioredis.Redis) -> None:
            pipe = client.pipeline(transaction=False)
            registry.withdraw(pipe, index, bid, key)
            await pipe.execute()

        try:
            await self.redis.call(withdraw)
        except RedisAway:
            log.info("status not withdrawn (Redis away): its key expires by itself")

    # --- one tick ---------------------------------------------------------------------
    async def _tick(self) -> None:
        now, consumed = self._ingest(await self._fetch())
        await self._admit(consumed, now)
        await self._watch()
        self.rejects.add(self._expire(now))
        await self._flush_rejects()
        fresh = self._view_ok and now - self._workers_at < VIEW_MAX_AGE_S
        workers = self._workers if fresh else await self._load_workers(force=True)
        if workers is not None:
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

    async def _fetch(self) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        # A short poll only while queued requests may go out: with Redis or Kafka away,
        # the queue waits for them, not for the next arrival.
        can_send = self.redis.up and self.kafka.up
        poll_ms = 5 if len(self.queue) and can_send else int(IDLE_POLL_S * 1000)
        if self.following.groups:
            poll_ms = min(poll_ms, int(FOLLOW_POLL_S * 1000))
        try:
            return await self.consumer.getmany(timeout_ms=poll_ms, max_records=self._fetch_size())
        except KafkaError as exc:
            note_kafka_error(self.metrics.kafka_errors, "fetch", exc)
            await asyncio.sleep(IDLE_POLL_S)
            return {}

    def _ingest(
        self, records: dict[TopicPartition, list[ConsumerRecord[Any, Any]]]
    ) -> tuple[float, list[Pending]]:
        """What is valid, with the time of arrival; the rest is rejected."""
        now, valid = time.time(), []
        for tp, msgs in records.items():
            for msg in msgs:
                self._consumed[tp] = msg.offset + 1
                self._unacked[tp].add(msg.offset)
                item = self._parse(tp, msg, now)
                if isinstance(item, Rejected):
                    self.rejects.add([item])
                else:
                    valid.append(item)
        return now, valid

    async def _admit(self, items: list[Pending], now: float) -> None:
        """Queue consumed requests, once those that asked for the cache were looked up
        together: a hit is answered now, a miss asks its worker to store the answer."""
        cache = self.cache
        asked = {id(p): a for p in items if (a := cache.asking(p.request, p.client_seeded))}
        if asked:
            try:
                await self.redis.call(lambda c: cache.look_up(c, list(asked.values())))
            except RedisAway:
                cache.lookups.labels("exact", "error").inc(len(asked))
                asked = {}  # queued as they came: the worker path needs Redis in any case
        hits = [p for p in items if id(p) in asked and asked[id(p)].entry is not None]
        answered = await asyncio.gather(*(self._answer(asked[id(p)]) for p in hits))
        served = {id(p) for p, ok in zip(hits, answered, strict=True) if ok}
        misses = [
            (p, a)
            for p in items
            if (a := asked.get(id(p))) is not None and a.entry is None and a.fresh
        ]
        followed = await self._follow(misses, now)
        for p in items:
            if id(p) in served:
                self._unacked[p.tp].discard(p.offset)
            elif id(p) not in followed:
                self._queue_asked(p, asked.get(id(p)), now)

    def _queue_asked(self, p: Pending, a: Asked | None, now: float) -> None:
        """Queue a request, asking its worker to store the answer if it may be cached."""
        if a is not None and (req := self.cache.to_store(a)) is not p.request:
            p.request, p.size = req, len(encode(req))
        self._enqueue(p, now)

    # --- coalesced misses ---------------------------------------------------------------
    async def _follow(self, misses: list[Waiting], now: float) -> set[int]:
        """Misses identical to a request being generated follow it instead of queueing
        (the first of several identical ones takes the marker and is queued). The ids of
        the followers; none while Redis is away (all are queued)."""
        cache = self.cache
        misses = [(p, a) for p, a in misses if a.mode.looks_up]
        if not misses or not cache.coalescing:
            return set()
        try:
            holders = await self.redis.call(lambda c: cache.claim(c, [a for _, a in misses]))
        except RedisAway:
            return set()
        wait_s = self.settings.cache_coalesce_wait_s
        followed = set()
        for (p, a), holder in zip(misses, holders, strict=True):
            if holder is None or holder == p.request.request_id:
                continue  # it leads (a redelivery may find its own marker)
            deadline = now + wait_s
            if p.request.deadline is not None:
                deadline = min(deadline, p.request.deadline)
            f = Follower((p, a), p.request.request_id, a.mode.stores, deadline)
            self.following.follow(cache.marker(a), a.scope, a.digest, holder, f)
            followed.add(id(p))
        return followed

    async def _watch(self) -> None:
        """Look at the markers followers wait on (at most every ``FOLLOW_POLL_S``, in one
        round trip) and act on what changed: answer followers from their leader's entry,
        hand a failed leader's place to one of its followers, queue those whose wait is
        over."""
        now = time.time()
        if not self.following.groups or now - self._watched_at < FOLLOW_POLL_S:
            return
        self._watched_at = now
        groups = list(self.following.groups.values())
        try:
            seen = await self.redis.call(lambda c: self.cache.watch(c, groups))
        except RedisAway:
            seen = {}
        out = self.following.settle(seen, now)
        waiting = out.generate + await self._hand_over(out.handovers)
        for (_, a), entry in out.answered:
            a.entry = entry
        hits = [w for w, _ in out.answered]
        results = await asyncio.gather(*(self._answer(a) for _, a in hits))
        lookups = self.cache.lookups
        mine = self.consumer.assignment()
        for (p, a), ok in zip(hits, results, strict=True):
            if ok:
                lookups.labels("exact", "coalesced").inc()
                self._unacked[p.tp].discard(p.offset)
            else:
                waiting.append((p, a))  # to a worker, which settles it from its stream
        for p, a in waiting:
            if p.tp in mine:  # a moved partition's new owner reads it again
                if a.entry is None:
                    lookups.labels("exact", "uncoalesced").inc()
                self._queue_asked(p, a, now)

    async def _hand_over(self, handovers: list[Handover[Waiting]]) -> list[Waiting]:
        """Claim failed leaders' markers for their candidates: those that took one are
        returned, to be generated; the others follow whoever holds it (while Redis is
        away, the failed leader still: the next look tries again)."""
        if not handovers:
            return []
        try:
            holders = await self.redis.call(lambda c: self.cache.take_over(c, handovers))
        except RedisAway:
            holders = [h.failed for h in handovers]
        leading = [
            self.following.handed(h, holder) for h, holder in zip(handovers, holders, strict=True)
        ]
        return [w for w in leading if w is not None]

    async def _answer(self, asked: Asked) -> bool:
        """Answer a cache hit; False leaves it to a worker (Redis or Kafka away)."""
        if not self.kafka.open():
            return False

        async def send(topic: str, value: bytes, key: bytes) -> None:
            try:
                ack = await self.producer.send(topic, value, key=key)
                if not (await asyncio.wait({ack}, timeout=HIT_SEND_TIMEOUT_S))[0]:
                    raise KafkaTimeoutError("a cache hit's completion unacknowledged")
                ack.result()
            except KafkaError as exc:
                kafka_failed(self.kafka, exc)  # later hits wait for Kafka, not each 5 s
                raise

        try:
            return await self.redis.call(lambda c: self.cache.answer(c, asked, send))
        except RedisAway:
            return False

    def _fetch_size(self) -> int:
        room = self.settings.max_queued_requests - len(self.queue)
        return max(1, min(256, room))

    def _parse(
        self, tp: TopicPartition, msg: ConsumerRecord[Any, Any], now: float
    ) -> Pending | Rejected:
        """The request with its seed fixed at ingestion, or why it is rejected."""
        try:
            sent = decode(GenerateRequest, msg.value or b"")
        except DecodeError as exc:
            return Rejected.of(msg, exc.reason, exc.detail, _salvage_request_id(msg.value))
        req = sent.with_seed()
        rid = req.request_id
        refused = self.sources.refusal(tp.topic, req.tenant, req.priority, req.reply.kafka_topic)
        if refused is not None:
            return Rejected.of(msg, *refused, rid)
        if req.deadline is not None and req.deadline < now:
            return Rejected.of(msg, "deadline_exceeded", "the deadline passed before dispatch", rid)
        size = len(encode(req))
        if size > self._request_room:
            detail = f"{size} bytes encoded; a batch holds at most {self._request_room}"
            return Rejected.of(msg, "too_large", detail, rid)
        # A seed derived from the id (shared.producer seeds every request so) is not the
        # client's choice: the answer could never be asked for again.
        seeded = sent.sampling.seed not in (None, seed_of(rid))
        return Pending(tp, msg.offset, req, size, client_seeded=seeded)

    def _enqueue(self, p: Pending, now: float) -> None:
        # The fair queue's cost is a character-based token estimate: tokenizing happens
        # only for what is dispatched (see _affinity), never for the whole backlog.
        req = p.request
        ids = req.prompt_token_ids
        cost = (len(ids) if ids else req.prompt_chars // 4 + 1) + req.sampling.max_tokens
        self.queue.push(Queued(p, req.tenant, req.priority.rank, cost, now))

    def _affinity(self, req: GenerateRequest) -> list[int]:
        """Leading block hashes of the prompt, as the workers' prefix caches key them.
        Only the head of the prompt is tokenized: routing needs no more."""
        if self.tokenizer is None:
            return []
        try:
            return prefix_hashes(self.tokenizer, req, self.settings.block_size)
        except Exception as exc:  # the template refuses it: the worker ends it with the reason
            log.info(
                "routed without affinity, the prompt does not tokenize: %r",
                exc,
                extra={"request_id": req.request_id},
            )
            return []

    def _expire(self, now: float) -> list[Rejected]:
        """Queued requests whose deadline passed while they waited."""
        gone = self.queue.remove_if(
            lambda q: q.item.request.deadline is not None and q.item.request.deadline < now
        )
        return [
            q.item.rejected("deadline_exceeded", "the deadline passed while queued") for q in gone
        ]

    async def _flush_rejects(self) -> None:
        for r in await self.rejects.flush():
            self._unacked[r.tp].discard(r.offset)
        self.metrics.rejects_pending.set(len(self.rejects))

    # --- dispatch ---------------------------------------------------------------------
    async def _load_workers(self, force: bool = False) -> list[WorkerView] | None:
        """The live workers and their room; None while Redis is away (with no view of the
        workers nothing is dispatched: the queue waits for Redis)."""
        now = time.time()
        age_ms = (now - self._workers_at) * 1000
        if not force and self._view_ok and age_ms < self.settings.heartbeat_refresh_ms:
            return self._workers
        index, key_of = self.names.workers_index, self.names.heartbeat
        ttl_s = self.settings.heartbeat_ttl_s
        try:
            raw = await self.redis.call(lambda c: registry.read_live(c, index, key_of, ttl_s))
        except RedisAway:
            self._view_ok = False
            return None
        self._workers_at, self._view_ok = now, True
        beats = [hb for hb in (self._decode_heartbeat(data, now) for data in raw) if hb]
        admitted, refused = admit(beats, self.settings.block_size)
        self._note_refused(refused, beats)
        views = [self._view(hb, now) for hb in admitted if hb.partitions]
        self._workers = sorted(views, key=lambda w: w.worker_id)
        return self._workers

    def _decode_heartbeat(self, data: bytes, now: float) -> WorkerHeartbeat | None:
        try:
            return decode(WorkerHeartbeat, data)
        except DecodeError as exc:
            self.metrics.bad_heartbeats.inc()
            if now - self._bad_heartbeat_logged_at > 60:  # it is read at every tick
                self._bad_heartbeat_logged_at = now
                log.warning("a worker heartbeat does not decode (%s): %s", exc.reason, exc.detail)
            return None

    def _note_refused(self, refused: dict[str, Refusal], beats: list[WorkerHeartbeat]) -> None:
        """Log each worker once as it is refused (the view is read at every tick), and
        count the refused ones by reason."""
        for hb in beats:
            why = refused.get(hb.worker_id)
            if why is not None and self._refused.get(hb.worker_id) is not why:
                log.error(
                    "worker %s is never routed to (%s differs): it hashes blocks of %d tokens "
                    "%d deep, this batcher %d and %d (TW_BLOCK_SIZE must be the same on both)",
                    hb.worker_id,
                    why.value,
                    hb.block_size,
                    hb.affinity_depth,
                    self.settings.block_size,
                    AFFINITY_DEPTH,
                )
        self._refused = refused
        for reason in Refusal:
            n = sum(1 for why in refused.values() if why is reason)
            self.metrics.refused_workers.labels(reason=reason.value).set(n)

    def _view(self, hb: WorkerHeartbeat, now: float) -> WorkerView:
        sent = self._sent[hb.worker_id]
        while sent and sent[0][0] < now - SENT_MEMORY_S:
            sent.popleft()
        since = [(n, tok) for t, n, tok in sent if t > hb.at - TRANSIT_MARGIN_S]
        view = WorkerView.of(hb, sum(n for n, _ in since), sum(tok for _, tok in since))
        at, left = self._left.get(hb.worker_id, (0.0, 0))
        if at >= hb.at:
            view.free_slots = min(view.free_slots, left)
        return view

    async def _dispatch(self, workers: list[WorkerView]) -> None:
        """Take what the workers have room for and send one batch per target partition.
        A batch Kafka did not take goes back to the queue, to be sent again."""
        if not self.kafka.open():
            return
        if not workers and self._refused:
            # Only refused workers are live: a batch sent by hash could land on one of
            # their partitions, so the queue waits for a worker to route to.
            return
        decided = time.time()
        items = await self._ground(self._take(workers))
        if not items:
            return
        try:
            num_parts = len(await self.producer.partitions_for(self.names.batches))
        except KafkaError as exc:
            self._send_failed(items, exc)
            return
        routed = await self._reserve(self._route(items, workers))
        sent = await self._send(_by_partition(routed, num_parts))
        self._record(sent, decided)

    def _take(self, workers: list[WorkerView]) -> list[Queued[Pending]]:
        room = sum(max(0, w.free_slots) for w in workers) if workers else self.policy.max_requests
        # Bulk fills spare capacity only: it leaves `interactive_reserve` slots per worker
        # free, so a chat request never waits behind a bulk backlog for a slot.
        reserve = self.settings.interactive_reserve
        bulk_room = sum(max(0, w.free_slots - reserve) for w in workers) if workers else room
        items = self.queue.pop(min(self.policy.max_requests, room), max_bulk=bulk_room)
        log.debug(
            "dispatch %d of %d queued (room %s)", len(items), len(self.queue) + len(items), room
        )
        return items

    async def _ground(self, items: list[Queued[Pending]]) -> list[Queued[Pending]]:
        """Requests that ask for retrieval get their passages (one embedding batch for
        the dispatch); one that cannot be grounded, or outgrows a batch, is rejected."""
        asking = [q for q in items if q.item.request.retrieval is not None]
        if not asking:
            return items
        results = await self.grounder.ground([q.item.request for q in asking])
        refused: set[int] = set()
        for q, res in zip(asking, results, strict=True):
            if isinstance(res, RetrievalError):
                rejected = q.item.rejected(res.code, str(res))
            elif (size := len(encode(res))) > self._request_room:
                detail = f"{size} bytes with its passages; a batch holds {self._request_room}"
                rejected = q.item.rejected("too_large", detail)
            else:
                q.item.request, q.item.size = res, size
                continue
            self.rejects.add([rejected])
            refused.add(id(q))
        return [q for q in items if id(q) not in refused]

    def _route(self, items: list[Queued[Pending]], workers: list[WorkerView]) -> list[Routed]:
        """The worker of each request (None when no worker is known)."""
        routed: list[Routed] = []
        for q in items:
            target = None
            if workers:
                affine = self.router.mode is RoutingMode.AFFINITY
                hashes = self._affinity(q.item.request) if affine else []
                target = self.router.route(hashes, workers)
                target.free_slots -= 1
                target.free_tokens -= q.cost
            routed.append((target, q))
        return routed

    async def _reserve(self, routed: list[Routed]) -> list[Routed]:
        """Reserve the routed requests' slots in the workers' shared ledgers (one round
        trip). Those another batcher took the last slots for go back to the queue; all go
        back while Redis is away."""
        wants: dict[str, tuple[WorkerView, int]] = {}
        for w, _ in routed:
            if w is not None:
                wants[w.worker_id] = (w, wants.get(w.worker_id, (w, 0))[1] + 1)
        if not wants:
            return routed
        now = time.time()
        if self._peers == 0:
            for w, q in routed:
                if w is not None:
                    self._sent[w.worker_id].append((now, 1, q.cost))
            return routed
        asked = [(w.hb, n) for w, n in wants.values()]
        try:
            grants = await self.redis.call(lambda c: self.reserver.reserve(c, asked, now))
        except RedisAway:
            self.queue.requeue([q for _, q in routed])
            return []
        granted = {wid: g.granted for wid, g in grants.items()}
        for wid, g in grants.items():
            w = wants[wid][0]
            self._left[wid] = (w.hb.at, g.left)
            w.free_slots = min(w.free_slots, g.left)
        kept: list[Routed] = []
        short: list[Queued[Pending]] = []
        for w, q in routed:
            if w is not None and granted[w.worker_id] <= 0:
                short.append(q)
                continue
            if w is not None:
                granted[w.worker_id] -= 1
                # Counted as sent even if the send fails and it is queued again: the
                # view is then conservative for a few seconds, never over-full.
                self._sent[w.worker_id].append((now, 1, q.cost))
            kept.append((w, q))
        if short:
            self.queue.requeue(short)
            self.metrics.slots_short.inc(len(short))
        return kept

    async def _send(self, groups: dict[int, list[Queued[Pending]]]) -> list[Queued[Pending]]:
        """Send each group in as few batches as fit under the message limit; returns the
        requests Kafka acknowledged."""
        chunks = [
            (part, [group[i] for i in run])
            for part, group in groups.items()
            for run in pack([q.item.size for q in group], self._request_room)
        ]
        asked_at = time.monotonic()
        acks = []
        for i, (part, chunk) in enumerate(chunks):
            batch = Batch(
                batcher_id=self.settings.batcher_id, requests=[q.item.request for q in chunk]
            )
            try:
                ack = await self.producer.send(self.names.batches, encode(batch), partition=part)
            except KafkaError as exc:
                self._send_failed([q for _, rest in chunks[i:] for q in rest], exc)
                break  # Kafka is away: what is left is queued again
            acks.append((chunk, ack))
        sent: list[Queued[Pending]] = []
        for chunk, ack in acks:
            try:
                await self._acked(ack)
            except KafkaError as exc:
                self._send_failed(chunk, exc)
                continue
            self.kafka.answered(asked_at)
            sent += chunk
            self.batch_sizes.append(len(chunk))
            self.metrics.batch_size.observe(len(chunk))
        return sent

    async def _acked(self, ack: asyncio.Future[Any]) -> None:
        """Wait for a batch's acknowledgement. The idempotent producer retries a batch until
        Kafka takes it, however long Kafka is away, so this waits as long (a batch never
        goes out twice that way); past the request timeout it reports an outage."""
        timeout_s = self.settings.kafka_request_timeout_ms / 1000
        while not (await asyncio.wait({ack}, timeout=timeout_s))[0]:
            self.kafka.failed(KafkaTimeoutError("a batch unacknowledged past the timeout"))
        ack.result()

    def _send_failed(self, items: list[Queued[Pending]], exc: KafkaError) -> None:
        """Requests whose batch Kafka did not take go back to the queue (those of
        partitions still ours: the others are read again by their new owner)."""
        first = items[0].item.request.request_id if items else None
        if isinstance(exc, (MessageSizeTooLargeError, RecordTooLargeError)):
            # Batches are sized to the limit, so only a topic or broker set below it
            # refuses one: sending it again would fail forever.
            log.error("a batch was refused as too large: %r", exc, extra={"request_id": first})
            detail = f"Kafka refused its batch as too large ({exc}): check max.message.bytes"
            self.rejects.add([q.item.rejected("too_large", detail) for q in items])
            return
        note_kafka_error(self.metrics.kafka_errors, "batch", exc, first)
        kafka_failed(self.kafka, exc)
        mine = self.consumer.assignment()
        back = [q for q in items if q.item.tp in mine]
        self.queue.requeue(back)
        self.metrics.requeued.inc(len(back))

    def _record(self, sent: list[Queued[Pending]], decided: float) -> None:
        done = time.time()
        for q in sent:
            self._unacked[q.item.tp].discard(q.item.offset)
            self.window_waits_ms.append((decided - q.enqueued_at) * 1000)
            self.handoff_ms.append((done - decided) * 1000)
            self.metrics.window.observe(decided - q.enqueued_at)
            self.metrics.handoff.observe(done - decided)
            self.metrics.requests.labels(priority=q.item.request.priority.value).inc()

    async def _commit(self) -> None:
        """Commit, per partition, up to the first record not yet safely handed off. A
        commit failed by a rebalance or a broker away is tried again next tick (or left to
        the partition's next owner)."""
        offsets = {
            tp: min(self._unacked[tp]) if self._unacked.get(tp) else nxt
            for tp, nxt in self._consumed.items()
        }
        changed = {tp: o for tp, o in offsets.items() if self._committed.get(tp) != o}
        if not changed:
            return
        try:
            await self.consumer.commit(changed)
        except KafkaError as exc:
            note_kafka_error(self.metrics.kafka_errors, "commit", exc)
            return
        self._committed.update(changed)

    async def release(self, revoked: set[TopicPartition]) -> None:
        """Partitions are moving to another batcher: commit what is handed off and drop
        the rest of their queue (the new owner reads it again from the commit point)."""
        await self._commit()
        self.queue.remove_if(lambda q: q.item.tp in revoked)
        self.following.remove_if(lambda w: w[0].tp in revoked)
        self.rejects.drop(revoked)
        for tp in revoked:
            self._unacked.pop(tp, None)
            self._consumed.pop(tp, None)
            self._committed.pop(tp, None)

    # --- backpressure -------------------------------------------------------------------
    def _apply_backpressure(self) -> None:
        """Pause consumption while the queue is over its limits, until it is down to half."""
        s = self.settings
        held = len(self.queue) + len(self.rejects) + len(self.following)
        over = held >= s.max_queued_requests or self.queue.tokens >= s.max_queued_tokens
        under = held <= s.max_queued_requests // 2 and self.queue.tokens <= s.max_queued_tokens // 2
        if self.backpressure.apply(full=over, room=under) and self.backpressure.paused:
            log.info("queue full (%d requests): paused consumption", held)

    async def _publish_status(self) -> None:
        now = time.time()
        if now - self._status_at < 0.25:
            return
        self._status_at = now
        self._update_gauges(now)
        status = BatcherStatus(
            batcher_id=self.settings.batcher_id,
            queued_requests=len(self.queue),
            queued_tokens=self.queue.tokens,
            paused=self.backpressure.paused,
            queued_by_priority={
                p.value: n for p, n in zip(Priority, self.queue.depth_by_class(), strict=True)
            },
            window_ms=self._window_ms,
        )
        bid = self.settings.batcher_id
        index, key = self.names.batchers_index, self.names.batcher_status(bid)

        async def advertise(client: aioredis.Redis) -> int:
            pipe = client.pipeline(transaction=False)
            registry.advertise(pipe, index, bid, key, encode(status), STATUS_TTL_S)
            pipe.zcount(index, now - STATUS_TTL_S, "+inf")
            return int((await pipe.execute())[-1])

        try:
            self._peers = await self.redis.call(advertise) - 1
        except RedisAway:
            pass  # the status key expires: edges see no queue figure while Redis is away

    def _update_gauges(self, now: float) -> None:
        m = self.metrics
        m.queue_depth.set(len(self.queue))
        m.queue_tokens.set(self.queue.tokens)
        m.paused.set(int(self.backpressure.paused))
        oldest = self.queue.oldest()
        wait_ms = (now - oldest) * 1000 if oldest is not None else 0.0
        self._window_ms = self.policy.window_ms(_saturation(self._workers), wait_ms)
        m.window_ms.set(self._window_ms)
        m.lag.set(
            sum(
                max(0, (self.consumer.highwater(tp) or nxt) - nxt)
                for tp, nxt in self._consumed.items()
            )
        )


def _by_partition(routed: list[Routed], num_parts: int) -> dict[int, list[Queued[Pending]]]:
    """The target partition of each request (its worker's, or by hash if none)."""
    groups: dict[int, list[Queued[Pending]]] = defaultdict(list)
    for target, q in routed:
        groups[partition_for(target, q.item.request.request_id, num_parts)].append(q)
    return groups


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
