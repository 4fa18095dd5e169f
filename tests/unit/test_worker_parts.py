"""The worker's per-request state machine on plain data, and the order in which ended
requests are settled, with hand-written fakes of Kafka and of the claims."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka.errors import (
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
)
from aiokafka.structs import TopicPartition

from services.worker.config import WorkerSettings
from services.worker.context import WorkerContext
from services.worker.control import Heartbeat, heartbeat_of
from services.worker.engine.request import Status
from services.worker.engine.wire import EngineStats, StepOutput
from services.worker.events import RequestState
from services.worker.metrics import WorkerMetrics
from services.worker.output import Output
from services.worker.requests import IllegalTransition, Phase, RequestTable
from services.worker.settle import Settler
from shared.messages import GenerateRequest, ReplyTarget, error_event
from shared.prefix_hash import AFFINITY_DEPTH
from shared.retry import Dependency

pytestmark = pytest.mark.timeout(30)


@dataclass
class Item:
    request_id: str
    phase: Phase
    partition: int = 0


def test_phases_change_only_along_their_transitions() -> None:
    table: RequestTable[Item] = RequestTable()
    a = Item("a", Phase.CLAIMING)
    table.add(a)
    with pytest.raises(IllegalTransition):
        table.add(Item("a", Phase.DEFERRED))  # one state per request
    with pytest.raises(IllegalTransition):
        table.move(a, Phase.SETTLING)  # held outputs are released first
    table.move(a, Phase.RUNNING)
    assert table.engine_count == 1
    table.move(a, Phase.DEFERRED)  # its claim was taken elsewhere
    assert table.engine_count == 0
    table.move(a, Phase.CLAIMED)  # that worker died: ours now
    table.move(a, Phase.SETTLING)  # e.g. cancelled meanwhile
    with pytest.raises(IllegalTransition):
        table.move(a, Phase.RUNNING)  # an ended request never runs again
    stranger = Item("a", Phase.SETTLING)
    assert not table.drop(stranger) and "a" in table  # only the held state itself
    assert table.drop(a) and "a" not in table and len(table) == 0


class Runner:
    """What the engine was asked to abort."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def test_the_outputs_of_a_handed_back_run_never_reach_the_next_run_of_its_request() -> None:
    """A request handed back while running (a rebalance) and delivered here again runs
    anew; the old run's last token and its abort, still on their way from the engine,
    are dropped: the new run is neither cut short as cancelled nor given a stale token."""
    ctx = worker_context(None, None, None)
    ctx.runner = Runner()  # type: ignore[assignment]
    req = GenerateRequest(prompt="The list")
    rid = req.request_id
    first = RequestState(req, 0, 0)
    ctx.table.add(first)
    ctx.table.drop(first)
    ctx.retire(first)
    again = RequestState(req, 0, 1, skip_upto=-1)
    ctx.table.add(again)
    outs = [
        StepOutput(rid, [5], "a"),  # the handed-back run's last step
        StepOutput(rid, [], "", Status.FINISHED_ABORTED),  # its abort
        StepOutput(rid, [7], "b"),  # the new run
    ]
    pairs, ended = Output(ctx).events(outs)
    assert ctx.runner.aborted == [rid]  # type: ignore[attr-defined]
    assert [(st, ev.seq, ev.token_ids) for st, ev in pairs] == [(again, 0, [7])]
    assert ended == [] and again.phase is Phase.RUNNING
    [(_, final)] = Output(ctx).events([StepOutput(rid, [9], "c", Status.FINISHED_LENGTH)])[0]
    assert final.final and final.seq == 1 and final.token_ids == [9]
    assert not ctx.retired
    # A run that ended while its claim was being taken has no output to come.
    held = RequestState(req, 0, 2, phase=Phase.CLAIMING)
    held.held.append(StepOutput(rid, [], "", Status.FINISHED_LENGTH))
    ctx.retire(held)
    assert not ctx.retired


def worker_context(
    producer: Any, claims: Any, consumer: Any, settings: WorkerSettings | None = None
) -> WorkerContext:
    """A worker's context with no engine, Redis or publisher: what settling needs."""
    settings = settings or WorkerSettings(model_dir="/nonexistent", worker_id="w")
    metrics = WorkerMetrics(settings.worker_id)
    return WorkerContext(
        settings=settings,
        runner=None,  # type: ignore[arg-type]
        tokenizer=None,
        metrics=metrics,
        redis_dep=Dependency("redis", logging.getLogger("test")),
        kafka_dep=Dependency("kafka", logging.getLogger("test")),
        redis=None,  # type: ignore[arg-type]
        publisher=None,  # type: ignore[arg-type]
        claims=claims,
        producer=producer,
        kafka_probe=None,  # type: ignore[arg-type]
        consumer=consumer,
    )


class FakeProducer:
    """Kafka refusing the first ``down`` sends of each kind with ``error`` (by default as a
    broker that went away would)."""

    def __init__(
        self, log: list[Any], down: int = 0, error: type[KafkaError] = KafkaConnectionError
    ) -> None:
        self.log, self.error = log, error
        self.down = {"completion": down, "dead_letter": down}

    def _refuse(self, kind: str) -> None:
        if self.down[kind]:
            self.down[kind] -= 1
            raise self.error("refused")

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        self._refuse("completion")
        self.log.append(("completion", topic))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._refuse("dead_letter")
        self.log.append(("dead_letter", topic))


class SearchedSettler(Settler):
    """A settler whose search of a reply topic reads the fake producer's log."""

    def __init__(self, ctx: WorkerContext, log: list[Any]) -> None:
        super().__init__(ctx)
        self.log = log

    async def _on_reply_topic(self, st: RequestState) -> bool:
        self.log.append(("searched", st.request.reply.kafka_topic))
        return ("completion", st.request.reply.kafka_topic) in self.log


class FakeClaims:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    async def release(self, rids: list[str], how: str, *, done_ttl_s: int = 0) -> None:
        self.log.append(("release", how, tuple(sorted(rids))))


class FakeConsumer:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.log.append(("commit", sorted(o for o in offsets.values())))


@pytest.mark.parametrize(
    "refusal",
    [KafkaConnectionError, OutOfOrderSequenceNumber, NotLeaderForPartitionError],
    ids=["broker-away", "producer-refused-for-good", "leader-moved"],
)
async def test_done_markers_wait_for_completions_and_dead_letters_through_kafka_refusals(
    refusal: type[KafkaError],
) -> None:
    """A send Kafka refuses for now (broker away, leader moving, or a producer refused
    for good, which is replaced) is tried again: never dead-lettered as undeliverable,
    never settled before it is acknowledged."""
    log: list[Any] = []
    ctx = worker_context(
        FakeProducer(log, down=2, error=refusal), FakeClaims(log), FakeConsumer(log)
    )
    ok = RequestState(
        GenerateRequest(prompt="p", reply=ReplyTarget(kafka_topic="out")), 0, 7, Phase.RUNNING
    )
    bad = RequestState(GenerateRequest(prompt="q"), 0, 7, Phase.RUNNING)
    for st in (ok, bad):
        ctx.table.add(st)
        ctx.table.move(st, Phase.SETTLING)
    ok.final = error_event(ok.request_id, 3, "x", "y").model_copy(
        update={"error": None, "finish_reason": "stop"}
    )
    bad.final = error_event(bad.request_id, 0, "engine_error", "boom")
    ctx.offsets.add(0, 7, [ok.request_id, bad.request_id])
    await SearchedSettler(ctx, log).settle([ok, bad])
    assert log == [
        ("searched", "out"),  # after the first refused try: not there
        ("searched", "out"),  # likewise after the second
        ("completion", "out"),
        ("dead_letter", ctx.names.requests_dlq),  # likewise
        ("release", "done", tuple(sorted([ok.request_id, bad.request_id]))),
        ("commit", [8]),
    ]
    assert len(ctx.table) == 0
    assert not ctx.kafka_dep.down_since  # the outage was recorded and is over


def test_the_heartbeat_says_how_its_prefix_hashes_were_cut() -> None:
    settings = WorkerSettings(model_dir="/m", worker_id="w", block_size=32, max_running=8)
    stats = EngineStats(running=2, waiting=1, kv_blocks=10, kv_used_blocks=4, block_size=32)
    hb = heartbeat_of(settings, stats, [0, 2], [7, 8])
    assert (hb.block_size, hb.affinity_depth) == (32, AFFINITY_DEPTH)
    assert (hb.worker_id, hb.partitions, hb.prefix_hashes) == ("w", [0, 2], [7, 8])
    assert (hb.free_slots, hb.free_kv_tokens, hb.kv_used_tokens) == (5, 6 * 32, 4 * 32)


def test_an_answer_to_a_call_made_before_an_outage_was_found_does_not_end_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker shutting down answers a send already in flight just after a probe found it
    gone: that answer says nothing about now. Only a call made since ends the outage, so
    the outage is logged once when it starts and once when it ends."""
    dep = Dependency("kafka", logging.getLogger("test.dependency"))
    asked = time.monotonic()
    with caplog.at_level(logging.INFO, logger="test.dependency"):
        dep.failed(ConnectionError("no leader"))
        dep.answered(asked_at=asked)
        assert not dep.up
        dep.failed(ConnectionError("gone"))
        dep.answered(asked_at=time.monotonic())
        assert dep.up
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "unreachable" in lines[0] and "is back" in lines[1], lines


class RebalancedConsumer:
    """A consumer whose group takes a partition away while its position is being asked
    for, as a rebalance does; ``highwater`` and ``position`` refuse an unassigned
    partition as aiokafka's do (an assertion and IllegalStateError)."""

    def __init__(self) -> None:
        self.assigned = {TopicPartition("t", 0), TopicPartition("t", 1)}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def highwater(self, tp: TopicPartition) -> int:
        assert tp in self.assigned, "Partition is not assigned"
        return 10

    async def position(self, tp: TopicPartition) -> int:
        if tp not in self.assigned:
            raise IllegalStateError(f"Partition {tp} is not assigned")
        self.assigned = {tp}  # the other partition goes to another worker meanwhile
        await asyncio.sleep(0)
        return 4


async def test_the_lag_read_during_a_rebalance_skips_the_partitions_taken_away() -> None:
    consumer = RebalancedConsumer()
    ctx = worker_context(None, None, consumer)
    beat = Heartbeat(ctx, None)  # type: ignore[arg-type]
    assert await beat._lag() == 10 - 4  # the partition still assigned, counted once
