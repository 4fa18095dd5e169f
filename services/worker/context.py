"""What every part of a worker shares: its settings, its clients, its dependencies' state
and the one table of the requests it holds. Built once by ``WorkerService``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from services.worker.claims import Claims
from services.worker.config import WorkerSettings
from services.worker.engine.wire import StepOutput
from services.worker.events import RequestState
from services.worker.metrics import WorkerMetrics
from services.worker.offsets import OffsetTracker
from services.worker.publisher import EventPublisher
from services.worker.requests import RequestTable
from services.worker.runtime import EngineProcess
from shared.codec import encode
from shared.dead_letters import dead_letter_key
from shared.kafka_io import (
    REFUSED_FOR_GOOD,
    KafkaProbe,
    RenewingProducer,
    make_consumer,
    ridden_out,
)
from shared.messages import DeadLetter
from shared.model_config import SamplingDefaults
from shared.names import Names
from shared.retry import Dependency

log = logging.getLogger("services.worker.service")


@dataclass
class WorkerContext:
    """The worker's shared state. ``table`` holds every request the worker has taken and
    not yet settled, handed back or left to another worker."""

    settings: WorkerSettings
    runner: EngineProcess
    tokenizer: Any
    metrics: WorkerMetrics
    redis_dep: Dependency
    kafka_dep: Dependency
    redis: aioredis.Redis
    publisher: EventPublisher
    claims: Claims
    producer: RenewingProducer
    kafka_probe: KafkaProbe
    consumer: AIOKafkaConsumer
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    offsets: OffsetTracker = field(default_factory=OffsetTracker)
    table: RequestTable[RequestState] = field(default_factory=RequestTable[RequestState])
    assigned_at: dict[int, float] = field(default_factory=dict)  # partition → when assigned
    nudge: asyncio.Event = field(default_factory=asyncio.Event)  # capacity freed: beat now
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # nothing in the engine
    finals: asyncio.Queue[list[RequestState]] = field(default_factory=asyncio.Queue)
    # Engine runs aborted after their request left the table (handed back, withdrawn,
    # lost), by request id: their outputs still come, up to one final output each, and
    # must not be taken for those of a later run of the same request here.
    retired: Counter[str] = field(default_factory=Counter)

    @property
    def names(self) -> Names:
        return self.settings.names

    @classmethod
    def build(
        cls, settings: WorkerSettings, runner: EngineProcess, tokenizer: Any
    ) -> WorkerContext:
        metrics = WorkerMetrics(settings.worker_id)
        redis_dep = Dependency("redis", log, metrics.deps)
        kafka_dep = Dependency("kafka", log, metrics.deps)
        wid = settings.worker_id
        names = settings.names
        producer = RenewingProducer(settings, client_id=wid)
        defaults = SamplingDefaults.of_folder(settings.model_dir)
        if defaults.unapplied:
            log.warning(
                "the model's generation_config.json states %s: not implemented, not applied",
                ", ".join(defaults.unapplied),
            )
        return cls(
            settings=settings,
            runner=runner,
            tokenizer=tokenizer,
            metrics=metrics,
            redis_dep=redis_dep,
            kafka_dep=kafka_dep,
            redis=settings.redis.client(),
            # Token events (nearly all of this worker's Redis traffic) and the claims bypass
            # redis-py, each on a connection of its own.
            publisher=EventPublisher(
                settings.redis, settings.names, name=f"tw-worker-{wid}", redis=redis_dep
            ),
            claims=Claims(settings.redis, settings.names, wid, settings.claim_ttl_s),
            producer=producer,
            # Completions go to each request's reply topic; these two are always written.
            kafka_probe=KafkaProbe(producer, [names.requests_dlq, names.completions], kafka_dep),
            consumer=make_consumer(
                settings,
                group_id=settings.names.worker_group,
                client_id=wid,
                session_timeout_ms=settings.session_timeout_ms,
            ),
            sampling_defaults=defaults,
        )

    def retire(self, st: RequestState) -> None:
        """Abort ``st``'s run in the engine: it is no longer this state's (the caller has
        dropped or deferred it), so what the run still outputs is ``stale``; unless its
        final output came already (held while its claim was being taken)."""
        if not any(out.finish is not None for out in st.held):
            self.retired[st.request_id] += 1
        self.runner.abort(st.request_id)
        self.left_engine(st)

    def stale(self, out: StepOutput) -> bool:
        """Whether ``out`` comes from a retired run. The engine ends every run with one
        final output (finished, failed or aborted) and takes a new run of a request only
        after the abort of the old one, so a retired run's outputs come first."""
        rid = out.request_id
        if not self.retired[rid]:
            return False
        if out.finish is not None:
            self.retired[rid] -= 1
            if not self.retired[rid]:
                del self.retired[rid]
        return True

    def left_engine(self, st: RequestState) -> None:
        """``st`` no longer runs here (finished, withdrawn, handed back or lost)."""
        self.nudge.set()
        if self.table.engine_count == 0:
            self.idle.set()

    async def send_dead_letter(self, letter: DeadLetter) -> None:
        """Write a dead letter, waiting out a Kafka outage (and a producer renewal)."""
        data, key = encode(letter), dead_letter_key(letter)
        while True:
            asked_at = time.monotonic()
            try:
                await self.producer.send_and_wait(self.names.requests_dlq, data, key=key)
            except KafkaError as exc:
                if not ridden_out(exc):
                    raise
                await asyncio.sleep(self.kafka_failed(exc))
                continue
            self.kafka_dep.answered(asked_at)
            return

    def kafka_failed(self, exc: KafkaError) -> float:
        """Record a failed send to be tried again; returns how long to wait. A producer
        refused for good is being replaced: Kafka itself answered, so it is not away."""
        if isinstance(exc, REFUSED_FOR_GOOD):
            self.metrics.handled_errors.labels("producer_renewed").inc()
            return 0.1
        return self.kafka_dep.failed(exc)
