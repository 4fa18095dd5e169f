"""The Batch API over HTTP with the official client, against real Kafka and Redis: a batch
that survives its edge being killed and restarted midway and is read through another edge,
a batch cancelled midway whose requests stop on the worker, validation refusals, and
tenant scoping. The full 500-line run is ``tokenwire bench batch-api --lines 500``."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import orjson
import pytest
import redis.asyncio as aioredis

from services.bench.batch_api import ENDED, input_file, lines_of, start_batch, wait_for
from services.edge.auth import KeyStore, hash_key
from shared.messages import Priority
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack, make_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "tokenwire-tiny"
ACME, BETA = "twk-test-batch-acme", "twk-test-batch-beta"
PEPPER = "batch-api-test-pepper"
KEYS = {
    "TW_AUTH": "required",
    "TW_API_KEYS": f"{hash_key(ACME)}=acme,{hash_key(BETA)}=beta",
    "TW_KEY_PEPPER": PEPPER,
}
# More lines than the runner keeps unanswered (256), so the edge taking over must send the
# rest from the recorded cursor. TW_TEST_BATCH_LINES=300 runs a quicker one.
LINES = int(os.environ.get("TW_TEST_BATCH_LINES", "500"))


@pytest.fixture(scope="module")
async def stack(infra: dict[str, str], model_dir: str) -> AsyncIterator[Stack]:
    ARTIFACTS.mkdir(exist_ok=True)
    stk = make_stack(new_prefix("batchapi"), infra, model_dir, ARTIFACTS)
    await stk.create_topics(partitions=2)
    stk.start("worker", TW_MAX_RUNNING="16")
    stk.start("batcher")
    stk.start("edge", name="a", **KEYS)
    stk.start("edge", name="b", **KEYS)
    try:
        await stk.wait_ready()
        yield stk
    finally:
        stk.stop_all()


def client(stack: Stack, edge: str, key: str = ACME) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url(edge) + "/v1", api_key=key, max_retries=0)


async def lease_holder(stack: Stack, key: str) -> str:
    """The name of the edge process holding a lease (its value names the holder's pid)."""
    redis = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:
        raw = await redis.get(key)
    finally:
        await redis.aclose()
    assert raw is not None, "nobody holds the lease"
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    pid = int(text.split(":")[1])
    return next(name for name, p in stack.procs.items() if p.pid == pid)


async def worker_cancelled(stack: Stack) -> float:
    """Requests the worker ended as cancelled (its Prometheus counter)."""
    port = stack.metrics_ports["worker"]
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    for line in text.splitlines():
        if line.startswith("tw_requests_finished_total{") and 'reason="cancelled"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def metric(stack: Stack, service: str, name: str, **labels: str) -> float:
    """The sum of a service's samples of ``name`` whose labels include ``labels``."""
    port = stack.metrics_ports[service]
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(w in line for w in wanted)
    )


def without_ids(row: dict[str, Any]) -> dict[str, Any]:
    """An output line without what differs between two answers: ids and timestamps."""
    response = dict(row["response"])
    body = {k: v for k, v in response.pop("body").items() if k not in ("id", "created")}
    response.pop("request_id")
    return {"custom_id": row["custom_id"], "error": row["error"], **response, "body": body}


async def test_repeated_lines_are_answered_from_the_cache(stack: Stack) -> None:
    """A batch whose lines repeat an earlier batch's: greedy and seeded lines are answered
    by the batcher from the exact cache (no worker runs them) with output lines equal to
    the misses' apart from ids and timestamps; a sampled line without a seed runs again.
    Each line is counted once either way."""
    a = client(stack, "a")
    content, ids = input_file(6, endpoint="/v1/chat/completions", model=MODEL, max_tokens=8)
    sampled = {"model": MODEL, "max_tokens": 8, "temperature": 0.9}
    for cid, extra in (("seeded", {"seed": 11}), ("unseeded", {})):
        body = {**sampled, **extra, "messages": [{"role": "user", "content": "Say a word."}]}
        line = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
        content += orjson.dumps(line) + b"\n"
    cacheable = [*ids, "seeded"]

    async def run() -> dict[str, dict[str, Any]]:
        batch = await start_batch(a, content, "/v1/chat/completions")
        end = await wait_for(a, batch.id, lambda x: x.status in ENDED, within_s=120)
        assert end.status == "completed" and end.error_file_id is None, end
        assert end.request_counts is not None
        assert (end.request_counts.total, end.request_counts.completed) == (8, 8)
        rows = await lines_of(a, end.output_file_id)
        assert sorted(r["custom_id"] for r in rows) == sorted([*cacheable, "unseeded"])
        return {r["custom_id"]: r for r in rows}

    first = await run()
    redis = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:  # a worker stores an answer just after sending its completion
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            keys = [k async for k in redis.scan_iter(match=stack.names.cache("acme", "x", "*"))]
            if len(keys) >= len(cacheable):
                break
            await asyncio.sleep(0.05)
        assert len(keys) == len(cacheable)  # the unseeded line's answer is not stored
    finally:
        await redis.aclose()
    finished = await metric(stack, "worker", "tw_requests_finished_total")
    hits = await metric(stack, "batcher", "tw_cache_lookups_total", result="hit")
    second = await run()
    assert await metric(stack, "batcher", "tw_cache_lookups_total", result="hit") == hits + 7
    # Only the unseeded line reached the worker.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if await metric(stack, "worker", "tw_requests_finished_total") > finished:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert await metric(stack, "worker", "tw_requests_finished_total") == finished + 1
    for cid in cacheable:
        assert without_ids(second[cid]) == without_ids(first[cid]), cid
        assert second[cid]["id"] != first[cid]["id"]
        assert second[cid]["response"]["body"]["usage"]["completion_tokens"] > 0
    assert second["unseeded"].keys() == first["unseeded"].keys()
    assert without_ids(second["unseeded"]).keys() == without_ids(first["unseeded"]).keys()


async def test_batch_survives_its_edges_going_down_and_is_read_through_another_edge(
    stack: Stack,
) -> None:
    a = client(stack, "a")
    content, ids = input_file(LINES, endpoint="/v1/completions", model=MODEL, max_tokens=4)
    batch = await start_batch(a, content, "/v1/completions")
    assert batch.status == "validating" and batch.endpoint == "/v1/completions"
    progressed = await wait_for(
        a,
        batch.id,
        lambda b: b.request_counts is not None and b.request_counts.completed >= 5,
        within_s=120,
    )
    assert progressed.status == "in_progress" and progressed.in_progress_at is not None
    # The edge advancing the batch dies mid-run (SIGKILL: its leases are left to expire)
    # and the other edge stops too: with no edge up the worker goes on, its completions
    # wait in Kafka. The offsets the collector stored are dropped, as if it had died
    # before storing any: every completion is read again, and must count once.
    holder = await lease_holder(
        stack, stack.names.batch_api("batch", "{" + batch.id + "}", "lease")
    )
    other_name = "b" if holder == "a" else "a"
    stack.stop(holder, sig=signal.SIGKILL)
    stack.stop(other_name)
    del stack.edge_ports[other_name]  # down until read through below
    redis = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:
        await redis.delete(stack.names.batch_api("{collector}", "offsets"))
        sent = await redis.hget(stack.names.batch_api("batch", "{" + batch.id + "}"), "submitted")
    finally:
        await redis.aclose()
    assert sent is not None and int(sent) < LINES  # some lines are left to send
    stack.start("edge", name=holder, **KEYS)
    await stack.wait_ready()
    end = await wait_for(client(stack, holder), batch.id, lambda x: x.status in ENDED, within_s=180)
    assert end.status == "completed", end
    assert end.request_counts is not None
    assert (end.request_counts.total, end.request_counts.completed) == (LINES, LINES)
    assert end.request_counts.failed == 0 and end.error_file_id is None
    assert end.finalizing_at is not None and end.completed_at is not None
    # Read through the other edge, started again.
    stack.start("edge", name=other_name, **KEYS)
    await stack.wait_ready()
    other = client(stack, other_name)
    again = await other.batches.retrieve(batch.id)
    assert again.output_file_id == end.output_file_id
    assert again.request_counts == end.request_counts
    out = await other.files.retrieve(end.output_file_id or "")
    assert out.purpose == "batch_output" and out.bytes > 0
    rows = await lines_of(other, end.output_file_id)
    assert len(rows) == LINES
    assert sorted(r["custom_id"] for r in rows) == ids  # each custom_id exactly once
    for r in rows:
        assert r["error"] is None and r["response"]["status_code"] == 200
        body = r["response"]["body"]
        assert body["object"] == "text_completion" and body["model"] == MODEL
        assert 1 <= body["usage"]["completion_tokens"] <= 4


async def test_cancelled_batch_stops_its_requests_and_keeps_what_finished(stack: Stack) -> None:
    a, b = client(stack, "a"), client(stack, "b")
    before = await worker_cancelled(stack)
    n = 48
    content, ids = input_file(
        n, endpoint="/v1/chat/completions", model=MODEL, max_tokens=200, extra={"ignore_eos": True}
    )
    batch = await start_batch(a, content, "/v1/chat/completions")
    await wait_for(
        a,
        batch.id,
        lambda x: x.request_counts is not None and x.request_counts.completed >= 2,
        within_s=120,
    )
    cancelling = await b.batches.cancel(batch.id)  # through the other edge
    assert cancelling.status in ("cancelling", "cancelled")
    end = await wait_for(b, batch.id, lambda x: x.status in ENDED, within_s=120)
    assert end.status == "cancelled" and end.cancelled_at is not None
    counts = end.request_counts
    assert counts is not None and counts.total == n
    assert 2 <= counts.completed < n and counts.completed + counts.failed == n
    out = await lines_of(a, end.output_file_id)
    errs = await lines_of(a, end.error_file_id)
    assert len(out) == counts.completed and len(errs) == counts.failed
    assert sorted(r["custom_id"] for r in out + errs) == ids
    assert all(r["response"]["status_code"] == 200 for r in out)
    assert all(r["response"] is None and r["error"]["code"] == "batch_cancelled" for r in errs)
    # The worker ended the running ones (not just the edge writing them off).
    assert await worker_cancelled(stack) > before
    with pytest.raises(openai.ConflictError):
        done = await start_batch(
            a,
            input_file(1, endpoint="/v1/completions", model=MODEL, max_tokens=1)[0],
            "/v1/completions",
        )
        await wait_for(a, done.id, lambda x: x.status in ENDED, within_s=60)
        await a.batches.cancel(done.id)


async def test_a_batch_past_its_window_expires_keeping_what_finished(stack: Stack) -> None:
    a = client(stack, "a")
    n = 32
    content, ids = input_file(
        n, endpoint="/v1/completions", model=MODEL, max_tokens=200, extra={"ignore_eos": True}
    )
    batch = await start_batch(a, content, "/v1/completions")
    await wait_for(
        a,
        batch.id,
        lambda x: x.request_counts is not None and x.request_counts.completed >= 1,
        within_s=120,
    )
    # The 24 h window, run out: the record's expiry moved to the past.
    redis = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:
        key = stack.names.batch_api("batch", "{" + batch.id + "}")
        await redis.hset(key, "expires_at", str(int(time.time()) - 1))
    finally:
        await redis.aclose()
    end = await wait_for(a, batch.id, lambda x: x.status in ENDED, within_s=120)
    assert end.status == "expired" and end.expired_at is not None
    counts = end.request_counts
    assert counts is not None and counts.completed >= 1 and counts.completed + counts.failed == n
    out = await lines_of(a, end.output_file_id)
    errs = await lines_of(a, end.error_file_id)
    assert len(out) == counts.completed and len(errs) == counts.failed > 0
    assert sorted(r["custom_id"] for r in out + errs) == ids
    assert all(r["response"] is None and r["error"]["code"] == "batch_expired" for r in errs)


async def test_a_bad_line_fails_the_batch_at_validation(stack: Stack) -> None:
    a = client(stack, "a")
    good = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": good},
        {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": good},
        {"custom_id": "y", "url": "/v1/completions", "body": {**good, "model": "gpt-4o"}},
        {"custom_id": "z", "url": "/v1/completions", "body": {**good, "best_of": 2}},
        {"custom_id": "w", "url": "/v1/chat/completions", "body": chat},
    ]
    content = b"\n".join(orjson.dumps(line) for line in lines) + b"\n{not json\n"
    batch = await start_batch(a, content, "/v1/completions")
    end = await wait_for(a, batch.id, lambda x: x.status in ENDED, within_s=30)
    assert end.status == "failed" and end.failed_at is not None
    assert end.errors is not None and end.errors.data is not None
    by_line = {e.line: e.code for e in end.errors.data}
    assert by_line == {
        2: "duplicate_custom_id",
        3: "model_not_found",
        4: "invalid_request",
        5: "mismatched_endpoint",
        6: "invalid_json_line",
    }
    assert "best_of" in next(e.message or "" for e in end.errors.data if e.line == 4)
    assert end.output_file_id is None and end.request_counts is not None
    assert end.request_counts.total == 0
    # Refused at create: what the request itself gets wrong.
    f = await a.files.create(file=("in.jsonl", content), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        await a.batches.create(
            input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        await a.batches.create(
            input_file_id=f.id,
            endpoint="/v1/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )
    with pytest.raises(openai.NotFoundError):
        await a.batches.create(
            input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        await a.files.create(file=("in.jsonl", content), purpose="fine-tune")


async def test_batches_and_files_belong_to_their_tenant(stack: Stack) -> None:
    acme, beta = client(stack, "a"), client(stack, "b", BETA)
    content, _ = input_file(2, endpoint="/v1/completions", model=MODEL, max_tokens=2)
    batch = await start_batch(acme, content, "/v1/completions")
    end = await wait_for(acme, batch.id, lambda x: x.status in ENDED, within_s=60)
    assert end.status == "completed"
    for call in (
        beta.batches.retrieve(batch.id),
        beta.batches.cancel(batch.id),
        beta.files.retrieve(batch.input_file_id),
        beta.files.content(end.output_file_id or ""),
        beta.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert batch.id not in [x.id async for x in beta.batches.list()]
    # The owner's list pages newest first with after/limit.
    mine = [x.id async for x in acme.batches.list(limit=1)]
    assert batch.id in mine and len(mine) == len(set(mine))
    page = await acme.batches.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    nxt = await acme.batches.list(limit=1, after=page.data[0].id)
    assert nxt.data[0].id != page.data[0].id
    # A key whose policy rules out bulk priority cannot make batches (they run at it).
    redis = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:
        keys = KeyStore(redis, stack.names, {}, required=True, pepper=PEPPER.encode())
        interactive, _ = await keys.create("acme", priorities=[Priority.INTERACTIVE])
    finally:
        await redis.aclose()
    with pytest.raises(openai.PermissionDeniedError):
        await client(stack, "a", interactive).batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/completions", completion_window="24h"
        )
    deleted = await acme.files.delete(batch.input_file_id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await acme.files.retrieve(batch.input_file_id)
