"""Kafka connection helpers: one configuration of producers, consumers and topics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from shared.settings import CommonSettings

log = logging.getLogger(__name__)

# One limit for every message on the bus, set everywhere from here: the broker's
# message.max.bytes (infra/kafka.sh reads this line, so it stays a plain product), each
# topic's max.message.bytes (ensure_topics), the producers' request size and the
# consumers' fetch sizes. 4 MiB holds the largest prompt the schema admits (4,000,000
# characters) in ASCII with the rest of its request around it.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# What Kafka adds around a value (batch and record headers, a short key): a value of at
# most MAX_VALUE_BYTES always fits in one message.
RECORD_OVERHEAD_BYTES = 4096
MAX_VALUE_BYTES = MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES


def make_producer(
    settings: CommonSettings,
    *,
    client_id: str,
    linger_ms: int = 2,
    request_timeout_ms: int = 30_000,
) -> AIOKafkaProducer:
    """An idempotent producer that waits for every in-sync replica (acks=all): a send that
    returns is durable, so callers may commit their input offsets after it. A send not
    acknowledged within ``request_timeout_ms`` fails with ``KafkaTimeoutError``."""
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=linger_ms,
        max_request_size=MAX_MESSAGE_BYTES,
        request_timeout_ms=request_timeout_ms,
    )


def make_consumer(
    settings: CommonSettings,
    *topics: str,
    group_id: str | None,
    client_id: str,
    session_timeout_ms: int = 10_000,
    **extra: object,
) -> AIOKafkaConsumer:
    """A consumer with manual commits: offsets are committed only after the work is safe."""
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=group_id,
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(100, session_timeout_ms // 3),
        max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        **extra,
    )


async def ensure_topics(
    settings: CommonSettings, partitions: Mapping[str, int], *, retries: int = 30
) -> list[str]:
    """Create the given topics (name → partition count) if missing; returns those created.
    Each takes messages up to MAX_MESSAGE_BYTES, whatever the broker's default.

    Retries while the broker is still starting, so it can run right after the broker's
    port opens."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, client_id="tw-admin")
    for attempt in range(retries):
        try:
            await admin.start()
            break
        except KafkaConnectionError:
            if attempt == retries - 1:
                raise
            await asyncio.sleep(1.0)
    created = []
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(
                name=t,
                num_partitions=n,
                replication_factor=1,
                topic_configs={"max.message.bytes": str(MAX_MESSAGE_BYTES)},
            )
            for t, n in partitions.items()
            if t not in existing
        ]
        for topic in missing:
            try:
                await admin.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()
    return created
