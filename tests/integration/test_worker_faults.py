"""A worker's failure paths against real Kafka, Redis and service processes: a failure that
belongs to one request ends that request (an error event at its next seq, a dead letter)
and never the worker; everything a request owes goes out before its done marker."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from services.bench.prometheus import scrape
from services.bench.servers import Server
from services.worker.claims import POISON_ATTEMPTS
from shared import token_stream
from shared.codec import decode, encode
from shared.messages import (
    Batch,
    ChatMessage,
    Completion,
    DeadLetter,
    FinishReason,
    GenerateRequest,
    ReplyTarget,
    SamplingParams,
    TokenEvent,
)
from tests.conftest import new_prefix
from tests.integration.harness import Stack, StreamRecorder, make_stack, produce, read_topic
from tests.integration.test_handoff import FAST_FAILOVER, greedy_requests, reference_tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def wait_final(
    redis: aioredis.Redis, stack: Stack, rid: str, within_s: float = 60
) -> list[TokenEvent]:
    """A request's replay log once it holds a final event."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stack.check_alive()
        events = await token_stream.read_log(redis, stack.names, rid)
        if events and events[-1].final:
            return events
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{rid} has no final event\n{stack.logs()}")


async def dead_letters(stack: Stack, rids: set[str], within_s: float = 30) -> dict[str, DeadLetter]:
    raw = await read_topic(
        stack.env["TW_KAFKA_BOOTSTRAP"],
        stack.names.requests_dlq,
        lambda vs: rids <= {decode(DeadLetter, v).request_id for v in vs},
        within_s,
    )
    return {dl.request_id: dl for dl in (decode(DeadLetter, v) for v in raw) if dl.request_id}


def context_of(model_dir: str) -> int:
    return int(json.loads((Path(model_dir) / "config.json").read_text())["max_position_embeddings"])


async def test_hostile_and_failing_requests_end_alone_and_the_worker_serves_on(
    bare: Stack, model_dir: str
) -> None:
    """The request that stopped every worker (temperature 1e-45) is served, greedily, over
    HTTP and raw on Kafka; requests that fail in the worker (over the context, a reply topic
    that does not exist) each get an error event and a dead letter, at once; a normal
    request after them is answered; no process exits."""
    st = bare
    st.start("worker")
    st.start("batcher")
    st.start("edge")
    await st.wait_ready()
    body = {"model": "tokenwire-tiny", "prompt": "The function returns", "max_tokens": 12}
    async with httpx.AsyncClient(timeout=60) as http:
        tiny = await http.post(st.url() + "/v1/completions", json={**body, "temperature": 1e-45})
        greedy = await http.post(st.url() + "/v1/completions", json={**body, "temperature": 0})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]

    hostile = GenerateRequest(prompt="If the value", sampling=SamplingParams(temperature=1e-45))
    too_long = GenerateRequest(
        prompt="The list", sampling=SamplingParams(max_tokens=context_of(model_dir) + 1)
    )
    no_topic = GenerateRequest(prompt="Return", reply=ReplyTarget(kafka_topic="no-such-topic"))
    normal = GenerateRequest(prompt="The module", sampling=SamplingParams(temperature=0))
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    started = time.monotonic()
    await produce(boot, st.names.requests, [encode(r) for r in (hostile, too_long, no_topic)])
    await produce(boot, st.names.requests, [encode(normal)])
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        ends = {
            r.request_id: (await wait_final(redis, st, r.request_id))[-1]
            for r in (hostile, too_long, no_topic, normal)
        }
    finally:
        await redis.aclose()
    assert time.monotonic() - started < 20  # no 30 s stall on the missing topic
    for ok in (hostile, normal):
        assert ends[ok.request_id].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    failed = {too_long.request_id: "invalid_request", no_topic.request_id: "reply_topic_not_found"}
    for rid, code in failed.items():
        err = ends[rid].error
        assert ends[rid].finish_reason == FinishReason.ERROR and err is not None
        assert err.code == code, err
    letters = await dead_letters(st, set(failed))
    for rid, code in failed.items():
        assert letters[rid].reason == code and letters[rid].original_size > 0
    st.check_alive()


def alternating_roles_model(model_dir: str, folder: Path) -> Path:
    """``model_dir`` (linked) with a chat template that refuses two turns of one role."""
    folder.mkdir()
    for f in Path(model_dir).iterdir():
        if f.name != "chat_template.jinja":
            (folder / f.name).symlink_to(f)
    alternate = (
        "{%- for m in messages[1:] -%}{%- if m['role'] == messages[loop.index0]['role'] -%}"
        "{{ raise_exception('Conversation roles must alternate') }}{%- endif -%}{%- endfor -%}"
    )
    template = (Path(model_dir) / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").write_text(alternate + template)
    return folder


async def test_a_conversation_the_chat_template_refuses_ends_alone(
    bare: Stack, model_dir: str, tmp_path: Path
) -> None:
    """A chat template that refuses a conversation (as Mistral's and Gemma's do when roles
    do not alternate) fails that request alone: the batcher, which renders the template to
    route by prefix, sends it on; the worker ends it with an error event and a dead letter;
    the next request is served and no process exits."""
    strict = alternating_roles_model(model_dir, tmp_path / "strict-template")
    st = bare
    st.start("worker", TW_MODEL_DIR=str(strict))
    st.start("batcher", TW_MODEL_DIR=str(strict))
    await st.wait_ready()
    greedy = SamplingParams(temperature=0, max_tokens=4)
    users = [ChatMessage(role="user", content=c) for c in ("Return the list", "and its keys")]
    refused = GenerateRequest(messages=users, sampling=greedy)
    normal = GenerateRequest(messages=users[:1], sampling=greedy)
    await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests, [encode(refused)])
    await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests, [encode(normal)])
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        end, served = [(await wait_final(redis, st, r.request_id))[-1] for r in (refused, normal)]
    finally:
        await redis.aclose()
    assert served.finish_reason is FinishReason.LENGTH
    assert end.finish_reason is FinishReason.ERROR and end.error is not None
    assert end.error.code == "invalid_request" and "must alternate" in end.error.message
    letter = (await dead_letters(st, {refused.request_id}))[refused.request_id]
    assert letter.reason == "invalid_request"
    st.check_alive()


async def test_an_error_event_takes_the_next_seq_of_a_redelivered_stream(bare: Stack) -> None:
    """A redelivered request that fails now (its deadline passed) ends with an error event
    after the events its stream already had, so a client following it sees the end."""
    st = bare
    st.start("worker")
    await st.wait_ready()
    req = GenerateRequest(prompt="The value", deadline=time.time() - 1)
    rid = req.request_id
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        before = [TokenEvent(request_id=rid, seq=i, text=f"t{i}") for i in range(3)]
        await token_stream.publish_events(redis, st.names, before)
        batch = Batch(batcher_id="test", requests=[req])
        await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.batches, [encode(batch)])
        events = await wait_final(redis, st, rid)
    finally:
        await redis.aclose()
    assert [e.seq for e in events] == [0, 1, 2, 3]
    assert events[-1].error is not None and events[-1].error.code == "deadline_exceeded"
    assert rid in await dead_letters(st, {rid})


async def test_a_final_event_out_before_a_crash_still_gets_its_completion(bare: Stack) -> None:
    """A worker that died after a request's final event but before its Kafka completion
    was acknowledged left no done marker: the request's next worker settles it from its
    replay log (never generating it again) and sends the completion the log holds."""
    st = bare
    st.start("worker")
    await st.wait_ready()
    [req] = greedy_requests(1, 6, seed=11)
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        await produce(boot, st.names.batches, [encode(Batch(requests=[req]))])
        events = await wait_final(redis, st, req.request_id)
        await asyncio.sleep(1.0)  # settled: the done marker is written
        assert await redis.delete(st.names.done_marker(req.request_id)) == 1
        # The same request again, now owing a completion, as its redelivery would.
        owed = req.model_copy(update={"reply": ReplyTarget(kafka_topic=st.names.completions)})
        await produce(boot, st.names.batches, [encode(Batch(requests=[owed]))])
        raw = await read_topic(boot, st.names.completions, lambda vs: bool(vs), 30)
        assert await token_stream.read_log(redis, st.names, req.request_id) == events
    finally:
        await redis.aclose()
    [done] = [decode(Completion, v) for v in raw]
    assert done.request_id == req.request_id and done.finish_reason == FinishReason.LENGTH
    assert done.token_ids == [t for e in events for t in e.token_ids]


async def test_a_completion_acknowledged_before_a_crash_is_not_sent_again(bare: Stack) -> None:
    """A worker that died after a request's completion was acknowledged but before its
    done marker was written: the request's next worker finds the final event in the replay
    log and the completion on the reply topic, and only writes the done marker."""
    st = bare
    st.start("worker")
    await st.wait_ready()
    [req] = greedy_requests(1, 6, seed=14, reply_topic=st.names.completions)
    rid, boot = req.request_id, st.env["TW_KAFKA_BOOTSTRAP"]
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        await produce(boot, st.names.batches, [encode(Batch(requests=[req]))])
        first = await read_topic(boot, st.names.completions, lambda vs: bool(vs), 60)
        events = await wait_final(redis, st, rid)
        for _ in range(50):  # settled: the done marker follows the acknowledged send
            if await redis.delete(st.names.done_marker(rid)) == 1:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no done marker")
        await produce(boot, st.names.batches, [encode(Batch(requests=[req]))])
        for _ in range(300):
            if await redis.exists(st.names.done_marker(rid)):
                break
            st.check_alive()
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the redelivered request was not settled\n{st.logs()}")
        assert await token_stream.read_log(redis, st.names, rid) == events
    finally:
        await redis.aclose()
    raw = await read_topic(boot, st.names.completions, lambda vs: len(vs) > len(first), 3)
    assert [decode(Completion, v).request_id for v in raw] == [rid], "one completion"


async def test_a_request_sent_more_than_once_is_generated_once(bare: Stack) -> None:
    """A producer whose send expired in an outage sends the request again, and Kafka may
    hold both copies. Here it arrives four times under one id: twice back to back through
    the batcher, once straight to the worker while it runs, once after it finished. The
    worker generates it once: one completion, one stream in the replay log, and its
    counters show one request's tokens."""
    st = bare
    st.start("worker")
    st.start("batcher")
    await st.wait_ready()
    new = 200  # about a second on the tiny model: the copy sent while it runs lands then
    [req] = greedy_requests(1, new, seed=15, reply_topic=st.names.completions)
    rid, boot = req.request_id, st.env["TW_KAFKA_BOOTSTRAP"]
    metrics = f"http://127.0.0.1:{st.metrics_ports['worker']}/metrics"
    before = await scrape(metrics)
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    producer = AIOKafkaProducer(bootstrap_servers=boot, acks="all")
    await producer.start()
    try:
        for _ in range(2):
            await producer.send_and_wait(st.names.requests, encode(req))
        for _ in range(600):  # running: its first tokens are in the replay log
            events = await token_stream.read_log(redis, st.names, rid)
            if events:
                break
            st.check_alive()
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"{rid} never started\n{st.logs()}")
        await producer.send_and_wait(st.names.batches, encode(Batch(requests=[req])))
        running = await token_stream.read_log(redis, st.names, rid)
        assert not running[-1].final, "the copy sent while it runs came after its end"
        events = await wait_final(redis, st, rid)
        for _ in range(50):
            if await redis.exists(st.names.done_marker(rid)):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no done marker")
        await producer.send_and_wait(st.names.requests, encode(req))
        await asyncio.sleep(3)  # room for a late copy to run
        st.check_alive()
        assert await token_stream.read_log(redis, st.names, rid) == events
    finally:
        await producer.stop()
        await redis.aclose()
    assert [e.seq for e in events] == list(range(len(events)))
    tokens = [t for e in events for t in e.token_ids]
    assert len(tokens) == new
    raw = await read_topic(boot, st.names.completions, lambda vs: len(vs) > 1, 3)
    assert [decode(Completion, v).token_ids for v in raw] == [tokens], "one completion"
    after = await scrape(metrics)
    generated = after["tw_generation_tokens_total"] - before.get("tw_generation_tokens_total", 0)
    assert generated == new, "generated once"

    def finished(samples: dict[str, float]) -> float:
        return sum(v for k, v in samples.items() if k.startswith("tw_requests_finished_total"))

    assert finished(after) - finished(before) == 1


async def test_a_poison_is_quarantined_and_the_rest_of_its_batch_is_served(bare: Stack) -> None:
    """A request that was running during two worker crashes (the processes that took it
    and died, in Redis) is not run a third time: it gets an error event and a dead letter
    with the reason ``poison``, and the other request of its batch is served."""
    st = bare
    st.start("worker")
    await st.wait_ready()
    poison, other = greedy_requests(2, 5, seed=12)
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        crashed = [f"gone:{i}" for i in range(POISON_ATTEMPTS)]  # processes that died under it
        await redis.sadd(st.names.takers(poison.request_id), *crashed)
        batch = Batch(requests=[poison, other])
        await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.batches, [encode(batch)])
        bad = await wait_final(redis, st, poison.request_id)
        good = await wait_final(redis, st, other.request_id)
    finally:
        await redis.aclose()
    assert len(bad) == 1 and bad[0].error is not None and bad[0].error.code == "poison"
    assert sum(len(e.token_ids) for e in good) == 5 and good[-1].finish_reason == "length"
    assert (await dead_letters(st, {poison.request_id}))[poison.request_id].reason == "poison"
    st.check_alive()


async def test_a_request_running_through_two_worker_crashes_is_quarantined_as_poison(
    bare: Stack, model_dir: str
) -> None:
    """Real crashes, not a count set by hand: a long request is running when its worker is
    SIGKILLed, and again on the worker that took it over. The third worker does not run
    it: an error event ``poison`` and a dead letter; the short request of its batch and a
    request sent afterwards are served."""
    st = bare
    long, short = greedy_requests(2, 5, seed=21)
    long = long.model_copy(
        update={
            "sampling": long.sampling.model_copy(update={"max_tokens": context_of(model_dir) - 64})
        }
    )
    [after] = greedy_requests(1, 5, seed=22)
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    try:
        st.start("worker", "w1", **FAST_FAILOVER)
        await st.wait_ready()
        await produce(boot, st.names.batches, [encode(Batch(requests=[long, short]))])
        seen = 0
        for crash, name in enumerate(("w1", "w2"), start=2):
            deadline = time.monotonic() + 120
            while True:  # running on this worker: its stream grows
                events = await token_stream.read_log(redis, st.names, long.request_id)
                assert not (events and events[-1].final), "the long request ended too soon"
                if len(events) > seen:
                    break
                assert time.monotonic() < deadline, st.logs()
                await asyncio.sleep(0.05)
            if name == "w2":
                # The short request must not be running during both crashes too (under
                # load it can be), or it is rightly a poison as well.
                await wait_final(redis, st, short.request_id)
            st.stop(name, signal.SIGKILL)
            # Counted after the kill: whatever the killed worker published up to its death
            # is not the next worker's progress.
            seen = len(await token_stream.read_log(redis, st.names, long.request_id))
            st.start("worker", f"w{crash}", **FAST_FAILOVER)
        bad = await wait_final(redis, st, long.request_id, within_s=120)
        good = await wait_final(redis, st, short.request_id)
        await produce(boot, st.names.batches, [encode(Batch(requests=[after]))])
        later = await wait_final(redis, st, after.request_id)
    finally:
        await redis.aclose()
    err = bad[-1].error
    assert err is not None and err.code == "poison", bad[-1]
    assert bad[-1].seq == len(bad) - 1, "the error event takes the next seq"
    for served in (good, later):
        assert sum(len(e.token_ids) for e in served) == 5 and served[-1].finish_reason == "length"
    assert (await dead_letters(st, {long.request_id}))[long.request_id].reason == "poison"
    st.check_alive()


async def test_a_worker_killed_while_kafka_reply_requests_finish_sends_each_one_completion(
    bare: Stack, model_dir: str
) -> None:
    st = bare
    reqs = greedy_requests(60, 10, seed=13, reply_topic=st.names.completions)
    st.start("batcher")
    st.start("worker", "w1", **FAST_FAILOVER, TW_MAX_RUNNING="8")
    await st.wait_ready()
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
        await produce(boot, st.names.requests, [encode(r) for r in reqs])
        while len(rec.finished()) < 15:
            st.check_alive()
            await asyncio.sleep(0.05)
        st.stop("w1", signal.SIGKILL)
        st.start("worker", "w2", **FAST_FAILOVER)
        await rec.wait_finished({r.request_id for r in reqs}, within_s=180, stack=st)
    want = {r.request_id for r in reqs}
    raw = await read_topic(
        boot,
        st.names.completions,
        lambda vs: want <= {decode(Completion, v).request_id for v in vs},
        60,
    )
    await asyncio.sleep(2)  # room for a late duplicate to show
    raw = await read_topic(boot, st.names.completions, lambda vs: len(vs) > len(raw), 3)
    ids = [decode(Completion, v).request_id for v in raw]
    assert sorted(ids) == sorted(want), "every request exactly one completion"
    expected = reference_tokens(model_dir, reqs[:5], 10)
    for v in raw:
        c = decode(Completion, v)
        if c.request_id in expected:
            assert c.token_ids == expected[c.request_id]


async def sse_stream(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> list[int]:
    """The ``id:`` of every event of one streamed response (asserting it ended)."""
    ids: list[int] = []
    async with http.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                ids.append(int(line[4:]))
            elif line == "data: [DONE]":
                return ids
    raise AssertionError("the stream ended without [DONE]")


async def readyz(http: httpx.AsyncClient, st: Stack, name: str) -> tuple[int, str]:
    """A service's readiness status code and what it says of Redis."""
    resp = await http.get(f"http://127.0.0.1:{st.metrics_ports[name]}/readyz")
    return resp.status_code, resp.json()["redis"]


async def ready_again(http: httpx.AsyncClient, st: Stack, name: str) -> tuple[int, str]:
    """A service's readiness once every one of its Redis connections has found Redis back
    (each retries on its own backoff, at most 2 s apart)."""
    for _ in range(50):
        state = await readyz(http, st, name)
        if state[0] == 200:
            break
        await asyncio.sleep(0.2)
    return state


async def test_a_redis_restart_under_load_stops_nothing_and_loses_nothing(
    infra: dict[str, str], model_dir: str, own_redis: Server, tmp_path: Path
) -> None:
    """Redis stopped for 3 s and started again while 8 streams run through the whole stack:
    every stream ends, its replay log has no gap and no duplicate and holds exactly the
    tokens of an undisturbed greedy run, the clients' SSE ids are contiguous, and no
    process exits."""
    st = make_stack(
        new_prefix("redis-out"), {**infra, "TW_REDIS_URL": own_redis.url}, model_dir, tmp_path
    )
    await st.create_topics()
    for kind in ("worker", "batcher", "edge"):
        st.start(kind)
    try:
        await st.wait_ready()
        reqs = greedy_requests(8, 160, seed=14)
        bodies = [
            {
                "model": "tokenwire-tiny",
                "prompt": r.prompt,
                "max_tokens": 160,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "resumable": True,
            }
            for r in reqs
        ]
        async with httpx.AsyncClient(timeout=180) as http:
            clients = [
                asyncio.create_task(sse_stream(http, st.url() + "/v1/completions", b))
                for b in bodies
            ]
            await asyncio.sleep(2.0)  # all streaming
            own_redis.stop()
            await asyncio.sleep(1.5)
            during = {name: await readyz(http, st, name) for name in ("worker", "batcher")}
            await asyncio.sleep(1.5)
            own_redis.start()
            seen = await asyncio.gather(*clients)
            after = {name: await ready_again(http, st, name) for name in ("worker", "batcher")}
        st.check_alive()
        for name in ("worker", "batcher"):  # the outage shows, and its end
            assert during[name] == (503, "down"), (name, during)
            assert after[name] == (200, "ok"), (name, after)
        for ids in seen:
            assert ids == list(range(len(ids))) and len(ids) > 1
        redis = aioredis.Redis.from_url(own_redis.url)
        try:
            rids = [st.names.tag_of(m) for m in await redis.keys(st.names.token_log("*"))]
            logs = {rid: await token_stream.read_log(redis, st.names, rid) for rid in rids}
        finally:
            await redis.aclose()
    finally:
        st.stop_all()
    assert len(logs) == 8
    by_prompt = {}
    for events in logs.values():
        assert [e.seq for e in events] == list(range(len(events)))
        assert events[-1].finish_reason == FinishReason.LENGTH
        by_prompt[tuple(t for e in events for t in e.token_ids)] = events
    expected = reference_tokens(model_dir, reqs, 160)
    assert set(by_prompt) == {tuple(t) for t in expected.values()}


async def test_a_request_whose_edge_died_is_cancelled_after_the_grace_period(
    bare: Stack,
) -> None:
    """A streamed request a disconnect would cancel loses its edge (SIGKILL, so no cancel is
    sent): its worker notices no client follows the stream and cancels it."""
    st = bare
    st.start("worker")
    st.start("batcher")
    # A grace well inside the time 1500 tokens take (about 2 s on a fast CPU): the edge
    # subscribes before it publishes, so no event goes unheard before the kill.
    st.start("edge", TW_UNFOLLOWED_GRACE_S="0.5")
    await st.wait_ready()
    body = {
        "model": "tokenwire-tiny",
        "prompt": "The function",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", st.url() + "/v1/completions", json=body) as resp:
            rid = resp.headers["x-request-id"]
            async for line in resp.aiter_lines():
                if line.startswith("id: 3"):
                    break
            st.stop("edge", signal.SIGKILL)
    killed = time.monotonic()
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        events = await wait_final(redis, st, rid, within_s=30)
    finally:
        await redis.aclose()
    assert events[-1].finish_reason == FinishReason.CANCELLED
    assert time.monotonic() - killed < 15
    assert sum(len(e.token_ids) for e in events) < 1500
