"""The Batch API's files and batches, kept in Redis.

Redis, because every edge already shares it and it is where the edge keeps what outlives
one process (owners, replay logs, rate buckets): a file or batch made through one edge is
served by any other, and an edge restart loses nothing. Kafka holds the requests and the
completions themselves; Redis holds what the Batch API adds on top: uploaded files, each
batch's record (status, counts, timestamps), its custom ids, and one result line per
request line. A result is recorded by one script that sets the line only if it is not set
yet and counts it in the same step, so a completion read twice (a redelivery after an
edge died, a request submitted twice) is counted once.

Keys (under ``<prefix>:bapi:``) carry the batch id in braces, so one batch's keys share a
Redis Cluster slot and its scripts stay single-slot.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, fields
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis

from shared.names import Names

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
ENDED: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
FILE_PURPOSES = ("batch", "batch_output")
COMPLETION_WINDOW_S = 24 * 3600

# A result line is stored with one leading byte saying which file it belongs to.
OUTPUT, ERROR = b"o", b"e"
JSON_FIELDS = ("metadata", "errors")
CANCELLED, EXPIRED = 1, 2  # BatchRecord.cancel_requested: why the batch stops early

_RECORD = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
return 1
"""

_MOVE = """
local now = redis.call('HGET', KEYS[1], 'status')
if not now then return false end
for i = 3, #ARGV do
  if now == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
    return ARGV[1]
  end
end
return now
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_SAVE_OFFSETS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return 1
"""

_LEASE = """
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


def _encode(values: dict[str, Any]) -> dict[Any, Any]:
    return {
        k: orjson.dumps(v) if k in JSON_FIELDS else str(v).encode()
        for k, v in values.items()
        if v is not None
    }


def _b(raw: bytes | str) -> bytes:
    return raw if isinstance(raw, bytes) else raw.encode()


def _s(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex[:24]}"


def line_request_id(batch_id: str, index: int) -> str:
    """The request id of a batch's line ``index`` (0-based): any edge reading a completion
    tells its batch and line from the id alone, and resubmitting a line reuses it."""
    return f"{batch_id}.{index}"


def parse_request_id(request_id: str) -> tuple[str, int] | None:
    """``(batch_id, index)`` of a request made by ``line_request_id``, else None."""
    if not request_id.startswith("batch_"):
        return None
    batch_id, _, index = request_id.rpartition(".")
    if not batch_id or not index.isdigit():
        return None
    return batch_id, int(index)


@dataclass
class FileInfo:
    """An uploaded (or produced) file's metadata, as OpenAI's file object."""

    id: str
    tenant: str
    bytes: int
    created_at: int
    filename: str
    purpose: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass
class BatchRecord:
    """One batch's state. Counts and timestamps change through ``BatchStore`` methods."""

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    model: str
    created_at: int
    expires_at: int
    status: str = "validating"
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    total: int = 0
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    cancel_requested: int = 0
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None

    def to_hash(self) -> dict[Any, Any]:
        return _encode({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> BatchRecord:
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for k, v in raw.items():
            name = k.decode()
            if name not in kinds:
                continue
            if name in JSON_FIELDS:
                values[name] = orjson.loads(v)
            elif "int" in str(kinds[name]):
                values[name] = int(v)
            else:
                values[name] = v.decode()
        return cls(**values)

    @property
    def counted(self) -> int:
        return self.completed + self.failed

    def to_openai(self) -> dict[str, Any]:
        errors = None
        if self.errors:
            errors = {"object": "list", "data": self.errors}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": self.metadata,
        }


class BatchStore:
    """Files and batches in Redis, scoped by tenant: a lookup under another tenant finds
    nothing, as if the object did not exist."""

    def __init__(self, redis: aioredis.Redis, names: Names) -> None:
        self.redis = redis
        self.names = names
        self._record = redis.register_script(_RECORD)
        self._move = redis.register_script(_MOVE)
        self._lease = redis.register_script(_LEASE)
        self._save_offsets = redis.register_script(_SAVE_OFFSETS)
        self._release = redis.register_script(_RELEASE)

    # --- keys -------------------------------------------------------------------------
    def _file(self, file_id: str) -> str:
        return self.names.batch_api("file", "{" + file_id + "}")

    def _content(self, file_id: str) -> str:
        return self.names.batch_api("file", "{" + file_id + "}", "content")

    def _batch(self, batch_id: str) -> str:
        return self.names.batch_api("batch", "{" + batch_id + "}")

    def _results(self, batch_id: str) -> str:
        return self.names.batch_api("batch", "{" + batch_id + "}", "results")

    def _input(self, batch_id: str) -> str:
        return self.names.batch_api("batch", "{" + batch_id + "}", "input")

    def _ids(self, batch_id: str) -> str:
        return self.names.batch_api("batch", "{" + batch_id + "}", "custom_ids")

    def _lease_key(self, batch_id: str) -> str:
        return self.names.batch_api("batch", "{" + batch_id + "}", "lease")

    def _listing(self, tenant: str) -> str:
        return self.names.batch_api("tenant", tenant, "batches")

    @property
    def _active(self) -> str:
        return self.names.batch_api("active")

    @property
    def _collector_lease(self) -> str:
        return self.names.batch_api("{collector}", "lease")

    @property
    def _offsets(self) -> str:
        return self.names.batch_api("{collector}", "offsets")

    # --- files ------------------------------------------------------------------------
    async def put_file(
        self, tenant: str, filename: str, purpose: str, content: bytes, file_id: str | None = None
    ) -> FileInfo:
        info = FileInfo(
            file_id or new_file_id(), tenant, len(content), int(time.time()), filename, purpose
        )
        meta: dict[Any, Any] = {k: str(v) for k, v in info.__dict__.items()}
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self._content(info.id), content)
        pipe.hset(self._file(info.id), mapping=meta)
        await pipe.execute()
        return info

    async def file(self, tenant: str, file_id: str) -> FileInfo | None:
        raw = await self.redis.hgetall(self._file(file_id))
        if not raw:
            return None
        d = {_s(k): _s(v) for k, v in raw.items()}
        if d.get("tenant") != tenant:
            return None
        return FileInfo(
            d["id"], d["tenant"], int(d["bytes"]), int(d["created_at"]), d["filename"], d["purpose"]
        )

    async def content(self, file_id: str) -> bytes | None:
        """A file's bytes (check its tenant with ``file`` first)."""
        raw = await self.redis.get(self._content(file_id))
        return _b(raw) if raw is not None else None

    async def delete_file(self, file_id: str) -> None:
        await self.redis.delete(self._file(file_id), self._content(file_id))

    # --- batches ----------------------------------------------------------------------
    async def create(self, rec: BatchRecord) -> None:
        # Three slots on a Redis Cluster, so no transaction: the batch is written before
        # it is listed, and an edge that fails between leaves it unlisted, not half-made.
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self._batch(rec.id), mapping=dict(rec.to_hash()))
        pipe.zadd(self._listing(rec.tenant), {rec.id: rec.created_at})
        pipe.sadd(self._active, rec.id)
        await pipe.execute()

    async def get(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        """The batch, or None (also when ``tenant`` is given and is not its tenant)."""
        raw = await self.redis.hgetall(self._batch(batch_id))
        if not raw:
            return None
        rec = BatchRecord.from_hash({_b(k): _b(v) for k, v in raw.items()})
        if tenant is not None and rec.tenant != tenant:
            return None
        return rec

    async def page(self, tenant: str, after: str | None, limit: int) -> tuple[list[str], bool]:
        """Batch ids of ``tenant``, newest first, those after ``after``; and whether more
        follow."""
        key = self._listing(tenant)
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(key, after)
            if not isinstance(rank, int):
                return [], False
            start = rank + 1
        ids = await self.redis.zrevrange(key, start, start + limit)
        out = [_s(i) for i in ids if isinstance(i, (bytes, str))]
        return out[:limit], len(out) > limit

    async def update(self, batch_id: str, **values: Any) -> None:
        """Set some of a batch's fields (names as ``BatchRecord``'s)."""
        await self.redis.hset(self._batch(batch_id), mapping=dict(_encode(values)))

    async def move(self, batch_id: str, to: str, *, from_: tuple[str, ...]) -> str | None:
        """Set the status to ``to`` (stamping ``<to>_at``) if it is one of ``from_``;
        returns the status now (None: no such batch)."""
        res = await self._move(keys=[self._batch(batch_id)], args=[to, int(time.time()), *from_])
        return res.decode() if isinstance(res, bytes) else res

    async def active(self) -> list[str]:
        return sorted(_s(m) for m in await self.redis.smembers(self._active))

    async def retire(self, batch_id: str) -> None:
        """The batch has ended: no edge advances it; its input copy is dropped (two slots on
        a Redis Cluster: in that order, each safe to repeat)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.srem(self._active, batch_id)
        pipe.delete(self._input(batch_id))
        await pipe.execute()

    async def lease(self, batch_id: str, holder: str, ttl_ms: int) -> bool:
        """Take or renew the lease on advancing ``batch_id``; False while another holds it."""
        return bool(await self._lease(keys=[self._lease_key(batch_id)], args=[holder, ttl_ms]))

    async def release(self, holder: str, batch_ids: list[str]) -> None:
        """Give up ``holder``'s leases (the collector's and these batches'), so another
        edge takes over at once rather than when they expire."""
        keys = [self._collector_lease, *(self._lease_key(b) for b in batch_ids)]
        for key in keys:
            await self._release(keys=[key], args=[holder])

    async def lease_collector(self, holder: str, ttl_ms: int) -> bool:
        """Take or renew the lease on reading the completions topic for batch results."""
        return bool(await self._lease(keys=[self._collector_lease], args=[holder, ttl_ms]))

    async def offsets(self) -> dict[int, int]:
        """Next completions-topic offset to read, by partition, as the last reader left it."""
        raw = await self.redis.hgetall(self._offsets)
        return {int(_s(k)): int(_s(v)) for k, v in raw.items()}

    async def save_offsets(self, holder: str, offsets: dict[int, int]) -> bool:
        """Store the next offsets once their results are recorded, only while ``holder``
        holds the collector lease (a reader that lost it records nothing more)."""
        args: list[Any] = [holder]
        for partition, offset in offsets.items():
            args += [partition, offset]
        keys = [self._collector_lease, self._offsets]
        return bool(await self._save_offsets(keys=keys, args=args))

    async def accept(self, batch_id: str, content: bytes, custom_ids: list[str]) -> None:
        """Keep a validated batch's input (its own copy: deleting the uploaded file does
        not stop it) and its custom ids by line index."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self._input(batch_id), content)
        if custom_ids:
            ids: dict[Any, Any] = {str(i): c for i, c in enumerate(custom_ids)}
            pipe.hset(self._ids(batch_id), mapping=ids)
        await pipe.execute()

    async def input(self, batch_id: str) -> bytes | None:
        """The batch's input, as ``accept`` kept it (None before validation or once ended)."""
        raw = await self.redis.get(self._input(batch_id))
        return _b(raw) if raw is not None else None

    async def custom_ids(self, batch_id: str, indexes: list[int]) -> list[str | None]:
        if not indexes:
            return []
        raw = await self.redis.hmget(self._ids(batch_id), [str(i) for i in indexes])
        return [_s(r) if r is not None else None for r in raw]

    async def record(self, batch_id: str, index: int, line: bytes, *, ok: bool) -> bool:
        """Record line ``index``'s result once; True if this call counted it."""
        res = await self._record(
            keys=[self._batch(batch_id), self._results(batch_id)],
            args=[index, (OUTPUT if ok else ERROR) + line, "completed" if ok else "failed"],
        )
        return bool(res)

    async def missing(self, batch_id: str, upto: int) -> list[int]:
        """Line indexes below ``upto`` with no result recorded yet."""
        have = {int(k) for k in await self.redis.hkeys(self._results(batch_id))}
        return [i for i in range(upto) if i not in have]

    async def results(self, batch_id: str) -> tuple[bytes, bytes]:
        """The output and error files' contents, lines in input order."""
        raw = await self.redis.hgetall(self._results(batch_id))
        out: list[bytes] = []
        err: list[bytes] = []
        for _, v in sorted(raw.items(), key=lambda kv: int(kv[0])):
            line = _b(v)
            (out if line[:1] == OUTPUT else err).append(line[1:] + b"\n")
        return b"".join(out), b"".join(err)
