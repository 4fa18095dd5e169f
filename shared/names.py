"""One place for every Kafka topic and Redis key or channel name.

A prefix (``TW_TOPIC_PREFIX``, default ``tw``) namespaces everything, so several stacks or
test runs can share one Kafka cluster and one Redis server without seeing each other.

Redis keys that one command or script touches together carry the same hash tag (the part
in braces), so on a Redis Cluster they live in one slot: a request's channel, replay log,
claim, takers, owner, cancel flag and done marker are tagged with its id, a tenant's
cache keys with the tenant, an API key's rate buckets with the key. ``sharded`` (a Redis
Cluster, ``TW_REDIS_CLUSTER``) carries token channels on sharded pub/sub (``SPUBLISH``,
``SSUBSCRIBE``: each message stays on its slot's shard) instead of the classic commands,
which a cluster relays to every node.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Names:
    """Topic, channel and key names under one prefix."""

    prefix: str = "tw"
    sharded: bool = False

    @property
    def publish(self) -> bytes:
        """The command that publishes on a token channel."""
        return b"SPUBLISH" if self.sharded else b"PUBLISH"

    # --- Kafka topics ---------------------------------------------------------------
    @property
    def requests(self) -> str:
        return f"{self.prefix}.requests"

    def requests_from(self, source: str) -> str:
        """The requests topic of one backend service (``TW_REQUEST_SOURCE``): only its
        Kafka user writes it, and the batcher checks the tenants it speaks for."""
        return f"{self.prefix}.requests.from-{source}"

    @property
    def batches(self) -> str:
        return f"{self.prefix}.batches"

    @property
    def completions(self) -> str:
        return f"{self.prefix}.completions"

    def completions_to(self, source: str) -> str:
        """The completions topic of one backend service: the reply topic its requests name
        (the batcher refuses any other it is not allowed), which only its Kafka user reads."""
        return f"{self.prefix}.completions.to-{source}"

    @property
    def requests_dlq(self) -> str:
        return f"{self.prefix}.requests.dlq"

    @property
    def topics(self) -> tuple[str, ...]:
        return (self.requests, self.batches, self.completions, self.requests_dlq)

    # --- consumer groups ------------------------------------------------------------
    @property
    def batcher_group(self) -> str:
        return f"{self.prefix}.batcher"

    @property
    def worker_group(self) -> str:
        return f"{self.prefix}.worker"

    def producer_group(self, client_id: str) -> str:
        """Base of a backend producer's completions-reading groups (``shared.producer``)."""
        return f"{self.prefix}.producer.{client_id}"

    # --- Redis --------------------------------------------------------------------------
    @staticmethod
    def tag_of(key: str | bytes) -> str:
        """The hash tag of a key (the request id of a per-request key)."""
        text = key.decode() if isinstance(key, bytes) else key
        return text[text.index("{") + 1 : text.index("}")]

    def token_channel(self, request_id: str) -> str:
        """Pub/sub channel carrying a request's live token events."""
        return f"{self.prefix}:tok:{{{request_id}}}"

    def token_log(self, request_id: str) -> str:
        """Redis Stream holding a request's events for replay (resume after disconnect)."""
        return f"{self.prefix}:log:{{{request_id}}}"

    def done_marker(self, request_id: str) -> str:
        """Key set when a request has finished, so a redelivered batch skips it."""
        return f"{self.prefix}:done:{{{request_id}}}"

    def claim(self, request_id: str) -> str:
        """Key naming the worker generating a request (expires if that worker dies)."""
        return f"{self.prefix}:claim:{{{request_id}}}"

    def takers(self, request_id: str) -> str:
        """Set of the worker processes that took a request's claim and did not end it
        cleanly (they crashed): past a limit the request is quarantined as a poison."""
        return f"{self.prefix}:takers:{{{request_id}}}"

    def cancelled(self, request_id: str) -> str:
        """Key set when a request is cancelled, for a worker that picks it up later."""
        return f"{self.prefix}:cancelled:{{{request_id}}}"

    def owner(self, request_id: str) -> str:
        """Key holding the tenant that submitted a request (resume/cancel are tenant-scoped)."""
        return f"{self.prefix}:owner:{{{request_id}}}"

    def batch_api(self, *parts: str) -> str:
        """A key of the Batch API's files and batches (``services/edge/batch_store.py``)."""
        return ":".join((self.prefix, "bapi", *parts))

    @property
    def api_keys(self) -> str:
        """Hash: sha256 hex of an API key → tenant."""
        return f"{self.prefix}:apikeys"

    def rate_bucket(self, key_id: str, kind: str) -> str:
        """A token bucket of one API key (``kind``: requests or tokens)."""
        return f"{self.prefix}:rl:{{{key_id}}}:{kind}"

    @property
    def batcher_status_prefix(self) -> str:
        return f"{self.prefix}:batcher:"

    def batcher_status(self, batcher_id: str) -> str:
        """Key holding a batcher's queue depth (expires when the batcher goes silent)."""
        return f"{self.batcher_status_prefix}{batcher_id}"

    def slot_ledger(self, worker_id: str) -> str:
        """Hash of the worker slots that batchers reserved since its last heartbeat
        (``services/batcher/slots.py``)."""
        return f"{self.prefix}:slots:{worker_id}"

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel on which edges broadcast cancellations to every worker."""
        return f"{self.prefix}:cancel"

    @property
    def heartbeat_prefix(self) -> str:
        return f"{self.prefix}:hb:"

    @property
    def workers_index(self) -> str:
        """Sorted set of worker ids by last heartbeat time."""
        return f"{self.prefix}:workers"

    @property
    def batchers_index(self) -> str:
        """Sorted set of batcher ids by last status time."""
        return f"{self.prefix}:batchers"

    @property
    def edges_index(self) -> str:
        """Sorted set of edge ids by last heartbeat time."""
        return f"{self.prefix}:edges"

    def edge_heartbeat(self, edge_id: str) -> str:
        """Key holding an edge's latest heartbeat (expires when the edge goes silent)."""
        return f"{self.prefix}:edge:{edge_id}"

    def heartbeat(self, worker_id: str) -> str:
        """Key holding a worker's latest heartbeat (expires when the worker goes silent)."""
        return f"{self.heartbeat_prefix}{worker_id}"

    def cache(self, tenant: str, *parts: str) -> str:
        """A key of a tenant's response caches: its generation counter (``gen``; a purge
        bumps it), exact entries (``x:<generation>:<digest>``), the in-flight markers of
        misses being generated (``f:<generation>:<digest>``) and semantic entries
        (``s:<generation>``, a hash of entry id to vector and metadata)."""
        return ":".join((self.prefix, "cache", "{" + tenant + "}", *parts))

    def cache_exact(self, tenant: str, generation: int, digest: str) -> str:
        """The events of the tenant's exact-cache entry ``digest``."""
        return self.cache(tenant, "x", str(generation), digest)
