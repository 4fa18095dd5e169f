"""A worker's settling against a real Kafka broker: a completion whose send failed after
the broker took it (its acknowledgement lost as the broker went away) is not sent again."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError

from services.worker.config import WorkerSettings
from services.worker.events import RequestState
from services.worker.requests import Phase
from services.worker.settle import Settler
from shared.kafka_io import RenewingProducer, ensure_topics
from shared.messages import FinishReason, GenerateRequest, ReplyTarget, TokenEvent
from tests.conftest import new_prefix
from tests.integration.harness import read_topic
from tests.unit.test_worker_parts import FakeClaims, FakeConsumer, worker_context

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class AckLost:
    """A real producer whose first ``lose`` sends reach the broker and are acknowledged
    there, but fail here as an acknowledgement that never came does."""

    def __init__(self, producer: RenewingProducer, lose: int) -> None:
        self.producer, self.lose = producer, lose

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        ack = await self.producer.send(topic, value, key=key)
        if self.lose:
            self.lose -= 1
            await ack
            raise KafkaTimeoutError("no answer from the broker")
        return ack

    async def partitions_for(self, topic: str) -> set[int]:
        return await self.producer.partitions_for(topic)


async def test_a_completion_whose_acknowledgement_was_lost_is_not_sent_again(
    infra: dict[str, str],
) -> None:
    prefix = new_prefix("settle")
    topic = f"{prefix}.completions"
    settings = WorkerSettings(
        model_dir="/nonexistent", worker_id="w", kafka_bootstrap=infra["TW_KAFKA_BOOTSTRAP"]
    )
    await ensure_topics(settings, {topic: 3})
    producer = RenewingProducer(settings, client_id="settle-test")
    await producer.start()
    log: list[Any] = []
    ctx = worker_context(AckLost(producer, lose=2), FakeClaims(log), FakeConsumer(log), settings)
    ended = []
    for i in range(3):
        req = GenerateRequest(prompt=f"p{i}", reply=ReplyTarget(kafka_topic=topic))
        st = RequestState(req, 0, i, Phase.RUNNING)
        ctx.table.add(st)
        ctx.table.move(st, Phase.SETTLING)
        st.final = TokenEvent(request_id=req.request_id, seq=0, finish_reason=FinishReason.STOP)
        ctx.offsets.add(0, i, [req.request_id])
        ended.append(st)
    try:
        await Settler(ctx).settle(ended)
    finally:
        await producer.stop()
    rids = sorted(st.request_id for st in ended)
    assert ("release", "done", tuple(rids)) in log
    await asyncio.sleep(1.0)  # time for a late duplicate to show
    raw = await read_topic(infra["TW_KAFKA_BOOTSTRAP"], topic, lambda _: False, 3.0)
    assert sorted(orjson.loads(v)["request_id"] for v in raw) == rids
