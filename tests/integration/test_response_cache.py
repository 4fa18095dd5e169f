"""The response caches on a real stack (Kafka, Redis, a worker, a batcher, edges with keys
of two tenants and the semantic cache on): an exact hit replays the first answer's stream
byte for byte apart from ids and timestamps and never reaches a worker; ``no-store`` and
``no-cache`` do what they say; one tenant's answers are never served to another; a
paraphrase is a semantic hit while one-slot edits are not; after a Redis restart a fresh
edge rebuilds the semantic index from Redis and serves from it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect as ws_connect

from services.bench import cluster
from services.bench.servers import Server, private_server
from services.edge.auth import hash_key
from shared.codec import decode, encode
from shared.messages import (
    CacheMode,
    Completion,
    GenerateRequest,
    ReplyTarget,
    SamplingParams,
)
from tests.conftest import ROOT, new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack, StreamRecorder, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "tokenwire-tiny"
ACME, BETA = "sk-test-acme-cache-0000000000000000", "sk-test-beta-cache-0000000000000000"
QUESTION = "How do I reverse a list in Python?"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Redis of this module's own, with an append-only file (a restart keeps the data)."""
    srv = private_server("redis", tmp_path_factory.mktemp("cache-redis"), persist="aof")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
async def stack(
    infra: dict[str, str], model_dir: str, redis_server: Server
) -> AsyncIterator[Stack]:
    ARTIFACTS.mkdir(exist_ok=True)
    st = cluster.make_stack(
        new_prefix("cache"), {**infra, "TW_REDIS_URL": redis_server.url}, model_dir, ARTIFACTS
    )
    st.env.update(
        TW_AUTH="required",
        TW_API_KEYS=f"{hash_key(ACME)}=acme,{hash_key(BETA)}=beta",
        TW_SEMANTIC_CACHE="true",
        # A follower that takes a cancelled leader's place generates 1,800 tokens while
        # the others wait for it: on a loaded 2-core machine longer than the default 30 s.
        TW_CACHE_COALESCE_WAIT_S="180",
    )
    await st.create_topics()
    st.start("worker")
    st.start("batcher")
    st.start("edge")
    try:
        await st.wait_ready(within_s=240)  # a worker loads in seconds, minutes on a busy host
        yield st
    finally:
        st.stop_all()


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        **extra,
    }


async def sse(
    st: Stack, body: dict[str, Any], key: str = ACME, edge: str = "edge"
) -> tuple[str, str, bytes]:
    """(cache header, request id, the SSE body) of one streamed call."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        r = await http.post(st.url(edge) + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.headers["x-tokenwire-cache"], r.headers["x-request-id"], r.content


def normalised(body: bytes, request_id: str) -> bytes:
    """An SSE body without what differs between two answers: ids and timestamps."""
    return re.sub(rb'"created":\d+', b'"created":0', body.replace(request_id.encode(), b"ID"))


async def stored(st: Stack, redis: aioredis.Redis, tenant: str, count: int) -> None:
    """Wait until ``tenant`` has ``count`` exact entries (a worker stores an answer as
    it settles the request, just after its final event)."""
    pattern = st.names.cache(tenant, "x", "*")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if len([k async for k in redis.scan_iter(match=pattern)]) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{tenant} has fewer than {count} cached answers")


async def ws_answer(st: Stack, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Every message of one chat request over the WebSocket, up to ``done``."""
    url = st.url().replace("http://", "ws://") + "/v1/ws"
    frames: list[dict[str, Any]] = []
    async with ws_connect(url, additional_headers={"Authorization": f"Bearer {ACME}"}) as ws:
        await ws.send(orjson.dumps({"type": "chat.completions", "body": payload}))
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append(orjson.loads(await asyncio.wait_for(ws.recv(), 30)))
    return [f for f in frames if f["type"] != "usage"]


async def worker_finished(st: Stack) -> float:
    url = f"http://127.0.0.1:{st.metrics_ports['worker']}/metrics"
    async with httpx.AsyncClient() as http:
        text = (await http.get(url)).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("tw_requests_finished_total{")
    )


async def published_ids(st: Stack, wanted: set[str]) -> set[str]:
    """Request ids on the requests topic, read until all of ``wanted`` are seen (or 5 s)."""

    def ids(values: list[bytes]) -> set[str]:
        return {GenerateRequest.model_validate_json(v).request_id for v in values}

    values = await read_topic(
        st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests, lambda v: wanted <= ids(v), 5.0
    )
    return ids(values)


@pytest.fixture
async def redis(stack: Stack) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:
        yield client
    finally:
        await client.aclose()


async def test_exact_hit_replays_the_stream(stack: Stack, redis: aioredis.Redis) -> None:
    body = chat("Write the word list twice.")
    cache1, rid1, first = await sse(stack, body)
    await stored(stack, redis, "acme", 1)
    finished = await worker_finished(stack)
    cache2, rid2, second = await sse(stack, body)
    assert (cache1, cache2) == ("miss", "exact")
    assert rid1 != rid2 and first.count(b"data: ") > 3
    assert normalised(second, rid2) == normalised(first, rid1)
    # Resumable like any stream: the events after seq 2, from the replay log.
    headers = {"Authorization": f"Bearer {ACME}", "Last-Event-ID": "2"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        resumed = await http.get(stack.url() + f"/v1/requests/{rid2}/stream")
    ids = [int(i) for i in re.findall(rb"^id: (\d+)$", resumed.content, re.M)]
    assert ids and ids[0] == 3 and resumed.content.endswith(b"data: [DONE]\n\n")
    # It never reached Kafka nor a worker; the miss did.
    assert rid1 in await published_ids(stack, {rid1})
    assert rid2 not in await published_ids(stack, {rid1})
    assert await worker_finished(stack) == finished
    # Over the WebSocket: the same events, and the first message says it was a hit.
    frames = await ws_answer(stack, body)
    assert frames[0]["type"] == "request" and frames[0]["cache"] == "exact"
    texts = [f["data"]["choices"][0]["delta"].get("content", "") for f in frames[1:-1]]
    sse_texts = [
        orjson.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in first.decode().splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(texts) == "".join(sse_texts) and frames[-1]["type"] == "done"
    # The same answer whole (not streamed) is a hit too, with usage filled in.
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {ACME}"}) as h:
        whole = await h.post(stack.url() + "/v1/chat/completions", json={**body, "stream": False})
    assert whole.headers["x-tokenwire-cache"] == "exact"
    assert orjson.loads(whole.content)["usage"]["completion_tokens"] > 0


async def test_no_store_and_no_cache(stack: Stack, redis: aioredis.Redis) -> None:
    body = chat("Name a module of the standard library.")
    assert (await sse(stack, {**body, "cache": "no-store"}))[0] == "miss"
    await asyncio.sleep(1.0)  # a stored answer would be there by now
    first = await sse(stack, body)
    assert first[0] == "miss"  # nothing was stored by no-store; this one is
    await stored(stack, redis, "acme", 2)
    finished = await worker_finished(stack)
    fresh = await sse(stack, {**body, "cache": "no-cache"})
    assert fresh[0] == "miss"
    assert normalised(fresh[2], fresh[1]) == normalised(first[2], first[1])  # greedy
    assert fresh[1] in await published_ids(stack, {fresh[1]})
    assert await worker_finished(stack) > finished
    assert (await sse(stack, body))[0] == "exact"


async def test_sampled_requests_are_not_cached_unless_seeded(stack: Stack) -> None:
    body = chat("Print a number.", temperature=0.8)
    assert [(await sse(stack, body))[0] for _ in range(2)] == ["miss", "miss"]
    seeded = {**body, "seed": 7}
    assert (await sse(stack, seeded))[0] == "miss"
    await asyncio.sleep(1.0)
    assert (await sse(stack, seeded))[0] == "exact"


async def test_semantic_hit_and_hard_negatives(stack: Stack, redis: aioredis.Redis) -> None:
    first = await sse(stack, chat(QUESTION))
    assert first[0] == "miss"
    await asyncio.sleep(1.0)  # the worker stores the answer as it settles
    para = await sse(stack, chat("What is the way to reverse a Python list?"))
    assert para[0] == "semantic"
    assert normalised(para[2], para[1]) == normalised(first[2], first[1])
    for edit in (
        "How do I not reverse a list in Python?",  # negation
        "How do I reverse a list in Haskell?",  # another entity
        "How do I reverse 2 lists in Python?",  # a number
    ):
        assert (await sse(stack, chat(edit)))[0] == "miss", edit
    # Another sampling class, another conversation: no semantic hit either.
    other_class = chat("What is the way to reverse a Python list?", max_tokens=5)
    assert (await sse(stack, other_class))[0] == "miss"
    with_system = chat("What is the way to reverse a Python list?")
    with_system["messages"].insert(0, {"role": "system", "content": "Answer in French."})
    assert (await sse(stack, with_system))[0] == "miss"


async def test_tenants_never_share(stack: Stack, redis: aioredis.Redis) -> None:
    body = chat("Which keyword defines a function?")
    assert (await sse(stack, body, ACME))[0] == "miss"
    await asyncio.sleep(1.0)
    assert (await sse(stack, body, ACME))[0] == "exact"
    # Tenant beta asks the same (storing nothing) and a paraphrase: both generated.
    assert (await sse(stack, {**body, "cache": "no-store"}, BETA))[0] == "miss"
    assert (await sse(stack, chat("What keyword defines a function?"), BETA))[0] == "miss"
    assert (await sse(stack, chat("What keyword defines a function?"), ACME))[0] == "semantic"


async def edge_metric(st: Stack, name: str, **labels: str) -> float:
    """The sum of the edge's samples of ``name`` whose labels include ``labels``."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(st.url() + "/metrics")).text
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(w in line for w in wanted)
    )


async def finished_at_least(st: Stack, count: float) -> float:
    """The worker's finished requests once they reach ``count`` (or 20 s), then a moment
    later: a request finishes on the worker just after its final event went out."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if await worker_finished(st) >= count:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    return await worker_finished(st)


async def lookups_reach(st: Stack, count: float) -> None:
    """Wait until the edge has finished ``count`` cache lookups (or 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if await edge_metric(st, "tw_cache_lookup_seconds_count", kind="total") >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the edge has not finished {count} lookups")


async def test_identical_misses_coalesce(stack: Stack) -> None:
    body = chat("Count from one to nine in words.", max_tokens=24)
    finished = await worker_finished(stack)
    coalesced = await edge_metric(stack, "tw_cache_lookups_total", result="coalesced")
    answers = await asyncio.gather(*(sse(stack, body) for _ in range(4)))
    # One generates; the others wait for its answer and replay it as exact hits.
    assert sorted(cache for cache, _, _ in answers) == ["exact", "exact", "exact", "miss"]
    assert len({rid for _, rid, _ in answers}) == 4
    first = answers[0][2]
    assert first.count(b"data: ") > 3
    assert all(normalised(b, rid) == normalised(first, answers[0][1]) for _, rid, b in answers)
    assert await finished_at_least(stack, finished + 1) == finished + 1
    after = await edge_metric(stack, "tw_cache_lookups_total", result="coalesced")
    assert after == coalesced + 3


async def test_a_cancelled_leader_does_not_strand_its_followers(stack: Stack) -> None:
    body = chat("Recite a poem about rivers.", max_tokens=1800, ignore_eos=True)
    finished = await worker_finished(stack)
    counts = {
        result: await edge_metric(stack, "tw_cache_lookups_total", result=result)
        for result in ("coalesced", "uncoalesced")
    }
    headers = {"Authorization": f"Bearer {ACME}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        url = stack.url() + "/v1/chat/completions"
        async with http.stream("POST", url, json=body) as leader:
            assert leader.headers["x-tokenwire-cache"] == "miss"
            rid = leader.headers["x-request-id"]
            lines = leader.aiter_lines()
            async for line in lines:  # the leader is generating
                if line.startswith("data: {"):
                    break
            looked_up = await edge_metric(stack, "tw_cache_lookup_seconds_count", kind="total")
            followers = [asyncio.create_task(sse(stack, body)) for _ in range(3)]
            # Their lookups are done (each found the leader's marker): they wait for it.
            await lookups_reach(stack, looked_up + 3)
            cancel = await http.post(stack.url() + f"/v1/requests/{rid}/cancel")
            assert cancel.status_code == 200, cancel.text
            rest = [line async for line in lines]
        assert any("request_cancelled" in line for line in rest), rest[-3:]
        answers = await asyncio.gather(*followers)
    # One follower took the leader's place and generated; the others waited for it.
    assert sorted(cache for cache, _, _ in answers) == ["exact", "exact", "miss"]
    first = answers[0][2]
    assert all(normalised(b, r) == normalised(first, answers[0][1]) for _, r, b in answers)
    assert b'"finish_reason":"length"' in first
    assert await finished_at_least(stack, finished + 2) == finished + 2
    for result, more in (("coalesced", 2), ("uncoalesced", 1)):
        now = await edge_metric(stack, "tw_cache_lookups_total", result=result)
        assert now == counts[result] + more, result


async def test_a_request_sent_straight_to_kafka_is_answered_by_the_batcher(
    stack: Stack, redis: aioredis.Redis
) -> None:
    """A backend service's greedy request with ``cache: default``, sent to the requests
    topic: the first is generated and stored; the same again under a new id is answered
    by the batcher from the cache (the same events apart from its id, a completion saying
    ``exact``) and never reaches a worker; another tenant's identical request misses."""
    boot = stack.env["TW_KAFKA_BOOTSTRAP"]

    def ask(tenant: str) -> GenerateRequest:
        return GenerateRequest(
            prompt="Name three colours of the rainbow.",
            tenant=tenant,
            cache=CacheMode.DEFAULT,
            sampling=SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
            reply=ReplyTarget(kafka_topic=stack.names.completions),
        )

    first, again, other = ask("kafka-a"), ask("kafka-a"), ask("kafka-b")
    async with StreamRecorder(stack.env["TW_REDIS_URL"], stack.names) as rec:
        await produce(boot, stack.names.requests, [encode(first)])
        await rec.wait_finished({first.request_id}, 60, stack=stack)
        await stored(stack, redis, "kafka-a", 1)
        finished = await worker_finished(stack)
        await produce(boot, stack.names.requests, [encode(again)])
        await rec.wait_finished({again.request_id}, 60, stack=stack)
        assert await worker_finished(stack) == finished, "the hit reached a worker"
        await produce(boot, stack.names.requests, [encode(other)])
        await rec.wait_finished({other.request_id}, 60, stack=stack)
    wanted = {first.request_id, again.request_id, other.request_id}
    raw = await read_topic(
        boot,
        stack.names.completions,
        lambda vs: wanted <= {decode(Completion, v).request_id for v in vs},
        30,
    )
    done = {c.request_id: c for c in (decode(Completion, v) for v in raw) if c.request_id in wanted}
    assert [done[r.request_id].cache for r in (first, again, other)] == ["miss", "exact", "miss"]
    assert len(done[first.request_id].token_ids) == 8
    assert done[again.request_id].token_ids == done[first.request_id].token_ids
    assert done[again.request_id].text == done[first.request_id].text

    def events(rid: str) -> list[dict[str, Any]]:
        return [e.model_dump(exclude={"request_id"}) for e in rec.stream(rid)]

    assert events(again.request_id) == events(first.request_id)
    assert await redis.exists(stack.names.done_marker(again.request_id))


async def test_purge_then_redis_restart_rebuilds_the_semantic_index(
    stack: Stack, redis: aioredis.Redis, redis_server: Server
) -> None:
    first = await sse(stack, chat("How do I open a file for reading?"), BETA)
    assert first[0] != "exact"
    await asyncio.sleep(1.0)
    await asyncio.to_thread(redis_server.stop)
    await asyncio.to_thread(redis_server.start)
    # A fresh edge has an empty index: it rebuilds beta's from Redis and serves from it.
    stack.start("edge", name="fresh")
    await stack.wait_ready(within_s=240)
    para = await sse(stack, chat("How can I open a file for reading?"), BETA, edge="fresh")
    assert para[0] == "semantic"
    assert normalised(para[2], para[1]) == normalised(first[2], first[1])
    # A purge makes every answer of the tenant unreachable at once.
    out = await asyncio.to_thread(_cli, stack, "cache", "purge", "--tenant", "beta")
    assert out.returncode == 0, out.stderr
    assert (await sse(stack, chat("How can I open a file for reading?"), BETA))[0] == "miss"
    assert [k async for k in redis.scan_iter(match=stack.names.cache("beta", "x", "0", "*"))] == []


def _cli(st: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=st.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def batcher_metric(st: Stack, name: str, **labels: str) -> float:
    """The sum of the batcher's samples of ``name`` whose labels include ``labels``."""
    url = f"http://127.0.0.1:{st.metrics_ports['batcher']}/metrics"
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(url)).text
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(w in line for w in wanted)
    )


def kafka_ask(st: Stack, tenant: str, prompt: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        prompt=prompt,
        tenant=tenant,
        model=MODEL,  # as an edge's request names it: the same answer, the same marker
        cache=CacheMode.DEFAULT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
        reply=ReplyTarget(kafka_topic=st.names.completions),
    )


async def completions_of(st: Stack, wanted: set[str]) -> dict[str, list[Completion]]:
    """Every completion of ``wanted`` on the completions topic (read once all are there,
    then a moment more: a duplicate would follow its first)."""
    boot = st.env["TW_KAFKA_BOOTSTRAP"]

    def have(vs: list[bytes]) -> bool:
        return wanted <= {decode(Completion, v).request_id for v in vs}

    await read_topic(boot, st.names.completions, have, 60)
    await asyncio.sleep(1.0)
    raw = await read_topic(boot, st.names.completions, lambda _: False, 3)
    out: dict[str, list[Completion]] = {rid: [] for rid in wanted}
    for c in (decode(Completion, v) for v in raw):
        if c.request_id in wanted:
            out[c.request_id].append(c)
    return out


async def test_identical_kafka_misses_coalesce_in_the_batcher(stack: Stack) -> None:
    """N identical greedy requests produced to Kafka at once: the worker generates the
    answer once; the others wait for it off the batcher's window and are answered from
    the cache, each with one completion and the same tokens."""
    n = 6
    reqs = [kafka_ask(stack, "kafka-co", "List the planets in order.", 24) for _ in range(n)]
    wanted = {r.request_id for r in reqs}
    finished = await worker_finished(stack)
    coalesced = await batcher_metric(stack, "tw_cache_lookups_total", result="coalesced")
    async with StreamRecorder(stack.env["TW_REDIS_URL"], stack.names) as rec:
        await produce(
            stack.env["TW_KAFKA_BOOTSTRAP"], stack.names.requests, [encode(r) for r in reqs]
        )
        await rec.wait_finished(wanted, 60, stack=stack)
        streams = {
            rid: [e.model_dump(exclude={"request_id"}) for e in rec.stream(rid)] for rid in wanted
        }
    done = await completions_of(stack, wanted)
    assert all(len(cs) == 1 for cs in done.values()), {r: len(cs) for r, cs in done.items()}
    results = sorted(cs[0].cache.value for cs in done.values())
    assert results == ["exact"] * (n - 1) + ["miss"]
    tokens = {tuple(cs[0].token_ids) for cs in done.values()}
    assert len(tokens) == 1 and len(next(iter(tokens))) == 24
    assert len({orjson.dumps(s) for s in streams.values()}) == 1  # the same events each
    assert await finished_at_least(stack, finished + 1) == finished + 1
    after = await batcher_metric(stack, "tw_cache_lookups_total", result="coalesced")
    assert after == coalesced + n - 1


async def test_kafka_followers_of_a_cancelled_edge_leader_take_its_place(stack: Stack) -> None:
    """Identical misses on both paths share one marker: Kafka requests follow an edge's
    streamed leader; when it is cancelled, one of them is generated in its place and the
    others are answered from its entry."""
    prompt = "Recite a poem about mountains."
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 1800,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    followers = [kafka_ask(stack, "acme", prompt, 1800) for _ in range(3)]
    wanted = {r.request_id for r in followers}
    finished = await worker_finished(stack)
    counts = {
        result: await batcher_metric(stack, "tw_cache_lookups_total", result=result)
        for result in ("coalesced", "uncoalesced", "miss")
    }
    headers = {"Authorization": f"Bearer {ACME}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        url = stack.url() + "/v1/completions"
        async with http.stream("POST", url, json=body) as leader:
            assert leader.headers["x-tokenwire-cache"] == "miss"
            rid = leader.headers["x-request-id"]
            lines = leader.aiter_lines()
            async for line in lines:  # the leader is generating
                if line.startswith("data: {"):
                    break
            boot = stack.env["TW_KAFKA_BOOTSTRAP"]
            await produce(boot, stack.names.requests, [encode(r) for r in followers])
            # Their lookups are done: each missed and follows the leader.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                misses = await batcher_metric(stack, "tw_cache_lookups_total", result="miss")
                if misses >= counts["miss"] + 3:
                    break
                await asyncio.sleep(0.02)
            assert misses == counts["miss"] + 3
            assert await worker_finished(stack) == finished  # none of them generated yet
            cancel = await http.post(stack.url() + f"/v1/requests/{rid}/cancel")
            assert cancel.status_code == 200, cancel.text
            rest = [line async for line in lines]
        assert any("request_cancelled" in line for line in rest), rest[-3:]
    done = await completions_of(stack, wanted)
    assert all(len(cs) == 1 for cs in done.values()), {r: len(cs) for r, cs in done.items()}
    assert sorted(cs[0].cache.value for cs in done.values()) == ["exact", "exact", "miss"]
    assert len({tuple(cs[0].token_ids) for cs in done.values()}) == 1
    assert all(cs[0].finish_reason.value == "length" for cs in done.values())
    assert await finished_at_least(stack, finished + 2) == finished + 2
    for result, more in (("coalesced", 2), ("uncoalesced", 1)):
        now = await batcher_metric(stack, "tw_cache_lookups_total", result=result)
        assert now == counts[result] + more, result
