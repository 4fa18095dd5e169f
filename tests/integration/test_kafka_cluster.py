"""The stack on a three-node Kafka cluster (infra/kafka.sh's cluster profile: three KRaft
nodes, each broker and controller; every topic replicated 3 times with
min.insync.replicas=2), and the broker leading the requests and batches partitions killed
with SIGKILL under load, then started again.

Streaming clients submit short greedy requests through the edge in a loop, and a backend
producer (``shared.producer.Producer``: acks=all, idempotent) submits Kafka-reply requests
a few times a second, from before the kill until after the node is back.

- Every topic the stack created has 3 replicas and min.insync.replicas=2.
- The partitions the killed node led get another leader while it is away, and it is back
  in every partition's in-sync replicas once started again.
- Every request the edge accepted is answered exactly once (SSE ids contiguous from 0, one
  final event, ``[DONE]``); every request the producer had acknowledged gets exactly one
  Completion; each of their replay logs in Redis holds seqs 0..n with no gap and no
  duplicate and one final event; greedy outputs equal an undisturbed run.
- A request refused meanwhile gets 503 with Retry-After, and succeeds when tried again.
- No process exits.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from services.bench.servers import Server
from shared import token_stream
from shared.kafka_io import make_admin
from shared.messages import GenerateRequest
from shared.producer import Producer
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import (
    Stack,
    StreamRecorder,
    completions,
    make_stack,
)
from tests.integration.test_handoff import FAST_FAILOVER, greedy_requests, reference_tokens
from tests.integration.test_kafka_outage import (
    MAX_TOKENS,
    PROMPTS,
    SAMPLE,
    UNLIMITED,
    Load,
    Served,
    check_clients,
    client_loop,
    served_at_least,
    tried_again,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CLIENTS = 4
WORKER_SLOTS = 8
REPLIES = 50  # Kafka-reply requests, one every REPLY_EVERY_S: past the node's return
REPLY_EVERY_S = 0.5
REPLY_TOKENS = 16
AWAY_S = 12.0  # the killed node stays down this long: past its 6 s broker session


async def describe(st: Stack, topics: list[str], within_s: float = 30) -> dict[str, Any]:
    """Topic metadata (partitions with leader, replicas, isr), asked through a new admin
    client until a node answers with every topic known."""
    deadline = time.monotonic() + within_s
    while True:
        admin = make_admin(st.settings, client_id="test-cluster")
        try:
            await admin.start()
            described = {t["topic"]: t for t in await admin.describe_topics(topics)}
            if all(described.get(t, {}).get("partitions") for t in topics):
                return described
        except KafkaError:
            if time.monotonic() > deadline:
                raise
        finally:
            await admin.close()
        assert time.monotonic() < deadline, f"topics {topics} not described"
        await asyncio.sleep(0.5)


def undisturbed(model_dir: str, replies: list[GenerateRequest]) -> dict[str, list[int]]:
    """Greedy outputs of the first prompts of PROMPTS (by prompt) and of the first
    Kafka-reply requests (by id), from the model itself."""
    sample = greedy_requests(SAMPLE, MAX_TOKENS, seed=21)  # the first prompts of PROMPTS
    ref = reference_tokens(model_dir, [*sample, *replies[:SAMPLE]], REPLY_TOKENS)
    out = {str(r.prompt): ref[r.request_id][:MAX_TOKENS] for r in sample}
    return out | {r.request_id: ref[r.request_id] for r in replies[:SAMPLE]}


def leaders(described: dict[str, Any], topic: str) -> set[int]:
    return {p["leader"] for p in described[topic]["partitions"]}


async def min_insync(st: Stack, topic: str, within_s: float = 30) -> str:
    """The topic's min.insync.replicas, asked until a node answers with the topic known: a
    node the new topic's metadata has not reached yet answers with an error code and no
    configs."""
    deadline = time.monotonic() + within_s
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"min.insync.replicas": None})
    while True:
        admin = make_admin(st.settings, client_id="test-cluster")
        try:
            await admin.start()
            [response] = await admin.describe_configs([resource])
            [(error, message, _, _, configs)] = response.resources
            found = [str(c[1]) for c in configs if c[0] == "min.insync.replicas"]
            if error == 0 and found:
                return found[0]
            last = f"error {error} {message!r}, configs {configs}"
        except KafkaError as exc:
            last = repr(exc)
        finally:
            await admin.close()
        assert time.monotonic() < deadline, f"min.insync.replicas of {topic}: {last}"
        await asyncio.sleep(0.5)


async def all_in_sync(st: Stack, topics: list[str], node: int, within_s: float = 60) -> None:
    """Wait until ``node`` is an in-sync replica of every partition of ``topics``."""
    deadline = time.monotonic() + within_s
    while True:
        described = await describe(st, topics)
        behind = [
            (t, p["partition"])
            for t in topics
            for p in described[t]["partitions"]
            if node not in p["isr"]
        ]
        if not behind:
            return
        assert time.monotonic() < deadline, f"node {node} not in sync for {behind}"
        await asyncio.sleep(0.5)


async def produce_replies(
    st: Stack, replies: list[GenerateRequest], accepted: list[str], stop: asyncio.Event
) -> None:
    """Submit the requests one every REPLY_EVERY_S through the project's producer until
    ``stop``; ``accepted``: those whose send Kafka acknowledged."""
    async with Producer(st.settings, client_id=f"{st.prefix}-backend") as producer:
        for req in replies:
            if stop.is_set():
                return
            accepted.append(await producer.submit(req))
            await asyncio.sleep(REPLY_EVERY_S)


async def check_logs(st: Stack, request_ids: list[str]) -> None:
    """Each request's replay log: seqs 0..n in order, no gap, no duplicate, one final
    event, and it is the last."""
    redis = st.settings.redis.client()  # a Redis Cluster's too
    try:
        for rid in request_ids:
            events = await token_stream.read_log(redis, st.names, rid)
            seqs = [e.seq for e in events]
            assert seqs == list(range(len(seqs))) and seqs, f"{rid}: replay log seqs {seqs}"
            assert [e.final for e in events].count(True) == 1 and events[-1].final, rid
    finally:
        await redis.aclose()


async def test_the_leader_broker_killed_under_load_loses_and_repeats_nothing(
    infra: dict[str, str], model_dir: str, kafka_cluster: Server
) -> None:
    t0 = time.monotonic()
    ARTIFACTS.mkdir(exist_ok=True)
    st = make_stack(
        new_prefix("kcluster"), {**infra, **kafka_cluster.client_env}, model_dir, ARTIFACTS
    )
    assert st.settings.kafka_replication_factor == 3
    await st.create_topics()
    n = st.names
    ours = [n.requests, n.batches, n.completions, n.requests_dlq]
    described = await describe(st, ours)
    for topic in ours:
        assert all(len(p["replicas"]) == 3 for p in described[topic]["partitions"]), topic
        assert await min_insync(st, topic) == "2", topic

    st.start("worker", **FAST_FAILOVER, TW_MAX_RUNNING=str(WORKER_SLOTS))
    st.start("batcher")
    st.start("edge", **UNLIMITED)
    replies = greedy_requests(REPLIES, REPLY_TOKENS, seed=23, reply_topic=n.completions)
    load, accepted = Load(), list[str]()
    stop = asyncio.Event()
    background: list[asyncio.Task[Any]] = []
    at: dict[str, float] = {}
    try:
        await st.wait_ready(within_s=240)  # a worker starts slowly on a busy machine
        at["ready"] = time.monotonic()
        url = st.url() + "/v1/completions"
        async with (
            httpx.AsyncClient(timeout=90, limits=httpx.Limits(max_connections=32)) as http,
            StreamRecorder(st.env["TW_REDIS_URL"], n) as rec,
        ):
            clients = [
                asyncio.create_task(client_loop(http, url, PROMPTS[i::CLIENTS], load, stop))
                for i in range(CLIENTS)
            ]
            replying = asyncio.create_task(produce_replies(st, replies, accepted, stop))
            background += [*clients, replying]
            await served_at_least(st, load, 2 * CLIENTS)
            while len(rec.finished() & set(accepted)) < 3:
                st.check_alive()
                await asyncio.sleep(0.05)

            # The node leading partitions of both topics (two partitions each over three
            # nodes: some node leads one of each), the one leading most of them.
            described = await describe(st, [n.requests, n.batches])
            both = leaders(described, n.requests) & leaders(described, n.batches)
            led = Counter(
                p["leader"] for t in (n.requests, n.batches) for p in described[t]["partitions"]
            )
            victim = max(both, key=lambda node: led[node])
            at["kill"] = time.monotonic()
            await asyncio.to_thread(kafka_cluster.kill, victim)
            reference = asyncio.create_task(asyncio.to_thread(undisturbed, model_dir, replies))
            background.append(reference)
            await asyncio.sleep(AWAY_S)
            moved = await describe(st, [n.requests, n.batches])
            for topic in (n.requests, n.batches):
                assert victim not in leaders(moved, topic), (topic, moved[topic])
            served_away = len(load.served)
            await asyncio.to_thread(kafka_cluster.start, victim)
            at["restarted"] = time.monotonic()
            await served_at_least(st, load, served_away + 2 * CLIENTS)
            stop.set()
            await asyncio.gather(*clients, replying)
            retried = [await tried_again(http, url, r) for r in load.refused]
            got = await completions(st, set(accepted), within_s=90)
            served_rids = [s.request_id for s in [*load.served, *retried] if isinstance(s, Served)]
            await rec.wait_finished({*served_rids, *accepted}, within_s=60, stack=st)
            expected = await reference
            at["answered"] = time.monotonic()
            await all_in_sync(st, [n.requests, n.batches, n.completions], victim)
            at["in sync"] = time.monotonic()
        st.check_alive()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        st.stop_all()
    at["end"] = time.monotonic()
    print(
        f"node {victim} killed (led {led[victim]} of {sum(led.values())} partitions); "
        f"{len(load.served)} served through the edge, {len(load.refused)} refused, "
        f"{len(accepted)} Kafka-reply requests; "
        + ", ".join(f"{k} at +{v - t0:.1f}s" for k, v in at.items())
    )

    check_clients(load, retried, expected)
    counts = Counter(c.request_id for c in got)
    assert {rid: counts[rid] for rid in accepted if counts[rid] != 1} == {}, "one Completion each"
    assert max(counts.values()) == 1, [rid for rid, k in counts.items() if k > 1]
    by_id = {r.request_id: r for r in replies}
    sampled = [c for c in got if c.request_id in expected]
    assert sampled, "the undisturbed run covers some Kafka-reply requests"
    for c in sampled:
        assert c.token_ids == expected[c.request_id], by_id[c.request_id].prompt
    await check_logs(st, [*served_rids, *accepted])
    for rid in [*served_rids, *accepted]:
        rec.stream(rid)  # as published: contiguous, one final event, duplicates identical
