"""Messages the batcher will not serve, on their way out: a dead letter to Kafka for each,
and an error event to the sender's token stream for each whose request id is known.

Either may have to wait (Kafka or Redis away). A rejected message is done only when both
are safe; until then its offset stays uncommitted, so a crash repeats them rather than
loses them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from services.batcher.links import Gate, RedisAway, RedisLink, kafka_failed, note_kafka_error
from services.batcher.metrics import BatcherMetrics
from shared import token_stream
from shared.codec import DecodeError, decode, encode
from shared.dead_letters import dead_letter_key, dead_letter_of_record
from shared.kafka_io import RenewingProducer
from shared.messages import DeadLetter, TokenEvent, error_event
from shared.names import Names

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Rejected:
    """A message that will not be served: its dead letter (with a bounded copy of the
    message, so a backlog of large ones holds little memory), and which of its two
    notices (dead letter, error event) are out."""

    letter: DeadLetter
    dead_lettered: bool = False
    notified: bool = False

    def __post_init__(self) -> None:
        self.notified = not self.letter.request_id  # nobody to tell

    @classmethod
    def of(
        cls, msg: ConsumerRecord[Any, Any], reason: str, detail: str, rid: str | None
    ) -> Rejected:
        return cls(dead_letter_of_record(msg, reason, detail, rid))

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.letter.topic, self.letter.partition)

    @property
    def offset(self) -> int:
        return self.letter.offset

    @property
    def done(self) -> bool:
        return self.dead_lettered and self.notified


class Rejects:
    """The rejected messages not yet done, and the sends that finish them."""

    def __init__(
        self,
        producer: RenewingProducer,
        kafka: Gate,
        redis: RedisLink,
        names: Names,
        metrics: BatcherMetrics,
    ) -> None:
        self.producer = producer
        self.kafka = kafka
        self.redis = redis
        self.names = names
        self.metrics = metrics
        self.pending: list[Rejected] = []

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, rejected: list[Rejected]) -> None:
        self.pending += rejected

    def drop(self, revoked: set[TopicPartition]) -> None:
        """Forget those of partitions moving to another batcher: it reads them again."""
        self.pending = [r for r in self.pending if r.tp not in revoked]

    async def flush(self) -> list[Rejected]:
        """Send what can be sent now; returns the rejected messages now done."""
        await self._dead_letter([r for r in self.pending if not r.dead_lettered])
        await self._notify([r for r in self.pending if not r.notified])
        done = [r for r in self.pending if r.done]
        self.pending = [r for r in self.pending if not r.done]
        return done

    async def _dead_letter(self, todo: list[Rejected]) -> None:
        if not todo or not self.kafka.open():
            return
        asked_at = time.monotonic()
        acks = []
        for r in todo:
            letter = r.letter
            try:
                ack = await self.producer.send(
                    self.names.requests_dlq, encode(letter), key=dead_letter_key(letter)
                )
                acks.append((r, ack))
            except KafkaError as exc:
                self._failed(exc, r)
                break  # the rest waits for the next try
        for r, ack in acks:
            try:
                await ack
            except KafkaError as exc:
                self._failed(exc, r)
                continue
            r.dead_lettered = True
            self.kafka.answered(asked_at)
            self.metrics.dead_letters.labels(reason=r.letter.reason).inc()

    def _failed(self, exc: KafkaError, r: Rejected) -> None:
        note_kafka_error(self.metrics.kafka_errors, "dead_letter", exc, r.letter.request_id)
        kafka_failed(self.kafka, exc)

    async def _notify(self, todo: list[Rejected]) -> None:
        for r, rid in [(r, r.letter.request_id) for r in todo if r.letter.request_id]:
            event = error_event(rid, 0, r.letter.reason, r.letter.detail)
            try:
                outcome = await self.redis.call(
                    partial(publish_error, names=self.names, event=event)
                )
            except RedisAway:
                return  # all of them wait for Redis; the link logged the outage
            except redis_errors.ResponseError as exc:
                # Only an append behind another writer's fails: the request is being
                # served under the same id, so this copy's error is not the sender's.
                outcome = "conflict"
                log.warning("error event not appended: %s", exc, extra={"request_id": rid})
            self.metrics.error_events.labels(outcome=outcome).inc()
            r.notified = True


async def publish_error(client: aioredis.Redis, names: Names, event: TokenEvent) -> str:
    """Append ``event`` to its stream as the next seq; not after a final event (a
    redelivered request that was served before). Returns what happened."""
    raw = await client.xrevrange(names.token_log(event.request_id), count=1)
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], raw)
    if entries:
        entry_id, fields = entries[0]
        if _final(fields):
            return "stream_ended"
        event = event.model_copy(update={"seq": token_stream.seq_of(entry_id) + 1})
    await token_stream.publish_events(client, names, [event])
    return "published"


def _final(fields: dict[bytes, bytes]) -> bool:
    try:
        return decode(TokenEvent, fields[b"d"]).final
    except (DecodeError, KeyError):
        return False  # an entry of no known form ends nothing
