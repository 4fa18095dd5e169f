"""Live members (workers, batchers) advertised in Redis without scanning the keyspace.

Each member refreshes its own key (with a TTL) and its score in an index sorted set (the
time it was last seen). Readers take the members seen within the TTL from the index and
fetch their keys in one MGET: two round trips, whatever else Redis holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis


def advertise(pipe: Any, index: str, member: str, key: str, value: bytes, ttl_s: float) -> None:
    """Queue the commands that refresh one member on a pipeline."""
    pipe.set(key, value, px=int(ttl_s * 1000))
    pipe.zadd(index, {member: time.time()})


def withdraw(pipe: Any, index: str, member: str, key: str) -> None:
    pipe.delete(key)
    pipe.zrem(index, member)


async def read_live(
    client: aioredis.Redis, index: str, key_of: Callable[[str], str], ttl_s: float
) -> list[bytes]:
    """The current values of the members seen within ``ttl_s`` (expired ones dropped)."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(index, "-inf", now - ttl_s)
    pipe.zrange(index, 0, -1)
    _, members = await pipe.execute()
    if not members:
        return []
    values = await get_each(client, [key_of(m.decode()) for m in members])
    return [v for v in values if isinstance(v, bytes)]


async def get_each(client: aioredis.Redis, keys: list[str]) -> list[object]:
    """GET of each key in one round trip (per node: a Redis Cluster holds them on many
    slots, where one MGET must not span more than one)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    return list(await pipe.execute())
