"""Two batchers under a burst, one worker: the worker's queue never goes past the free
slots it advertised (the batchers share their reservations in Redis)."""

from __future__ import annotations

import asyncio

import pytest

from shared.codec import decode, encode
from shared.messages import (
    Batch,
    Completion,
    GenerateRequest,
    ReplyTarget,
    SamplingParams,
    WorkerHeartbeat,
)
from tests.integration.harness import Stack, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MAX_RUNNING = 2


async def watch_heartbeats(stk: Stack, worker_id: str, seen: list[WorkerHeartbeat]) -> None:
    """Every distinct heartbeat the worker publishes (read every 5 ms)."""
    client = stk.settings.redis.client()
    key = stk.names.heartbeat(worker_id)
    try:
        while True:
            raw = await client.get(key)
            if raw is not None:
                hb = decode(WorkerHeartbeat, raw)
                if not seen or seen[-1].at != hb.at:
                    seen.append(hb)
            await asyncio.sleep(0.005)
    finally:
        await client.aclose()


async def test_two_batchers_never_overfill_a_worker(bare: Stack) -> None:
    stk = bare
    worker_id = f"{stk.prefix}-worker"
    # A heartbeat also goes out when requests end (it shows the worker idle), so requests
    # must outlast the interval for a periodic beat to catch the worker at work.
    stk.start("worker", TW_MAX_RUNNING=str(MAX_RUNNING), TW_HEARTBEAT_INTERVAL_S="0.1")
    # Windows short enough that both batchers dispatch between two heartbeats.
    fast = {"TW_WINDOW_MIN_MS": "5", "TW_WINDOW_MAX_MS": "10", "TW_INTERACTIVE_RESERVE": "0"}
    stk.start("batcher", "batcher-a", TW_BATCHER_ID=f"{stk.prefix}-a", **fast)
    stk.start("batcher", "batcher-b", TW_BATCHER_ID=f"{stk.prefix}-b", **fast)
    await stk.wait_ready(within_s=240)
    await asyncio.sleep(3)  # both batchers in the group, each owning one partition
    seen: list[WorkerHeartbeat] = []
    watcher = asyncio.create_task(watch_heartbeats(stk, worker_id, seen))
    topic = stk.names.completions
    burst = [
        GenerateRequest(
            tenant=f"t{i % 4}",
            prompt=f"Request {i} asks the worker to count",
            # Long enough that a pair outlasts the interval on a fast host too (64 did not).
            sampling=SamplingParams(max_tokens=256, temperature=0, ignore_eos=True),
            reply=ReplyTarget(kafka_topic=topic),
        )
        for i in range(24)
    ]
    boot = stk.env["TW_KAFKA_BOOTSTRAP"]
    # Keys spread the burst over both partitions, so both batchers hold some of it.
    await produce(
        boot,
        stk.names.requests,
        [encode(r) for r in burst],
        keys=[r.request_id.encode() for r in burst],
    )
    want = {r.request_id for r in burst}
    try:
        raw = await read_topic(
            boot,
            topic,
            lambda vs: want <= {decode(Completion, v).request_id for v in vs},
            180,
        )
    finally:
        watcher.cancel()
    done = {decode(Completion, v).request_id for v in raw}
    assert want <= done, stk.logs()
    batches = await read_topic(
        boot,
        stk.names.batches,
        lambda vs: want <= {r.request_id for v in vs for r in decode(Batch, v).requests},
        30,
    )
    # The burst went through both batchers, or the test shows nothing.
    assert {decode(Batch, v).batcher_id for v in batches} == {f"{stk.prefix}-a", f"{stk.prefix}-b"}
    busy = [hb for hb in seen if hb.running]
    assert busy, "no heartbeat caught the worker at work"
    over = [(hb.running, hb.waiting, hb.free_slots) for hb in seen if hb.free_slots < 0]
    assert not over, f"queue beyond the advertised slots (running, waiting, free): {over}"
    assert max(hb.running + hb.waiting for hb in seen) <= MAX_RUNNING
