"""A plain Python producer for backend services: publish requests to Kafka, read finished
results from the completions topic (or follow a request's token stream in Redis).

With ``TW_REQUEST_SOURCE`` set, requests go to that service's own requests topic and their
replies default to its own completions topic, the one the batcher allows it and only its
Kafka user reads; without it, the shared topics.

    async with Producer(CommonSettings.from_env()) as p:
        rid = await p.submit(GenerateRequest(prompt="Hello", reply=ReplyTarget(kafka_topic=...)))
        async for c in p.completions({rid}):
            print(c.text)
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection
from types import TracebackType

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from shared.codec import DecodeError, decode, encode
from shared.kafka_io import RenewingProducer, make_consumer, ridden_out
from shared.messages import Completion, GenerateRequest
from shared.retry import backoff
from shared.settings import CommonSettings

log = logging.getLogger(__name__)

# The longest wait between two sends of a request Kafka did not take.
RETRY_CAP_S = 5.0


class Producer:
    """Publishes ``GenerateRequest`` records (keyed by request id, acks=all) and reads
    ``Completion`` records addressed to it."""

    def __init__(self, settings: CommonSettings, *, client_id: str = "tw-producer") -> None:
        self.settings = settings
        self.names = settings.names
        self._client_id = client_id
        self._producer: RenewingProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Producer:
        # Renewed when Kafka refuses it for good, as after a send that expired in an outage.
        self._producer = RenewingProducer(self.settings, client_id=self._client_id, linger_ms=5)
        await self._producer.start(wait=False)  # Kafka away at the start: the caller's to say
        # Subscribe before publishing: completions that arrive early are not missed.
        self._consumer = make_consumer(
            self.settings,
            self.replies,
            group_id=f"{self.names.producer_group(self._client_id)}-{uuid.uuid4().hex[:8]}",
            client_id=self._client_id,
            auto_offset_reset="latest",
        )
        await self._consumer.start()
        await self._consumer.seek_to_end()
        return self

    async def __aexit__(self, *exc: object | type[BaseException] | TracebackType | None) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    @property
    def topic(self) -> str:
        """Where requests go: this service's own requests topic, or the shared one."""
        source = self.settings.request_source
        return self.names.requests_from(source) if source else self.names.requests

    @property
    def replies(self) -> str:
        """Where completions come back by default (and what ``completions`` reads): this
        service's own completions topic, or the shared one."""
        source = self.settings.request_source
        return self.names.completions_to(source) if source else self.names.completions

    async def submit(self, req: GenerateRequest) -> str:
        """Publish one request (its seed fixed now) once Kafka has it durably; returns its id.
        A Kafka outage is waited out (the send is tried again with backoff, however long it
        lasts; wrap the call in a timeout to give up sooner), so a long job survives a broker
        restart. A send that expired may have reached Kafka all the same: the request then
        arrives twice under one id, and the worker generates it once (its claim, the replay
        log's final event and the done marker turn the copy away)."""
        assert self._producer is not None, "use `async with Producer(...)`"
        req = req.with_seed()
        if req.reply.kafka_topic is None:
            req = req.model_copy(
                update={"reply": req.reply.model_copy(update={"kafka_topic": self.replies})}
            )
        value, key = encode(req), req.request_id.encode()
        failures = 0
        while True:
            try:
                await self._producer.send_and_wait(self.topic, value, key=key)
            except KafkaError as exc:
                if not ridden_out(exc):
                    raise
                if failures == 0:
                    log.warning("Kafka did not take a request (%r): trying again", exc)
                await asyncio.sleep(backoff(failures, cap_s=RETRY_CAP_S))
                failures += 1
                continue
            if failures:
                log.warning("Kafka took the request after %d failed sends", failures)
            return req.request_id

    async def completions(
        self, request_ids: Collection[str] | None = None, *, timeout_s: float | None = None
    ) -> AsyncIterator[Completion]:
        """Completions of ``request_ids`` (all, if None) as they arrive; with ids, stops once
        each was seen. Raises ``TimeoutError`` after ``timeout_s`` without progress."""
        assert self._consumer is not None, "use `async with Producer(...)`"
        want = set(request_ids) if request_ids is not None else None
        last = time.monotonic()
        while want is None or want:
            batch = await self._consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for m in msgs:
                    try:
                        c = decode(Completion, m.value)
                    except DecodeError:
                        continue
                    if want is None or c.request_id in want:
                        last = time.monotonic()
                        if want is not None:
                            want.discard(c.request_id)
                        yield c
            if timeout_s is not None and time.monotonic() - last > timeout_s:
                raise TimeoutError(f"no completion in {timeout_s}s; {len(want or ())} outstanding")
