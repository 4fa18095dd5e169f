"""Test helpers over real Kafka and Redis: service processes (the benchmarks' own, from
services.bench.cluster), a recorder of every token event as clients receive them that
checks each stream's events, and topic read/write helpers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from services.bench import cluster
from services.bench.cluster import Stack, free_port
from shared.messages import Completion, TokenEvent
from tests.conftest import ROOT


class StreamRecorder(cluster.StreamRecorder):
    """The benchmarks' recorder, with the client's view of a stream checked."""

    async def __aenter__(self) -> StreamRecorder:
        await super().__aenter__()
        return self

    def stream(self, request_id: str) -> list[TokenEvent]:
        """The client's view: events by seq. Asserts that every duplicate delivery is
        identical and that seqs are contiguous from 0 up to one final event."""
        by_seq: dict[int, TokenEvent] = {}
        for ev in self.raw.get(request_id, []):
            if ev.seq in by_seq:
                assert by_seq[ev.seq] == ev, (
                    f"{request_id}: seq {ev.seq} delivered with different content"
                )
            by_seq[ev.seq] = ev
        seqs = sorted(by_seq)
        assert seqs == list(range(len(seqs))), f"{request_id}: gap in {seqs}"
        events = [by_seq[s] for s in seqs]
        assert [e.final for e in events].count(True) == 1 and events[-1].final, request_id
        return events


def make_stack(prefix: str, infra: dict[str, str], model_dir: str, log_dir: Path) -> Stack:
    """The benchmarks' stack (its edges know the key of ``auth_headers``), with edges
    that serve anonymous calls: the pipeline and fault tests call without a key. Tests of
    keys start their edges with ``TW_AUTH=required`` (the default outside the demo)."""
    stack = cluster.make_stack(prefix, infra, model_dir, log_dir)
    stack.env["TW_AUTH"] = "off"
    return stack


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


async def completions(st: Stack, want: set[str], within_s: float) -> list[Completion]:
    """Every Completion on the stack's completions topic once all of ``want`` have one,
    after a pause that leaves a late duplicate time to show."""
    boot, topic = st.env["TW_KAFKA_BOOTSTRAP"], st.names.completions

    def complete(values: list[bytes]) -> bool:
        return want <= {orjson.loads(v)["request_id"] for v in values}

    await read_topic(boot, topic, complete, within_s)
    await asyncio.sleep(1.0)
    raw = await read_topic(boot, topic, lambda _: False, 3.0)
    return [Completion.model_validate_json(v) for v in raw]


__all__ = [
    "ROOT",
    "Stack",
    "StreamRecorder",
    "completions",
    "free_port",
    "make_stack",
    "produce",
    "read_topic",
]


async def dashboard_status(edge_url: str) -> dict[str, Any] | None:
    """The first status snapshot the edge's dashboard stream sends (None if it ends first)."""
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("GET", edge_url + "/dashboard/events") as r,
    ):
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and "status" in (event := orjson.loads(line[6:])):
                status: dict[str, Any] = event["status"]
                return status
    return None
