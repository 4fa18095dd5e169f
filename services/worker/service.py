"""The worker service: Kafka batches in, engine steps, token events out to Redis.

The engine runs in a process of its own (``EngineProcess``); this service's event loop
feeds it and publishes its outputs. One task per concern: ``_consume`` feeds the engine
from the batches topic, ``_publish`` sends each step's events for all sequences in one
Redis pipeline (``EventPublisher``), ``_complete`` settles finished requests (Kafka
completions and dead letters, then done markers, then offset commits: off the publishing
path, so token events never wait on Kafka acks), ``_heartbeat`` advertises load and keeps
claims alive, ``_cancels`` aborts cancelled requests.

Hand-off guarantees: a batch's offset is committed only when all its requests are settled;
a request's stream is written by one worker at a time (a claim in Redis, ``Claims``, that
expires when its worker dies; the engine may start while the claim is taken, and a request
claimed elsewhere is aborted with nothing published); a redelivered request skips the events
already in its replay log, and one whose done marker exists is never generated again. The
done marker is written only once everything the request owes (its final event, its Kafka
completion, its dead letter) is acknowledged.

Failure model: a failure that belongs to one request ends that request (an error event at
its next seq, a dead letter); a request that was running in two worker crashes is
quarantined as a poison; Redis or Kafka going away is waited out with backoff (token events
buffered in order, the engine paused when the buffer is full), never a reason to exit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from services.worker.claims import POISON_ATTEMPTS, Claim, Claims
from services.worker.config import WorkerSettings
from services.worker.engine.engine import EngineRequest, StepOutput
from services.worker.engine.sampler import SamplingConfig
from services.worker.events import StreamState
from services.worker.metrics import WorkerMetrics
from services.worker.offsets import OffsetTracker
from services.worker.publisher import EventPublisher
from services.worker.runtime import EngineFailed, EngineProcess
from shared import registry
from shared.codec import DecodeError, decode, encode
from shared.dead_letters import dead_letter, dead_letter_key
from shared.kafka_io import make_consumer, make_producer
from shared.messages import (
    Batch,
    CancelRequest,
    DeadLetter,
    FinishReason,
    GenerateRequest,
    Priority,
    TokenEvent,
    WorkerHeartbeat,
    error_event,
)
from shared.metrics import serve_metrics
from shared.prompts import prompt_token_ids
from shared.retry import KAFKA_DOWN, REDIS_DOWN, Dependency

log = logging.getLogger(__name__)

HEARTBEAT_MIN_GAP_S = 0.05
INLINE_TOKENIZE_CHARS = 8192
SHUTDOWN_STEP_S = 5.0
# A batch created this long after its partition was assigned here cannot have been running
# on a worker that crashed: its requests may start before their claims answer.
FRESH_BATCH_MARGIN_S = 1.0
TOPICS_REFRESH_S = 5.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: WorkerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.service.hand_back([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        now = time.time()
        for tp in assigned:
            self.service.assigned_at[tp.partition] = now
        log.info("assigned partitions %s", sorted(tp.partition for tp in assigned))


class WorkerService:
    """A decode worker in the ``tw.batches`` consumer group."""

    def __init__(self, settings: WorkerSettings, runner: EngineProcess, tokenizer: Any) -> None:
        self.settings = settings
        self.names = settings.names
        self.runner = runner
        self.tokenizer = tokenizer
        self.metrics = WorkerMetrics(settings.worker_id)
        self.redis_dep = Dependency("redis", log, self.metrics.deps)
        self.kafka_dep = Dependency("kafka", log, self.metrics.deps)
        self.redis: aioredis.Redis = aioredis.Redis.from_url(settings.redis_url)
        # Token events (nearly all of this worker's Redis traffic) and the claim of each
        # request (on its way to the engine) bypass redis-py, each on a connection of its own.
        self.publisher = EventPublisher(
            settings.redis_url,
            self.names,
            name=f"tw-worker-{settings.worker_id}",
            redis=self.redis_dep,
        )
        self.claims = Claims(
            settings.redis_url, self.names, settings.worker_id, settings.claim_ttl_s
        )
        self.producer: AIOKafkaProducer = make_producer(settings, client_id=settings.worker_id)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings,
            group_id=self.names.worker_group,
            client_id=settings.worker_id,
            session_timeout_ms=settings.session_timeout_ms,
        )
        self.offsets = OffsetTracker()
        self.streams: dict[str, StreamState] = {}
        self.partition_of: dict[str, int] = {}
        self.deferred: dict[str, tuple[int, int, GenerateRequest]] = {}  # claimed elsewhere
        self.assigned_at: dict[int, float] = {}  # partition → when it was assigned here
        self._topics: set[str] = set()  # reply topics known to exist
        self._topics_at = 0.0
        self._stopping = asyncio.Event()
        self._nudge = asyncio.Event()
        self._idle = asyncio.Event()  # set when the last running request finishes
        self._finals: asyncio.Queue[list[StreamState]] = asyncio.Queue()
        self._paused = False
        self._summary: list[int] = []

    async def run(self) -> None:
        """Serve until ``stop()``; then drain gracefully (see ``_shutdown``)."""
        serve_metrics(
            self.metrics.registry,
            self.settings.metrics_port,
            self.settings.metrics_host,
            readiness=lambda: {"redis": self.redis_dep.up, "kafka": self.kafka_dep.up},
        )
        await self.runner.attach()
        await self.producer.start()
        self.consumer.subscribe([self.names.batches], listener=_Rebalance(self))
        await self.consumer.start()
        consume = asyncio.create_task(self._consume(), name="consume")
        others = [
            asyncio.create_task(self._publish(), name="publish"),
            asyncio.create_task(self._complete(), name="complete"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._cancels(), name="cancels"),
        ]
        stop = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait(
                [consume, *others, stop], return_when=asyncio.FIRST_COMPLETED
            )
            for t in done:
                if t is not stop and t.exception():
                    raise t.exception()  # type: ignore[misc]
            consume.cancel()
            await asyncio.gather(consume, return_exceptions=True)
            await self._drain()
        finally:
            for t in [consume, *others, stop]:
                t.cancel()
            # Bounded: a client library that ignores cancellation must not keep a stopping
            # worker (and its partitions) hostage.
            await asyncio.wait([consume, *others, stop], timeout=SHUTDOWN_STEP_S)
            await asyncio.to_thread(self.runner.stop)
            await asyncio.wait_for(self._shutdown(), timeout=3 * SHUTDOWN_STEP_S)

    def stop(self) -> None:
        self._stopping.set()

    async def _drain(self) -> None:
        """Stop taking work and let running requests finish, and their completions go
        out, for a bounded time."""
        deadline = time.monotonic() + self.settings.drain_timeout_s
        if self.streams:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.drain_timeout_s)
            except TimeoutError:
                log.info("drain: %d requests still running, handing them back", len(self.streams))
        try:
            await asyncio.wait_for(self._finals.join(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("drain: finished requests not settled in time; they are redelivered")

    async def _shutdown(self) -> None:
        """Hand back what did not finish (its batches stay uncommitted, so the group
        redelivers them), commit what did, and leave the group."""
        await self.hand_back(list(set(self.partition_of.values())))
        await self._commit()
        await self.consumer.stop()
        await self.producer.stop()
        pipe = self.redis.pipeline(transaction=False)
        wid = self.settings.worker_id
        registry.withdraw(pipe, self.names.workers_index, wid, self.names.heartbeat(wid))
        try:
            await pipe.execute()
        except REDIS_DOWN as exc:  # the heartbeat key expires on its own
            log.warning("could not withdraw the heartbeat: %r", exc)
        await self.publisher.aclose()
        await self.claims.aclose()
        await self.redis.aclose()

    async def hand_back(self, partitions: list[int]) -> None:
        """Stop generating the unfinished requests of ``partitions`` (revoked or shutting
        down) without a final event: their next owner continues their streams. After an
        engine failure their claims count as a crashed attempt (poison accounting)."""
        await self._commit()
        mine = []
        for part in partitions:
            for rid in self.offsets.drop_partition(part):
                self.deferred.pop(rid, None)
                if self.streams.pop(rid, None) is not None:
                    self.runner.abort(rid)
                    mine.append(rid)
                self.partition_of.pop(rid, None)
        if not mine:
            return
        how = "crashed" if self.runner.error is not None else "handed_back"
        try:
            await self.claims.release(mine, how)
        except REDIS_DOWN as exc:  # the claims expire on their own
            log.warning("could not release %d claims: %r", len(mine), exc)
        log.info("handed back %d unfinished requests (%s)", len(mine), how)

    # --- intake -----------------------------------------------------------------------
    async def _consume(self) -> None:
        while True:
            self._apply_backpressure()
            records = await self.consumer.getmany(timeout_ms=100, max_records=64)
            for tp, msgs in records.items():
                for msg in msgs:
                    await self._take_batch(tp, msg)

    def _apply_backpressure(self) -> None:
        """Stop fetching while the engine's queue is long; Kafka keeps the rest durable."""
        full = self.runner.stats.waiting >= self.settings.max_waiting
        parts = list(self.consumer.assignment())
        if full and not self._paused:
            self.consumer.pause(*parts)
        elif not full and self._paused:
            self.consumer.resume(*parts)
        self._paused = full

    async def _take_batch(self, tp: TopicPartition, msg: ConsumerRecord[Any, Any]) -> None:
        try:
            batch = decode(Batch, msg.value)
        except DecodeError as exc:
            # Batches come from our own batchers; a bad one is dead-lettered and skipped.
            log.error("undecodable batch at %s:%s: %s", tp, msg.offset, exc)
            self.offsets.add(tp.partition, msg.offset, [])
            await self._dead_letter(
                dead_letter(
                    reason=exc.reason,
                    detail=exc.detail,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=msg.offset,
                    key=msg.key,
                    value=msg.value,
                    request_id=None,
                )
            )
            return
        reqs = batch.requests
        self.offsets.add(tp.partition, msg.offset, [r.request_id for r in reqs])
        # The engine starts at once and the claim's round trip overlaps the prefill: until
        # the claim answers, a stream's outputs are held, and a request that turns out not
        # to be this worker's to start is aborted with nothing of it published. Only for a
        # fresh batch: a redelivered one may hold a poison, which must not reach the
        # engine before its claim has counted the crashes it was in.
        early: dict[str, StreamState] = {}
        if batch.created_at > self.assigned_at.get(tp.partition, math.inf) + FRESH_BATCH_MARGIN_S:
            for req in reqs:
                if req.request_id not in self.streams:  # else a duplicate: resolved below
                    st = self._start_early(tp.partition, msg.offset, req)
                    if st is not None:
                        early[req.request_id] = st
        try:
            rids = [r.request_id for r in reqs]
            claims = await self.redis_dep.call(lambda: self.claims.take(rids), REDIS_DOWN)
            for req, claim in zip(reqs, claims, strict=True):
                st = early.pop(req.request_id, None)
                await self._resolve(tp.partition, msg.offset, req, claim, st)
        finally:
            for rid, st in early.items():  # unresolved: intake stopped
                self._withdraw(rid, st)

    async def _resolve(
        self,
        partition: int,
        offset: int,
        req: GenerateRequest,
        claim: Claim,
        early: StreamState | None,
    ) -> None:
        """Act on a request's claim; ``early`` is its stream if it started early."""
        rid = req.request_id
        if early is not None:
            if self.streams.get(rid) is not early:
                return  # handed back while the claim was on its way
            if claim.ours and not (claim.done or claim.cancelled or claim.poison):
                await self._confirm(early, claim.last_seq)
                return
            self._withdraw(rid, early)
        if claim.done:
            self.offsets.done(rid)  # finished before a crash: never generated twice
        elif rid in self.streams:
            return  # a duplicate delivery of a request running here
        elif not claim.ours:
            self.deferred[rid] = (partition, offset, req)  # another live worker has it
        else:
            st = StreamState(req, next_seq=claim.last_seq + 1, partition=partition, offset=offset)
            if claim.poison:
                why = f"the request was running during {POISON_ATTEMPTS} worker crashes"
                await self._end(st, "poison", why)
            elif claim.cancelled:
                ev = TokenEvent(
                    request_id=rid, seq=st.next_seq, finish_reason=FinishReason.CANCELLED
                )
                await self._end_with(st, ev)
            else:
                await self._start_request(st, claim.last_seq)

    def _start_early(self, partition: int, offset: int, req: GenerateRequest) -> StreamState | None:
        """Submit a request before its claim answers, its outputs held; None where the
        claimed path must decide (a passed deadline, a reply topic not yet known, a long
        or failing prompt)."""
        if req.deadline is not None and req.deadline < time.time():
            return None
        topic = req.reply.kafka_topic
        if req.prompt_chars > INLINE_TOKENIZE_CHARS or (topic and topic not in self._topics):
            return None
        try:
            ids = prompt_token_ids(self.tokenizer, req)
        except Exception:  # a template or tokenizer error: reported on the claimed path
            return None
        st = StreamState(req, held=[], partition=partition, offset=offset)
        self._submit(st, ids)
        return st

    async def _confirm(self, st: StreamState, skip_upto: int) -> None:
        """An early-started stream is this worker's: send what it held back."""
        st.skip_upto = skip_upto
        held, st.held = st.held or [], None
        self._started(st.request)
        if held:
            await self._emit(*self._events(held))

    def _withdraw(self, rid: str, st: StreamState) -> None:
        """An early-started request is not this worker's to run: abort it unpublished."""
        if self.streams.get(rid) is st:
            del self.streams[rid]
            self.partition_of.pop(rid, None)
            self.runner.abort(rid)
            if not self.streams:
                self._idle.set()

    def _started(self, req: GenerateRequest) -> None:
        self.metrics.started(req)
        log.debug(
            "started %.1f ms after creation",
            (time.time() - req.created_at) * 1000,
            extra={"request_id": req.request_id},
        )

    async def _start_request(self, st: StreamState, skip_upto: int) -> None:
        """Start a request this worker holds (its events up to ``skip_upto`` are in its
        replay log already), or end it with an error that is its own."""
        req = st.request
        st.next_seq = 0
        st.skip_upto = skip_upto
        if req.deadline is not None and req.deadline < time.time():
            why = "the deadline passed before generation started"
            await self._end(st, "deadline_exceeded", why, seq=skip_upto + 1)
            return
        topic = req.reply.kafka_topic
        if topic and not await self._topic_exists(topic):
            why = f"the reply topic '{topic}' does not exist"
            await self._end(st, "reply_topic_not_found", why, seq=skip_upto + 1)
            return
        try:
            # Short prompts are tokenized inline (well under a millisecond): a thread hop
            # would wait for the GIL behind the engine's step. Long ones go to a thread so
            # the event loop never stalls on them.
            if req.prompt_chars <= INLINE_TOKENIZE_CHARS:
                ids = prompt_token_ids(self.tokenizer, req)
            else:
                ids = await asyncio.to_thread(prompt_token_ids, self.tokenizer, req)
        except Exception as exc:  # a template or tokenizer error is the request's problem
            why = f"cannot tokenize the prompt: {exc}"
            await self._end(st, "invalid_request", why, seq=skip_upto + 1)
            return
        self._started(req)
        self._submit(st, ids)

    def _submit(self, st: StreamState, ids: list[int]) -> None:
        """Track ``st`` as running here and hand its request to the engine."""
        req = st.request
        self.streams[req.request_id] = st
        self.partition_of[req.request_id] = st.partition
        sp = req.sampling
        self.runner.submit(
            EngineRequest(
                request_id=req.request_id,
                prompt_ids=ids,
                max_tokens=sp.max_tokens,
                sampling=SamplingConfig(sp.temperature, sp.top_p, sp.top_k, sp.seed),
                stop=sp.stop,
                stop_token_ids=sp.stop_token_ids,
                ignore_eos=sp.ignore_eos,
                priority=0 if req.priority is Priority.INTERACTIVE else 1,
            )
        )

    async def _topic_exists(self, topic: str) -> bool:
        """Whether a reply topic exists (cluster metadata, refreshed at most every few
        seconds for names not seen yet). While Kafka is away the answer is yes: the
        completion then waits for Kafka like any other."""
        if topic in self._topics or time.monotonic() - self._topics_at < TOPICS_REFRESH_S:
            return topic in self._topics
        try:
            cluster = await asyncio.wait_for(self.producer.client.fetch_all_metadata(), 5.0)
        except (KafkaError, TimeoutError) as exc:
            log.warning("cannot read the topic list: %r", exc)
            return True
        self._topics = set(cluster.topics())
        self._topics_at = time.monotonic()
        return topic in self._topics

    async def _end(self, st: StreamState, code: str, message: str, seq: int | None = None) -> None:
        """End a request with an error of its own: an error event at its next seq (never one
        a redelivered stream has already had), then a dead letter and its completion."""
        log.warning("failed (%s): %s", code, message, extra={"request_id": st.request.request_id})
        next_seq = st.next_seq if seq is None else seq
        await self._end_with(st, error_event(st.request.request_id, next_seq, code, message))

    async def _end_with(self, st: StreamState, ev: TokenEvent) -> None:
        st.final = ev
        await self._emit([(st, ev)], [st])

    async def _retry_deferred(self) -> None:
        """Requests claimed by another worker: done when it finishes them, ours if its
        claim expires (it died)."""
        if not self.deferred:
            return
        rids = list(self.deferred)
        for rid, claim in zip(rids, await self.claims.take(rids), strict=True):
            entry = self.deferred.pop(rid, None)
            if entry is not None:  # not handed back meanwhile
                await self._resolve(*entry, claim, None)  # deferred again if not ours

    # --- output -------------------------------------------------------------------------
    async def _publish(self) -> None:
        outputs = self.runner.outputs
        while True:
            outs = await outputs.get()
            if self.runner.error is not None:
                raise EngineFailed("engine step failed") from self.runner.error
            batch = [outs]
            while not outputs.empty():  # catch up in one round trip
                batch.append(outputs.get_nowait())
            self.runner.taken()
            await self._emit(*self._events([o for step in batch for o in step]))

    async def _emit(
        self, pairs: list[tuple[StreamState, TokenEvent]], finished: list[StreamState]
    ) -> None:
        """Publish events (waiting out a Redis outage); finished streams go on to
        ``_complete``, and a stream no client follows any more is cancelled."""
        await self.publisher.publish(pairs)
        now = time.monotonic()
        for st, ev in pairs:
            self.metrics.published(st.request, ev)
            rid = ev.request_id
            if ev.final:
                log.info("finished: %s", ev.finish_reason, extra={"request_id": rid})
            elif st.abandoned(now) and not st.cancelling and self.streams.get(rid) is st:
                st.cancelling = True
                log.info("no client follows the stream: cancelling", extra={"request_id": rid})
                self.metrics.unfollowed.inc()
                self.runner.abort(rid)
        if finished:
            self._finals.put_nowait(finished)

    def _events(
        self, outs: list[StepOutput]
    ) -> tuple[list[tuple[StreamState, TokenEvent]], list[StreamState]]:
        """The events to publish for ``outs``, and the streams they finish (including
        those whose final event went out before a redelivery)."""
        pairs = []
        finished = []
        for out in outs:
            state = self.streams.get(out.request_id)
            if state is None:
                continue  # handed back or cancelled meanwhile
            if state.held is not None:
                state.held.append(out)  # its claim has not answered yet
                continue
            ev = state.event(out)
            if out.finish is not None:
                del self.streams[out.request_id]
                self.partition_of.pop(out.request_id, None)
                self._nudge.set()
                if not self.streams:
                    self._idle.set()
                finished.append(state)
            if ev is not None:
                pairs.append((state, ev))
        return pairs, finished

    async def _complete(self) -> None:
        """Settle finished requests, in the order a crash can never undo: completions and
        dead letters to Kafka, then their done markers, then their batches' commits."""
        while True:
            finals = await self._finals.get()
            got = 1
            while not self._finals.empty():  # catch up in one round trip
                finals += self._finals.get_nowait()
                got += 1
            try:
                await self._settle(finals)
            finally:
                for _ in range(got):
                    self._finals.task_done()

    async def _settle(self, finals: list[StreamState]) -> None:
        await self._send_completions([st for st in finals if st.request.reply.kafka_topic])
        for st in finals:
            if st.final is not None and st.final.error is not None:
                self.metrics.failures.labels(st.final.error.code).inc()
                await self._dead_letter(self._letter_of(st, st.final))
        rids = [st.request.request_id for st in finals]
        ttl = self.settings.done_ttl_s
        await self.redis_dep.call(
            lambda: self.claims.release(rids, "done", done_ttl_s=ttl), REDIS_DOWN
        )
        for rid in rids:
            self.offsets.done(rid)
        await self._commit()

    async def _send_completions(self, finals: list[StreamState]) -> None:
        """Each finished request's ``Completion`` to its reply topic, waiting out a Kafka
        outage; one that cannot be delivered at all is dead-lettered."""
        pending = finals
        while pending:
            results = await asyncio.gather(
                *(self._send_completion(st) for st in pending), return_exceptions=True
            )
            retry: list[StreamState] = []
            last: BaseException | None = None
            for st, res in zip(pending, results, strict=True):
                if isinstance(res, KAFKA_DOWN):
                    retry.append(st)
                    last = res
                elif isinstance(res, KafkaError):
                    self.metrics.handled_errors.labels("completion").inc()
                    log.warning(
                        "completion undeliverable: %r",
                        res,
                        extra={"request_id": st.request.request_id},
                    )
                    assert st.final is not None
                    letter = self._letter_of(st, st.final, "completion_undeliverable", repr(res))
                    await self._dead_letter(letter)
                elif isinstance(res, BaseException):
                    raise res
            if last is not None:
                await asyncio.sleep(self.kafka_dep.failed(last))
            else:
                self.kafka_dep.answered()
            pending = retry

    async def _send_completion(self, st: StreamState) -> None:
        topic, final = st.request.reply.kafka_topic, st.final
        assert topic is not None and final is not None
        record = encode(st.completion(final, self.settings.worker_id))
        await (await self.producer.send(topic, record, key=st.request.request_id.encode()))

    def _letter_of(
        self, st: StreamState, final: TokenEvent, reason: str | None = None, detail: str = ""
    ) -> DeadLetter:
        err = final.error
        return dead_letter(
            reason=reason or (err.code if err else "error"),
            detail=detail or (err.message if err else ""),
            topic=self.names.batches,
            partition=st.partition,
            offset=st.offset,
            key=st.request.request_id,
            value=encode(st.request),
            request_id=st.request.request_id,
        )

    async def _dead_letter(self, letter: DeadLetter) -> None:
        """Write a dead letter, waiting out a Kafka outage."""
        data, key = encode(letter), dead_letter_key(letter)
        await self.kafka_dep.call(
            lambda: self.producer.send_and_wait(self.names.requests_dlq, data, key=key),
            KAFKA_DOWN,
        )

    async def _commit(self) -> None:
        offsets = self.offsets.committable()
        if not offsets:
            return
        try:
            await self.consumer.commit(
                {TopicPartition(self.names.batches, p): o for p, o in offsets.items()}
            )
        except KafkaError as exc:  # a rebalance in flight, or Kafka away: try again later
            self.offsets.not_committed(offsets)
            self.metrics.handled_errors.labels("commit").inc()
            log.warning("commit of %s failed, retried later: %r", offsets, exc)

    # --- control ------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        """Advertise load about every second — at once (throttled) when requests finish,
        so batchers see freed capacity quickly — and keep this worker's claims alive."""
        s = self.settings
        while True:
            try:
                await self._beat()
            except REDIS_DOWN as exc:
                await asyncio.sleep(self.redis_dep.failed(exc))
                continue
            self.redis_dep.answered()
            self._nudge.clear()
            try:
                await asyncio.wait_for(self._nudge.wait(), s.heartbeat_interval_s)
            except TimeoutError:
                pass  # a regular beat
            await asyncio.sleep(HEARTBEAT_MIN_GAP_S)

    async def _beat(self) -> None:
        s = self.settings
        st = self.runner.stats
        hb = WorkerHeartbeat(
            worker_id=s.worker_id,
            partitions=sorted(tp.partition for tp in self.consumer.assignment()),
            # Negative when requests queue beyond the running cap: batchers count it.
            free_slots=s.max_running - st.running - st.waiting,
            free_kv_tokens=st.free_kv_tokens,
            running=st.running,
            waiting=st.waiting,
            kv_used_tokens=st.kv_used_blocks * st.block_size,
            prefix_hashes=await self._prefix_summary(),
        )
        pipe = self.redis.pipeline(transaction=False)
        key = self.names.heartbeat(s.worker_id)
        registry.advertise(
            pipe, self.names.workers_index, s.worker_id, key, encode(hb), s.heartbeat_ttl_s
        )
        await pipe.execute()
        running = [rid for rid, state in self.streams.items() if state.held is None]
        for rid in await self.claims.refresh(running) if running else []:
            self._lost(rid)
        await self._retry_deferred()
        self.metrics.refresh(st, await self._lag())
        self.metrics.engine_paused.set(int(self.runner.paused))

    def _lost(self, rid: str) -> None:
        """Another worker holds the claim of a request running here (ours lapsed while Redis
        was away): stop ours and wait for it, as for any request claimed elsewhere."""
        st = self.streams.pop(rid, None)
        if st is None:
            return
        log.warning("claim taken by another worker: stopping", extra={"request_id": rid})
        self.metrics.handled_errors.labels("claim_lost").inc()
        self.runner.abort(rid)
        self.partition_of.pop(rid, None)
        self.deferred[rid] = (st.partition, st.offset, st.request)

    async def _prefix_summary(self) -> list[int]:
        """The KV cache's routing summary from the engine process; the previous one if the
        engine does not answer within a heartbeat."""
        try:
            wait = self.settings.heartbeat_interval_s
            self._summary = await asyncio.wait_for(self.runner.kv_summary(256), wait)
        except TimeoutError:
            pass  # busy engine: the previous summary is a heartbeat old
        return self._summary

    async def _lag(self) -> int:
        """Batches on assigned partitions not yet fetched, plus those fetched but unfinished."""
        unfetched = 0
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            if high is None:
                continue
            try:
                pos = await asyncio.wait_for(self.consumer.position(tp), 0.5)
            except (KafkaError, TimeoutError) as exc:  # a rebalance or Kafka away
                log.debug("no position for %s: %r", tp, exc)
                continue
            unfetched += max(0, high - pos)
        return unfetched + self.offsets.unfinished_batches()

    async def _cancels(self) -> None:
        """Abort requests cancelled on the cancel channel (resubscribing after a Redis
        outage; cancels sent meanwhile are repeated by their edges until a final event)."""
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.names.cancel_channel)
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None:
                        self._cancel(msg["data"])
            except REDIS_DOWN as exc:
                await asyncio.sleep(self.redis_dep.failed(exc))
            finally:
                try:
                    await asyncio.wait_for(pubsub.aclose(), SHUTDOWN_STEP_S)
                except REDIS_DOWN as exc:  # TimeoutError among them
                    log.debug("closing the cancel subscription: %r", exc)

    def _cancel(self, data: bytes) -> None:
        try:
            cancel = decode(CancelRequest, data)
        except DecodeError as exc:
            self.metrics.handled_errors.labels("cancel_decode").inc()
            log.warning("undecodable cancel: %s", exc)
            return
        if cancel.request_id in self.streams:
            self.runner.abort(cancel.request_id)
