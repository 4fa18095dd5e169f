"""The Lua script of the shared slot ledger, on the real Redis, grants exactly what the
pure rules (``services/batcher/slots.py``) grant, for any sequence of reservations."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.batcher.reservations import SlotReserver
from services.batcher.slots import SlotLedger
from shared.messages import WorkerHeartbeat
from shared.names import Names

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MARGIN_S = 0.02

calls = st.lists(
    st.tuples(
        st.integers(0, 5),  # which heartbeat the batcher holds
        st.floats(0, 0.05),  # time since the previous call
        st.integers(1, 5),  # slots wanted
        st.sampled_from(["a", "b", "c"]),  # the batcher
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(free=st.lists(st.integers(-2, 6), min_size=6, max_size=6), seq=calls)
async def test_the_script_grants_what_the_pure_ledger_grants(
    infra: dict[str, str], free: list[int], seq: list[tuple[int, float, int, str]]
) -> None:
    names = Names(f"slots-{uuid.uuid4().hex[:8]}")
    client = aioredis.from_url(infra["TW_REDIS_URL"])
    reservers = {b: SlotReserver(names, b, MARGIN_S, 10.0) for b in "abc"}
    pure = SlotLedger()
    now = 1_700_000_000.0
    try:
        for i, (beat, dt, want, batcher) in enumerate(seq):
            now += dt
            hb = WorkerHeartbeat(worker_id="w", at=now - 0.1 + beat * 0.03, free_slots=free[beat])
            token = f"{batcher}:{i}"
            expected = pure.reserve(hb.at, hb.free_slots, now, want, MARGIN_S, token)
            got = await reservers[batcher].reserve(client, [(hb, want)], now)
            assert got == {"w": expected}, (i, hb, want)
    finally:
        await client.delete(names.slot_ledger("w"))
        await client.aclose()
