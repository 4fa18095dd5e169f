"""What Kafka and Redis hold for requests sent around the edge: Kafka-reply requests
(published with ``shared.producer.Producer``) counted on the completions topic, dead
letters, and replay logs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import replace

import redis.asyncio as aioredis

from services.chaos.accounting import Expect, Outcome, log_outcome, reply_outcome
from shared import token_stream
from shared.codec import DecodeError, decode
from shared.kafka_io import make_consumer
from shared.messages import DeadLetter, GenerateRequest, TokenEvent
from shared.names import Names
from shared.producer import Producer
from shared.retry import REDIS_DOWN
from shared.settings import CommonSettings


class KafkaReplies:
    """Requests published to the requests topic with a Kafka reply; every ``Completion``
    that comes back is counted (exactly one per request is owed)."""

    def __init__(self, settings: CommonSettings) -> None:
        self.producer = Producer(settings, client_id="tw-chaos")
        self.seen: defaultdict[str, list[str]] = defaultdict(list)  # id -> finish reasons
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KafkaReplies:
        await self.producer.__aenter__()
        self._task = asyncio.create_task(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.producer.__aexit__(*exc)

    async def _collect(self) -> None:
        async for c in self.producer.completions():
            self.seen[c.request_id].append(c.finish_reason.value)

    async def submit(self, req: GenerateRequest) -> str:
        """Publish ``req`` (its reply to the completions topic unless it names a topic)."""
        return await self.producer.submit(req)

    async def wait(self, rids: Collection[str], within_s: float, linger_s: float = 3.0) -> None:
        """Until each of ``rids`` has a Completion (or ``within_s`` passed), then
        ``linger_s`` more for a late duplicate to show."""
        deadline = time.monotonic() + within_s
        while not all(r in self.seen for r in rids) and time.monotonic() < deadline:
            if self._task is not None and self._task.done():
                self._task.result()  # the reader's failure, if it had one
            await asyncio.sleep(0.2)
        await asyncio.sleep(linger_s)

    def outcome(self, rid: str, expect: Expect = Expect.OK) -> Outcome:
        return replace(reply_outcome(self.seen.get(rid, []), expect), request_id=rid)


class DeadLetters:
    """The dead letters written from now on, by request id."""

    def __init__(self, settings: CommonSettings) -> None:
        self.topic = settings.names.requests_dlq
        self.consumer = make_consumer(settings, self.topic, group_id=None, client_id="tw-chaos")
        self.reasons: dict[str, str] = {}

    async def __aenter__(self) -> DeadLetters:
        await self.consumer.start()
        await self.consumer.seek_to_end()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def wait(self, rid: str, within_s: float) -> str | None:
        """The reason ``rid`` was dead-lettered, once its record shows (None if it did
        not within ``within_s``)."""
        deadline = time.monotonic() + within_s
        while rid not in self.reasons and time.monotonic() < deadline:
            batch = await self.consumer.getmany(timeout_ms=200)
            for msg in (m for msgs in batch.values() for m in msgs):
                try:
                    letter = decode(DeadLetter, msg.value or b"")
                except DecodeError:
                    continue  # not ours to judge: the DLQ takes what it is given
                if letter.request_id:
                    self.reasons[letter.request_id] = letter.reason
        return self.reasons.get(rid)


async def replay_log(
    client: aioredis.Redis, names: Names, rid: str, within_s: float
) -> list[TokenEvent]:
    """A request's replay log once it holds a final event, or as it is after ``within_s``
    (Redis away meanwhile is waited out)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            events = await token_stream.read_log(client, names, rid)
        except REDIS_DOWN:
            events = []
        if (events and events[-1].final) or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.25)


def log_judged(rid: str, events: list[TokenEvent], expect: Expect) -> Outcome:
    """A request judged by its replay log."""
    finish = events[-1].finish_reason if events else None
    judged = log_outcome([e.seq for e in events], finish.value if finish else None, expect)
    return replace(judged, request_id=rid)
