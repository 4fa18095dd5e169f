"""Test helpers over real Kafka and Redis: service processes (from services.bench.cluster),
a recorder of every token event as clients receive them, and topic read/write helpers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from services.bench.cluster import ROOT, Stack, StreamRecorder, free_port, make_stack


async def produce(
    bootstrap: str, topic: str, values: list[bytes], keys: list[bytes] | None = None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futs = [
            await producer.send(topic, v, key=keys[i] if keys else None)
            for i, v in enumerate(values)
        ]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str, topic: str, until: Callable[[list[bytes]], bool], within_s: float
) -> list[bytes]:
    """Values of a topic from the start, until ``until(values)`` holds or time runs out."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + within_s
        while not until(values) and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=300)).values():
                values += [m.value for m in msgs]
    finally:
        await consumer.stop()
    return values


__all__ = ["ROOT", "Stack", "StreamRecorder", "free_port", "make_stack", "produce", "read_topic"]
