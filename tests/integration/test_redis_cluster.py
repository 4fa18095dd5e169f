"""The stack on the cluster profile: three Kafka nodes (every topic replicated 3 times,
min.insync.replicas=2), a Redis Cluster (infra/redis.sh's cluster profile: three masters
with a replica each; the services with ``TW_REDIS_CLUSTER=true`` and one node's URL), two
workers, two batchers and two edges; and the Redis master serving the most running requests
killed with SIGKILL under load, then started again. (The Hub and the worker's writer are
also checked alone through a failover.)

- Both edges stream answers; the requests' keys spread over the shards, each request's keys
  (channel, replay log, claim, owner, done marker) on one.
- A stream is resumed through the other edge with Last-Event-ID.
- Streaming clients submit short greedy requests through both edges in a loop from before the
  kill until after the replica has taken over: every request an edge accepted is answered
  exactly once (SSE ids contiguous from 0, one final event, ``[DONE]``) as an undisturbed run
  answers it, and each replay log holds seqs 0..n with no gap and no duplicate. A request
  refused while the slot had no master gets 503 with Retry-After and succeeds when tried
  again after it.
- The killed master's replica is promoted; the killed node, started again, rejoins as a
  replica, and the clients are served on. No process exits.
- A connection closed by another task while a command is sent on it (what the cluster
  client does to busy connections after a failover) raises an outage error, plain or
  cluster, and the client goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import uvloop
from redis.asyncio.cluster import RedisCluster

from services.bench.servers import Server, private_redis_cluster
from services.edge.hub import RESYNC, Hub, Mailbox
from shared import token_stream
from shared.codec import decode
from shared.messages import TokenEvent
from shared.names import Names
from shared.redis_client import RedisAccess, initialized
from shared.resp import RespWriter, Topology
from shared.retry import REDIS_DOWN
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack, make_stack
from tests.integration.test_handoff import FAST_FAILOVER
from tests.integration.test_kafka_cluster import check_logs
from tests.integration.test_kafka_outage import (
    PROMPTS,
    UNLIMITED,
    Load,
    Served,
    check_clients,
    check_served,
    client_loop,
    one_request,
    served_at_least,
    tried_again,
    undisturbed,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CLIENTS = 4  # per edge
EDGES = ("edge", "edge2")


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[Server]:
    """Three masters and three replicas of this test's own."""
    srv = private_redis_cluster(tmp_path / "redis-cluster-run", shards=3)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


async def topology(st: Stack) -> Topology:
    topo = Topology(st.settings.redis)
    await topo.refresh(5.0)
    return topo


async def resumed(http: httpx.AsyncClient, st: Stack, served: Served, edge: str) -> list[int]:
    """The SSE ids ``edge`` sends for ``served``'s stream after its first event."""
    url = f"{st.url(edge)}/v1/requests/{served.request_id}/stream"
    ids: list[int] = []
    async with http.stream("GET", url, headers={"Last-Event-ID": "0"}) as resp:
        assert resp.status_code == 200, (await resp.aread())[:300]
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                ids.append(int(line[4:]))
    return ids


async def promoted(topo: Topology, victim: tuple[str, int], within_s: float = 30) -> None:
    """Until every slot has a master again and ``victim`` serves none (``topo`` knows the
    other nodes: the URL's may be the one killed)."""
    deadline = time.monotonic() + within_s
    while True:
        topo.invalidate()
        try:
            await topo.refresh(2.0)
            if victim not in topo.masters and len(topo.masters) == 3:
                return
        except ConnectionError:
            pass
        assert time.monotonic() < deadline, "no replica took the killed master's slots"
        await asyncio.sleep(0.3)


async def closed_under_a_command(conn: Any) -> BaseException:
    """What a command (its send, then its reply read, as the client runs one) raises when
    another task closes its connection while it is under way: what redis-py's cluster
    client does to a node's busy connections when it reads the slots' owners again after
    a failover (a CI run's edge met it mid-stream). Where it breaks depends on the Python:
    on 3.11 the send raises (its write waits for its turn), on 3.12 the send has written
    by then and the read raises."""
    await conn.connect()

    async def command() -> Any:
        await conn.send_command("PING")
        return await conn.read_response()

    running = asyncio.create_task(command())
    await asyncio.sleep(0)  # the command is under way
    await conn.disconnect(nowait=True)
    with pytest.raises(BaseException) as caught:
        await running
    return caught.value


async def test_a_connection_closed_under_a_command_is_an_outage_not_a_crash(
    infra: dict[str, str], redis_cluster: Server
) -> None:
    plain = RedisAccess(infra["TW_REDIS_URL"]).client(socket_timeout=2.0)
    cluster = RedisAccess(redis_cluster.url, cluster=True).client(socket_timeout=2.0)
    try:
        await initialized(cluster)
        node = cast(RedisCluster, cluster).get_random_node()
        for conn in (plain.connection_pool.make_connection(), node.acquire_connection()):
            exc = await closed_under_a_command(conn)
            assert isinstance(exc, REDIS_DOWN), repr(exc)
        # ... and both clients go on.
        assert await plain.ping()
        assert await cluster.ping()
    finally:
        await plain.aclose()
        await cluster.aclose()


def test_a_transport_closed_under_a_command_is_an_outage_on_uvloop_too(
    infra: dict[str, str], redis_cluster: Server
) -> None:
    """The services run on uvloop, whose closed transport raises ``RuntimeError`` ("the
    handler is closed") where asyncio's raises ``ConnectionError``: a CI run's edge met it
    reading a replay log during a cluster failover and answered 500."""

    async def closed_transport() -> list[BaseException | None]:
        plain = RedisAccess(infra["TW_REDIS_URL"]).client(socket_timeout=2.0)
        cluster = RedisAccess(redis_cluster.url, cluster=True).client(socket_timeout=2.0)
        raised: list[BaseException | None] = []
        try:
            await initialized(cluster)
            node = cast(RedisCluster, cluster).get_random_node()
            for conn in (plain.connection_pool.make_connection(), node.acquire_connection()):
                await conn.connect()
                conn._writer.transport.abort()  # closed by another task, writer still set
                try:
                    await conn.send_command("PING")
                    raised.append(None)
                except BaseException as exc:
                    raised.append(exc)
            assert await plain.ping() and await cluster.ping()  # both clients go on
        finally:
            await plain.aclose()
            await cluster.aclose()
        return raised

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        raised = runner.run(closed_transport())
    assert all(isinstance(exc, REDIS_DOWN) for exc in raised), raised


async def test_the_hub_and_the_writer_follow_a_failover(redis_cluster: Server) -> None:
    """Token events written through the worker's RESP writer to streams on every shard,
    heard through the edge's hub; the master of some of them killed midway: the writer
    waits out the failover, the hub places those channels on the promoted replica and
    resyncs them, and every replay log ends complete."""
    access = RedisAccess(redis_cluster.url, cluster=True)
    names = Names(new_prefix("rhub"), sharded=True)
    writer = RespWriter(access, name="tw-test-writer", timeout_s=2.0, attempts=1)
    hub = Hub(access, name="tw-test-hub")
    await hub.start()
    rids = [f"r{i}" for i in range(24)]
    boxes = {r: Mailbox() for r in rids}
    steps = 40
    try:
        for r in rids:
            await hub.subscribe(names.token_channel(r).encode(), boxes[r])
        victim = hub.topology.node_of(names.token_channel(rids[0]).encode())
        on_victim = {r for r in rids if hub.topology.node_of(names.token_log(r).encode()) == victim}
        assert 0 < len(on_victim) < len(rids)
        failed_writes = 0
        for seq in range(steps):
            if seq == 10:
                await asyncio.to_thread(
                    redis_cluster.kill, redis_cluster.ports.index(victim[1]) + 1
                )
            events = [
                TokenEvent(
                    request_id=r,
                    seq=seq,
                    text="x",
                    token_ids=[seq],
                    finish_reason=("length" if seq == steps - 1 else None),
                )
                for r in rids
            ]
            deadline = time.monotonic() + 30
            while True:
                try:
                    await writer.execute(token_stream.event_commands(names, events))
                    break
                except ConnectionError:
                    failed_writes += 1
                    assert time.monotonic() < deadline, "no replica took over in 30 s"
                    await asyncio.sleep(0.2)
        deadline = time.monotonic() + 20
        while not hub.connected:
            assert time.monotonic() < deadline, "the hub did not reconnect"
            await asyncio.sleep(0.1)
        assert victim not in hub.topology.masters
        assert failed_writes > 0  # the writer did wait for the failover
        await asyncio.sleep(0.5)
        for r, box in boxes.items():
            got = box.take()
            heard = {decode(TokenEvent, d).seq for d in got if d != RESYNC}
            if r in on_victim:
                # Subscribed again on the promoted replica, then told to read the log for
                # what went by meanwhile.
                assert RESYNC in got, r
                assert heard >= set(range(10)), r  # before the kill, live
            else:
                assert RESYNC not in got and heard == set(range(steps)), r
        redis = access.client()
        try:
            for r in rids:
                logged = await token_stream.read_log(redis, names, r)
                assert [e.seq for e in logged] == list(range(steps)), r
        finally:
            await redis.aclose()
    finally:
        await hub.stop()
        await writer.aclose()


async def test_the_cluster_profile_survives_a_redis_master_killed_under_load(
    infra: dict[str, str], model_dir: str, kafka_cluster: Server, redis_cluster: Server
) -> None:
    t0 = time.monotonic()
    ARTIFACTS.mkdir(exist_ok=True)
    env = {
        **infra,
        **kafka_cluster.client_env,
        "TW_REDIS_URL": redis_cluster.url,
        "TW_REDIS_CLUSTER": "true",
    }
    st = make_stack(new_prefix("rcluster"), env, model_dir, ARTIFACTS)
    assert st.names.sharded and st.settings.kafka_replication_factor == 3
    await st.create_topics()
    for name in ("worker", "worker2"):
        st.start("worker", name, **FAST_FAILOVER, TW_MAX_RUNNING="8")
    for name in ("batcher", "batcher2"):
        st.start("batcher", name)
    for edge in EDGES:
        st.start("edge", edge, **UNLIMITED)
    load, stop = Load(), asyncio.Event()
    background: list[asyncio.Task[Any]] = []
    at: dict[str, float] = {}
    try:
        await st.wait_ready(within_s=300, workers=2)
        at["ready"] = time.monotonic()
        async with httpx.AsyncClient(timeout=90, limits=httpx.Limits(max_connections=32)) as http:
            # Every edge streams; a stream resumes through the other edge.
            first = {
                e: await one_request(http, st.url(e) + "/v1/completions", PROMPTS[0]) for e in EDGES
            }
            for edge, served in first.items():
                assert isinstance(served, Served), served
                check_served(served)
                other = EDGES[1 - EDGES.index(edge)]
                assert await resumed(http, st, served, other) == served.ids[1:]
            topo = await topology(st)
            assert len(topo.masters) == 3

            clients = [
                asyncio.create_task(
                    client_loop(
                        http, st.url(e) + "/v1/completions", PROMPTS[i::CLIENTS], load, stop
                    )
                )
                for e in EDGES
                for i in range(CLIENTS)
            ]
            background += clients
            await served_at_least(st, load, 2 * len(clients))
            shards = Counter(
                topo.node_of(st.names.token_log(s.request_id).encode()) for s in load.served
            )
            assert len(shards) >= 2, f"every request on one shard: {shards}"

            # The master serving the most of the requests so far.
            victim = shards.most_common(1)[0][0]
            node = redis_cluster.ports.index(victim[1]) + 1
            at["kill"] = time.monotonic()
            await asyncio.to_thread(redis_cluster.kill, node)
            reference = asyncio.create_task(asyncio.to_thread(undisturbed, model_dir, []))
            background.append(reference)
            await promoted(topo, victim)
            at["promoted"] = time.monotonic()
            served_then = len(load.served)
            await served_at_least(st, load, served_then + 2 * len(clients))
            await asyncio.to_thread(redis_cluster.start, node)
            at["restarted"] = time.monotonic()
            await served_at_least(st, load, len(load.served) + 2 * len(clients))
            stop.set()
            await asyncio.gather(*clients)
            url = st.url() + "/v1/completions"
            retried = [await tried_again(http, url, r) for r in load.refused]
            expected = await reference
        st.check_alive()
        assert victim not in (await topology(st)).masters
        await rejoined(redis_cluster, node)
    finally:
        stop.set()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        st.stop_all()
    at["end"] = time.monotonic()
    print(
        f"master {victim} killed (served {shards[victim]} of {sum(shards.values())} requests "
        f"so far); {len(load.served)} served, {len(load.refused)} refused "
        f"(at {', '.join(f'+{r.at - t0:.1f}s' for r in load.refused)}); "
        + ", ".join(f"{k} at +{v - t0:.1f}s" for k, v in at.items())
    )
    for edge in EDGES:  # what made an edge refuse, should a check below fail
        log = (st.log_dir / f"{st.prefix}-{edge}.log").read_text(errors="replace")
        print(
            f"--- {edge}'s warnings", *(w for w in log.splitlines() if '"WARNING"' in w), sep="\n"
        )
    check_clients(load, retried, expected)
    for worker in ("worker", "worker2"):  # both workers served
        assert '"msg":"finished' in (st.log_dir / f"{st.prefix}-{worker}.log").read_text()
    served_ids = [s.request_id for s in [*load.served, *retried] if isinstance(s, Served)]
    await check_logs(st, served_ids)


async def rejoined(srv: Server, node: int, within_s: float = 30) -> None:
    """Until node ``node``, started again, is up as a replica."""
    deadline = time.monotonic() + within_s
    while True:
        view = {n.number: n for n in await asyncio.to_thread(srv.nodes)}
        if view[node].role == "replica" and view[node].state == "up":
            return
        assert time.monotonic() < deadline, f"node {node} did not rejoin: {view[node]}"
        await asyncio.sleep(0.3)
