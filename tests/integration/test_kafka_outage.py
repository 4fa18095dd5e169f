"""The Kafka broker stopped under load and started again, through the whole stack (edge,
batcher, worker): once for 10 s, and once for longer than the producers' 30 s request
timeout.

Eight streaming clients submit short greedy requests in a loop; Kafka-reply requests are
at every stage when the broker goes (completed, generating, queued in the batcher: the
worker has few slots); from just before the broker stops until it is back, a new client
arrives four times a second (so sends are in flight while the broker shuts down).

- Every request the edge accepted (200) is answered exactly once: SSE ids contiguous from
  0, one final event, ``[DONE]``; each Kafka-reply request gets exactly one Completion.
- A request refused meanwhile gets 503 with Retry-After within the edge's Kafka timeout
  (never a 500, never a hang), and the same request succeeds once the broker is back.
- No process exits; greedy outputs equal an undisturbed run.
- The edge, the batcher and the worker show the outage on ``/readyz`` and in their Kafka
  gauge while it lasts, and log it once when it starts and once when it ends.

``TW_TEST_KAFKA_LONG_OUTAGE_S`` shortens the long outage (default 40 s); at 30 s or less it
no longer outlasts the producers' request timeout, which is what that case is for.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from aiokafka.errors import KafkaError

from services.bench.servers import Server
from shared.codec import encode
from shared.kafka_io import RenewingProducer, ensure_topics
from shared.messages import Completion, GenerateRequest
from shared.settings import CommonSettings
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import (
    Stack,
    StreamRecorder,
    completions,
    make_stack,
    produce,
)
from tests.integration.test_handoff import FAST_FAILOVER, greedy_requests, reference_tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LONG_OUTAGE_S = float(os.environ.get("TW_TEST_KAFKA_LONG_OUTAGE_S", "40"))
CLIENTS = 8
MAX_TOKENS = 8
REPLY_REQUESTS = 24
REPLY_MAX_TOKENS = 32
WORKER_SLOTS = 8  # few, so the batcher holds a queue of its own when the broker goes
EDGE_KAFKA_TIMEOUT_S = 10.0  # the edge's default TW_KAFKA_REQUEST_TIMEOUT_MS
ANSWER_SLACK_S = 5.0  # admission's own work on a busy 2-core machine
UNLIMITED = {"TW_RATE_REQUESTS_PER_MIN": "100000000", "TW_RATE_TOKENS_PER_MIN": "1000000000"}
PROMPTS = [r.prompt for r in greedy_requests(16, MAX_TOKENS, seed=21) if r.prompt is not None]
ARRIVAL_S = 0.25
SAMPLE = 3  # prompts (and Kafka-reply requests) checked against an undisturbed run


@dataclass
class Served:
    """A request the edge accepted, as its client saw the stream."""

    request_id: str
    prompt: str
    ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    done: bool = False


@dataclass
class Refused:
    """A request the edge did not accept."""

    prompt: str
    status: int
    retry_after: str | None
    answered_s: float
    body: str
    at: float = field(default_factory=time.monotonic)  # when it came back


@dataclass
class Load:
    """What the clients saw; ``errors``: anything neither served nor refused (a transport
    error, a client timeout)."""

    served: list[Served] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def request(self, http: httpx.AsyncClient, url: str, prompt: str) -> Refused | None:
        """One request, recorded; returns its refusal, if it was refused."""
        try:
            outcome = await one_request(http, url, prompt)
        except httpx.HTTPError as exc:
            self.errors.append(f"{prompt!r}: {exc!r}")
            return None
        if isinstance(outcome, Served):
            self.served.append(outcome)
            return None
        self.refused.append(outcome)
        return outcome


def body_of(prompt: str) -> dict[str, Any]:
    return {
        "model": "tokenwire-tiny",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        "cache": "no-cache",  # the prompts repeat: a cached answer would need no broker
    }


async def one_request(http: httpx.AsyncClient, url: str, prompt: str) -> Served | Refused:
    """One streamed request, read to its end."""
    started = time.monotonic()
    async with http.stream("POST", url, json=body_of(prompt)) as resp:
        answered_s = time.monotonic() - started
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            return Refused(
                prompt, resp.status_code, resp.headers.get("retry-after"), answered_s, text
            )
        served = Served(resp.headers["x-request-id"], prompt)
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                served.ids.append(int(line[4:]))
            elif line == "data: [DONE]":
                served.done = True
            elif line.startswith("data: "):
                chunk = orjson.loads(line[6:])
                for choice in chunk.get("choices", []):
                    served.token_ids += choice.get("token_ids", [])
                    if choice.get("finish_reason") is not None:
                        served.finish.append(choice["finish_reason"])
                if "error" in chunk:
                    served.finish.append(f"error: {chunk['error']}")
        return served


async def tried_again(
    http: httpx.AsyncClient, url: str, refused: Refused, tries: int = 3
) -> Served | Refused:
    """``refused``'s request sent again, as a client told to retry does: up to ``tries``
    times, each refusal's Retry-After waited out before the next."""
    outcome = await one_request(http, url, refused.prompt)
    for _ in range(tries - 1):
        if isinstance(outcome, Served):
            break
        await asyncio.sleep(float(outcome.retry_after or 1))
        outcome = await one_request(http, url, refused.prompt)
    return outcome


async def client_loop(
    http: httpx.AsyncClient, url: str, prompts: list[str], load: Load, stop: asyncio.Event
) -> None:
    """Submit requests one after another until ``stop``; after a refusal, wait as told
    (at most a second, to keep the load up)."""
    i = 0
    while not stop.is_set():
        refused = await load.request(http, url, prompts[i % len(prompts)])
        i += 1
        if refused is not None:
            await asyncio.sleep(min(1.0, float(refused.retry_after or 1)))


async def arrivals(
    http: httpx.AsyncClient, url: str, load: Load, stop: asyncio.Event
) -> list[asyncio.Task[Refused | None]]:
    """A new client every ``ARRIVAL_S`` until ``stop``, each with one request."""
    started: list[asyncio.Task[Refused | None]] = []
    while not stop.is_set():
        prompt = PROMPTS[len(started) % len(PROMPTS)]
        started.append(asyncio.create_task(load.request(http, url, prompt)))
        await asyncio.sleep(ARRIVAL_S)
    return started


@dataclass
class KafkaViews:
    """How each process shows Kafka over time: (monotonic time, its ``/readyz`` state of
    Kafka, its ``dependency_up`` gauge for Kafka)."""

    seen: dict[str, list[tuple[float, str, str]]] = field(default_factory=dict)

    async def watch(self, st: Stack, stop: asyncio.Event) -> None:
        ports = st.metrics_ports
        bases = {
            "edge": st.url(),
            **{name: f"http://127.0.0.1:{ports[name]}" for name in ("batcher", "worker")},
        }
        async with httpx.AsyncClient(timeout=5) as http:
            while not stop.is_set():
                for name, base in bases.items():
                    ready = (await http.get(base + "/readyz")).json().get("kafka", "?")
                    text = (await http.get(base + "/metrics")).text
                    gauge = re.search(
                        rf'^tw_{name}_dependency_up{{dependency="kafka"}} (\S+)$', text, re.M
                    )
                    view = (time.monotonic(), str(ready), gauge[1] if gauge else "?")
                    self.seen.setdefault(name, []).append(view)
                await asyncio.sleep(0.5)

    def down_between(self, name: str, start: float, end: float) -> bool:
        """Whether both views showed Kafka down at some time in ``[start, end]``."""
        views = [v for v in self.seen.get(name, []) if start <= v[0] <= end]
        return any(r != "ok" for _, r, _ in views) and any(g == "0.0" for _, _, g in views)

    def last(self, name: str) -> tuple[str, str]:
        _, ready, gauge = self.seen[name][-1]
        return ready, gauge

    def timeline(self, name: str, since: float) -> str:
        return " ".join(f"{t - since:.1f}:{r[:4]}/{g}" for t, r, g in self.seen.get(name, []))


def outage_lines(st: Stack, name: str) -> tuple[int, int]:
    """How often ``name`` logged Kafka going away and coming back."""
    text = (st.log_dir / f"{st.prefix}-{name}.log").read_text(errors="replace")
    return text.count("kafka is unreachable"), text.count("kafka is back")


async def served_at_least(st: Stack, load: Load, n: int, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while len(load.served) < n:
        st.check_alive()
        assert time.monotonic() < deadline, f"{len(load.served)} served, not {n}\n{st.logs()}"
        await asyncio.sleep(0.05)


def undisturbed(model_dir: str, replies: list[GenerateRequest]) -> dict[str, list[int]]:
    """Greedy outputs of the sampled prompts (by prompt) and Kafka-reply requests (by id),
    from the model itself. Greedy decoding extends its own prefix, so one run as long as
    the longest request serves both."""
    sample = greedy_requests(SAMPLE, MAX_TOKENS, seed=21)  # the first prompts of PROMPTS
    ref = reference_tokens(model_dir, [*sample, *replies[:SAMPLE]], REPLY_MAX_TOKENS)
    out = {str(r.prompt): ref[r.request_id][:MAX_TOKENS] for r in sample}
    return out | {r.request_id: ref[r.request_id] for r in replies[:SAMPLE]}


def check_served(served: Served) -> None:
    rid = served.request_id
    assert served.done, f"{rid}: no [DONE]"
    assert served.ids == list(range(len(served.ids))), f"{rid}: ids {served.ids}"
    assert served.finish == ["length"], f"{rid}: {served.finish}"
    assert len(served.token_ids) == MAX_TOKENS, f"{rid}: {served.token_ids}"


def check_clients(
    load: Load, retried: list[Served | Refused], expected: dict[str, list[int]]
) -> None:
    """Accepted requests answered exactly once and as an undisturbed run answers them;
    refused ones refused properly, and served when tried again."""
    assert not load.errors, load.errors
    for served in load.served:
        check_served(served)
    assert len({s.request_id for s in load.served}) == len(load.served)
    for refused in load.refused:
        assert refused.status == 503, refused
        assert refused.retry_after is not None and int(refused.retry_after) >= 1, refused
        assert refused.answered_s < EDGE_KAFKA_TIMEOUT_S + ANSWER_SLACK_S, refused
    for again in retried:
        assert isinstance(again, Served), again
        check_served(again)
    outputs = [*load.served, *(a for a in retried if isinstance(a, Served))]
    sampled = [s for s in outputs if s.prompt in expected]
    assert sampled
    for s in sampled:
        assert s.token_ids == expected[s.prompt], s.prompt


def check_replies(
    replies: list[GenerateRequest], got: list[Completion], expected: dict[str, list[int]]
) -> None:
    ids = sorted(c.request_id for c in got)
    assert ids == sorted(r.request_id for r in replies), "each exactly one Completion"
    for c in got:
        if c.request_id in expected:
            assert c.token_ids == expected[c.request_id], c.request_id


async def run_outage(
    infra: dict[str, str], model_dir: str, kafka: Server, outage_s: float, tag: str
) -> Load:
    """The scenario of this module with the broker away for ``outage_s``; returns what
    the clients saw, once every check has passed."""
    ARTIFACTS.mkdir(exist_ok=True)
    st = make_stack(
        new_prefix(tag), {**infra, "TW_KAFKA_BOOTSTRAP": kafka.url}, model_dir, ARTIFACTS
    )
    await st.create_topics()
    st.start("worker", **FAST_FAILOVER, TW_MAX_RUNNING=str(WORKER_SLOTS))
    st.start("batcher")
    st.start("edge", **UNLIMITED)
    replies = greedy_requests(
        REPLY_REQUESTS, REPLY_MAX_TOKENS, seed=22, reply_topic=st.names.completions
    )
    reply_ids = {r.request_id for r in replies}
    load = Load()
    views = KafkaViews()
    stop, back, checked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    background: list[asyncio.Task[Any]] = []
    at: dict[str, float] = {"begin": time.monotonic()}
    try:
        await st.wait_ready()
        at["ready"] = time.monotonic()
        url = st.url() + "/v1/completions"
        limits = httpx.Limits(max_connections=8 * CLIENTS)
        async with (
            httpx.AsyncClient(timeout=60, limits=limits) as http,
            StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec,
        ):
            clients = [
                asyncio.create_task(client_loop(http, url, PROMPTS[i::CLIENTS], load, stop))
                for i in range(CLIENTS)
            ]
            background += clients
            await served_at_least(st, load, 2 * CLIENTS)
            watcher = asyncio.create_task(views.watch(st, checked))
            background.append(watcher)
            await produce(
                st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests, [encode(r) for r in replies]
            )
            while len(rec.finished() & reply_ids) < REPLY_REQUESTS // 4:
                st.check_alive()
                await asyncio.sleep(0.05)
            newcomers = asyncio.create_task(arrivals(http, url, load, back))
            at["stop"] = time.monotonic()
            await asyncio.to_thread(kafka.stop)
            at["stopped"] = time.monotonic()
            # The reference run takes CPU the stack barely uses while the broker is away.
            reference = asyncio.create_task(asyncio.to_thread(undisturbed, model_dir, replies))
            background += [newcomers, reference]
            await asyncio.sleep(outage_s)
            await asyncio.to_thread(kafka.start)
            await st.create_topics()
            at["started"] = time.monotonic()
            back.set()
            await served_at_least(st, load, len(load.served) + 2 * CLIENTS)
            at["recovered"] = time.monotonic()
            stop.set()
            await asyncio.gather(*clients, *await newcomers)
            retried = [await tried_again(http, url, r) for r in load.refused]
            got = await completions(st, reply_ids, within_s=60)
            at["checked"] = time.monotonic()
            expected = await reference
            checked.set()
            await watcher
        st.check_alive()
        logged = {name: outage_lines(st, name) for name in ("edge", "batcher", "worker")}
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        st.stop_all()
    at["end"] = time.monotonic()
    steps = list(at.items())
    print(
        f"broker away {outage_s:g} s: {len(load.served)} served, {len(load.refused)} refused;",
        ", ".join(f"{b} +{tb - ta:.1f}s" for (_, ta), (b, tb) in itertools.pairwise(steps)),
    )

    for name in ("edge", "batcher", "worker"):
        print(f"{name} kafka (s after stop: readyz/gauge): {views.timeline(name, at['stopped'])}")
        print(f"{name} logged outages/returns: {logged[name]}")
    check_clients(load, retried, expected)
    check_replies(replies, got, expected)
    accepted = [s.request_id for s in [*load.served, *retried] if isinstance(s, Served)]
    for rid in [*accepted, *reply_ids]:
        rec.stream(rid)  # as published: contiguous, one final event, duplicates identical
    for name in ("edge", "batcher", "worker"):
        assert views.down_between(name, at["stopped"], at["started"]), name
        assert views.last(name) == ("ok", "1.0"), name
        assert logged[name] == (1, 1), f"{name}: one line when Kafka went, one when back"
    return load


async def test_kafka_away_10s_under_load(
    infra: dict[str, str], model_dir: str, own_kafka: Server
) -> None:
    await run_outage(infra, model_dir, own_kafka, 10.0, "kafka-10s")


async def test_kafka_away_past_the_producer_timeout_under_load(
    infra: dict[str, str], model_dir: str, own_kafka: Server
) -> None:
    load = await run_outage(infra, model_dir, own_kafka, LONG_OUTAGE_S, "kafka-long")
    assert load.refused, "arrivals during a long outage are refused"


async def test_a_producer_kafka_refuses_for_good_after_an_outage_is_renewed(
    own_kafka: Server,
) -> None:
    """The failure behind an edge that answered every request with 503 after a broker
    restart: a producer that read the cluster while its only broker shut down (its
    partitions then have no leader) lets a send expire, and aiokafka has spent that send's
    sequence number; the restarted broker refuses every later send to that partition
    (OutOfOrderSequenceNumber). The producer is replaced, and sends go through again."""
    settings = CommonSettings(kafka_bootstrap=own_kafka.url)
    await ensure_topics(settings, {"t": 1})
    producer = RenewingProducer(settings, client_id="test", request_timeout_ms=2000)
    await producer.start()
    try:
        await producer.send_and_wait("t", b"before")
        stopping = asyncio.create_task(asyncio.to_thread(own_kafka.stop))
        while not stopping.done():  # a read of the cluster during the shutdown
            await producer.client.force_metadata_update()
            await asyncio.sleep(0.02)
        lost = await producer.send("t", b"during")
        with pytest.raises(KafkaError):
            await asyncio.wait_for(lost, 10)  # expired while no broker answered
        await asyncio.to_thread(own_kafka.start)
        refused = 0
        deadline = time.monotonic() + 30
        while True:
            try:
                await asyncio.wait_for(producer.send_and_wait("t", b"after"), 10)
                break
            except KafkaError:
                refused += 1  # the one the broker refuses before the producer is renewed
                assert time.monotonic() < deadline, "sends still refused"
                await asyncio.sleep(0.2)
    finally:
        await producer.stop()
    assert producer.renewals == refused == 1
