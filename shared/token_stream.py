"""Token streams over Redis: pub/sub for live delivery (sharded on a Redis Cluster:
``Names.sharded``), a Redis Stream as the replay log. A request's channel and log share its
hash tag, so on a cluster both live on its slot's master and the pub/sub traffic splits
across the shards instead of every node relaying every message.

Writer: each event is appended to the request's log (stream id ``0-<seq+1>``) *before* it
is published, so a reader that subscribes first and then reads the log sees every event:
whatever it missed live is already in the log. Reader: subscribe, replay the log after the
last seq it has, then follow the channel, dropping duplicates by ``seq``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from shared.codec import decode, encode
from shared.messages import TokenEvent
from shared.names import Names
from shared.redis_client import initialized

LOG_TTL_S = 3600
LOG_MAXLEN = 100_000


def log_id(seq: int) -> str:
    """The replay-log entry id of event ``seq``; explicit ids make a re-append fail loudly."""
    return f"0-{seq + 1}"


def event_commands(
    names: Names, events: Sequence[TokenEvent], *, ttl_s: int = LOG_TTL_S
) -> list[tuple[bytes, ...]]:
    """The commands that append ``events`` to their logs and publish them, in order."""
    out: list[tuple[bytes, ...]] = []
    maxlen, ttl = b"%d" % LOG_MAXLEN, b"%d" % ttl_s
    for ev in events:
        data = encode(ev)
        log_key = names.token_log(ev.request_id).encode()
        entry = log_id(ev.seq).encode()
        out.append((b"XADD", log_key, b"MAXLEN", b"~", maxlen, entry, b"d", data))
        if ev.seq == 0 or ev.final:
            out.append((b"EXPIRE", log_key, ttl))
        out.append((names.publish, names.token_channel(ev.request_id).encode(), data))
    return out


def queue_events(
    pipe: Any, names: Names, events: Sequence[TokenEvent], *, ttl_s: int = LOG_TTL_S
) -> None:
    """Add the commands that append and publish ``events`` to a redis-py pipeline."""
    for cmd in event_commands(names, events, ttl_s=ttl_s):
        pipe.execute_command(*cmd)


# KEYS[1]: a replay log; ARGV: its MAXLEN, its TTL, then an entry id and an event's bytes
# for each event, in order. One command for a whole stream's events: a pipeline of an XADD
# per event costs the client more (packing, one reply each) than the round trip.
_APPEND_LOG = """
for i = 3, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], ARGV[i], 'd', ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return (#ARGV - 2) / 2
"""


def queue_log(
    pipe: Any, names: Names, request_id: str, encoded: Sequence[tuple[int, bytes]], *, ttl_s: int
) -> None:
    """Add to a redis-py pipeline the one command that appends ``encoded`` ((seq, event
    bytes), in order) to ``request_id``'s replay log, unpublished: for a stream that no
    one can follow yet (a cache hit's, under a request id not handed out), whose readers
    all start from the log."""
    args: list[bytes | int] = [LOG_MAXLEN, ttl_s]
    for seq, data in encoded:
        args += [log_id(seq).encode(), data]
    pipe.eval(_APPEND_LOG, 1, names.token_log(request_id), *args)


async def publish_events(
    client: aioredis.Redis, names: Names, events: Sequence[TokenEvent], *, ttl_s: int = LOG_TTL_S
) -> None:
    """Append and publish ``events`` in one round trip."""
    if not events:
        return
    pipe = client.pipeline(transaction=False)
    queue_events(pipe, names, events, ttl_s=ttl_s)
    await pipe.execute()


async def last_published_seq(client: aioredis.Redis, names: Names, request_id: str) -> int:
    """The highest seq in a request's replay log, or -1 when it has none."""
    entries = await client.xrevrange(names.token_log(request_id), count=1)
    return seq_of(entries[0][0]) if entries else -1  # type: ignore[arg-type]


def seq_of(entry_id: bytes | str) -> int:
    """The seq of a replay-log entry id (the inverse of ``log_id``)."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.split("-")[1]) - 1


async def read_log(
    client: aioredis.Redis, names: Names, request_id: str, *, after_seq: int = -1
) -> list[TokenEvent]:
    """The events of a request's replay log with seq > ``after_seq``, in order."""
    raw = await read_log_raw(client, names, request_id, from_seq=after_seq + 1)
    return [decode(TokenEvent, data) for data in raw]


async def read_log_raw(
    client: aioredis.Redis, names: Names, request_id: str, *, from_seq: int = 0
) -> list[bytes]:
    """The encoded events of a request's replay log with seq >= ``from_seq``, in order
    (for relays that pass the bytes on without building models)."""
    entries = await client.xrange(names.token_log(request_id), min=log_id(from_seq), max="+")
    return [fields[b"d"] for _, fields in entries or ()]  # type: ignore[index,misc]


async def follow(
    client: aioredis.Redis,
    names: Names,
    request_id: str,
    *,
    after_seq: int = -1,
    idle_timeout_s: float | None = None,
) -> AsyncIterator[TokenEvent]:
    """Yield a request's events with seq > ``after_seq`` exactly once each, in order,
    until the final event. Raises ``TimeoutError`` after ``idle_timeout_s`` without one."""
    pubsub = (await initialized(client)).pubsub()
    channel = names.token_channel(request_id)
    if names.sharded:  # a cluster's pub/sub: a connection to the channel's shard
        await pubsub.ssubscribe(channel)
        get_message = pubsub.get_sharded_message  # type: ignore[attr-defined,unused-ignore]
    else:
        await pubsub.subscribe(channel)
        get_message = pubsub.get_message
    next_seq = after_seq + 1
    try:
        for ev in await read_log(client, names, request_id, after_seq=after_seq):
            if ev.seq == next_seq:
                next_seq += 1
                yield ev
                if ev.final:
                    return
        loop = asyncio.get_running_loop()
        last_event_at = loop.time()
        while True:
            msg = await get_message(ignore_subscribe_messages=True, timeout=1.0)
            if msg is None:
                if idle_timeout_s is not None and loop.time() - last_event_at > idle_timeout_s:
                    raise TimeoutError(f"no event for {request_id} in {idle_timeout_s}s")
                continue
            ev = decode(TokenEvent, msg["data"])
            if ev.seq < next_seq:
                continue  # already seen through the log
            last_event_at = loop.time()
            # A gap means events went out before we subscribed; they are in the log.
            batch = (
                [ev]
                if ev.seq == next_seq
                else await read_log(client, names, request_id, after_seq=next_seq - 1)
            )
            for item in batch:
                if item.seq != next_seq:
                    continue
                next_seq += 1
                yield item
                if item.final:
                    return
    finally:
        await (pubsub.sunsubscribe() if names.sharded else pubsub.unsubscribe())
        await pubsub.aclose()
