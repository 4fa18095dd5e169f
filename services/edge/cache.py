"""The response caches at the edge: look a request up before it goes to Kafka, replay a hit
through the same token stream a worker would write, and ask the worker to store a miss.

A hit looks like a miss to the client: it gets a new request id, events from seq 0 on the
request's Redis stream and replay log (so SSE, WebSocket, ``Last-Event-ID`` resumes and
usage all work unchanged), and never reaches Kafka or a worker. Only the latency and the
``x-tokenwire-cache`` header differ.

Identical misses are coalesced: the first takes a short-lived in-flight marker in Redis
(``SET NX PX``, keyed by scope, generation and digest, holding its request id) and is
generated; one that finds the marker follows the leader's token stream and, once it has
ended, answers from the entry the leader's worker stored, as an exact hit. A leader that
fails, is cancelled or stores nothing hands the marker to one follower, which generates in
its place while the others follow it; past ``TW_CACHE_COALESCE_WAIT_S`` a follower is
generated itself. ``no-cache`` requests never coalesce; ``no-store`` ones follow but never
lead (their answer would not be stored).

Keys are scoped per tenant (``TW_CACHE_SHARED`` puts every tenant in one scope) and carry
the scope's generation: ``tokenwire cache purge`` bumps it, so no entry written before is
reachable, and deletes the old entries.

Lookups run here, at the edge, before anything is queued: the exact lookup is one Redis
round trip (a script reads the generation and the entry), which ``tokenwire bench cache``
cannot tell apart from no lookup in a miss's TTFT; a hit then answers without Kafka, the
batcher's window or a worker, in one more round trip (the owner record and the events,
written together; the client is answered from the events). After an exact miss the
semantic lookup embeds the prompt in a thread, batched with the lookups that arrive while
one is computing (``semantic.py``), and writes a missed prompt's entry off the request's
path; one text costs a forward pass (about 9 ms on one quiet CPU thread traced in float32,
4 ms in bfloat16 where the CPU has it: ``TW_EMBED_DTYPE``), which
the batcher's window would amortise over a dispatch (``tokenwire bench index``: 3.9x
cheaper per query at 16 per call) but only by serving hits from the batcher, after the
window's wait. That is why the semantic cache is off by default.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.edge.config import EdgeSettings
from services.edge.metrics import EdgeMetrics
from shared import token_stream
from shared.cache.inflight import CLAIM, RELEASE, claim_args, marker_key
from shared.cache.inflight import text as _text
from shared.cache.keys import (
    exact_digest,
    model_identity,
    reproducible,
)
from shared.cache.store import (
    cache_scope,
    extra_inputs,
    hit_completion,
    read_exact,
    replay_events,
    to_store,
)
from shared.codec import encode
from shared.messages import CacheMode, CacheResult, GenerateRequest
from shared.names import Names
from shared.retry import REDIS_DOWN

if TYPE_CHECKING:
    from services.edge.relay import EventStream
    from services.edge.semantic import SemanticCache

log = logging.getLogger(__name__)


class CacheMetrics:
    """``tw_cache_lookups_total{kind,result}`` and TTFT by cache result."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lookups = Counter(
            "tw_cache_lookups",
            "response-cache lookups by kind (exact, semantic) and result (hit, miss, skip, "
            "error; coalesced: a miss answered by the identical request being generated, "
            "uncoalesced: one that waited for it and then was generated itself)",
            ["kind", "result"],
            registry=registry,
        )
        self.ttft = Histogram(
            "tw_cache_first_event_seconds",
            "request creation at the edge to its first event relayed, by cache result",
            ["cache"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.lookup_seconds = Histogram(
            "tw_cache_lookup_seconds",
            "time a cache lookup takes, by kind",
            ["kind"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class Lookup:
    """A lookup's outcome: a hit's stored events, or the request to publish (with its
    store instruction when its answer may be cached)."""

    result: CacheResult
    request: GenerateRequest
    entry: bytes | None = None
    coalesce: Coalesce | None = None


@dataclass(frozen=True, slots=True)
class Coalesce:
    """A cacheable miss's in-flight marker: ``held`` when this request took it (it
    generates the answer), else ``leader`` is the request generating it."""

    scope: str
    digest: str
    marker: str
    held: bool
    leader: str | None = None


# After the leader's final event, how long its answer may take to appear (its worker
# stores it as it settles the request, just after publishing that event).
STORE_GRACE_S = 2.0
STORED_FINISHES = frozenset({"stop", "length"})


class ResponseCache:
    """The exact cache (and, when on, the semantic one) of one edge process."""

    def __init__(
        self,
        settings: EdgeSettings,
        redis: aioredis.Redis,
        registry: CollectorRegistry,
        semantic: SemanticCache | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.names: Names = settings.names
        self.metrics = CacheMetrics(registry)
        self.model = model_identity(settings.model_dir, settings.model_name)
        self.semantic = semantic
        self._remembering: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Load the embedder now (seconds), not on the first request."""
        if self.semantic is not None:
            await self.semantic.embedder.embedder()

    def scope(self, tenant: str) -> str:
        return cache_scope(tenant, self.settings.cache_shared)

    async def generation(self, scope: str) -> int:
        raw = await self.redis.get(self.names.cache(scope, "gen"))
        return int(raw) if raw else 0

    async def lookup(self, req: GenerateRequest, mode: CacheMode, *, client_seeded: bool) -> Lookup:
        """Look ``req`` up; on a miss, the request to publish (asking its worker to store
        the answer unless ``no-store``). Redis trouble is a miss, never an error."""
        if not self.settings.cache or not reproducible(req, client_seeded):
            self.metrics.lookups.labels("exact", "skip").inc()
            return Lookup(CacheResult.MISS, req)
        extra = extra_inputs(req, self.settings.index_root)
        if extra is None:  # names an input whose version is unknown here
            self.metrics.lookups.labels("exact", "skip").inc()
            return Lookup(CacheResult.MISS, req)
        started = time.perf_counter()
        try:
            digest = exact_digest(req, self.model, extra)
            return await self._lookup(req, mode, digest, extra.get("retrieval"))
        except REDIS_DOWN as exc:
            log.warning("cache lookup failed: %r", exc, extra={"request_id": req.request_id})
            self.metrics.lookups.labels("exact", "error").inc()
            return Lookup(CacheResult.MISS, req)
        finally:
            self.metrics.lookup_seconds.labels("total").observe(time.perf_counter() - started)

    async def _lookup(
        self, req: GenerateRequest, mode: CacheMode, digest: str, retrieval_version: str | None
    ) -> Lookup:
        scope = self.scope(req.tenant)
        # Token-id prompts have no text to embed: exact lookups only.
        semantic = self.semantic if req.prompt_token_ids is None else None
        gen, entry = await read_exact(self.redis, self.names, scope, digest)
        if mode.looks_up:
            self.metrics.lookups.labels("exact", "hit" if entry else "miss").inc()
            if entry:
                return Lookup(CacheResult.EXACT, req, entry)
        probe = None
        # The prompt is embedded only once the exact cache has missed: started beside the
        # exact read, the forward pass of every exact hit ran on in its thread after the
        # hit was answered, and took the CPU its reply needed (exact-hit TTFT 13 ms against
        # 4.4 ms on 2 cores); the read is one round trip, a fraction of the pass.
        if semantic is not None and mode.looks_up:
            started = time.perf_counter()
            probe = await semantic.lookup(scope, gen, req)
            hit = probe.entry is not None
            self.metrics.lookups.labels("semantic", "hit" if hit else "miss").inc()
            self.metrics.lookup_seconds.labels("semantic").observe(time.perf_counter() - started)
            if probe.entry is not None:
                return Lookup(CacheResult.SEMANTIC, req, probe.entry)
        coalesce = None
        if mode.looks_up and self.settings.cache_coalesce_wait_s > 0:
            marker = marker_key(self.names, scope, gen, digest)
            coalesce = await self._claim(
                Coalesce(scope, digest, marker, held=False), req.request_id, mode.stores
            )
        if not mode.stores:
            return Lookup(CacheResult.MISS, req, coalesce=coalesce)
        if semantic is not None:
            # Off the request's path: the entry only matters once the answer is stored,
            # after the request finishes.
            self._remember(semantic.remember(scope, gen, req, digest, probe), req.request_id)
        ttl_s = self.settings.cache_ttl_s
        stored = to_store(req, scope, digest, gen, ttl_s, retrieval_version)
        return Lookup(CacheResult.MISS, stored, coalesce=coalesce)

    async def _claim(
        self, c: Coalesce, request_id: str, may_lead: bool, failed: str = ""
    ) -> Coalesce:
        """Take the in-flight marker of ``c`` (replacing ``failed``, a leader whose answer
        did not come), or learn who holds it."""
        wait_s = self.settings.cache_coalesce_wait_s
        args = claim_args(request_id, wait_s, may_lead, failed)
        holder = await self.redis.eval(CLAIM, 1, c.marker, *args)
        if holder is None:
            return Coalesce(c.scope, c.digest, c.marker, held=may_lead)
        leader = _text(holder)
        return Coalesce(c.scope, c.digest, c.marker, held=False, leader=leader)

    async def release(self, found: Lookup) -> None:
        """Give up the in-flight marker ``found`` holds (its request was never queued), so
        identical requests stop waiting for it. Best effort: it expires anyway."""
        c = found.coalesce
        if c is None or not c.held:
            return
        try:
            await self.redis.eval(RELEASE, 1, c.marker, found.request.request_id)
        except REDIS_DOWN as exc:
            log.debug("in-flight marker not released: %r", exc)

    async def coalesce(self, found: Lookup, open_stream: Callable[[str], EventStream]) -> Lookup:
        """A miss identical to a request being generated (``found.coalesce.leader``):
        wait for the leader's stream to end and answer from the entry it stored, as an
        exact hit. If the leader fails, is cancelled, or its answer does not appear, this
        request takes its place (or follows whoever did first); past the wait setting it
        is published as a miss of its own."""
        c = found.coalesce
        assert c is not None and c.leader is not None
        req = found.request
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.cache_coalesce_wait_s
        try:
            while c.leader is not None and loop.time() < deadline:
                entry = await self._await_leader(c, c.leader, open_stream, deadline)
                if entry is not None:
                    self.metrics.lookups.labels("exact", "coalesced").inc()
                    return Lookup(CacheResult.EXACT, req, entry)
                may_lead = req.cache_store is not None
                c = await self._claim(c, req.request_id, may_lead, failed=c.leader)
        except REDIS_DOWN as exc:
            log.warning("coalesced wait failed: %r", exc, extra={"request_id": req.request_id})
            c = Coalesce(c.scope, c.digest, c.marker, held=False)
        self.metrics.lookups.labels("exact", "uncoalesced").inc()
        return Lookup(CacheResult.MISS, req, coalesce=c)

    async def _await_leader(
        self,
        c: Coalesce,
        leader: str,
        open_stream: Callable[[str], EventStream],
        deadline: float,
    ) -> bytes | None:
        """The entry ``leader`` stored, once its stream has ended; None when it ended
        without one, it let its marker go before its stream ended, or ``deadline``
        (loop time) passed."""
        loop = asyncio.get_running_loop()
        async with open_stream(leader) as stream:
            while not stream.finished:
                left = deadline - loop.time()
                if left <= 0:
                    return None
                if not await stream.next(min(left, 1.0)) and not stream.finished:
                    holder = await self.redis.get(c.marker)
                    if holder is None or _text(holder) != leader:
                        return None  # never queued, or expired: nothing to wait for
            final = stream.final_event or {}
        if final.get("finish_reason") not in STORED_FINISHES or final.get("error"):
            return None
        grace = min(deadline, loop.time() + STORE_GRACE_S)
        pause = 0.002
        while True:
            _, entry = await read_exact(self.redis, self.names, c.scope, c.digest)
            if entry is not None or loop.time() + pause > grace:
                return entry
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _remember(self, work: Coroutine[Any, Any, None], request_id: str) -> None:
        """Run a semantic entry's write in the background; a failure is logged (the
        request is served all the same, only not found by later paraphrases)."""

        async def run() -> None:
            try:
                await work
            except Exception as exc:
                log.warning("semantic entry not written: %r", exc, extra={"request_id": request_id})

        task = asyncio.create_task(run())
        self._remembering.add(task)
        task.add_done_callback(self._remembering.discard)

    async def settle(self) -> None:
        """Wait for the semantic entries being written (tests, shutdown)."""
        while self._remembering:
            await asyncio.gather(*self._remembering, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class Hit:
    """A hit written to its request's stream: the events as the replay log holds them, and
    the Kafka completion record to send (none unless the request asks for one)."""

    events: list[dict[str, Any]]
    records: list[bytes]


async def publish_hit(
    redis: aioredis.Redis,
    names: Names,
    req: GenerateRequest,
    entry: bytes,
    result: CacheResult,
    *,
    log_ttl_s: int,
    owner: tuple[str, str, int] | None = None,
) -> Hit:
    """Write a hit's events to ``req``'s replay log, seqs from 0, and ``owner`` (key,
    record, TTL) when given, in one round trip of two commands. The events come back as
    the log holds them, so the client is answered from them without reading it; they are
    not published, since no one can be subscribed to a request id not yet handed out (a
    resume reads the log)."""
    events = replay_events(entry, req.request_id)
    encoded = [(ev.seq, encode(ev)) for ev in events]
    pipe = redis.pipeline(transaction=False)
    if owner is not None:
        key, record, ttl_s = owner
        pipe.set(key, record, ex=ttl_s)
    token_stream.queue_log(pipe, names, req.request_id, encoded, ttl_s=log_ttl_s)
    await pipe.execute()
    logged = [orjson.loads(data) for _, data in encoded]
    if not req.reply.kafka_topic:
        return Hit(logged, [])
    return Hit(logged, [encode(hit_completion(req, events, result))])


async def purge(redis: aioredis.Redis, names: Names, scope: str) -> int:
    """Make every cached answer of ``scope`` unreachable (bump its generation) and delete
    the old entries; the number of keys deleted."""
    await redis.incr(names.cache(scope, "gen"))
    deleted = 0
    for pattern in (names.cache(scope, kind, "*") for kind in ("x", "f", "s")):
        batch: list[bytes] = []
        async for key in redis.scan_iter(match=pattern, count=500):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await redis.unlink(*batch)
                batch = []
        if batch:
            deleted += await redis.unlink(*batch)
    return deleted


def response_cache(
    settings: EdgeSettings, redis: aioredis.Redis, metrics: EdgeMetrics
) -> ResponseCache:
    """The edge's caches as its settings ask (the semantic one only when turned on)."""
    semantic = None
    if settings.semantic_cache:
        from services.edge.semantic import EmbedBatcher, SemanticCache, load_single_threaded

        model_dir, dtype = settings.embed_model_dir or None, settings.embed_dtype
        semantic = SemanticCache(
            settings,
            redis,
            EmbedBatcher(lambda: load_single_threaded(model_dir, dtype), words=True),
        )
    return ResponseCache(settings, redis, metrics.registry, semantic)
