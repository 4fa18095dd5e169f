"""Kafka connection helpers: one configuration of producers, consumers and topics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    TopicAlreadyExistsError,
    UnknownProducerId,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.metadata import MetadataRequest

from shared.kafka_access import KafkaAccess
from shared.retry import KAFKA_DOWN, backoff
from shared.settings import CommonSettings
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# One limit for every message on the bus, set everywhere from here: the broker's
# message.max.bytes (infra/kafka.sh reads this line, so it stays a plain product), each
# topic's max.message.bytes (ensure_topics), the producers' request size and the
# consumers' fetch sizes. 4 MiB holds the largest prompt the schema admits (4,000,000
# characters) in ASCII with the rest of its request around it; a bulk line over it (text
# of several bytes a character, many long messages) is refused by ``too_large``.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# What Kafka adds around a value (batch and record headers, a short key): a value of at
# most MAX_VALUE_BYTES always fits in one message.
RECORD_OVERHEAD_BYTES = 4096
MAX_VALUE_BYTES = MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES


def too_large(size: int) -> str | None:
    """Why a value of ``size`` bytes cannot go on the bus (no record holds it), or None.
    Kafka would refuse it at send, and a sender that lets that error through fails more
    than the one value (a bulk job ended with it)."""
    if size <= MAX_VALUE_BYTES:
        return None
    return (
        f"the request is {size:,} bytes encoded; a Kafka record holds at most {MAX_VALUE_BYTES:,}"
    )


# A client that cannot start (no broker answers, or none accepts this service's login)
# tries again after these delays: a service started before Kafka, or with a password
# Kafka refuses, waits and keeps trying (a fixed password file is read on the next try).
START_RETRY_FIRST_S = 0.5
START_RETRY_CAP_S = 5.0

# How often a probe asks Kafka whether it answers, and how long it waits for the answer.
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0


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
        **settings.kafka.options(),
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=linger_ms,
        max_request_size=MAX_MESSAGE_BYTES,
        request_timeout_ms=request_timeout_ms,
    )


# What a broker answers an idempotent producer it will never take another batch from on
# that partition. aiokafka (0.14) gives a batch its sequence number when the batch first
# leaves its queue and never takes the number back, so a batch that then fails (one that
# expired while its partition had no known leader, as after a cluster view read while the
# partition's only broker shut down) leaves a gap: the broker refuses every later batch
# for the partition as out of order. Only a new producer (a new producer id) gets past it.
REFUSED_FOR_GOOD: tuple[type[KafkaError], ...] = (OutOfOrderSequenceNumber, UnknownProducerId)


def ridden_out(exc: KafkaError) -> bool:
    """Whether a Kafka error is one to wait out and retry: the broker away, slow or moving
    leaders, a consumer-group rebalance that failed a commit, or a producer refused for
    good (a ``RenewingProducer`` replaces itself, so the retry goes through). Anything
    else (a refused authorization, a fenced producer, a record too large) is a
    configuration error or a bug."""
    return exc.retriable or isinstance(
        exc, (*KAFKA_DOWN, *REFUSED_FOR_GOOD, CommitFailedError, IllegalStateError)
    )


class RenewingProducer:
    """``make_producer``'s producer, replaced by a new one as soon as a send fails with
    ``REFUSED_FOR_GOOD``: that send fails as any failed send does (its caller answers or
    retries as usual), and later sends go through the new producer. Sends made while the
    replacement starts wait for it. Hand this object, not its current producer, to what
    sends or asks for metadata (``client`` is always the current producer's)."""

    def __init__(
        self,
        settings: CommonSettings,
        *,
        client_id: str,
        linger_ms: int = 2,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self._settings = settings
        self._options: dict[str, Any] = {
            "client_id": client_id,
            "linger_ms": linger_ms,
            "request_timeout_ms": request_timeout_ms,
        }
        self._current = make_producer(settings, **self._options)
        self._renewing: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self.renewals = 0

    @property
    def client(self) -> Any:
        return self._current.client

    async def start(self, *, wait: bool = True) -> None:
        """Start, trying again with a new producer for as long as Kafka does not let it
        in (away, or refusing the login: aiokafka logs each refusal); with ``wait`` off,
        the first failure is raised (a one-shot command reports it)."""
        failures = 0
        while True:
            try:
                await self._current.start()
                return
            except KAFKA_DOWN as exc:
                await self._current.stop()
                if not wait:
                    raise
                if failures == 0:
                    login = self._settings.kafka.login()
                    log.warning(
                        "Kafka does not let the producer in (%r; login: %s): trying again",
                        exc,
                        login,
                    )
                await asyncio.sleep(
                    backoff(failures, first_s=START_RETRY_FIRST_S, cap_s=START_RETRY_CAP_S)
                )
                failures += 1
                self._current = make_producer(self._settings, **self._options)

    async def stop(self) -> None:
        """Stop the current producer (it flushes what it holds) and any being retired."""
        await cancel_and_wait(self._renewing)  # it may be waiting for Kafka: not at shutdown
        await asyncio.gather(*self._retired, return_exceptions=True)
        await self._current.stop()

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Queue a record; returns the future of its acknowledgement (as aiokafka's)."""
        if self._renewing is not None:
            await asyncio.shield(self._renewing)
        producer = self._current
        ack: asyncio.Future[Any] = await producer.send(topic, value, key=key, partition=partition)
        ack.add_done_callback(lambda done: self._check(producer, done))
        return ack

    async def send_and_wait(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> Any:
        return await (await self.send(topic, value, key=key, partition=partition))

    async def partitions_for(self, topic: str) -> set[int]:
        partitions: set[int] = await self._current.partitions_for(topic)
        return partitions

    def _check(self, producer: AIOKafkaProducer, ack: asyncio.Future[Any]) -> None:
        if ack.cancelled():
            return
        exc = ack.exception()
        refused = isinstance(exc, REFUSED_FOR_GOOD)
        if refused and producer is self._current and self._renewing is None:
            log.warning("Kafka refuses this producer for good (%r): replacing it", exc)
            self._renewing = asyncio.create_task(self._renew(producer), name="producer-renewal")

    async def _renew(self, old: AIOKafkaProducer) -> None:
        """Start a new producer (Kafka answered the refusal, so it is there: a start that
        fails anyway is tried again with backoff), then retire the old one."""
        delay = 0.1
        while True:
            new = make_producer(self._settings, **self._options)
            try:
                await new.start()
                break
            except KafkaError as exc:
                log.warning("new producer not started (%r): trying again", exc)
                await new.stop()
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)
            except asyncio.CancelledError:
                await new.stop()
                raise
        self._current = new
        self.renewals += 1
        self._renewing = None
        # The old producer still delivers what it holds for other partitions.
        retiring = asyncio.create_task(old.stop(), name="producer-retirement")
        self._retired.add(retiring)
        retiring.add_done_callback(self._retired.discard)


def make_consumer(
    settings: CommonSettings,
    *topics: str,
    group_id: str | None,
    client_id: str,
    session_timeout_ms: int = 10_000,
    **extra: Any,
) -> AIOKafkaConsumer:
    """A consumer with manual commits: offsets are committed only after the work is safe.
    ``extra`` adds or overrides aiokafka options (``auto_offset_reset``, …)."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        **settings.kafka.options(),
        "group_id": group_id,
        "client_id": client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_bytes": 4 * MAX_MESSAGE_BYTES,
        "session_timeout_ms": session_timeout_ms,
        "heartbeat_interval_ms": max(100, session_timeout_ms // 3),
        "max_partition_fetch_bytes": MAX_MESSAGE_BYTES,
    }
    return AIOKafkaConsumer(*topics, **(options | extra))


# How far before a record's expected time a search for it starts: the clocks of the
# service that stamped the time and of the producer that wrote the record may differ.
CLOCK_SKEW_S = 60.0


class TooFarBack(LookupError):
    """A search for a record would read more records than its limit allows."""


async def holds_keyed_record(
    settings: CommonSettings,
    topic: str,
    partitions: Collection[int],
    key: bytes,
    since_s: float,
    *,
    client_id: str,
    scan_limit: int = 200_000,
    timeout_s: float = 60.0,
) -> bool:
    """Whether ``topic`` (of ``partitions``) holds a record keyed ``key`` written since
    about ``since_s``: read on the one partition a producer's default (murmur2)
    partitioner gives that key, from the record time ``since_s`` less ``CLOCK_SKEW_S`` to
    the end. Raises ``TooFarBack`` when that is more than ``scan_limit`` records,
    ``KafkaTimeoutError`` when it is not read within ``timeout_s``, and ``KafkaError`` as
    any client does."""
    ordered = sorted(partitions)
    tp = TopicPartition(topic, DefaultPartitioner()(key, ordered, ordered))
    consumer = make_consumer(settings, group_id=None, client_id=client_id)
    await consumer.start()
    try:
        consumer.assign([tp])
        since_ms = int((since_s - CLOCK_SKEW_S) * 1000)
        first = (await consumer.offsets_for_times({tp: since_ms}))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if first is None or first.offset >= end:
            return False
        if end - first.offset > scan_limit:
            raise TooFarBack(f"{end - first.offset} records on {tp} since {since_ms} ms")
        consumer.seek(tp, first.offset)
        deadline = time.monotonic() + timeout_s
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:  # fetches fail silently while a broker is away
                raise KafkaTimeoutError(f"{tp} not read to offset {end} in {timeout_s} s")
            got = await consumer.getmany(tp, timeout_ms=1000)
            if any(rec.key == key for rec in got.get(tp, ())):
                return True
        return False
    finally:
        await consumer.stop()


def make_admin(settings: CommonSettings, *, client_id: str) -> AIOKafkaAdminClient:
    """An admin client (topics, consumer-group offsets, record deletion)."""
    return AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap, client_id=client_id, **settings.kafka.options()
    )


async def start_consumer(consumer: AIOKafkaConsumer, access: KafkaAccess) -> None:
    """Start a consumer, trying again for as long as Kafka does not let it in (a failed
    start stops at the bootstrap, before the consumer holds anything, so it can be
    started again). The log line names the login ``access`` the consumer was made with."""
    failures = 0
    while True:
        try:
            await consumer.start()
            return
        except KAFKA_DOWN as exc:
            if failures == 0:
                log.warning(
                    "Kafka does not let the consumer in (%r; login: %s): trying again",
                    exc,
                    access.login(),
                )
            await asyncio.sleep(
                backoff(failures, first_s=START_RETRY_FIRST_S, cap_s=START_RETRY_CAP_S)
            )
            failures += 1


async def unless_stopped(start: Awaitable[None], stopping: asyncio.Event) -> bool:
    """Await ``start`` (a start that may retry for as long as Kafka keeps the service
    out) unless ``stopping`` is set first: then cancel it and return False, so a service
    asked to stop while it waits for Kafka exits instead of waiting on."""
    starting = asyncio.ensure_future(start)
    stop = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if starting.done():
        starting.result()
        return True
    await cancel_and_wait(starting)
    return False


def topic_configs(settings: CommonSettings) -> dict[str, str]:
    """The configuration of every topic the project creates: its largest message, and how
    many replicas must hold a record before an acks=all send returns (with the settings'
    replication factor, the one place topics get their durability from)."""
    return {
        "max.message.bytes": str(MAX_MESSAGE_BYTES),
        "min.insync.replicas": str(settings.kafka_min_insync_replicas),
    }


async def ensure_topics(
    settings: CommonSettings, partitions: Mapping[str, int], *, retries: int = 30
) -> list[str]:
    """Create the given topics (name → partition count) if missing; returns those created.
    Each takes messages up to MAX_MESSAGE_BYTES, whatever the broker's default, and is
    replicated as ``topic_configs`` says (the settings' replication factor and
    min.insync.replicas).

    Retries while the broker is still starting, so it can run right after the broker's
    port opens."""
    admin = make_admin(settings, client_id="tw-admin")
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
                replication_factor=settings.kafka_replication_factor,
                topic_configs=topic_configs(settings),
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


class Outages(Protocol):
    """What a probe reports to: a dependency's record of whether it answers."""

    def failed(self, exc: BaseException) -> object: ...

    def answered(self, asked_at: float | None = None) -> None: ...


class KafkaProbe:
    """Whether Kafka serves the topics a service writes, asked every ``interval_s`` over a
    started producer's connections (its ``client``) and reported to ``outages``:
    served when a broker answers a metadata request for them and each of their partitions
    has a leader. A service learns of an outage within seconds even while it sends
    nothing (its producer retries a send for as long as Kafka is away, so a send alone
    reports an outage late or never), and of its end as soon as the topics are served.

    The answer is read into a cluster view of the probe's own, never the client's: a view
    taken while a broker shuts down shows its partitions without a leader, and an aiokafka
    producer holding such a view asks for metadata again, without pause, until a broker
    answers (a busy loop for the whole outage)."""

    def __init__(
        self,
        producer: Any,
        topics: Sequence[str],
        outages: Outages,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._producer = producer  # a RenewingProducer's client changes: read it each time
        self._topics = list(topics)
        self._outages = outages
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kafka-probe")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def probe(self) -> bool:
        """Ask once and report the answer; True when the topics are served."""
        asked_at = time.monotonic()
        try:
            unserved = await asyncio.wait_for(self._unserved(), self._timeout_s)
        except TimeoutError:
            unserved = f"no broker answered within {self._timeout_s:g} s"
        if unserved is None:
            self._outages.answered(asked_at)
            return True
        self._outages.failed(KafkaConnectionError(unserved))
        return False

    async def _unserved(self) -> str | None:
        """Why the topics are not served now, or None when they are."""
        request = MetadataRequest(self._topics, allow_auto_topic_creation=False)
        client = self._producer.client
        for broker in client.cluster.brokers():
            try:
                response = await client.send(broker.nodeId, request)
            except KafkaError as exc:  # this broker is away; another may answer
                log.debug("metadata probe of broker %s failed: %r", broker.nodeId, exc)
                continue
            view = ClusterMetadata()
            view.update_metadata(response)
            leaderless = [t for t in self._topics if not _led(view, t)]
            return f"no leader for {', '.join(leaderless)}" if leaderless else None
        return "no broker answered a metadata request"

    async def _run(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(self._interval_s)


def _led(view: Any, topic: str) -> bool:
    """Whether ``view`` (a ClusterMetadata) knows ``topic`` and a leader for each partition."""
    partitions = view.partitions_for_topic(topic)
    return bool(partitions) and all(
        view.leader_for_partition(TopicPartition(topic, p)) not in (None, -1) for p in partitions
    )
