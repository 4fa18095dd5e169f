"""Crash recovery and scale-out through Kafka consumer groups: nothing lost, nothing
answered twice as the client sees it, outputs identical to an uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import torch
from aiokafka import AIOKafkaConsumer
from transformers import AutoModelForCausalLM, AutoTokenizer

from shared.codec import decode, encode
from shared.messages import (
    Batch,
    Completion,
    FinishReason,
    GenerateRequest,
    Priority,
    ReplyTarget,
    SamplingParams,
)
from tests.integration.harness import Stack, StreamRecorder, completions, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

FAST_FAILOVER = {"TW_SESSION_TIMEOUT_MS": "3000", "TW_CLAIM_TTL_S": "2"}
WORDS = (
    "the function returns a list of values for each key in the mapping if it is not None".split()
)


def greedy_requests(
    n: int, max_tokens: int, seed: int, reply_topic: str | None = None
) -> list[GenerateRequest]:
    rng = random.Random(seed)
    return [
        GenerateRequest(
            prompt=" ".join(rng.choices(WORDS, k=rng.randint(3, 20))),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            reply=ReplyTarget(kafka_topic=reply_topic),
        )
        for _ in range(n)
    ]


def reference_tokens(model_dir: str, reqs: list[GenerateRequest], n: int) -> dict[str, list[int]]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = {}
    with torch.inference_mode():
        for r in reqs:
            ids = tok(r.prompt, return_tensors="pt")["input_ids"]
            gen = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=[])
            out[r.request_id] = gen[0, ids.shape[1] :].tolist()
    return out


async def wait_for_progress(rec: StreamRecorder, streams: int, within_s: float = 60) -> None:
    for _ in range(int(within_s * 10)):
        if len(rec.raw) >= streams:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"only {len(rec.raw)} streams started")


async def test_worker_killed_mid_stream_another_takes_over(bare: Stack, model_dir: str) -> None:
    st = bare
    reqs = greedy_requests(100, 24, seed=1)
    st.start("batcher")
    st.start("worker", "w1", **FAST_FAILOVER, TW_MAX_RUNNING="16")
    await st.wait_ready()
    async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
        await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests, [encode(r) for r in reqs])
        await wait_for_progress(rec, 20)
        assert len(rec.finished()) < 100
        st.stop("w1", signal.SIGKILL)
        st.start("worker", "w2", **FAST_FAILOVER)
        await rec.wait_finished({r.request_id for r in reqs}, within_s=240, stack=st)
    st.stop_all()  # the references need the CPU more than an idle stack
    expected = await asyncio.to_thread(reference_tokens, model_dir, reqs, 24)
    for r in reqs:
        events = rec.stream(r.request_id)  # contiguous, one final, duplicates identical
        assert [t for e in events for t in e.token_ids] == expected[r.request_id]
        assert events[-1].finish_reason == "length"


async def test_a_request_claimed_elsewhere_waits_for_that_claim(bare: Stack) -> None:
    """Requests another live worker holds are left to it: one is generated here only once
    that claim lapses (its worker died); one cancelled meanwhile ends cancelled, with no
    token generated."""
    st = bare
    st.start("worker", **FAST_FAILOVER)
    await st.wait_ready()
    held, cancelled = greedy_requests(2, 4, seed=5)
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        for r in (held, cancelled):
            await redis.set(st.names.claim(r.request_id), b"another-worker", px=3000)
        async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
            batch = Batch(batcher_id="test", requests=[held, cancelled])
            await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.batches, [encode(batch)])
            await asyncio.sleep(1.5)
            assert not rec.raw, "generated while another worker held the claim"
            await redis.set(st.names.cancelled(cancelled.request_id), b"1", ex=60)
            await rec.wait_finished({held.request_id, cancelled.request_id}, 60, stack=st)
    finally:
        await redis.aclose()
    assert sum(len(e.token_ids) for e in rec.stream(held.request_id)) == 4
    ends = rec.stream(cancelled.request_id)
    assert [e.finish_reason for e in ends] == [FinishReason.CANCELLED]
    assert not ends[0].token_ids


async def test_outputs_before_the_claim_answers_are_held_for_it(
    bare: Stack, model_dir: str
) -> None:
    """The engine starts before a batch's claims answer. With Redis holding writes back (so
    the claims wait) while the engine generates, a request another worker holds publishes
    nothing and is left to it; the one this worker claims streams in full, in order."""
    st = bare
    st.start("worker", **FAST_FAILOVER)
    await st.wait_ready()
    mine, elsewhere = greedy_requests(2, 12, seed=7)
    redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    try:
        await redis.set(st.names.claim(elsewhere.request_id), b"another-worker", px=4000)
        async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
            await redis.execute_command("CLIENT", "PAUSE", 2500, "WRITE")
            batch = Batch(batcher_id="test", requests=[mine, elsewhere])
            await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.batches, [encode(batch)])
            await rec.wait_finished({mine.request_id}, 60, stack=st)
            assert elsewhere.request_id not in rec.raw, "published without the claim"
            await rec.wait_finished({elsewhere.request_id}, 60, stack=st)  # once it lapses
    finally:
        await redis.aclose()
    expected = reference_tokens(model_dir, [mine, elsewhere], 12)
    for r in (mine, elsewhere):
        events = rec.stream(r.request_id)
        assert [e.seq for e in events] == list(range(len(events)))
        assert [t for e in events for t in e.token_ids] == expected[r.request_id]
        assert events[-1].finish_reason == "length"


async def test_batcher_killed_and_restarted_answers_each_request_once(bare: Stack) -> None:
    st = bare
    reqs = greedy_requests(200, 4, seed=2)
    st.start("batcher", "b1")
    st.start("worker", **FAST_FAILOVER)
    await st.wait_ready()
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
        await produce(boot, st.names.requests, [encode(r) for r in reqs[:100]])
        await wait_for_progress(rec, 10)
        st.stop("b1", signal.SIGKILL)
        await produce(boot, st.names.requests, [encode(r) for r in reqs[100:]])
        st.start("batcher", "b2", **FAST_FAILOVER)
        await rec.wait_finished({r.request_id for r in reqs}, within_s=240, stack=st)
    for r in reqs:
        events = rec.stream(r.request_id)
        assert sum(len(e.token_ids) for e in events) == 4


async def test_two_batchers_and_two_workers_share_the_load(bare: Stack) -> None:
    st = bare
    reqs = greedy_requests(80, 6, seed=3, reply_topic=st.names.completions)
    for i, r in enumerate(reqs):
        r.tenant = f"tenant{i % 3}"
        r.priority = Priority.BULK if i % 4 == 0 else Priority.INTERACTIVE
    for name in ("b1", "b2"):
        st.start("batcher", name)
    for name in ("w1", "w2"):
        st.start("worker", name, TW_MAX_RUNNING="8")
    await st.wait_ready(workers=2)
    await asyncio.sleep(3)  # let both groups settle their partitions
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    await produce(
        boot,
        st.names.requests,
        [encode(r) for r in reqs],
        keys=[r.request_id.encode() for r in reqs],
    )
    want = {r.request_id for r in reqs}
    raw = await read_topic(
        boot,
        st.names.completions,
        lambda vs: want <= {decode(Completion, v).request_id for v in vs},
        180,
    )
    done = {decode(Completion, v).request_id: decode(Completion, v) for v in raw}
    assert want <= done.keys(), st.logs()
    assert {c.worker_id for c in done.values()} == {f"{st.prefix}-w1", f"{st.prefix}-w2"}
    batches = await read_topic(boot, st.names.batches, lambda vs: False, 3)
    batchers = {decode(Batch, v).batcher_id for v in batches}
    assert len(batchers) == 2


async def test_sigterm_drains_hands_back_and_another_worker_finishes(
    bare: Stack, model_dir: str
) -> None:
    st = bare
    reqs = greedy_requests(12, 400, seed=4)  # long enough to be running at SIGTERM
    st.start("batcher")
    st.start("worker", "w1", **FAST_FAILOVER, TW_DRAIN_TIMEOUT_S="1")
    await st.wait_ready()
    async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
        await produce(st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests, [encode(r) for r in reqs])
        await wait_for_progress(rec, 12)
        rc = st.stop("w1", signal.SIGTERM, timeout=30)
        assert rc == 0  # it drained, handed back and left the group on its own
        assert len(rec.finished()) < 12
        st.start("worker", "w2", **FAST_FAILOVER)
        await rec.wait_finished({r.request_id for r in reqs}, within_s=300, stack=st)
    expected = reference_tokens(model_dir, reqs[:3], 400)
    for r in reqs:
        events = rec.stream(r.request_id)
        assert sum(len(e.token_ids) for e in events) == 400
    for r in reqs[:3]:
        assert [t for e in rec.stream(r.request_id) for t in e.token_ids] == expected[r.request_id]


async def test_a_worker_joining_takes_partitions_without_restarting_what_stays(
    bare: Stack,
) -> None:
    """A second worker joins while the first runs long requests on both partitions: the
    first hands back only the requests of the partition it loses, and the ones on the
    partition it keeps run on, never started again; every request is answered once."""
    st = bare
    st.start("batcher")
    # The first worker is paused while the second loads its model (a variable time): its
    # Kafka session and its claims must outlast the pause.
    st.start(
        "worker",
        "w1",
        TW_MAX_RUNNING="16",
        TW_LOG_LEVEL="DEBUG",
        TW_SESSION_TIMEOUT_MS="120000",
        TW_CLAIM_TTL_S="300",
    )
    await st.wait_ready()
    reqs = greedy_requests(8, 1500, seed=5, reply_topic=st.names.completions)
    boot = st.env["TW_KAFKA_BOOTSTRAP"]
    async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
        await produce(
            boot,
            st.names.requests,
            [encode(r) for r in reqs],
            [r.request_id.encode() for r in reqs],
        )
        await wait_for_progress(rec, len(reqs))
        # Frozen mid-generation until the second worker has joined the group, so the
        # rebalance comes while every request still runs, however fast this machine is.
        w1 = st.procs["w1"].pid
        signal_tree(w1, signal.SIGSTOP)
        try:
            st.start("worker", "w2", TW_MAX_RUNNING="16")
            await wait_heartbeat(st, f"{st.prefix}-w2")
        finally:
            signal_tree(w1, signal.SIGCONT)
        got = await completions(st, {r.request_id for r in reqs}, within_s=240)
        for r in reqs:
            rec.stream(r.request_id)  # contiguous, one final event
    assert sorted(c.request_id for c in got) == sorted(r.request_id for r in reqs)
    log = (st.log_dir / f"{st.prefix}-w1.log").read_text()
    starts = Counter(
        json.loads(line).get("request_id") for line in log.splitlines() if '"started ' in line
    )
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assigned = [
        (x["t"], set(json.loads(x["msg"].removeprefix("assigned partitions "))))
        for x in lines
        if x["logger"] == "services.worker.service" and x["msg"].startswith("assigned partitions")
    ]
    assert [len(parts) for _, parts in assigned] == [2, 1], assigned  # the join moved one
    rebalanced_at, kept = assigned[-1]
    parts = await batch_partitions(boot, st.names.batches, {r.request_id for r in reqs})
    stayed = [r.request_id for r in reqs if parts[r.request_id] in kept]
    moved = [r.request_id for r in reqs if parts[r.request_id] not in kept]
    assert stayed and moved, parts  # both partitions held some
    finished_at = {
        x["request_id"]: x["t"]
        for x in lines
        if x["msg"].startswith("finished") and "request_id" in x
    }
    assert any(finished_at.get(rid, 0) > rebalanced_at for rid in stayed), "all done before"
    assert {rid: starts[rid] for rid in stayed} == dict.fromkeys(stayed, 1), starts
    worker_of = {c.request_id: c.worker_id for c in got}
    assert {worker_of[rid] for rid in stayed} == {f"{st.prefix}-w1"}


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and its children (a worker and its engine process)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for p in [pid, *map(int, children)]:
        os.kill(p, sig)


async def wait_heartbeat(st: Stack, worker_id: str, within_s: float = 180) -> None:
    """Until ``worker_id`` has a heartbeat: its model is loaded and its consumer joins."""
    client = st.settings.redis.client()
    try:
        for _ in range(int(within_s * 5)):
            st.check_alive()
            if await client.zscore(st.names.workers_index, worker_id) is not None:
                return
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()
    raise TimeoutError(f"no heartbeat from {worker_id}:\n{st.logs()}")


async def batch_partitions(bootstrap: str, topic: str, want: set[str]) -> dict[str, int]:
    """The batches topic's partition of each request in ``want``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: dict[str, int] = {}
    try:
        for _ in range(50):
            for tp, msgs in (await consumer.getmany(timeout_ms=300)).items():
                for m in msgs:
                    for r in decode(Batch, m.value).requests:
                        out.setdefault(r.request_id, tp.partition)
            if want <= out.keys():
                break
    finally:
        await consumer.stop()
    return out
