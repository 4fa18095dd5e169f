"""What the batcher and the workers share about their Kafka consumers: backpressure (pause
and resume of every assigned partition) and the rebalance listener."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiokafka import TopicPartition

from shared.consumer_flow import Backpressure, Rebalance

pytestmark = pytest.mark.timeout(30)

PARTS = [TopicPartition("t", 0), TopicPartition("t", 1)]


class FakeConsumer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(PARTS)

    def pause(self, *parts: TopicPartition) -> None:
        self.calls.append(("pause", sorted(parts)))

    def resume(self, *parts: TopicPartition) -> None:
        self.calls.append(("resume", sorted(parts)))


def test_backpressure_pauses_every_partition_once_and_resumes_when_there_is_room() -> None:
    consumer = FakeConsumer()
    bp = Backpressure(cast(Any, consumer))
    assert not bp.apply(full=False, room=True) and not bp.paused
    assert bp.apply(full=True, room=False) and bp.paused
    assert not bp.apply(full=True, room=False)  # already paused: no second call
    assert not bp.apply(full=False, room=False)  # below full, not yet down to room
    assert bp.apply(full=False, room=True) and not bp.paused
    assert consumer.calls == [("pause", PARTS), ("resume", PARTS)]


def test_backpressure_without_hysteresis_follows_full() -> None:
    consumer = FakeConsumer()
    bp = Backpressure(cast(Any, consumer))
    for full in (True, True, False, False, True):
        bp.apply(full=full, room=not full)
        assert bp.paused is full
    assert [c for c, _ in consumer.calls] == ["pause", "resume", "pause"]


async def test_rebalance_hands_partition_moves_to_the_service() -> None:
    revoked: list[list[TopicPartition]] = []
    assigned: list[list[TopicPartition]] = []

    async def on_revoked(parts: list[TopicPartition]) -> None:
        revoked.append(parts)

    listener = Rebalance(on_revoked, assigned.append)
    await listener.on_partitions_revoked(PARTS[:1])
    await listener.on_partitions_assigned(PARTS)
    assert (revoked, assigned) == ([PARTS[:1]], [PARTS])
    await Rebalance(on_revoked).on_partitions_assigned(PARTS)  # no assigned callback: fine
    assert assigned == [PARTS]
