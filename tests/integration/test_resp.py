"""The RESP writer the worker's token events and claims go through, against the real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.resp import RedisReplyError, RespWriter
from tests.conftest import new_prefix

pytestmark = pytest.mark.integration


async def test_writer_pipelines_replies_in_order_and_survives_a_killed_connection(
    infra: dict[str, str],
) -> None:
    url = infra["TW_REDIS_URL"]
    key = new_prefix("resp").encode()
    writer = RespWriter(url, name=f"tw-test-{key.decode()}")
    admin = aioredis.Redis.from_url(url)
    try:
        replies = await writer.execute(
            [
                (b"SET", key, b"v1"),
                (b"XADD", key + b":log", b"0-1", b"d", b"x"),
                (b"XADD", key + b":log", b"0-1", b"d", b"x"),  # repeated id: an error
                (b"GET", key),
            ]
        )
        assert replies[0] == b"OK" and replies[1] == b"0-1" and replies[3] == b"v1"
        assert isinstance(replies[2], RedisReplyError)

        # The server drops the connection; the next batch reconnects and goes through.
        (mine,) = [c for c in await admin.client_list() if c["name"] == writer.name]
        assert await admin.client_kill_filter(_id=mine["id"]) == 1
        replies = await writer.execute([(b"SET", key, b"v2"), (b"GET", key)])
        assert replies == [b"OK", b"v2"]
        assert writer.reconnects == 1
        assert await admin.get(key) == b"v2"
    finally:
        await admin.delete(key, key + b":log")
        await writer.aclose()
        await admin.aclose()
