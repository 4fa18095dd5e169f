"""A rolling restart of every service, one at a time, under load: two workers, two
batchers and two edges on one topic prefix; each in turn gets SIGTERM (it drains and exits
by itself), is started again, and is ready before the next one goes.

Streaming clients submit short greedy, resumable requests through both edges in a loop: a
request refused (503) or whose connection fails before it is accepted goes to the other
edge; a stream cut after it was accepted is resumed on the other edge with
``Last-Event-ID``. Before each edge goes, a long stream is opened on it, so the edge has a
stream to hand over. A backend producer (``shared.producer.Producer``) submits Kafka-reply
requests a few times a second throughout.

- Every request the edges accepted is answered exactly once: SSE ids contiguous from 0
  over all its connections, one final event, ``[DONE]``; every Kafka-reply request gets
  exactly one Completion; each replay log holds seqs 0..n, no gap, no duplicate, one final
  event; every published stream is contiguous and its duplicates identical.
- Greedy outputs equal the stack's undisturbed run of the same prompts (made before the
  first restart), which equals the model's own ``generate`` on a sample.
- Each service ends by itself after SIGTERM (a worker or batcher with status 0, an edge by
  the signal uvicorn raises again once it has drained); no other process exits meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from services.bench.cluster import kill_stuck
from shared.codec import decode
from shared.messages import (
    BatcherStatus,
    GenerateRequest,
    ReplyTarget,
    SamplingParams,
    WorkerHeartbeat,
)
from shared.producer import Producer
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack, StreamRecorder, make_stack
from tests.integration.test_handoff import FAST_FAILOVER, greedy_requests, reference_tokens
from tests.integration.test_kafka_cluster import check_logs, completions
from tests.integration.test_kafka_outage import UNLIMITED

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

MAX_TOKENS = 8
LONG_TOKENS = 400  # a stream still open when its edge stops
PROMPTS = [str(r.prompt) for r in greedy_requests(6, MAX_TOKENS, seed=41)]
CLIENTS = 2  # one starting on each edge, each alternating between them
REPLY_EVERY_S = 1.0
SAMPLE = 2  # prompts checked against the model's own generate
EDGE_GRACE_S = "1"  # the edges' TW_SHUTDOWN_GRACE_S: open streams are cut after it
WORKERS = ("worker-a", "worker-b")
BATCHERS = ("batcher-a", "batcher-b")
EDGES = ("edge-a", "edge-b")


@dataclass
class Answer:
    """One accepted request as its client saw it, over every connection it took."""

    request_id: str
    prompt: str
    edges: list[str]
    accepted_at: float = field(default_factory=time.monotonic)
    ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    done: bool = False


@dataclass
class Load:
    """What the clients saw: accepted requests, refusals and failed connections that were
    retried elsewhere, and anything else (``errors``: each fails the test)."""

    answers: list[Answer] = field(default_factory=list)
    refused: Counter[int] = field(default_factory=Counter)
    unreachable: int = 0
    errors: list[str] = field(default_factory=list)

    def completed(self) -> int:
        return sum(a.done for a in self.answers)


def body_of(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "tokenwire-tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "resumable": True,
        "return_token_ids": True,
        "cache": "no-cache",  # the prompts repeat: every answer is generated
    }


async def read_events(resp: httpx.Response, answer: Answer) -> None:
    """The events of one connection, appended to ``answer`` (a cut raises)."""
    async for line in resp.aiter_lines():
        if line.startswith("id: "):
            answer.ids.append(int(line[4:]))
        elif line == "data: [DONE]":
            answer.done = True
        elif line.startswith("data: "):
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices", []):
                answer.token_ids += choice.get("token_ids") or []
                if choice.get("finish_reason") is not None:
                    answer.finish.append(choice["finish_reason"])
            if "error" in chunk:
                answer.finish.append(f"error: {chunk['error']}")


def other(edge: str) -> str:
    return EDGES[1 - EDGES.index(edge)]


async def submit(
    http: httpx.AsyncClient, st: Stack, prompt: str, edge: str, load: Load, max_tokens: int
) -> Answer | None:
    """One request, started on ``edge``: refused or unreachable, on the other edge (a
    refusal waits its Retry-After, at most half a second); once accepted, followed to its
    end, resumed on the other edge whenever a connection ends before ``[DONE]``."""
    deadline = time.monotonic() + 120
    answer: Answer | None = None
    while answer is None:
        if time.monotonic() > deadline:
            load.errors.append(f"{prompt!r}: never accepted")
            return None
        try:
            url = st.url(edge) + "/v1/completions"
            async with http.stream("POST", url, json=body_of(prompt, max_tokens)) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    if resp.status_code != 503:
                        load.errors.append(f"{prompt!r}: {resp.status_code} {text}")
                        return None
                    load.refused[resp.status_code] += 1
                    await asyncio.sleep(min(0.5, float(resp.headers.get("retry-after", 1))))
                    edge = other(edge)
                    continue
                answer = Answer(resp.headers["x-request-id"], prompt, [edge])
                load.answers.append(answer)
                await read_events(resp, answer)
        except httpx.TransportError:
            if answer is None:  # not accepted: a new request, elsewhere
                load.unreachable += 1
                edge = other(edge)
                await asyncio.sleep(0.05)
    while not answer.done:
        edge = other(edge)
        if time.monotonic() > deadline:
            load.errors.append(f"{answer.request_id}: not finished, ids {answer.ids}")
            return answer
        await resume(http, st, answer, edge, load)
    return answer


async def resume(http: httpx.AsyncClient, st: Stack, answer: Answer, edge: str, load: Load) -> None:
    """One connection resuming ``answer`` after its last event id, on ``edge``."""
    after = str(answer.ids[-1]) if answer.ids else "-1"
    url = f"{st.url(edge)}/v1/requests/{answer.request_id}/stream"
    try:
        async with http.stream(
            "GET", url, headers={"Last-Event-ID": after}, params={"return_token_ids": "true"}
        ) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                if resp.status_code != 503:
                    load.errors.append(f"{answer.request_id}: resume {resp.status_code} {text}")
                    answer.done = True  # give up on it: the error fails the test
                    return
                load.refused[resp.status_code] += 1
                await asyncio.sleep(0.2)
                return
            answer.edges.append(edge)
            await read_events(resp, answer)
    except httpx.TransportError:
        await asyncio.sleep(0.05)


async def client_loop(
    http: httpx.AsyncClient, st: Stack, first: str, load: Load, stop: asyncio.Event
) -> None:
    """Requests one after another until ``stop``, through alternating edges."""
    edges = itertools.cycle([first, other(first)])
    prompts = itertools.cycle(PROMPTS)
    while not stop.is_set():
        await submit(http, st, next(prompts), next(edges), load, MAX_TOKENS)


async def produce_replies(
    st: Stack, prompts: itertools.cycle[str], accepted: list[GenerateRequest], stop: asyncio.Event
) -> None:
    """Kafka-reply requests, one every REPLY_EVERY_S until ``stop``; ``accepted``: those
    whose send Kafka acknowledged."""
    async with Producer(st.settings, client_id=f"{st.prefix}-backend") as producer:
        while not stop.is_set():
            req = GenerateRequest(
                prompt=next(prompts),
                sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
                reply=ReplyTarget(kafka_topic=st.names.completions),
            )
            await producer.submit(req)
            accepted.append(req)
            await asyncio.sleep(REPLY_EVERY_S)


async def watch_alive(st: Stack, stop: asyncio.Event) -> None:
    """Fails as soon as a process the test did not stop has exited."""
    while not stop.is_set():
        st.check_alive()
        await asyncio.sleep(0.2)


async def ready(st: Stack, kind: str, name: str, since: float) -> None:
    """Wait until a restarted service serves: a worker's heartbeat from after ``since``
    with a partition of its own, a batcher's status from after ``since``, an edge's
    ``/readyz``."""
    deadline = time.monotonic() + 240  # a worker loads its model slowly on a busy machine
    redis = st.settings.redis.client()
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            while time.monotonic() < deadline:
                st.check_alive()
                if kind == "edge":
                    try:
                        if (await http.get(st.url(name) + "/readyz")).status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                elif kind == "worker":
                    raw = await redis.get(st.names.heartbeat(f"{st.prefix}-{name}"))
                    hb = decode(WorkerHeartbeat, raw) if raw else None
                    if hb is not None and hb.at > since and hb.partitions:
                        return
                else:
                    raw = await redis.get(st.names.batcher_status(f"{st.prefix}-{name}"))
                    if raw and decode(BatcherStatus, raw).at > since:
                        return
                await asyncio.sleep(0.2)
    finally:
        await redis.aclose()
    raise TimeoutError(f"{name} not ready again\n{st.logs()}")


def start(st: Stack, kind: str, name: str) -> None:
    if kind == "worker":
        st.start(kind, name, **FAST_FAILOVER, TW_MAX_RUNNING="8")
    elif kind == "batcher":
        st.start(kind, name, TW_BATCHER_ID=f"{st.prefix}-{name}")
    else:
        st.start(kind, name, **UNLIMITED, TW_SHUTDOWN_GRACE_S=EDGE_GRACE_S)


async def graceful_stop(st: Stack, name: str) -> int:
    """SIGTERM, and the exit status once the process has drained and ended by itself."""
    proc = st.procs.pop(name)
    proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.to_thread(proc.wait, 90)
    except subprocess.TimeoutExpired:
        kill_stuck(proc)
        raise AssertionError(
            f"{name} still runs 90 s after SIGTERM\n{st.logs(name, 300)}"
        ) from None


async def served_more(load: Load, n: int, st: Stack, via: str | None = None) -> None:
    """Wait until ``n`` more requests than now have completed through the edges (and,
    with ``via``, one accepted from now on by that edge)."""
    want, since = load.completed() + n, time.monotonic()

    def through_via() -> bool:
        return via is None or any(
            a.done and a.edges[0] == via and a.accepted_at > since for a in load.answers
        )

    deadline = time.monotonic() + 90
    while load.completed() < want or not through_via():
        assert time.monotonic() < deadline, f"{load.completed()} served, not {want}\n{st.logs()}"
        assert not load.errors, load.errors
        await asyncio.sleep(0.05)


async def test_a_rolling_restart_of_every_service_loses_and_repeats_nothing(
    infra: dict[str, str], model_dir: str
) -> None:
    t0 = time.monotonic()
    ARTIFACTS.mkdir(exist_ok=True)
    st = make_stack(new_prefix("rolling"), infra, model_dir, ARTIFACTS)
    await st.create_topics(partitions=2)
    sample = [GenerateRequest(prompt=p) for p in PROMPTS[:SAMPLE]]
    model = asyncio.create_task(asyncio.to_thread(reference_tokens, model_dir, sample, MAX_TOKENS))
    for kind, names in (("worker", WORKERS), ("batcher", BATCHERS), ("edge", EDGES)):
        for name in names:
            start(st, kind, name)
    load, long_load, warm_load = Load(), Load(), Load()
    replies: list[GenerateRequest] = []
    stop, done = asyncio.Event(), asyncio.Event()
    background: list[asyncio.Task[Any]] = []
    exits: dict[str, int] = {}
    at: dict[str, float] = {}
    try:
        await st.wait_ready(within_s=240, workers=2)
        for name in WORKERS:
            await ready(st, "worker", name, 0)  # both in the group, a partition each
        at["ready"] = time.monotonic()
        async with (
            httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as http,
            StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec,
        ):
            # The undisturbed run: each prompt once, before anything restarts.
            warm = await asyncio.gather(
                *(
                    submit(http, st, p, EDGES[i % 2], warm_load, MAX_TOKENS)
                    for i, p in enumerate(PROMPTS)
                )
            )
            undisturbed = {a.prompt: a.token_ids for a in warm if a is not None}
            assert len(undisturbed) == len(PROMPTS), warm
            background.append(asyncio.create_task(watch_alive(st, done)))
            background += [
                asyncio.create_task(client_loop(http, st, EDGES[i % 2], load, stop))
                for i in range(CLIENTS)
            ]
            replying = asyncio.create_task(
                produce_replies(st, itertools.cycle(PROMPTS), replies, stop)
            )
            background.append(replying)
            await served_more(load, CLIENTS, st)
            longs: list[asyncio.Task[Answer | None]] = []
            for kind, names in (("worker", WORKERS), ("batcher", BATCHERS), ("edge", EDGES)):
                for name in names:
                    if kind == "edge":  # a stream open on the edge when it stops
                        longs.append(await open_long(http, st, name, long_load))
                    exits[name] = await graceful_stop(st, name)
                    restarted = time.time()
                    at[f"{name} exited"] = time.monotonic()
                    start(st, kind, name)
                    await ready(st, kind, name, restarted)
                    at[f"{name} ready"] = time.monotonic()
                    await served_more(load, CLIENTS, st, via=name if kind == "edge" else None)
            stop.set()
            await asyncio.gather(*background[1:])  # the clients and the producer end
            long_answers = await asyncio.gather(*longs)
            answers = [*warm_load.answers, *load.answers, *long_load.answers]
            got = await completions(st, {r.request_id for r in replies}, within_s=90)
            await rec.wait_finished({a.request_id for a in answers}, within_s=60, stack=st)
            done.set()
            await asyncio.gather(*background)  # the watcher saw every process alive
        st.check_alive()
    finally:
        stop.set()
        done.set()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        st.stop_all()
        await asyncio.gather(model, return_exceptions=True)  # a thread: it ends by itself
    at["end"] = time.monotonic()
    print(
        f"{len(load.answers)} streams through the edges ({load.completed()} completed), "
        f"{sum(len(a.edges) > 1 for a in answers)} resumed on the other edge, "
        f"{sum(load.refused.values())} refused, {load.unreachable} edge unreachable; "
        f"{len(replies)} Kafka-reply requests; "
        + ", ".join(f"{k} at +{v - t0:.1f}s" for k, v in at.items())
    )

    # uvicorn ends a graceful shutdown by raising the signal it caught once more, so an
    # edge that drained ends by SIGTERM; the workers and batchers return 0.
    graceful = dict.fromkeys([*WORKERS, *BATCHERS], 0) | dict.fromkeys(EDGES, -signal.SIGTERM)
    assert exits == graceful, exits
    errors = [*warm_load.errors, *load.errors, *long_load.errors]
    assert not errors, errors
    for a in answers:
        rid = a.request_id
        assert a.done, f"{rid}: no [DONE]"
        assert a.ids == list(range(len(a.ids))), f"{rid}: ids {a.ids} over {a.edges}"
        assert a.finish == ["length"], f"{rid}: {a.finish}"
        assert a.token_ids[:MAX_TOKENS] == undisturbed[a.prompt], (rid, a.prompt)
    assert len({a.request_id for a in answers}) == len(answers)
    for a in long_answers:
        assert a is not None and len(a.token_ids) == LONG_TOKENS, a
    counts = Counter(c.request_id for c in got)
    by_id = {r.request_id: r for r in replies}
    assert {r: counts[r] for r in by_id if counts[r] != 1} == {}, "one Completion each"
    assert set(counts) == set(by_id), set(counts) - set(by_id)
    for c in got:
        assert c.token_ids == undisturbed[str(by_id[c.request_id].prompt)], c.request_id
    rids = [*(a.request_id for a in answers), *by_id]
    await check_logs(st, rids)
    for rid in rids:
        rec.stream(rid)  # as published: contiguous, one final event, duplicates identical

    reference = await model
    for r in sample:
        assert undisturbed[str(r.prompt)] == reference[r.request_id], r.prompt


async def open_long(http: httpx.AsyncClient, st: Stack, edge: str, load: Load) -> asyncio.Task[Any]:
    """A long stream started on ``edge``, once its first event has arrived there."""
    task = asyncio.create_task(submit(http, st, PROMPTS[0], edge, load, LONG_TOKENS))
    deadline = time.monotonic() + 60
    while not (load.answers and load.answers[-1].ids and load.answers[-1].edges[0] == edge):
        assert not task.done() or task.result() is None, "the long stream ended at once"
        assert time.monotonic() < deadline, f"no long stream on {edge}\n{st.logs()}"
        await asyncio.sleep(0.02)
    return task
