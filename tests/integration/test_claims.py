"""The worker's claims against a real Redis: taken, refreshed and released only by their
holder, and the count of crashed attempts that makes a request a poison."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from services.worker.claims import POISON_ATTEMPTS, Claims
from shared.names import Names
from tests.conftest import new_prefix

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def names() -> AsyncIterator[Names]:
    yield Names(new_prefix("claims"))


async def test_claims_are_refreshed_and_released_only_by_their_holder(
    infra: dict[str, str], names: Names
) -> None:
    url = infra["TW_REDIS_URL"]
    a, b = Claims(url, names, "wa", 5.0), Claims(url, names, "wb", 5.0)
    redis = aioredis.Redis.from_url(url)
    try:
        [first] = await a.take(["r1"])
        assert first.ours and not first.done and first.last_seq == -1
        [other] = await b.take(["r1"])
        assert not other.ours
        # b neither extends nor deletes a's claim; a keeps it.
        assert await b.refresh(["r1"]) == ["r1"]
        await b.release(["r1"], "handed_back")
        assert await redis.get(names.claim("r1")) == b"wa"
        assert await a.refresh(["r1"]) == []
        # A claim Redis lost (a restart without persistence) is taken again by its holder.
        await redis.delete(names.claim("r1"))
        assert await a.refresh(["r1"]) == []
        assert await redis.get(names.claim("r1")) == b"wa"
        await a.release(["r1"], "done", done_ttl_s=60)
        assert await redis.exists(names.done_marker("r1"))
        assert not await redis.exists(names.claim("r1"), names.takers("r1"))
        [again] = await b.take(["r1"])
        assert again.done and not again.ours
    finally:
        for c in (a, b):
            await c.aclose()
        await redis.aclose()


async def test_two_crashed_attempts_make_a_poison_and_handbacks_do_not_count(
    infra: dict[str, str], names: Names
) -> None:
    url = infra["TW_REDIS_URL"]
    workers = [Claims(url, names, f"w{i}", 0.2) for i in range(5)]
    try:
        # Handed back cleanly (a rebalance, a shutdown) any number of times: never a poison.
        for w in workers[:3]:
            [c] = await w.take(["r"])
            assert c.ours and c.crashed_attempts == 0 and not c.poison
            await w.release(["r"], "handed_back")
        # Two workers crash under it (their claims lapse) ...
        for i, w in enumerate(workers[:POISON_ATTEMPTS]):
            [c] = await w.take(["r"])
            assert c.ours and c.crashed_attempts == i and not c.poison
            await asyncio.sleep(0.3)  # the claim expires with its dead worker
        # ... and the next taker quarantines it; a duplicate delivery sees the same.
        [c] = await workers[3].take(["r"])
        assert c.poison and c.crashed_attempts == POISON_ATTEMPTS
        [dup] = await workers[3].take(["r"])
        assert dup.poison
        # An engine failure under a request counts like a crash.
        [c2] = await workers[4].take(["s"])
        await workers[4].release(["s"], "crashed")
        [c2] = await workers[0].take(["s"])
        assert c2.crashed_attempts == 1
    finally:
        for w in workers:
            await w.aclose()


async def test_a_worker_taking_its_own_lapsed_claim_again_is_no_crash(
    infra: dict[str, str], names: Names
) -> None:
    """A take retried across a Redis failover, or a batch delivered back to the worker
    that held it, finds the claim lapsed (Redis was away longer than its TTL): the worker
    is alive, so its own earlier attempt is no crash, however often that happens. A new
    process under the same worker id is another attempt: the one before it died."""
    url = infra["TW_REDIS_URL"]
    w, other = Claims(url, names, "w", 0.2), Claims(url, names, "x", 0.2)
    try:
        for _ in range(POISON_ATTEMPTS + 1):
            [c] = await w.take(["r"])
            assert c.ours and c.crashed_attempts == 0 and not c.poison
            await asyncio.sleep(0.3)  # lapsed while this worker could not refresh it
        [c] = await other.take(["r"])
        assert c.ours and c.crashed_attempts == 1  # w may have died: counted once
        await other.release(["r"], "handed_back")
        restarted = Claims(url, names, "w", 0.2)
        try:
            [c] = await restarted.take(["r"])
            assert c.ours and c.crashed_attempts == 1  # the process before it
            await restarted.release(["r"], "handed_back")
        finally:
            await restarted.aclose()
        [c] = await w.take(["r"])  # the first process, alive after all
        assert c.ours and c.crashed_attempts == 0
    finally:
        for claims in (w, other):
            await claims.aclose()
