"""The batcher service: a consumer group on the requests topic.

Each loop: fetch what has arrived, send bad messages to the dead-letter topic, add valid
requests to the open batch, and dispatch it to a worker partition when the window policy
says so. Input offsets are committed only after the batch (or dead letter) is acknowledged
by Kafka (acks=all), so a crash redelivers rather than loses.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from services.batcher.config import BatcherSettings
from services.batcher.routing import pick_partition, pick_worker
from services.batcher.window import WindowPolicy
from shared import token_stream
from shared.codec import DecodeError, decode, encode
from shared.kafka_io import make_consumer, make_producer
from shared.messages import Batch, DeadLetter, GenerateRequest, WorkerHeartbeat, error_event
from shared.names import Names

log = logging.getLogger(__name__)


class BatcherService:
    def __init__(self, settings: BatcherSettings) -> None:
        self.settings = settings
        self.names: Names = settings.names
        self.policy = WindowPolicy(
            settings.window_min_ms, settings.window_max_ms, settings.max_batch_requests
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_url(settings.redis_url)
        self.producer: AIOKafkaProducer = make_producer(settings, client_id=settings.batcher_id)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings,
            self.names.requests,
            group_id=self.names.batcher_group,
            client_id=settings.batcher_id,
        )
        self.pending: list[tuple[TopicPartition, int, GenerateRequest]] = []
        self.opened_at = 0.0
        self._consumed: dict[TopicPartition, int] = {}  # offset after the last one read
        self._committed: dict[TopicPartition, int] = {}
        self._workers: list[WorkerHeartbeat] = []
        self._workers_at = 0.0
        self._stopping = asyncio.Event()
        self.batches_sent = 0
        self.dead_letters = 0

    async def run(self) -> None:
        await self.producer.start()
        await self.consumer.start()
        try:
            while not self._stopping.is_set():
                await self._tick()
            if self.pending:
                await self._dispatch()
        finally:
            await self.consumer.stop()
            await self.producer.stop()
            await self.redis.aclose()

    def stop(self) -> None:
        self._stopping.set()

    async def _tick(self) -> None:
        wait_ms = 50 if not self.pending else 5
        records = await self.consumer.getmany(timeout_ms=wait_ms, max_records=256)
        now = time.time()
        dead: list[tuple[ConsumerRecord[Any, Any], DecodeError]] = []
        for tp, msgs in records.items():
            for msg in msgs:
                req = self._parse(msg)
                if isinstance(req, DecodeError):
                    dead.append((msg, req))
                else:
                    if not self.pending:
                        self.opened_at = now
                    self.pending.append((tp, msg.offset, req))
                self._consumed[tp] = msg.offset + 1
        if dead:
            await self._dead_letter(dead)
        workers = await self._load_workers()
        target = pick_worker(workers, len(self.pending))
        free = target.free_slots if target else None
        if self.policy.should_dispatch(len(self.pending), self.opened_at, time.time(), free):
            await self._dispatch(target)
        elif dead:
            await self._commit()

    def _parse(self, msg: ConsumerRecord[Any, Any]) -> GenerateRequest | DecodeError:
        """The request with its seed fixed at ingestion, or why it is not one."""
        try:
            return decode(GenerateRequest, msg.value or b"").with_seed()
        except DecodeError as exc:
            return exc

    async def _dead_letter(self, dead: list[tuple[ConsumerRecord[Any, Any], DecodeError]]) -> None:
        """Each bad message goes to the DLQ with its bytes, reason and origin; where a
        request id and reply channel can be read, the sender also gets an error event."""
        sends = []
        notify = []
        for msg, err in dead:
            rid = _salvage_request_id(msg.value)
            dl = DeadLetter(
                reason=err.reason,
                detail=err.detail,
                topic=msg.topic,
                partition=msg.partition,
                offset=msg.offset,
                key=msg.key.decode("utf-8", "replace") if msg.key else None,
                original_b64=base64.b64encode(msg.value or b"").decode(),
                request_id=rid,
            )
            sends.append(await self.producer.send(self.names.requests_dlq, encode(dl), key=msg.key))
            if rid is not None:
                notify.append(error_event(rid, 0, err.reason, err.detail))
        await asyncio.gather(*sends)
        self.dead_letters += len(dead)
        if notify:
            await token_stream.publish_events(self.redis, self.names, notify)

    async def _load_workers(self) -> list[WorkerHeartbeat]:
        now = time.time()
        if (now - self._workers_at) * 1000 < self.settings.heartbeat_refresh_ms:
            return self._workers
        self._workers_at = now
        keys = [
            k
            async for k in self.redis.scan_iter(match=self.names.heartbeat_prefix + "*", count=100)
        ]
        raw = await self.redis.mget(keys) if keys else []
        workers = []
        for data in raw:
            if data:
                try:
                    workers.append(decode(WorkerHeartbeat, data))
                except DecodeError:
                    continue
        self._workers = workers
        return workers

    async def _dispatch(self, target: WorkerHeartbeat | None = None) -> None:
        cap = self.policy.max_requests
        taken, self.pending = self.pending[:cap], self.pending[cap:]
        self.opened_at = time.time()  # what is left opens the next window
        reqs = [req for _, _, req in taken]
        batch = Batch(batcher_id=self.settings.batcher_id, requests=reqs)
        num = len(await self.producer.partitions_for(self.names.batches))
        partition = pick_partition(target, batch.batch_id, num)
        fut = await self.producer.send(self.names.batches, encode(batch), partition=partition)
        await fut
        if target is not None:
            target.free_slots -= len(reqs)  # until its next heartbeat says otherwise
        self.batches_sent += 1
        await self._commit()

    async def _commit(self) -> None:
        """Commit, per partition, up to the first record not yet safely handed off."""
        floor: dict[TopicPartition, int] = {}
        for tp, off, _ in self.pending:
            floor[tp] = min(floor.get(tp, off), off)
        offsets = {tp: floor.get(tp, nxt) for tp, nxt in self._consumed.items()}
        changed = {tp: o for tp, o in offsets.items() if self._committed.get(tp) != o}
        if changed:
            await self.consumer.commit(changed)
            self._committed.update(changed)


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
