"""The worker service: Kafka batches in, engine steps on a thread, token events out to Redis.

One loop per concern: ``_consume`` feeds the engine from the batches topic, ``_publish``
sends each step's events for all sequences in one Redis pipeline and commits finished
batches, ``_heartbeat`` advertises load, ``_cancels`` aborts cancelled requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from services.worker.config import WorkerSettings
from services.worker.engine.engine import Engine, EngineRequest, StepOutput
from services.worker.engine.sampler import SamplingConfig
from services.worker.events import StreamState
from services.worker.offsets import OffsetTracker
from services.worker.prompts import prompt_token_ids
from services.worker.runtime import EngineThread
from shared import token_stream
from shared.codec import DecodeError, decode, encode
from shared.kafka_io import make_consumer, make_producer
from shared.messages import (
    Batch,
    CancelRequest,
    GenerateRequest,
    Priority,
    TokenEvent,
    WorkerHeartbeat,
    error_event,
)

log = logging.getLogger(__name__)


class WorkerService:
    """A decode worker in the ``tw.batches`` consumer group."""

    def __init__(self, settings: WorkerSettings, engine: Engine, tokenizer: Any) -> None:
        self.settings = settings
        self.names = settings.names
        self.engine = engine
        self.tokenizer = tokenizer
        self.redis: aioredis.Redis = aioredis.Redis.from_url(settings.redis_url)
        self.producer: AIOKafkaProducer = make_producer(settings, client_id=settings.worker_id)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings,
            self.names.batches,
            group_id=self.names.worker_group,
            client_id=settings.worker_id,
        )
        self.offsets = OffsetTracker()
        self.streams: dict[str, StreamState] = {}
        self._stopping = asyncio.Event()
        self._paused = False
        self.thread: EngineThread | None = None

    async def run(self) -> None:
        """Serve until ``stop()``; then stop taking work and shut down cleanly."""
        self.thread = EngineThread(self.engine, asyncio.get_running_loop())
        self.thread.start()
        await self.producer.start()
        await self.consumer.start()
        tasks = [
            asyncio.create_task(self._consume(), name="consume"),
            asyncio.create_task(self._publish(), name="publish"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._cancels(), name="cancels"),
        ]
        stop = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop and t.exception():
                    raise t.exception()  # type: ignore[misc]
        finally:
            for t in [*tasks, stop]:
                t.cancel()
            await asyncio.gather(*tasks, stop, return_exceptions=True)
            self.thread.stop()
            await self._commit()
            await self.consumer.stop()
            await self.producer.stop()
            await self.redis.delete(self.names.heartbeat(self.settings.worker_id))
            await self.redis.aclose()

    def stop(self) -> None:
        self._stopping.set()

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
        full = self.engine.stats.waiting >= self.settings.max_waiting
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
        todo = []
        for req in batch.requests:
            if await self.redis.exists(self.names.done_marker(req.request_id)):
                continue  # finished before a crash: never generated twice
            todo.append(req)
        self.offsets.add(tp.partition, msg.offset, [r.request_id for r in todo])
        for req in todo:
            await self._start_request(req)

    async def _start_request(self, req: GenerateRequest) -> None:
        now = time.time()
        if req.deadline is not None and req.deadline < now:
            await self._fail(
                req, "deadline_exceeded", "the request's deadline passed before it started"
            )
            return
        try:
            ids = await asyncio.to_thread(prompt_token_ids, self.tokenizer, req)
        except Exception as exc:  # a template or tokenizer error is the request's problem
            await self._fail(req, "invalid_request", f"cannot tokenize the prompt: {exc}")
            return
        skip = await token_stream.last_published_seq(self.redis, self.names, req.request_id)
        self.streams[req.request_id] = StreamState(req, skip_upto=skip)
        sp = req.sampling
        assert self.thread is not None
        self.thread.submit(
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
        state = StreamState(req)
        ev = error_event(req.request_id, 0, code, message)
        await self._send([(state, ev)])
        self.offsets.done(req.request_id)

    # --- output -------------------------------------------------------------------------
    async def _publish(self) -> None:
        assert self.thread is not None
        while True:
            outs = await self.thread.outputs.get()
            if self.thread.error is not None:
                raise RuntimeError("engine thread failed") from self.thread.error
            batch = [outs]
            while not self.thread.outputs.empty():  # catch up in one round trip
                batch.append(self.thread.outputs.get_nowait())
            await self._send(self._events([o for step in batch for o in step]))
            await self._commit()

    def _events(self, outs: list[StepOutput]) -> list[tuple[StreamState, TokenEvent]]:
        pairs = []
        for out in outs:
            state = self.streams.get(out.request_id)
            if state is None:
                continue
            ev = state.event(out)
            if out.finish is not None:
                del self.streams[out.request_id]
                self.offsets.done(out.request_id)
                if ev is None:  # the final event went out before a redelivery
                    continue
            if ev is not None:
                pairs.append((state, ev))
        return pairs

    async def _send(self, pairs: list[tuple[StreamState, TokenEvent]]) -> None:
        """All events of a step in one pipeline; completions to Kafka for finished ones."""
        if not pairs:
            return
        pipe = self.redis.pipeline(transaction=False)
        token_stream.queue_events(pipe, self.names, [ev for _, ev in pairs])
        finals = [(st, ev) for st, ev in pairs if ev.final]
        for _, ev in finals:
            pipe.set(self.names.done_marker(ev.request_id), b"1", ex=self.settings.done_ttl_s)
        await pipe.execute()
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
        s = self.settings
        while True:
            st = self.engine.stats
            hb = WorkerHeartbeat(
                worker_id=s.worker_id,
                partitions=sorted(tp.partition for tp in self.consumer.assignment()),
                free_slots=max(0, s.max_running - st.running - st.waiting),
                free_kv_tokens=st.free_kv_tokens,
                running=st.running,
                waiting=st.waiting,
                kv_used_tokens=st.kv_used_blocks * st.block_size,
                prefix_hashes=self.engine.kv.hottest_hashes(64),
            )
            await self.redis.set(
                self.names.heartbeat(s.worker_id), encode(hb), px=int(s.heartbeat_ttl_s * 1000)
            )
            await asyncio.sleep(s.heartbeat_interval_s)

    async def _cancels(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.names.cancel_channel)
        try:
            async for msg in pubsub.listen():
                if msg["type"] != "message":
                    continue
                try:
                    cancel = decode(CancelRequest, msg["data"])
                except DecodeError:
                    continue
                if cancel.request_id in self.streams and self.thread is not None:
                    self.thread.abort(cancel.request_id)
        finally:
            await pubsub.aclose()
