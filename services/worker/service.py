"""The worker service: Kafka batches in, engine steps, token events out to Redis.

The engine runs in a process of its own (``EngineProcess``); this service's event loop
feeds it and publishes its outputs. One task per concern: ``_consume`` feeds the engine
from the batches topic, ``_publish`` sends each step's events for all sequences in one
Redis pipeline, ``_complete`` sends finished requests' completions to Kafka and then
commits their batches (off the publishing path: token events never wait on Kafka acks),
``_heartbeat`` advertises load and keeps claims alive, ``_cancels`` aborts cancelled
requests.

Hand-off guarantees: a batch's offset is committed only when all its requests finished; a
request's stream is written by one worker at a time (a claim key in Redis that expires when
its worker dies; the engine starts while the claim is taken, and a request claimed
elsewhere is aborted with nothing published); a redelivered request skips the events
already in its replay log, and one that finished before (a done marker) is never generated
again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from services.worker.config import WorkerSettings
from services.worker.engine.engine import EngineRequest, StepOutput
from services.worker.engine.sampler import SamplingConfig
from services.worker.events import StreamState
from services.worker.metrics import WorkerMetrics
from services.worker.offsets import OffsetTracker
from services.worker.runtime import EngineProcess
from shared import registry, token_stream
from shared.codec import DecodeError, decode, encode
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
from shared.resp import RedisReplyError, RespWriter, command

log = logging.getLogger(__name__)

HEARTBEAT_MIN_GAP_S = 0.05
INLINE_TOKENIZE_CHARS = 8192
SHUTDOWN_STEP_S = 5.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: WorkerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.service.hand_back([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("assigned partitions %s", sorted(tp.partition for tp in assigned))


class WorkerService:
    """A decode worker in the ``tw.batches`` consumer group."""

    def __init__(self, settings: WorkerSettings, runner: EngineProcess, tokenizer: Any) -> None:
        self.settings = settings
        self.names = settings.names
        self.runner = runner
        self.tokenizer = tokenizer
        self.redis: aioredis.Redis = aioredis.Redis.from_url(settings.redis_url)
        # Token events (nearly all of this worker's Redis traffic) and the claim of each
        # request (on its way to the engine) bypass redis-py, each on a connection of its own.
        self.events_out = RespWriter(settings.redis_url, name=f"tw-worker-{settings.worker_id}")
        self.claims = RespWriter(settings.redis_url, name=f"tw-worker-{settings.worker_id}-claims")
        self.producer: AIOKafkaProducer = make_producer(settings, client_id=settings.worker_id)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings,
            group_id=self.names.worker_group,
            client_id=settings.worker_id,
            session_timeout_ms=settings.session_timeout_ms,
        )
        self.offsets = OffsetTracker()
        self.metrics = WorkerMetrics(settings.worker_id)
        self.streams: dict[str, StreamState] = {}
        self.partition_of: dict[str, int] = {}
        self.deferred: dict[str, tuple[int, int, GenerateRequest]] = {}  # claimed elsewhere
        self._stopping = asyncio.Event()
        self._nudge = asyncio.Event()
        self._idle = asyncio.Event()  # set when the last running request finishes
        self._finals: asyncio.Queue[list[tuple[StreamState, TokenEvent]]] = asyncio.Queue()
        self._paused = False
        self._summary: list[int] = []

    async def run(self) -> None:
        """Serve until ``stop()``; then drain gracefully (see ``_shutdown``)."""
        serve_metrics(self.metrics.registry, self.settings.metrics_port, self.settings.metrics_host)
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.settings.drain_timeout_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finals.join(), max(0.1, deadline - time.monotonic()))

    async def _shutdown(self) -> None:
        """Hand back what did not finish (its batches stay uncommitted, so the group
        redelivers them), commit what did, and leave the group."""
        with contextlib.suppress(Exception):
            await self.hand_back(list({p for p in self.partition_of.values()}))
            await self._commit()
        await self.consumer.stop()
        await self.producer.stop()
        with contextlib.suppress(Exception):
            pipe = self.redis.pipeline(transaction=False)
            wid = self.settings.worker_id
            registry.withdraw(pipe, self.names.workers_index, wid, self.names.heartbeat(wid))
            await pipe.execute()
        await self.events_out.aclose()
        await self.claims.aclose()
        await self.redis.aclose()

    async def hand_back(self, partitions: list[int]) -> None:
        """Stop generating the unfinished requests of ``partitions`` (revoked or shutting
        down) without a final event: their next owner continues their streams."""
        await self._commit()
        mine = []
        for part in partitions:
            for rid in self.offsets.drop_partition(part):
                self.deferred.pop(rid, None)
                if self.streams.pop(rid, None) is not None:
                    self.runner.abort(rid)
                    mine.append(rid)
                self.partition_of.pop(rid, None)
        if mine:
            await self.redis.delete(*(self.names.claim(r) for r in mine))
            log.info("handed back %d unfinished requests", len(mine))

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
            # Batches come from our own batchers; a bad one is logged and skipped.
            log.error("undecodable batch at %s:%s: %s", tp, msg.offset, exc)
            self.offsets.add(tp.partition, msg.offset, [])
            return
        reqs = batch.requests
        self.offsets.add(tp.partition, msg.offset, [r.request_id for r in reqs])
        # The engine starts at once and the claim's round trip overlaps the prefill: until
        # the claim answers, a stream's outputs are held, and a request that turns out not
        # to be this worker's to start is aborted with nothing of it published.
        early: dict[str, StreamState] = {}
        for req in reqs:
            if req.request_id not in self.streams:  # else a duplicate: resolved below
                st = self._start_early(tp.partition, req)
                if st is not None:
                    early[req.request_id] = st
        try:
            claims = await self._claim([r.request_id for r in reqs])
            for req, claim in zip(reqs, claims, strict=True):
                st = early.pop(req.request_id, None)
                await self._resolve(tp.partition, msg.offset, req, claim, st)
        finally:
            for rid, st in early.items():  # unresolved: the claim failed or intake stopped
                self._withdraw(rid, st)

    async def _resolve(
        self,
        partition: int,
        offset: int,
        req: GenerateRequest,
        claim: tuple[bool, bool, bool, int],
        early: StreamState | None,
    ) -> None:
        """Act on a request's claim; ``early`` is its stream if it started early."""
        done, cancelled, ours, skip = claim
        rid = req.request_id
        if early is not None:
            if self.streams.get(rid) is not early:
                return  # handed back while the claim was on its way
            if ours and not done and not cancelled:
                await self._confirm(early, skip)
                return
            self._withdraw(rid, early)
        if done:
            self.offsets.done(rid)  # finished before a crash: never generated twice
        elif rid in self.streams:
            return  # a duplicate delivery of a request running here
        elif not ours:
            self.deferred[rid] = (partition, offset, req)  # another live worker has it
        else:
            await self._admit(partition, offset, req, cancelled, skip)

    @property
    def _claim_ms(self) -> int:
        return int(self.settings.claim_ttl_s * 1000)

    async def _claim(self, rids: list[str]) -> list[tuple[bool, bool, bool, int]]:
        """One round trip for all ``rids``: per request, is it finished, is it cancelled,
        is it this worker's (claimed now or before: so the connection may send it again),
        and the last seq its stream has."""
        me = self.settings.worker_id.encode()
        ttl = b"%d" % self._claim_ms
        cmds = []
        for rid in rids:
            claim = self.names.claim(rid).encode()
            cmds += [
                command(b"EXISTS", self.names.done_marker(rid).encode()),
                command(b"EXISTS", self.names.cancelled(rid).encode()),
                command(b"SET", claim, me, b"NX", b"PX", ttl),
                command(b"GET", claim),
                command(
                    b"XREVRANGE", self.names.token_log(rid).encode(), b"+", b"-", b"COUNT", b"1"
                ),
            ]
        res = await self.claims.execute(cmds)
        for r in res:
            if isinstance(r, RedisReplyError):
                raise r
        return [
            (bool(res[i]), bool(res[i + 1]), res[i + 3] in (None, me), _last_seq(res[i + 4]))
            for i in range(0, len(res), 5)
        ]

    async def _admit(
        self, partition: int, offset: int, req: GenerateRequest, cancelled: bool, skip: int
    ) -> None:
        """Start a request this worker holds, or end its stream if it was cancelled."""
        if cancelled:
            ev = TokenEvent(
                request_id=req.request_id, seq=skip + 1, finish_reason=FinishReason.CANCELLED
            )
            await self._send([(StreamState(req), ev)])
            self.offsets.done(req.request_id)
        else:
            await self._start_request(partition, offset, req, skip)

    def _start_early(self, partition: int, req: GenerateRequest) -> StreamState | None:
        """Submit a request before its claim answers, its outputs held; None where the
        claimed path must decide (a passed deadline, a long or failing prompt)."""
        if req.deadline is not None and req.deadline < time.time():
            return None
        if req.prompt_chars > INLINE_TOKENIZE_CHARS:
            return None
        try:
            ids = prompt_token_ids(self.tokenizer, req)
        except Exception:  # reported once the request is known to be this worker's
            return None
        st = StreamState(req, held=[])
        self._submit(partition, st, ids)
        return st

    async def _confirm(self, st: StreamState, skip_upto: int) -> None:
        """An early-started stream is this worker's: send what it held back."""
        st.skip_upto = skip_upto
        held, st.held = st.held or [], None
        self._started(st.request)
        if held:
            await self._emit(self._events(held))

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

    async def _start_request(
        self, partition: int, offset: int, req: GenerateRequest, skip_upto: int
    ) -> None:
        if req.deadline is not None and req.deadline < time.time():
            await self._fail(
                req, "deadline_exceeded", "the deadline passed before generation started"
            )
            dl = DeadLetter(
                reason="deadline_exceeded",
                detail="the deadline passed before generation started",
                topic=self.names.batches,
                partition=partition,
                offset=offset,
                key=req.request_id,
                original_b64=base64.b64encode(encode(req)).decode(),
                request_id=req.request_id,
            )
            await self.producer.send_and_wait(
                self.names.requests_dlq, encode(dl), key=req.request_id.encode()
            )
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
            await self._fail(req, "invalid_request", f"cannot tokenize the prompt: {exc}")
            return
        self._started(req)
        self._submit(partition, StreamState(req, skip_upto=skip_upto), ids)

    def _submit(self, partition: int, st: StreamState, ids: list[int]) -> None:
        """Track ``st`` as running here and hand its request to the engine."""
        req = st.request
        self.streams[req.request_id] = st
        self.partition_of[req.request_id] = partition
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

    async def _fail(self, req: GenerateRequest, code: str, message: str) -> None:
        ev = error_event(req.request_id, 0, code, message)
        await self._send([(StreamState(req), ev)])
        self.offsets.done(req.request_id)

    async def _retry_deferred(self) -> None:
        """Requests claimed by another worker: done when it finishes them, ours if its
        claim expires (it died)."""
        if not self.deferred:
            return
        rids = list(self.deferred)
        for rid, claim in zip(rids, await self._claim(rids), strict=True):
            entry = self.deferred.pop(rid, None)
            if entry is not None:  # not handed back meanwhile
                await self._resolve(*entry, claim, None)  # deferred again if not ours

    # --- output -------------------------------------------------------------------------
    async def _publish(self) -> None:
        outputs = self.runner.outputs
        while True:
            outs = await outputs.get()
            if self.runner.error is not None:
                raise RuntimeError("engine step failed") from self.runner.error
            batch = [outs]
            while not outputs.empty():  # catch up in one round trip
                batch.append(outputs.get_nowait())
            await self._emit(self._events([o for step in batch for o in step]))

    async def _emit(self, pairs: list[tuple[StreamState, TokenEvent]]) -> None:
        """Publish events; finished streams' completions go to ``_complete``."""
        await self._publish_events(pairs)
        finals = [(st, ev) for st, ev in pairs if ev.final]
        if finals:
            self._finals.put_nowait(finals)

    async def _complete(self) -> None:
        """Completions of finished requests to their Kafka reply topics; only once they
        are acknowledged may the requests' batches be committed."""
        while True:
            finals = await self._finals.get()
            got = 1
            while not self._finals.empty():  # catch up in one round trip
                finals += self._finals.get_nowait()
                got += 1
            try:
                await self._send_completions(finals)
                for _, ev in finals:
                    self.offsets.done(ev.request_id)
                await self._commit()
            finally:
                for _ in range(got):
                    self._finals.task_done()

    def _events(self, outs: list[StepOutput]) -> list[tuple[StreamState, TokenEvent]]:
        pairs = []
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
                if ev is None:  # the final event went out before a redelivery
                    self.offsets.done(out.request_id)
                    continue
            if ev is not None:
                pairs.append((state, ev))
        return pairs

    async def _send(self, pairs: list[tuple[StreamState, TokenEvent]]) -> None:
        """Events, then completions to Kafka for finished ones (waiting for the acks)."""
        await self._publish_events(pairs)
        await self._send_completions([(st, ev) for st, ev in pairs if ev.final])

    async def _publish_events(self, pairs: list[tuple[StreamState, TokenEvent]]) -> None:
        """All events of a step in one write, with done markers for finished ones."""
        if not pairs:
            return
        cmds = token_stream.event_commands(self.names, [ev for _, ev in pairs])
        done_ttl = b"%d" % self.settings.done_ttl_s
        for _, ev in pairs:
            if ev.final:
                rid = ev.request_id
                cmds.append((b"SET", self.names.done_marker(rid).encode(), b"1", b"EX", done_ttl))
                cmds.append((b"DEL", self.names.claim(rid).encode()))
        for res in await self.events_out.execute([command(*c) for c in cmds]):
            if isinstance(res, RedisReplyError):  # e.g. an event another worker logged first
                log.warning("redis: %s", res)
        for st, ev in pairs:
            self.metrics.published(st.request, ev)
            if ev.final:
                log.info("finished: %s", ev.finish_reason, extra={"request_id": ev.request_id})

    async def _send_completions(self, finals: list[tuple[StreamState, TokenEvent]]) -> None:
        sends = []
        for st, ev in finals:
            topic = st.request.reply.kafka_topic
            if topic:
                rec = encode(st.completion(ev, self.settings.worker_id))
                sends.append(await self.producer.send(topic, rec, key=ev.request_id.encode()))
        if sends:
            await asyncio.gather(*sends)

    async def _commit(self) -> None:
        offsets = self.offsets.committable()
        if offsets:
            with contextlib.suppress(Exception):  # a rebalance in flight; redelivery is safe
                await self.consumer.commit(
                    {TopicPartition(self.names.batches, p): o for p, o in offsets.items()}
                )

    # --- control ------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        """Advertise load about every second — at once (throttled) when requests finish,
        so batchers see freed capacity quickly — and keep this worker's claims alive."""
        s = self.settings
        while True:
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
            for rid in self.streams:
                pipe.pexpire(self.names.claim(rid), self._claim_ms)
            await pipe.execute()
            await self._retry_deferred()
            self.metrics.refresh(st, await self._lag())
            self._nudge.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), s.heartbeat_interval_s)
            await asyncio.sleep(HEARTBEAT_MIN_GAP_S)

    async def _prefix_summary(self) -> list[int]:
        """The KV cache's routing summary from the engine process; the previous one if the
        engine does not answer within a heartbeat."""
        with contextlib.suppress(TimeoutError):
            wait = self.settings.heartbeat_interval_s
            self._summary = await asyncio.wait_for(self.runner.kv_summary(256), wait)
        return self._summary

    async def _lag(self) -> int:
        """Batches on assigned partitions not yet fetched, plus those fetched but unfinished."""
        unfetched = 0
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            if high is not None:
                with contextlib.suppress(Exception):
                    pos = await asyncio.wait_for(self.consumer.position(tp), 0.5)
                    unfetched += max(0, high - pos)
        return unfetched + self.offsets.unfinished_batches()

    async def _cancels(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.names.cancel_channel)
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is None:
                    continue
                try:
                    cancel = decode(CancelRequest, msg["data"])
                except DecodeError:
                    continue
                if cancel.request_id in self.streams:
                    self.runner.abort(cancel.request_id)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pubsub.aclose(), SHUTDOWN_STEP_S)


def _last_seq(entries: list[Any] | None) -> int:
    """The seq of the newest replay-log entry (from XREVRANGE count=1), or -1."""
    return token_stream.seq_of(entries[0][0]) if entries else -1
