"""Exact-cache entries in Redis: a finished request's token events, stored by the worker
that generated them and replayed by an edge under a new request id.

An entry is the request's whole event list (seq 0 to the final event, request ids left
out) as one JSON array under ``Names.cache_exact``, with the TTL the edge asked for. It is
copied from the request's replay log, so it holds exactly the events its client saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from shared import token_stream
from shared.cache.keys import SHARED_SCOPE, STORABLE_FINISHES
from shared.messages import (
    CacheResult,
    CacheStore,
    Completion,
    FinishReason,
    GenerateRequest,
    TokenEvent,
)
from shared.names import Names
from shared.retrieval.store import RetrievalError, index_version


def cache_scope(tenant: str, shared: bool) -> str:
    """The cache scope a tenant's entries live in (one for all when tenants share)."""
    return SHARED_SCOPE if shared else tenant


def to_store(
    req: GenerateRequest,
    scope: str,
    digest: str,
    generation: int,
    ttl_s: int,
    retrieval_version: str | None,
) -> GenerateRequest:
    """``req`` asking its worker to store its answer as entry ``digest`` of ``scope``."""
    store = CacheStore(
        digest=digest,
        generation=generation,
        ttl_s=ttl_s,
        shared=scope == SHARED_SCOPE,
        retrieval_version=retrieval_version,
    )
    return req.model_copy(update={"cache_store": store})


def storable(req: GenerateRequest, final: TokenEvent | None) -> bool:
    """Whether a finished request's answer goes to the cache: the edge asked for it, it
    ended by stop or length (never an error or a cancellation), and it was grounded on
    the retrieval index version its key names."""
    spec = req.cache_store
    return (
        spec is not None
        and final is not None
        and final.finish_reason in STORABLE_FINISHES
        and final.error is None
        and _grounded_as_keyed(req, spec.retrieval_version)
    )


def _grounded_as_keyed(req: GenerateRequest, version: str | None) -> bool:
    """Whether the retrieval applied is the index version the key names (an index that
    changed between the edge's lookup and the batcher's retrieval: not stored)."""
    if req.retrieval is None:
        return True
    return req.grounding is not None and req.grounding.version == version


def entry_of(raws: list[bytes]) -> bytes | None:
    """The cache value for a replay log's encoded events, or None when the log is not one
    whole stream (seq 0 on, contiguous, ending with a final event)."""
    events: list[dict[str, Any]] = [orjson.loads(r) for r in raws]
    if not events or events[-1].get("finish_reason") is None:
        return None
    if [ev["seq"] for ev in events] != list(range(len(events))):
        return None
    for ev in events:
        ev.pop("request_id", None)
    return orjson.dumps(events)


async def store_answer(client: aioredis.Redis, names: Names, req: GenerateRequest) -> bool:
    """Copy ``req``'s replay log into its exact-cache entry; False when the log is not
    whole (expired, trimmed)."""
    spec = req.cache_store
    if spec is None:
        return False
    raws = await token_stream.read_log_raw(client, names, req.request_id)
    value = entry_of(raws)
    if value is None:
        return False
    scope = SHARED_SCOPE if spec.shared else req.tenant
    key = names.cache_exact(scope, spec.generation, spec.digest)
    await client.set(key, value, ex=spec.ttl_s)
    return True


def replay_events(entry: bytes, request_id: str) -> list[TokenEvent]:
    """A cache entry's events under ``request_id``, seqs from 0."""
    return [TokenEvent(request_id=request_id, **ev) for ev in orjson.loads(entry)]


async def read_entry(client: aioredis.Redis, key: str) -> bytes | None:
    """An exact-cache entry's value, or None when there is none."""
    raw = await client.get(key)
    if raw is None or isinstance(raw, bytes):
        return raw
    return str(raw).encode()


# KEYS[1]: the scope's generation counter; ARGV: the exact entries' key prefix, a digest.
# The entry key is built from the generation read in the same call (a purge in between
# cannot pair an old generation with a new entry).
READ_ENTRY = """
local gen = redis.call('GET', KEYS[1]) or '0'
return {gen, redis.call('GET', ARGV[1] .. ':' .. gen .. ':' .. ARGV[2])}
"""


def read_entry_args(names: Names, scope: str, digest: str) -> tuple[str, str, str]:
    """``READ_ENTRY``'s key and arguments for entry ``digest`` of ``scope``."""
    entry_prefix = names.cache_exact(scope, 0, digest).rsplit(":", 2)[0]
    return names.cache(scope, "gen"), entry_prefix, digest


async def read_exact(
    client: aioredis.Redis, names: Names, scope: str, digest: str
) -> tuple[int, bytes | None]:
    """The scope's generation and the exact entry ``digest`` of it, in one round trip."""
    raw_gen, entry = await client.eval(READ_ENTRY, 1, *read_entry_args(names, scope, digest))
    return int(raw_gen), entry


def extra_inputs(req: GenerateRequest, index_root: Path) -> dict[str, str] | None:
    """Inputs a request names but does not hold, with their versions: the current version
    of the retrieval index it names. None when that cannot be told (never cached)."""
    if req.retrieval is None:
        return {}
    try:
        return {"retrieval": index_version(index_root, req.retrieval.index)}
    except RetrievalError:
        return None


def hit_completion(
    req: GenerateRequest, events: list[TokenEvent], result: CacheResult
) -> Completion:
    """The Kafka completion of a request answered from a cache entry's ``events``."""
    final = events[-1]
    return Completion(
        request_id=req.request_id,
        tenant=req.tenant,
        text="".join(ev.text for ev in events),
        token_ids=[t for ev in events for t in ev.token_ids],
        finish_reason=final.finish_reason or FinishReason.STOP,
        usage=final.usage,
        created_at=req.created_at,
        cache=result,
    )
