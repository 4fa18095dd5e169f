"""The edge against real Kafka, Redis, a batcher, a worker and several edge processes:
the OpenAI client, resume on another edge, cancellation, keys and tenants, rate limits,
load shedding, validation, WebSocket, and a schemathesis run against the OpenAPI spec."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import redis.asyncio as aioredis
from openai.types.chat import ChatCompletionMessageParam
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from services.bench.prometheus import scrape
from services.edge.auth import hash_key
from shared import registry, token_stream
from shared.codec import decode, encode
from shared.messages import BatcherStatus, TokenEvent, WorkerHeartbeat
from tests.integration.harness import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tokenwire-tiny"
ACME, BETA, GAMMA, DELTA = (f"twk-test-{t}" for t in ("acme", "beta", "gamma", "delta"))
KEYS_ENV = f"{hash_key(ACME)}=acme,{hash_key(BETA)}=beta,{hash_key(DELTA)}=delta"
LONG = {"max_tokens": 1500, "ignore_eos": True, "temperature": 0}


@dataclass
class Edges:
    stack: Stack
    redis: aioredis.Redis

    def url(self, name: str) -> str:
        return self.stack.url(name)


@pytest.fixture(scope="module")
async def edges(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edges]:
    """Extra edges on the module's stack: ``a`` and ``b`` require keys, ``limited`` has
    tight rate limits, ``fuzz`` no rate limits and a small max_tokens, ``vast`` a context
    and a body limit larger than a Kafka record."""
    keyed = {"TW_AUTH": "required", "TW_API_KEYS": KEYS_ENV, "TW_LOAD_REFRESH_S": "0.2"}
    stack.start("edge", name="a", **keyed)
    stack.start("edge", name="b", **keyed, TW_KEEPALIVE_S="0.3")
    stack.start(
        "edge",
        name="limited",
        **keyed,
        TW_RATE_REQUESTS_PER_MIN="3",
        TW_RATE_TOKENS_PER_MIN="400",
    )
    stack.start(
        "edge",
        name="fuzz",
        **keyed,
        TW_RATE_REQUESTS_PER_MIN="0",
        TW_RATE_TOKENS_PER_MIN="0",
        TW_MAX_TOKENS_LIMIT="8",
        TW_MAX_BODY_BYTES="65536",
    )
    # A model whose context holds more tokens than a Kafka record, and a body limit above
    # a record's size: the edge's own checks pass a request that cannot go on the bus.
    vast = tmp_path_factory.mktemp("vast-context")
    served = Path(stack.env["TW_MODEL_DIR"])
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(served / name, vast / name)
    config = json.loads((served / "config.json").read_text())
    config["max_position_embeddings"] = 10_000_000
    (vast / "config.json").write_text(json.dumps(config))
    stack.start(
        "edge",
        name="vast",
        **keyed,
        TW_MODEL_DIR=str(vast),
        TW_MAX_BODY_BYTES="16000000",
        TW_RATE_TOKENS_PER_MIN="0",
    )
    client = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    await client.hset(stack.names.api_keys, hash_key(GAMMA), "gamma")  # a key kept in Redis
    try:
        await stack.wait_ready()
        yield Edges(stack, client)
    finally:
        await client.aclose()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


_LINES: weakref.WeakKeyDictionary[httpx.Response, AsyncIterator[str]] = weakref.WeakKeyDictionary()


async def sse(resp: httpx.Response, limit: int | None = None) -> list[tuple[int | None, str]]:
    """(id, data) of the SSE events of a response, stopping after ``limit`` with an id;
    a later call goes on where the last one stopped."""
    lines = _LINES.setdefault(resp, resp.aiter_lines())
    out: list[tuple[int | None, str]] = []
    event_id = None
    async for line in lines:
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            out.append((event_id, line[6:]))
            if limit is not None and event_id is not None and len(out) >= limit:
                break
            event_id = None
    return out


def texts(events: list[tuple[int | None, str]]) -> dict[int, str]:
    """seq → text of the token events (chunks with an id)."""
    out = {}
    for i, data in events:
        if i is not None:
            choice = orjson.loads(data)["choices"][0]
            out[i] = choice.get("text", choice.get("delta", {}).get("content", ""))
    return out


# --- the OpenAI client -------------------------------------------------------------------
async def test_openai_client_streaming_and_not_for_both_endpoints(edges: Edges) -> None:
    client = openai.AsyncOpenAI(base_url=edges.url("a") + "/v1", api_key=ACME, max_retries=0)
    prompt = "The function returns a list of"
    whole = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, temperature=0
    )
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole.usage is not None and whole.usage.prompt_tokens >= 1
    assert whole.choices[0].finish_reason in ("stop", "length")

    parts, finish, usage = [], None, None
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert "".join(parts) == whole.choices[0].text  # greedy: the same tokens either way
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    # vLLM's return_token_ids: the chunks' ids add up to the completion, streamed or not.
    with_ids = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0}
    with_ids["return_token_ids"] = True
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(edges.url("a") + "/v1/completions", json=with_ids, headers=auth(ACME))
        ids = r.json()["choices"][0]["token_ids"]
        async with http.stream(
            "POST",
            edges.url("b") + "/v1/completions",
            json={**with_ids, "stream": True},
            headers=auth(ACME),
        ) as resp:
            chunks = [orjson.loads(d)["choices"][0] for i, d in await sse(resp) if i is not None]
    assert len(ids) == whole.usage.completion_tokens
    assert [t for c in chunks for t in c["token_ids"]] == ids
    assert "".join(c["text"] for c in chunks) == whole.choices[0].text

    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What does the function return?"}
    ]
    chat = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    deltas, roles = [], []
    chat_stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    async for c in chat_stream:
        if c.choices:
            deltas.append(c.choices[0].delta.content or "")
            roles.append(c.choices[0].delta.role)
    assert "".join(deltas) == chat.choices[0].message.content
    assert roles[0] == "assistant"

    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    await client.close()


async def test_health_readiness_and_metrics(edges: Edges) -> None:
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ok", "kafka": "ok", "redis": "ok", "pubsub": "ok"}
        metrics = (await http.get("/metrics")).text
    assert "tw_edge_events_relayed_total" in metrics
    assert 'tw_edge_requests_total{route="/v1/completions",status="200"}' in metrics
    assert "tw_edge_first_event_seconds_bucket" in metrics


# --- keys and tenants ----------------------------------------------------------------
async def test_requests_need_a_valid_key(edges: Edges) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        for headers in ({}, auth("twk-wrong"), {"Authorization": "Basic abc"}):
            r = await http.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["error"]["type"] == "authentication_error"
        assert (await http.get("/v1/models")).status_code == 401
        # A key registered in Redis (hashed) works like one from the settings.
        r = await http.post("/v1/completions", json=body, headers=auth(GAMMA))
        assert r.status_code == 200, r.text
    # An edge without TW_AUTH=required serves anonymous calls as tenant "default".
    async with httpx.AsyncClient(base_url=edges.url("edge"), timeout=30) as http:
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert await edges.redis.get(edges.stack.names.owner(r.json()["id"])) == b"default"


async def test_another_tenant_cannot_resume_or_cancel(edges: Edges) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "resumable": True}
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        rid = (await http.post("/v1/completions", json=body, headers=auth(ACME))).json()["id"]
        assert await edges.redis.get(edges.stack.names.owner(rid)) == b"acme"
        for path in (f"/v1/requests/{rid}/stream",):
            assert (await http.get(path, headers=auth(BETA))).status_code == 404
        assert (
            await http.post(f"/v1/requests/{rid}/cancel", headers=auth(BETA))
        ).status_code == 404
        missing = await http.get("/v1/requests/cmpl-nope/stream", headers=auth(ACME))
        assert missing.status_code == 404
        async with http.stream("GET", f"/v1/requests/{rid}/stream", headers=auth(ACME)) as r:
            assert r.status_code == 200
            events = await sse(r)
    assert events[-1] == (None, "[DONE]")
    assert sorted(texts(events)) == list(range(len(texts(events))))


# --- resume ----------------------------------------------------------------------------
async def test_resume_on_another_edge_with_last_event_id(edges: Edges) -> None:
    body = {"model": MODEL, "prompt": "Return the", "stream": True, "resumable": True, **LONG}
    body["max_tokens"] = 60
    k = 5
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream(
            "POST", edges.url("a") + "/v1/completions", json=body, headers=auth(ACME)
        ) as r:
            rid = r.headers["x-request-id"]
            first = await sse(r, limit=k)  # then drop the connection mid-stream
        assert [i for i, _ in first] == list(range(k))
        last = first[-1][0]
        async with http.stream(
            "GET",
            edges.url("b") + f"/v1/requests/{rid}/stream",
            headers={**auth(ACME), "Last-Event-ID": str(last)},
        ) as r:
            assert r.status_code == 200
            rest = await sse(r)
        # After the end, a fresh reader gets the whole stream from the replay log.
        async with http.stream(
            "GET", edges.url("a") + f"/v1/requests/{rid}/stream", headers=auth(ACME)
        ) as r:
            replay = await sse(r)
        # Resuming after the final event: nothing is missing, so only the end marker.
        final_id = max(texts(replay))
        async with http.stream(
            "GET",
            edges.url("b") + f"/v1/requests/{rid}/stream",
            headers={**auth(ACME), "Last-Event-ID": str(final_id)},
        ) as r:
            after_end = await sse(r)
    assert rest[-1] == (None, "[DONE]")
    ids = [i for i, _ in rest if i is not None]
    assert ids == list(range(k, final_id + 1))  # exactly the missed events: no gap, no dup
    assert {**texts(first), **texts(rest)} == texts(replay)
    assert len(texts(replay)) == final_id + 1 and final_id >= k
    assert after_end == [(None, "[DONE]")]


async def test_keepalives_while_waiting_then_the_live_events(edges: Edges) -> None:
    """A stream opened before its request produced anything: comments keep it open, then
    the events arrive live (seq as SSE id) and the stream ends with [DONE]."""
    names = edges.stack.names
    rid = f"cmpl-late{uuid.uuid4().hex[:8]}"
    await edges.redis.set(names.owner(rid), "acme", ex=60)
    events = [
        TokenEvent(request_id=rid, seq=i, text=f"t{i}", finish_reason="stop" if i == 2 else None)
        for i in range(3)
    ]
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("GET", edges.url("b") + f"/v1/requests/{rid}/stream", headers=auth(ACME)) as r,
    ):
        async for line in r.aiter_lines():
            lines.append(line)
            if line == ": keep-alive" and lines.count(line) == 2:
                await token_stream.publish_events(edges.redis, names, events)
    assert lines.count(": keep-alive") >= 2
    assert [ln for ln in lines if ln.startswith("id: ")] == ["id: 0", "id: 1", "id: 2"]
    assert lines[-2] == "data: [DONE]"


async def test_shared_subscriber_survives_a_dropped_connection(edges: Edges) -> None:
    """Kill the edge's pub/sub connection mid-stream: it reconnects, reads what it missed
    from the replay log, and the client sees every event once."""
    body = {"model": MODEL, "prompt": "The list", "stream": True, **LONG, "max_tokens": 200}
    pid = edges.stack.procs["a"].pid
    name = f"tw-edge:{edges.stack.prefix}:{pid}"
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", edges.url("a") + "/v1/completions", json=body, headers=auth(ACME)) as r,
    ):
        got = await sse(r, limit=3)
        (conn,) = [c for c in await edges.redis.client_list() if c.get("name") == name]
        await edges.redis.execute_command("CLIENT", "KILL", "ID", conn["id"])
        got += await sse(r)
        metrics = (await http.get(edges.url("a") + "/metrics")).text
    ids = [i for i, _ in got if i is not None]
    assert ids == list(range(len(ids)))
    assert orjson.loads(got[-2][1])["choices"][0]["finish_reason"] == "length"
    assert "tw_edge_pubsub_reconnects 1.0" in metrics


# --- cancellation ----------------------------------------------------------------------
async def _heartbeat(edges: Edges) -> WorkerHeartbeat:
    n = edges.stack.names
    (raw,) = await registry.read_live(edges.redis, n.workers_index, n.heartbeat, 3.0)
    return decode(WorkerHeartbeat, raw)


async def _wait_idle_worker(edges: Edges, within_s: float = 30) -> WorkerHeartbeat:
    deadline = time.monotonic() + within_s
    while True:
        hb = await _heartbeat(edges)
        if (hb.running == 0 and hb.kv_used_tokens == 0) or time.monotonic() > deadline:
            return hb
        await asyncio.sleep(0.2)


async def test_cancel_mid_stream_ends_it_and_frees_the_sequence(edges: Edges) -> None:
    body = {"model": MODEL, "prompt": "The module", "stream": True, **LONG}
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream(
            "POST", edges.url("a") + "/v1/completions", json=body, headers=auth(ACME)
        ) as r:
            rid = r.headers["x-request-id"]
            got = await sse(r, limit=3)
            ack = await http.post(edges.url("b") + f"/v1/requests/{rid}/cancel", headers=auth(ACME))
            assert ack.status_code == 200, ack.text
            got += await sse(r)
    info = ack.json()
    assert info["status"] == "cancelled" and info["finish_reason"] == "cancelled"
    ids = [i for i, _ in got if i is not None]
    assert ids == list(range(len(ids)))
    assert ids[-1] == info["last_event_id"]  # no token after the acknowledged end
    # OpenAI's finish reasons have no "cancelled": the stream ends with an error.
    final = orjson.loads(got[-2][1])
    assert final["error"]["code"] == "request_cancelled", final
    assert info["usage"]["completion_tokens"] < LONG["max_tokens"]
    hb = await _wait_idle_worker(edges)
    assert (hb.running, hb.kv_used_tokens) == (0, 0)
    # Cancelling a finished request reports how it ended.
    async with httpx.AsyncClient(timeout=30) as http:
        again = await http.post(edges.url("a") + f"/v1/requests/{rid}/cancel", headers=auth(ACME))
    assert again.json()["last_event_id"] == info["last_event_id"]


async def test_cancel_right_after_submission(edges: Edges) -> None:
    """A cancel that may reach the bus before any worker holds the request (still in the
    batcher's window) ends it all the same."""
    body = {"model": MODEL, "prompt": "The class", "stream": True, **LONG}
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", edges.url("a") + "/v1/completions", json=body, headers=auth(ACME)) as r,
    ):
        rid = r.headers["x-request-id"]
        ack = await http.post(edges.url("a") + f"/v1/requests/{rid}/cancel", headers=auth(ACME))
        events = await sse(r)
    assert ack.json()["status"] == "cancelled"
    assert orjson.loads(events[-2][1])["error"]["code"] == "request_cancelled"
    assert len(events) - 1 < LONG["max_tokens"]


async def test_disconnect_cancels_a_non_resumable_stream(edges: Edges) -> None:
    body = {"model": MODEL, "prompt": "If the argument", "stream": True, **LONG}
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", edges.url("a") + "/v1/completions", json=body, headers=auth(ACME)) as r,
    ):
        rid = r.headers["x-request-id"]
        await sse(r, limit=2)
    events = [
        ev
        async for ev in token_stream.follow(edges.redis, edges.stack.names, rid, idle_timeout_s=30)
    ]
    assert events[-1].finish_reason == "cancelled"
    assert len(events) < LONG["max_tokens"]


async def test_a_non_streamed_client_giving_up_cancels(edges: Edges) -> None:
    names = edges.stack.names
    pattern = names.owner("cmpl-*")
    before = {k async for k in edges.redis.scan_iter(match=pattern, count=1000)}
    body = {"model": MODEL, "prompt": "The value", **LONG}
    # Gives up well inside the 1,500 tokens' time: an idle machine ran them in 1.5 s, the
    # read timeout this had, and the request finished by length before its cancel.
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=0.5)) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(edges.url("a") + "/v1/completions", json=body, headers=auth(ACME))
    new: set[Any] = set()
    for _ in range(50):  # the edge may still be writing the owner key
        new = {k async for k in edges.redis.scan_iter(match=pattern, count=1000)} - before
        if new:
            break
        await asyncio.sleep(0.1)
    (key,) = new
    rid = names.tag_of(key)
    events = [ev async for ev in token_stream.follow(edges.redis, names, rid, idle_timeout_s=30)]
    assert events[-1].finish_reason == "cancelled"


# --- WebSocket -------------------------------------------------------------------------
async def test_websocket_streams_cancels_and_resumes(edges: Edges) -> None:
    url = edges.url("a").replace("http://", "ws://") + "/v1/ws"
    async with ws_connect(url) as ws:
        await ws.send(
            orjson.dumps({"type": "completions", "body": {"model": MODEL, "prompt": "x"}})
        )
        refused = orjson.loads(await ws.recv())
        assert refused["type"] == "error" and refused["status"] == 401
    async with ws_connect(url, additional_headers=auth(ACME)) as ws:
        body = {"model": MODEL, "prompt": "The function", "max_tokens": 12, "temperature": 0}
        await ws.send(orjson.dumps({"type": "completions", "body": body}))
        frames = await _ws_until_done(ws)
        rid = frames[0]["id"]
        events = [f for f in frames if f["type"] == "event"]
        assert [f["id"] for f in events] == list(range(len(events)))
        assert frames[-2]["type"] == "usage" and frames[-1] == {"type": "done"}
        # The same events as the SSE replay of that request.
        await ws.send(orjson.dumps({"type": "resume", "request_id": rid, "last_event_id": 2}))
        resumed = [f for f in await _ws_until_done(ws) if f["type"] == "event"]
        assert [f["id"] for f in resumed] == [f["id"] for f in events[3:]]
        assert [f["data"] for f in resumed] == [f["data"] for f in events[3:]]
        # Cancel the request being relayed with a message on the same socket.
        long = {"model": MODEL, **LONG, "messages": [{"role": "user", "content": "hi"}]}
        await ws.send(orjson.dumps({"type": "chat.completions", "body": long}))
        n = 0
        while n < 3:
            n += orjson.loads(await ws.recv())["type"] == "event"
        await ws.send(orjson.dumps({"type": "cancel"}))
        frames = await _ws_until_done(ws)
        assert frames[-3]["type"] == "error", frames[-3:]
        assert frames[-3]["error"]["code"] == "request_cancelled"
        await ws.send(orjson.dumps({"type": "resume", "request_id": rid.replace("cmpl", "x")}))
        assert orjson.loads(await ws.recv())["status"] == 404


async def test_websocket_says_why_a_frame_is_no_message_and_serves_on(edges: Edges) -> None:
    url = edges.url("a").replace("http://", "ws://") + "/v1/ws"
    async with ws_connect(url, additional_headers=auth(ACME)) as ws:
        for frame, why in (
            (b"\xff\xfe", "not valid JSON"),
            ('{"type": "completions", "body": {"prompt": "\\ud800"}}', "not valid JSON"),
            ("[1, 2]", "not a JSON object"),
        ):
            await ws.send(frame)
            answer = orjson.loads(await ws.recv())
            assert answer["type"] == "error" and answer["status"] == 400, answer
            assert answer["error"]["message"].startswith(
                f"a message must be a JSON object: it was {why}"
            )
        await ws.send(orjson.dumps({"type": "nope"}))
        assert "unknown message type" in orjson.loads(await ws.recv())["error"]["message"]
        body = {"model": MODEL, "prompt": "The function", "max_tokens": 3, "temperature": 0}
        await ws.send(orjson.dumps({"type": "completions", "body": body}))
        assert (await _ws_until_done(ws))[-1] == {"type": "done"}


async def test_websocket_answers_messages_sent_during_a_relay(edges: Edges) -> None:
    """A message that arrives while a request is relayed waits its turn; none is dropped."""
    url = edges.url("a").replace("http://", "ws://") + "/v1/ws"
    async with ws_connect(url, additional_headers=auth(ACME)) as ws:
        for prompt in ("The function", "The module"):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            await ws.send(orjson.dumps({"type": "completions", "body": body}))
        first, second = await _ws_until_done(ws), await _ws_until_done(ws)
        assert first[0]["type"] == second[0]["type"] == "request"
        assert first[0]["id"] != second[0]["id"]
        assert first[-1] == second[-1] == {"type": "done"}


async def _ws_until_done(ws: ClientConnection) -> list[dict[str, Any]]:
    frames = []
    while True:
        f = orjson.loads(await ws.recv())
        frames.append(f)
        if f["type"] == "done" or (f["type"] == "error" and "status" in f):  # or a refusal
            return frames


# --- admission ---------------------------------------------------------------------------
async def test_rate_limits_answer_429_with_retry_after(edges: Edges) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
    async with httpx.AsyncClient(base_url=edges.url("limited"), timeout=30) as http:
        codes = [
            (await http.post("/v1/completions", json=body, headers=auth(BETA))).status_code
            for _ in range(3)
        ]
        burst = await http.post("/v1/completions", json=body, headers=auth(BETA))
        # Another key has buckets of its own; a request bigger than a whole minute of
        # tokens can never pass and says so.
        big = await http.post(
            "/v1/completions", json={**body, "max_tokens": 450}, headers=auth(DELTA)
        )
        tokens = [
            (
                await http.post(
                    "/v1/completions", json={**body, "max_tokens": 150}, headers=auth(DELTA)
                )
            ).status_code
            for _ in range(3)
        ]
    assert codes == [200, 200, 200]
    assert burst.status_code == 429 and burst.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(burst.headers["retry-after"]) >= 1
    assert big.status_code == 429 and big.json()["error"]["code"] == "request_too_large"
    assert tokens[:2] == [200, 200] and tokens[2] == 429  # 400 tokens a minute


async def test_queue_depth_sheds_load_with_503(edges: Edges) -> None:
    names = edges.stack.names
    fake = BatcherStatus(batcher_id="fake", queued_requests=1_000_000, paused=True)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        pipe = edges.redis.pipeline(transaction=False)
        registry.advertise(
            pipe, names.batchers_index, "fake", names.batcher_status("fake"), encode(fake), 30
        )
        await pipe.execute()
        try:
            r = await _poll_status(http, body, 503)
            assert r.json()["error"]["code"] == "overloaded" and "retry-after" in r.headers
        finally:
            pipe = edges.redis.pipeline(transaction=False)
            registry.withdraw(pipe, names.batchers_index, "fake", names.batcher_status("fake"))
            await pipe.execute()
        await _poll_status(http, body, 200)


async def _poll_status(
    http: httpx.AsyncClient, body: dict[str, object], want: int, within_s: float = 15
) -> httpx.Response:
    deadline = time.monotonic() + within_s
    while True:
        r = await http.post("/v1/completions", json=body, headers=auth(ACME))
        if r.status_code == want or time.monotonic() > deadline:
            assert r.status_code == want, r.text
            return r
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    ("patch", "code"),
    [
        ({"max_tokens": -5}, None),
        ({"max_tokens": 10_000}, None),
        ({"prompt": "word " * 2100}, "context_length_exceeded"),
        ({"prompt": "word " * 1000, "max_tokens": 1500}, "context_length_exceeded"),
        ({"prompt": ""}, None),
        ({"n": 17}, None),
        ({"stop": ["x"] * 20}, None),
        ({"temperature": "hot"}, None),
        ({"best_of": 2}, "unsupported_parameter"),
        ({"presence_penalty": 3}, None),
        ({"logit_bias": {"x": 1}}, None),
        # Past 64 bits (the wire's encoder refused it: a 500), a digit that is not 0-9, an
        # id the vocabulary does not have.
        ({"logit_bias": {"99999999999999999999": 1}}, None),
        ({"logit_bias": {"\u00b2": 1}}, None),
        ({"logit_bias": {"4096": 1}}, None),
        ({"stop_token_ids": [4096]}, None),
        ({"logprobs": 6}, None),
        ({"min_p": 1.5}, None),
        ({"min_p": -0.1}, None),
        ({"include_stop_str_in_output": "maybe"}, None),
        ({"suffix": "x"}, "unsupported_parameter"),
        ({"stop": 5}, None),
    ],
)
async def test_bad_parameters_are_400(
    edges: Edges, patch: dict[str, object], code: str | None
) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **patch}
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        r = await http.post("/v1/completions", json=body, headers=auth(ACME))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if code:
        assert err["code"] == code
    if code == "unsupported_parameter":
        [name] = [k for k in patch]
        assert err["param"] == name and name in err["message"]
    if "stop" in patch:  # a union's error names the field, not pydantic's member path
        assert err["param"] == "stop", err
    for named in ("min_p", "include_stop_str_in_output", "logit_bias", "stop_token_ids"):
        if named in patch:
            assert err["param"] == named, err


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/completions", b'"prompt": "hi \\ud800 there"'),
        ("/v1/completions", b'"prompt": "hi", "stop": ["\\udc00"]'),
        ("/v1/chat/completions", b'"messages": [{"role": "user", "content": "\\ud83d!"}]'),
    ],
)
async def test_a_lone_surrogate_is_a_json_error(edges: Edges, path: str, field: bytes) -> None:
    """A "\\ud800" escape with no pair is no character: the standard library's JSON parser
    made it a str that no tokenizer or encoder takes (a 500); it is a JSON error."""
    body = b'{"model": "' + MODEL.encode() + b'", "max_tokens": 2, ' + field + b"}"
    headers = {**auth(ACME), "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        r = await http.post(path, content=body, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] is None
    assert err["message"].startswith("the body is not valid JSON: "), err


async def test_a_logit_bias_reaches_the_sampler(edges: Edges) -> None:
    # The bias maps token ids to amounts: JSON keys are strings on the wire and ints in the
    # sampler (it was answered 500: the wire encoder refused the int keys). A bias of 100
    # makes its token every greedy pick.
    body = {
        "model": MODEL,
        "prompt": "The function",
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logit_bias": {"42": 100},
    }
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=60) as http:
        r = await http.post("/v1/completions", json=body, headers=auth(ACME))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == [42] * 4


async def test_an_unknown_model_is_404_and_each_model_can_be_read(edges: Edges) -> None:
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        body = {"model": "gpt-nope", "prompt": "Hi", "max_tokens": 2}
        r = await http.post("/v1/completions", json=body, headers=auth(ACME))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        one = await http.get(f"/v1/models/{MODEL}", headers=auth(ACME))
        assert one.status_code == 200 and one.json()["id"] == MODEL, one.text
        missing = await http.get("/v1/models/gpt-nope", headers=auth(ACME))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        meta = {**body, "model": MODEL, "user": "u", "metadata": {"k": "v"}, "temperature": None}
        ok = await http.post("/v1/completions", json=meta, headers=auth(ACME))
        assert ok.status_code == 200, ok.text


async def test_a_request_larger_than_a_kafka_record_gets_413(edges: Edges) -> None:
    """A body the edge accepts can still hold a request no Kafka record holds (4 MiB): a
    prompt of 1.5M three-byte characters under a 16 MB body limit, within a 10M-token
    context. It is refused as too large, not as Kafka being away."""
    body = {"model": MODEL, "prompt": "中" * 1_500_000, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=edges.url("vast"), timeout=60) as http:
        r = await http.post("/v1/completions", json=body, headers=auth(ACME))
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large"
        assert "Kafka record" in r.json()["error"]["message"]
        ok = await http.post(
            "/v1/completions", json={**body, "prompt": "hello"}, headers=auth(ACME)
        )
        assert ok.status_code == 200, ok.text


async def test_malformed_and_oversized_bodies(edges: Edges) -> None:
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        for raw in (b"{not json", b"[]", b'"x"', b"", b'{"model": "tokenwire-tiny"}'):
            r = await http.post(
                "/v1/completions",
                content=raw,
                headers={**auth(ACME), "content-type": "application/json"},
            )
            assert r.status_code == 400, (raw, r.text)
        big = {"model": MODEL, "prompt": "x" * 1_100_000}
        r = await http.post("/v1/chat/completions", json=big, headers=auth(ACME))
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            for _ in range(40):
                yield b"x" * 32_768

        r = await http.post("/v1/completions", content=chunks(), headers=auth(ACME))
        assert r.status_code == 413
        bad_id = await http.get("/v1/requests/a b/stream", headers=auth(ACME))
        assert bad_id.status_code == 400
        bad_last = await http.get(
            "/v1/requests/cmpl-x/stream", headers={**auth(ACME), "Last-Event-ID": "x"}
        )
        assert bad_last.status_code == 400


async def test_schemathesis_finds_no_server_errors(edges: Edges) -> None:
    """Fuzz every operation of the OpenAPI document (valid and invalid inputs) against a
    live edge: no input may produce a 5xx."""
    url = edges.url("fuzz")
    args = [
        "run",
        f"{url}/openapi.json",
        "--checks=not_a_server_error",
        "--max-examples=40",
        "--seed=7",
        "--workers=1",  # its generator is not thread-safe (flaky internal errors with 2)
        "--phases=examples,coverage,fuzzing",
        "--request-timeout=20",
        f"--header=Authorization: Bearer {ACME}",
        "--suppress-health-check=all",
        "--generation-database=none",
        "--no-color",
    ]
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(ROOT / ".venv/bin/schemathesis"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=artifacts,  # where it keeps its own state
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    report = out.decode(errors="replace")
    (artifacts / "edge-schemathesis.txt").write_text(report)
    assert proc.returncode == 0, report[-8000:]


async def test_stop_token_ids_end_a_completion(edges: Edges) -> None:
    body = {
        "model": MODEL,
        "prompt": "The function",
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=60) as http:
        free = await http.post("/v1/completions", json=body, headers=auth(ACME))
        ids = free.json()["choices"][0]["token_ids"]
        assert len(ids) == 8, free.text
        # The last of the first six tokens whose id did not come before it.
        stop_at = max(i for i, t in enumerate(ids[:6]) if ids.index(t) == i)
        stopped = await http.post(
            "/v1/completions",
            json={**body, "stop_token_ids": [ids[stop_at]]},  # EOS still ignored
            headers=auth(ACME),
        )
        held = await http.post(  # min_tokens: the stop id cannot end it before 7 tokens
            "/v1/completions",
            json={**body, "stop_token_ids": [ids[stop_at]], "min_tokens": 7},
            headers=auth(ACME),
        )
    choice = stopped.json()["choices"][0]
    assert choice["token_ids"] == ids[: stop_at + 1], stopped.text
    assert choice["finish_reason"] == "stop"
    assert len(held.json()["choices"][0]["token_ids"]) >= 7, held.text


async def test_include_stop_str_in_output_keeps_the_stop_string(edges: Edges) -> None:
    """A stop string taken from the greedy output ends it there: cut by default, kept at
    the end with ``include_stop_str_in_output``; both endpoints, streamed and not."""
    client = openai.AsyncOpenAI(base_url=edges.url("a") + "/v1", api_key=ACME, max_retries=0)
    common: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "temperature": 0}
    ignore_eos = {"ignore_eos": True, "cache": "no-cache"}
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is a list?"}]

    async def completion(stream: bool, **extra: Any) -> str:
        body = {**ignore_eos, **extra}
        if not stream:
            r = await client.completions.create(
                prompt="The function returns", extra_body=body, **common
            )
            return r.choices[0].text
        chunks = await client.completions.create(
            prompt="The function returns", stream=True, extra_body=body, **common
        )
        return "".join([c.choices[0].text async for c in chunks if c.choices])

    async def chat(stream: bool, **extra: Any) -> str:
        body = {**ignore_eos, **extra}
        if not stream:
            r = await client.chat.completions.create(messages=msgs, extra_body=body, **common)
            return r.choices[0].message.content or ""
        chunks = await client.chat.completions.create(
            messages=msgs, stream=True, extra_body=body, **common
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    for ask in (completion, chat):
        full = await ask(False)
        assert len(full) >= 8, full
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        before = full[: full.index(stop)]
        for stream in (False, True):
            cut = await ask(stream, stop=[stop])
            kept = await ask(stream, stop=[stop], include_stop_str_in_output=True)
            assert cut == before, (ask.__name__, stream, full, stop, cut)
            assert kept == before + stop, (ask.__name__, stream, full, stop, kept)
    await client.close()


async def test_min_p_reaches_the_sampler(edges: Edges) -> None:
    """At a hot temperature a seeded request wanders off the greedy text; with ``min_p``
    1 only the top token stays, so the same request gives the greedy text exactly."""
    client = openai.AsyncOpenAI(base_url=edges.url("a") + "/v1", api_key=ACME, max_retries=0)
    common: dict[str, Any] = {"model": MODEL, "prompt": "The function returns", "max_tokens": 16}
    extra = {"ignore_eos": True}
    greedy = await client.completions.create(temperature=0, extra_body=extra, **common)
    hot = {"temperature": 2.0, "seed": 7}
    wild = await client.completions.create(**hot, extra_body=extra, **common)
    held = await client.completions.create(**hot, extra_body={**extra, "min_p": 1.0}, **common)
    assert wild.choices[0].text != greedy.choices[0].text
    assert held.choices[0].text == greedy.choices[0].text
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is a list?"}]
    chat_greedy = await client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=16, temperature=0, extra_body=extra
    )
    chat_held = await client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=16, **hot, extra_body={**extra, "min_p": 1.0}
    )
    assert chat_held.choices[0].message.content == chat_greedy.choices[0].message.content
    await client.close()


async def test_tokenize_and_detokenize_agree_with_what_the_worker_counts(edges: Edges) -> None:
    prompt = "The function returns a list of values"
    msgs = [{"role": "user", "content": "What is a list?"}]
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=60, headers=auth(ACME)) as http:
        tok = (await http.post("/tokenize", json={"model": MODEL, "prompt": prompt})).json()
        done = await http.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
        )
        assert tok["count"] == len(tok["tokens"]) == done.json()["usage"]["prompt_tokens"]
        assert tok["max_model_len"] == 2048
        back = await http.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]})
        assert back.json()["prompt"] == prompt
        chat = (await http.post("/tokenize", json={"model": MODEL, "messages": msgs})).json()
        answered = await http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 1}
        )
        assert chat["count"] == answered.json()["usage"]["prompt_tokens"]
        refusals = [
            ("/tokenize", {"model": MODEL}, 400),
            ("/tokenize", {"model": MODEL, "prompt": "x", "messages": msgs}, 400),
            ("/tokenize", {"model": "gpt-nope", "prompt": "x"}, 404),
            ("/detokenize", {"model": MODEL, "tokens": [10**9]}, 400),
            ("/detokenize", {"model": MODEL, "tokens": [1], "skip": True}, 400),
        ]
        for path, body, status in refusals:
            r = await http.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)


async def test_logprobs_through_the_openai_client_streamed_and_not(edges: Edges) -> None:
    """Greedy: each token is its position's best, so its log-probability heads its top
    list; the same values whether streamed or not, in both endpoints' shapes."""
    client = openai.AsyncOpenAI(base_url=edges.url("a") + "/v1", api_key=ACME, max_retries=0)
    prompt = "The function returns a list of"
    common = {
        "model": MODEL,
        "max_tokens": 12,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = await client.completions.create(prompt=prompt, logprobs=3, **common)
    lp = whole.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 12
    assert "".join(lp.tokens or []) == whole.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in (lp.tokens or [])[:i]) for i in range(12)]
    for chosen, top in zip(lp.token_logprobs or [], lp.top_logprobs or [], strict=True):
        assert len(top) <= 3 and chosen <= 0 and abs(max(top.values()) - chosen) < 1e-5
    streamed = []
    stream = await client.completions.create(prompt=prompt, logprobs=3, stream=True, **common)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.token_logprobs or []
    assert streamed == lp.token_logprobs

    msgs = [{"role": "user", "content": "What is a list?"}]
    chat = await client.chat.completions.create(
        messages=msgs,  # type: ignore[arg-type]
        logprobs=True,
        top_logprobs=2,
        **common,
    )
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content is not None and len(content) == 12
    # Special tokens (the template's markers) are listed but not part of the content.
    said = [c.token for c in content if not (c.token.startswith("<|") and c.token.endswith("|>"))]
    assert "".join(said) == chat.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob
        assert c.bytes == list(c.token.encode())
    plain = await client.chat.completions.create(messages=msgs, **common)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None


# --- several choices, token-id prompts, echo ------------------------------------------------
async def test_n_choices_prefill_the_prompt_once(edges: Edges) -> None:
    """n=4 answers with four choices, each with its own index, seed and finish reason;
    the worker prefills the prompt once (its prefix-cache counters show the other three
    choices served from the first one's blocks). Seeded: the same choices again."""
    client = openai.AsyncOpenAI(base_url=edges.url("a") + "/v1", api_key=ACME, max_retries=0)
    metrics = f"http://127.0.0.1:{edges.stack.metrics_ports['worker']}/metrics"
    nonce = uuid.uuid4().hex[:8]
    prompt = f"Note {nonce}. The module docstring explains that the function returns " * 3
    before = await scrape(metrics)
    common = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 1.0}
    whole = await client.completions.create(n=4, seed=7, **common)  # type: ignore[call-overload]
    await asyncio.sleep(1.5)  # the worker's metrics count each choice as it settles
    after = await scrape(metrics)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason in ("stop", "length") for c in whole.choices)
    assert len({c.text for c in whole.choices}) > 1, "four seeds, four samples"
    assert whole.usage is not None
    prompt_tokens = whole.usage.prompt_tokens  # counted once for the four choices
    cached = after["tw_prefix_cache_hit_tokens_total"] - before["tw_prefix_cache_hit_tokens_total"]
    computed = after["tw_prefill_tokens_total"] - before["tw_prefill_tokens_total"]
    full_blocks = (prompt_tokens - 1) // 16 * 16
    assert cached >= 3 * full_blocks, (cached, prompt_tokens)
    assert computed <= prompt_tokens + 3 * 16, (computed, prompt_tokens)
    assert whole.usage.completion_tokens >= 4  # every choice's tokens
    again = await client.completions.create(n=4, seed=7, **common)  # type: ignore[call-overload]
    assert [c.text for c in again.choices] == [c.text for c in whole.choices]
    # Streamed: chunks of both choices, each adding up to its non-streamed text.
    parts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    stream = await client.completions.create(  # type: ignore[call-overload]
        n=4, seed=7, stream=True, stream_options={"include_usage": True}, **common
    )
    usage = None
    async for chunk in stream:
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + c.text
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
        usage = chunk.usage or usage
    assert [parts[i] for i in range(4)] == [c.text for c in whole.choices]
    assert [finishes[i] for i in range(4)] == [c.finish_reason for c in whole.choices]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    chat = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What does the function return?"}],
        max_tokens=8,
        temperature=0,
        n=2,
    )
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy
    await client.close()


async def test_prompt_lists_token_ids_echo_and_fingerprint(edges: Edges) -> None:
    """A list of prompts answers a choice per prompt, in order; a prompt given as token
    ids answers as its text does; echo puts each prompt before its completion; every
    response carries the same ``system_fingerprint``."""
    client = openai.AsyncOpenAI(base_url=edges.url("a") + "/v1", api_key=ACME, max_retries=0)
    greedy = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    first, second = "The function returns a list of", "A class holds"
    singles = [await client.completions.create(prompt=p, **greedy) for p in (first, second)]
    listed = await client.completions.create(prompt=[first, second], **greedy)
    assert [c.text for c in listed.choices] == [s.choices[0].text for s in singles]
    assert listed.usage is not None and singles[0].usage is not None
    assert singles[1].usage is not None
    assert listed.usage.prompt_tokens == singles[0].usage.prompt_tokens + (
        singles[1].usage.prompt_tokens
    )
    async with httpx.AsyncClient(timeout=30) as http:
        tok = await http.post(
            edges.url("a") + "/tokenize", json={"model": MODEL, "prompt": first}, headers=auth(ACME)
        )
    ids = tok.json()["tokens"]
    by_ids = await client.completions.create(prompt=ids, **greedy)
    assert by_ids.choices[0].text == singles[0].choices[0].text
    both = await client.completions.create(prompt=[ids, ids[:3]], **greedy)
    assert both.choices[0].text == singles[0].choices[0].text and len(both.choices) == 2
    echoed = await client.completions.create(prompt=first, echo=True, **greedy)
    assert echoed.choices[0].text == first + singles[0].choices[0].text
    parts = []
    stream = await client.completions.create(prompt=first, echo=True, stream=True, **greedy)
    async for chunk in stream:
        parts += [c.text for c in chunk.choices]
    assert "".join(parts) == echoed.choices[0].text
    prints = {r.system_fingerprint for r in (*singles, listed, by_ids, echoed)}
    assert len(prints) == 1 and prints.pop().startswith("fp_")  # type: ignore[union-attr]
    async with httpx.AsyncClient(base_url=edges.url("a"), timeout=30) as http:
        for bad, param in (
            ({"prompt": [10**9]}, "prompt"),
            ({"prompt": first, "echo": True, "logprobs": 1}, None),
            ({"prompt": first, "n": 2, "resumable": True}, None),
        ):
            r = await http.post("/v1/completions", json={**greedy, **bad}, headers=auth(ACME))
            assert r.status_code == 400, r.text
            if param:
                assert r.json()["error"]["param"] == param
    await client.close()
