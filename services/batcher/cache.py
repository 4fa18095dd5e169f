"""The exact response cache for requests that backend services send straight to Kafka with
a ``cache`` field (edges look their requests up before queueing them).

The requests a tick consumed are looked up together, in one Redis round trip, as they
arrive: a hit never waits for the window. A hit is answered here, under the request's own
id: its events are appended to its replay log and published (its producer may be
following the channel already), its ``Completion`` (``cache: exact``) is sent to its reply
topic, and then its done marker is written. A miss goes on to a worker, asking it to store
the answer (unless ``no-store``), unless an identical miss is being generated: then it
follows that one (``coalesce.py``) and is answered from its entry, as an exact hit.

A request that has a replay log or a done marker already is a redelivery (this batcher
died before committing it): it goes to a worker as it is, whose claim settles it exactly
once (a finished log is settled from the log, its completion sent only if the reply topic
does not hold it yet). A hit whose completion Kafka does not take in time goes the same
way; should that completion land after the worker looked for it, it is delivered twice,
never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter

from services.batcher.coalesce import Group, Handover, Seen
from shared import token_stream
from shared.cache.inflight import CLAIM, claim_args, marker_key, text
from shared.cache.keys import exact_digest, model_identity, reproducible
from shared.cache.store import (
    READ_ENTRY,
    cache_scope,
    extra_inputs,
    hit_completion,
    read_entry_args,
    replay_events,
    to_store,
)
from shared.codec import encode
from shared.messages import CacheMode, CacheResult, GenerateRequest
from shared.names import Names
from shared.settings import CommonSettings

log = logging.getLogger(__name__)

Send = Callable[[str, bytes, bytes], Awaitable[None]]  # topic, value, key; raises KafkaError


@dataclass(slots=True)
class Asked:
    """A request that asked for the cache: its digest, and what the lookup found."""

    request: GenerateRequest
    mode: CacheMode
    digest: str
    retrieval_version: str | None
    scope: str
    generation: int = 0
    entry: bytes | None = None
    fresh: bool = True  # no replay log, no done marker: not seen before


class KafkaCache:
    """Looks up, and answers, the cache-asking requests a batcher consumed."""

    def __init__(self, settings: CommonSettings, model_dir: str, registry: CollectorRegistry):
        self.settings = settings
        self.names: Names = settings.names
        # Without the model's folder its identity is its name alone: an entry could outlive
        # a change of weights under that name, so nothing is looked up.
        self.model = model_identity(model_dir, settings.model_name) if model_dir else None
        self.lookups = Counter(
            "tw_cache_lookups",
            "response-cache lookups of requests sent straight to Kafka, by kind and result "
            "(hit, miss, skip: not cacheable, or the cache off; error: Redis away)",
            ["kind", "result"],
            registry=registry,
        )

    def asking(self, req: GenerateRequest, client_seeded: bool) -> Asked | None:
        """What a consumed request needs looked up, or None (it did not ask, may not be
        cached, or the cache is off here)."""
        mode = req.cache
        if mode is None or req.cache_store is not None:
            return None
        extra = extra_inputs(req, self.settings.index_root)
        if (
            self.model is None
            or not self.settings.cache
            or not reproducible(req, client_seeded)
            or extra is None
        ):
            self.lookups.labels("exact", "skip").inc()
            return None
        scope = cache_scope(req.tenant, self.settings.cache_shared)
        digest = exact_digest(req, self.model, extra)
        return Asked(req, mode, digest, extra.get("retrieval"), scope)

    async def look_up(self, client: aioredis.Redis, asked: list[Asked]) -> None:
        """Fill in each request's entry and whether it is fresh, in one round trip."""
        pipe = client.pipeline(transaction=False)
        for a in asked:
            rid = a.request.request_id
            pipe.exists(self.names.token_log(rid), self.names.done_marker(rid))
            pipe.eval(READ_ENTRY, 1, *read_entry_args(self.names, a.scope, a.digest))
        replies: list[Any] = await pipe.execute()
        for i, a in enumerate(asked):
            seen, (raw_gen, entry) = replies[2 * i], replies[2 * i + 1]
            a.fresh, a.generation = not seen, int(raw_gen)
            a.entry = entry if a.fresh and a.mode.looks_up else None
            if a.fresh and a.mode.looks_up:
                self.lookups.labels("exact", "hit" if entry else "miss").inc()

    @property
    def coalescing(self) -> bool:
        """Whether identical misses wait for the first one's answer."""
        return self.settings.cache_coalesce_wait_s > 0

    def marker(self, a: Asked) -> str:
        """The in-flight marker of ``a``'s answer (edges use the same)."""
        return marker_key(self.names, a.scope, a.generation, a.digest)

    async def claim(self, client: aioredis.Redis, misses: list[Asked]) -> list[str | None]:
        """Claim each miss's in-flight marker, in one round trip and in order (the first
        of identical misses takes it): the holder each should follow, or None where it
        holds the marker now (or, ``no-store``, no one holds it)."""
        wait_s = self.settings.cache_coalesce_wait_s
        pipe = client.pipeline(transaction=False)
        for a in misses:
            args = claim_args(a.request.request_id, wait_s, a.mode.stores)
            pipe.eval(CLAIM, 1, self.marker(a), *args)
        return [None if h is None else text(h) for h in await pipe.execute()]

    async def take_over(
        self, client: aioredis.Redis, handovers: list[Handover[Any]]
    ) -> list[str | None]:
        """Claim failed leaders' markers for their candidates: None where the candidate
        took it, else the request that holds it now."""
        wait_s = self.settings.cache_coalesce_wait_s
        pipe = client.pipeline(transaction=False)
        for h in handovers:
            args = claim_args(h.candidate.request_id, wait_s, True, failed=h.failed)
            pipe.eval(CLAIM, 1, h.marker, *args)
        return [None if h is None else text(h) for h in await pipe.execute()]

    async def watch(self, client: aioredis.Redis, groups: list[Group[Any]]) -> dict[str, Seen]:
        """One look at each followed marker, in one round trip: its holder, whether its
        leader has ended (read before the entry: a worker stores the answer before it
        sets the done marker, so an ended leader's answer is never missed), the entry."""
        pipe = client.pipeline(transaction=False)
        for g in groups:
            pipe.get(g.marker)
            pipe.exists(self.names.done_marker(g.leader))
            pipe.eval(READ_ENTRY, 1, *read_entry_args(self.names, g.scope, g.digest))
        replies: list[Any] = await pipe.execute()
        seen = {}
        for i, g in enumerate(groups):
            holder, done, (_, entry) = replies[3 * i : 3 * i + 3]
            seen[g.marker] = Seen(None if holder is None else text(holder), bool(done), entry)
        return seen

    def to_store(self, a: Asked) -> GenerateRequest:
        """The request a worker runs: asked to store its answer unless it may not be."""
        if not a.fresh or not a.mode.stores:
            return a.request
        ttl_s = self.settings.cache_ttl_s
        return to_store(a.request, a.scope, a.digest, a.generation, ttl_s, a.retrieval_version)

    async def answer(self, client: aioredis.Redis, a: Asked, send: Send) -> bool:
        """Answer a hit: its stream, its completion, its done marker. False when Kafka did
        not take the completion (the request then goes to a worker, which settles it from
        the stream written here); Redis errors propagate (nothing of it was written, or the
        worker's claim sees the stream)."""
        assert a.entry is not None
        req = a.request
        events = replay_events(a.entry, req.request_id)
        await token_stream.publish_events(client, self.names, events)
        topic = req.reply.kafka_topic
        if topic:
            record = encode(hit_completion(req, events, CacheResult.EXACT))
            try:
                await send(topic, record, req.request_id.encode())
            except KafkaError as exc:
                log.warning(
                    "a cache hit's completion was not sent (%r): a worker settles it",
                    exc,
                    extra={"request_id": req.request_id},
                )
                return False
        done = self.names.done_marker(req.request_id)
        await client.set(done, b"1", ex=token_stream.LOG_TTL_S)
        log.info("answered from the exact cache", extra={"request_id": req.request_id})
        return True
