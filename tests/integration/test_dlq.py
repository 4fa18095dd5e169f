"""``tokenwire dlq`` against the real stack: a request dead-lettered for a reason an
operator can fix is listed, shown, replayed once the fix is in and answered exactly once;
one that fails again after its replay stays dead; purge trims the topic by time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer

from services.cli import main
from services.ops.dlq import REPLAY_HEADER, read_letters, replay, resolve
from services.worker.intake import TOPICS_REFRESH_S
from shared.codec import decode, encode
from shared.kafka_io import ensure_topics
from shared.messages import Completion, DeadLetter, GenerateRequest, ReplyTarget, SamplingParams
from shared.token_stream import read_log
from tests.integration.harness import Stack, produce, read_topic

Cli = Callable[..., Coroutine[Any, Any, str]]


@pytest.fixture
def cli(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``tokenwire dlq ARGS`` run in this process (in a thread: it has its own event loop)
    with the stack's settings; returns what it printed."""
    for k, v in stack.env.items():
        if k.startswith("TW_"):
            monkeypatch.setenv(k, v)

    async def run(*args: str) -> str:
        out = io.StringIO()

        def call() -> None:
            with contextlib.redirect_stdout(out):
                main(["dlq", *args])

        await asyncio.to_thread(call)
        return out.getvalue()

    return run


async def _letters_of(stack: Stack, rid: str, n: int) -> list[DeadLetter]:
    def enough(values: list[bytes]) -> bool:
        return len([v for v in values if decode(DeadLetter, v).request_id == rid]) >= n

    values = await read_topic(stack.settings.kafka_bootstrap, stack.names.requests_dlq, enough, 60)
    return [d for v in values if (d := decode(DeadLetter, v)).request_id == rid]


async def _records(bootstrap: str, topic: str, rid: str, settle_s: float) -> list[tuple]:
    """(value, headers) of every record keyed ``rid`` on ``topic``, read for ``settle_s``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out = []
    try:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=300)).values():
                out += [(m.value, dict(m.headers)) for m in msgs if m.key == rid.encode()]
    finally:
        await consumer.stop()
    return out


async def test_a_fixed_request_is_replayed_and_answered_once(stack: Stack, cli: Cli) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    replies = f"{stack.prefix}.replies"
    req = GenerateRequest(
        prompt="The function returns",
        sampling=SamplingParams(max_tokens=4, temperature=0),
        reply=ReplyTarget(redis=True, kafka_topic=replies),
    )
    rid = req.request_id
    await produce(bootstrap, stack.names.requests, [encode(req)], [rid.encode()])
    (letter,) = await _letters_of(stack, rid, 1)
    assert letter.reason == "reply_topic_not_found"

    listed = json.loads(await cli("list", "--json", "--reason", "reply_topic_not_found"))
    (row,) = [r for r in listed if r["request_id"] == rid]
    assert row["service"] == "worker" and row["from"]["topic"] == stack.names.batches
    shown = json.loads(await cli("show", row["id"]))
    assert shown["reason"] == "reply_topic_not_found" and shown["replayable"] == "yes"
    original = shown["original"]["decoded"]
    assert original["request_id"] == rid and original["reply"]["kafka_topic"] == replies
    assert json.loads(await cli("show", rid))["id"] == row["id"]  # by request id

    # Not fixed yet: a dry run says it would go, and sends nothing.
    assert "would be replayed (replay 1 of at most 1)" in await cli(
        "replay", "--dry-run", row["id"]
    )
    await ensure_topics(stack.settings, {replies: 1})  # the fix
    await asyncio.sleep(TOPICS_REFRESH_S + 1)  # workers see topics at most this old
    out = await cli("replay", row["id"])
    assert f"{row['id']}  {rid}  replayed (replay 1 of at most 1)" in out, out

    async def answered() -> list[Completion]:
        got = await _records(bootstrap, replies, rid, 3)
        return [decode(Completion, v) for v, _ in got]

    deadline = time.monotonic() + 60
    while not (done := await answered()) and time.monotonic() < deadline:
        pass
    assert [c.error for c in done] == [None]
    client = aioredis.Redis.from_url(stack.settings.redis_url)
    try:
        events = await read_log(client, stack.names, rid)
    finally:
        await client.aclose()
    assert [e.seq for e in events] == list(range(len(events))) and events[-1].error is None

    # Again, by either name: nothing is sent, and nothing is generated a second time.
    again = await cli("replay", row["id"], rid)
    assert again.count("not replayed: it was answered already") == 2, again
    assert len(await answered()) == 1
    sent = await _records(bootstrap, stack.names.requests, rid, 2)
    assert [h.get(REPLAY_HEADER) for _, h in sent] == [None, b"1"]


async def test_a_request_that_fails_after_its_replay_stays_dead(stack: Stack, cli: Cli) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    req = GenerateRequest(prompt="The value", deadline=time.time() - 1)
    rid = req.request_id
    await produce(bootstrap, stack.names.requests, [encode(req)], [rid.encode()])
    (first,) = await _letters_of(stack, rid, 1)
    assert first.reason == "deadline_exceeded"

    out = await cli("replay", "--reason", "deadline_exceeded")
    assert f"{rid}  replayed (replay 1 of at most 1)" in out, out
    letters = await _letters_of(stack, rid, 2)  # it failed again
    assert [d.reason for d in letters] == ["deadline_exceeded"] * 2

    for args in (["--reason", "deadline_exceeded"], [rid]):
        out = await cli("replay", *args)
        assert f"{rid}  not replayed: replay limit reached (1 of 1): it stays dead" in out, out
    await asyncio.sleep(2)
    assert len(await _letters_of(stack, rid, 2)) == 2
    sent = await _records(bootstrap, stack.names.requests, rid, 2)
    assert [h.get(REPLAY_HEADER) for _, h in sent] == [None, b"1"]


async def test_purge_deletes_the_letters_written_before_a_time(stack: Stack, cli: Cli) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    old = GenerateRequest(prompt="old", deadline=time.time() - 1)
    await produce(bootstrap, stack.names.requests, [encode(old)], [old.request_id.encode()])
    await _letters_of(stack, old.request_id, 1)
    await asyncio.sleep(1.5)
    cut = datetime.now(UTC)
    new = GenerateRequest(prompt="new", deadline=time.time() - 1)
    await produce(bootstrap, stack.names.requests, [encode(new)], [new.request_id.encode()])
    await _letters_of(stack, new.request_id, 1)

    before = json.loads(await cli("list", "--json"))
    kept = [r for r in before if r["at"] >= cut.timestamp()]
    out = await cli("purge", "--before", cut.isoformat())
    assert f"{len(before) - len(kept)} dead letter(s) written before" in out, out
    after = json.loads(await cli("list", "--json"))
    assert after == kept and new.request_id in {r["request_id"] for r in after}
    assert old.request_id not in {r["request_id"] for r in after}
    since = json.loads(await cli("list", "--json", "--since", "1h", "--limit", "1"))
    assert [r["request_id"] for r in since] == [new.request_id]


async def test_bytes_that_are_no_request_are_shown_as_kept_and_never_replayed(
    cli: Cli, stack: Stack
) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    junk = b"\xff\xfe not json \x00"
    await produce(bootstrap, stack.names.requests, [junk], [b"junk-key"])

    def lettered(values: list[bytes]) -> bool:
        return any(decode(DeadLetter, v).key == "junk-key" for v in values)

    await read_topic(bootstrap, stack.names.requests_dlq, lettered, 60)
    (row,) = [r for r in json.loads(await cli("list", "--json", "--reason", "undecodable"))]
    shown = json.loads(await cli("show", row["id"]))
    assert shown["original"]["decoded"] is None and shown["service"] == "batcher"
    assert base64.b64decode(shown["original"]["base64"]) == junk
    out = await cli("replay", row["id"])
    assert "not replayed: the original is not a request (undecodable)" in out, out
    assert "0 of 1 replayed" in out


async def test_racing_replays_are_generated_once(stack: Stack) -> None:
    """Two replays at once, each allowed (two replays a request): whatever both send, the
    workers' claims and done markers generate the request once."""
    bootstrap = stack.settings.kafka_bootstrap
    replies = f"{stack.prefix}.race"
    req = GenerateRequest(
        prompt="The module",
        sampling=SamplingParams(max_tokens=4, temperature=0),
        reply=ReplyTarget(redis=True, kafka_topic=replies),
    )
    rid = req.request_id
    await produce(bootstrap, stack.names.requests, [encode(req)], [rid.encode()])
    await _letters_of(stack, rid, 1)
    await ensure_topics(stack.settings, {replies: 1})
    await asyncio.sleep(TOPICS_REFRESH_S + 1)
    letter = resolve(await read_letters(stack.settings), rid)
    assert letter is not None
    outcomes = await asyncio.gather(
        *(replay(stack.settings, [letter], max_replays=2) for _ in range(2))
    )
    assert sum(o.verdict == "ok" for (o,) in outcomes) >= 1, outcomes
    got: list[Completion] = []
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        got = [decode(Completion, v) for v, _ in await _records(bootstrap, replies, rid, 3)]
    await asyncio.sleep(3)  # room for a second generation, if there were one
    got = [decode(Completion, v) for v, _ in await _records(bootstrap, replies, rid, 3)]
    assert [c.request_id for c in got] == [rid]
