"""API keys and who is calling.

A key is stored only as a digest, never as itself. Keys made by ``tokenwire keys create``
are stored as HMAC-SHA-256 of the key under a per-deployment pepper (``TW_KEY_PEPPER`` or
``TW_KEY_PEPPER_FILE``), so a copy of Redis alone cannot test guesses offline. Each such
key carries a policy (``KeyRecord``): its tenant, its own rate and token limits, the
priorities and models it may use, and an expiry. Older keys, plain SHA-256 digests mapped
to a tenant (in ``TW_API_KEYS`` or as a bare tenant in the Redis hash), still work, with
the edge's default policy.

Keys are looked up in Redis on every call, never cached in the process: a revoked key
(deleted from the hash) is refused by every edge at its next request.

A caller is a ``Principal``: its tenant, the id its rate limits key on, and its policy.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field

from services.edge.errors import unauthorized
from shared.messages import Priority
from shared.names import Names
from shared.settings import SettingsError

KEY_PREFIX = "twk-"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
_TENANT = re.compile(TENANT_PATTERN)
ANONYMOUS = "default"


def new_key() -> str:
    """A fresh API key (shown once; only its digest is stored)."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def hash_key(key: str) -> str:
    """The unpeppered SHA-256 digest of a key: the form ``TW_API_KEYS`` holds."""
    return hashlib.sha256(key.encode()).hexdigest()


def peppered_digest(key: str, pepper: bytes) -> str:
    """HMAC-SHA-256 of ``key`` under the deployment's pepper: how created keys are stored."""
    return hmac.new(pepper, key.encode(), hashlib.sha256).hexdigest()


def load_pepper(value: str, file: str) -> bytes:
    """The pepper from its setting or, when that is empty, from its file (surrounding
    whitespace dropped); empty when neither is set. A file that cannot be read is a
    ``SettingsError`` that says how to make one."""
    if value:
        return value.encode()
    if file:
        try:
            return Path(file).read_bytes().strip()
        except OSError as exc:
            raise SettingsError(
                f"TW_KEY_PEPPER_FILE: cannot read {file} ({exc.strerror or exc}); "
                f"make one with: tokenwire keys pepper --file {file}"
            ) from None
    return b""


def parse_key_list(spec: str) -> dict[str, str]:
    """``sha256hex=tenant,…`` (the ``TW_API_KEYS`` setting) as a digest → tenant map."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        digest, sep, tenant = item.partition("=")
        digest = digest.strip().lower()
        if not sep or not _HEX64.match(digest) or not _TENANT.match(tenant.strip()):
            raise ValueError(
                f"TW_API_KEYS entry {item[:12]!r}…: expected '<sha256 hex>=<tenant>' "
                "(tenant: letters, digits, '.', '_', '-')"
            )
        out[digest] = tenant.strip()
    return out


class KeyRecord(BaseModel):
    """What the store keeps for a created key (JSON in the Redis hash, under its digest).
    ``None`` limits take the edge's defaults; ``None`` priorities or models allow all."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    tenant: str = Field(pattern=TENANT_PATTERN)
    created_at: float
    expires_at: float | None = None
    requests_per_min: int | None = Field(None, ge=0)
    tokens_per_min: int | None = Field(None, ge=0)
    priorities: tuple[Priority, ...] | None = None
    models: tuple[str, ...] | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant its requests belong to, the id of its key (rate buckets
    key on it) and what the key allows."""

    tenant: str
    key_id: str
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    priorities: frozenset[Priority] | None = None
    models: frozenset[str] | None = None

    def may_use_priority(self, priority: Priority) -> bool:
        return self.priorities is None or priority in self.priorities

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models


def bearer_token(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _bucket_id(digest: str) -> str:
    # A digest prefix names the key in rate-limit buckets; braces make the two buckets
    # of one key a Redis Cluster hash tag, so one script can update both atomically.
    return "{" + digest[:16] + "}"


class KeyStore:
    """Resolves API keys to principals (peppered records in Redis, then the legacy
    SHA-256 digests of the settings and of Redis), and administers created keys."""

    def __init__(
        self,
        redis: aioredis.Redis,
        names: Names,
        static: dict[str, str],
        *,
        required: bool,
        pepper: bytes = b"",
    ) -> None:
        self._redis = redis
        self._names = names
        self._static = static
        self._pepper = pepper
        self.required = required

    @property
    def peppered(self) -> bool:
        """Whether a pepper is set (without one, created keys cannot be checked)."""
        return bool(self._pepper)

    async def authenticate(self, key: str | None) -> Principal:
        """The caller with ``key``. Where keys are required, a missing, unknown or expired
        key is a 401 ``ApiError``; otherwise it runs as the anonymous tenant (OpenAI
        clients always send some key, so a development edge must not refuse theirs)."""
        if key is None:
            if self.required:
                raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
            return Principal(ANONYMOUS, "anonymous")
        who = await self._lookup(key)
        if who is None:
            if not self.required:
                return Principal(ANONYMOUS, "anonymous")
            raise unauthorized("invalid API key")
        return who

    async def _lookup(self, key: str) -> Principal | None:
        peppered, plain = peppered_digest(key, self._pepper), hash_key(key)
        tenant = self._static.get(plain)
        if tenant is not None:
            return Principal(tenant, _bucket_id(plain))
        raw_record, raw_tenant = await self._redis.hmget(self._names.api_keys, [peppered, plain])
        if raw_record is not None:
            try:
                record = KeyRecord.model_validate_json(raw_record)
            except ValueError:
                return None
            if record.expired(time.time()):
                raise unauthorized("this API key has expired")
            return Principal(
                record.tenant,
                _bucket_id(peppered),
                record.requests_per_min,
                record.tokens_per_min,
                None if record.priorities is None else frozenset(record.priorities),
                None if record.models is None else frozenset(record.models),
            )
        tenant = _text(raw_tenant)
        if tenant is None or not _TENANT.match(tenant):
            return None
        return Principal(tenant, _bucket_id(plain))

    async def create(
        self,
        tenant: str,
        *,
        requests_per_min: int | None = None,
        tokens_per_min: int | None = None,
        priorities: Iterable[Priority] | None = None,
        models: Iterable[str] | None = None,
        expires_at: float | None = None,
    ) -> tuple[str, KeyRecord]:
        """A fresh key for ``tenant`` with this policy, stored peppered; returns the key
        (shown once) and its record. Refused without a pepper."""
        if not self._pepper:
            raise ValueError("no pepper: set TW_KEY_PEPPER or TW_KEY_PEPPER_FILE first")
        key = new_key()
        digest = peppered_digest(key, self._pepper)
        record = KeyRecord(
            id=digest[:16],
            tenant=tenant,
            created_at=round(time.time(), 3),
            expires_at=expires_at,
            requests_per_min=requests_per_min,
            tokens_per_min=tokens_per_min,
            priorities=None if priorities is None else tuple(priorities),
            models=None if models is None else tuple(models),
        )
        await self._redis.hset(self._names.api_keys, digest, record.model_dump_json())
        return key, record

    async def records(self) -> list[KeyRecord | str]:
        """Every key in Redis: created keys' records, and the tenant of each legacy one
        (as ``"legacy:<digest prefix>=<tenant>"``)."""
        out: list[KeyRecord | str] = []
        for digest, raw in (await self._redis.hgetall(self._names.api_keys)).items():
            value = _text(raw) or ""
            if value.startswith("{"):
                try:
                    out.append(KeyRecord.model_validate_json(value))
                    continue
                except ValueError:
                    pass
            out.append(f"legacy:{(_text(digest) or '')[:16]}={value}")
        return out

    async def revoke(self, key_id: str) -> bool:
        """Delete the key whose id (the first 16 hex digits of its digest, as ``records``
        lists it) is ``key_id``; every edge refuses it from its next request. False when
        there is no such key."""
        if not re.fullmatch(r"[0-9a-f]{16}", key_id):
            return False
        async for digest, _ in self._redis.hscan_iter(self._names.api_keys):
            field = _text(digest) or ""
            if field[:16] == key_id:
                return bool(await self._redis.hdel(self._names.api_keys, field))
        return False

    async def add(self, tenant: str, key: str | None = None) -> str:
        """Register a legacy key (a fresh one by default) for ``tenant`` in Redis by its
        SHA-256 digest, with the edge's default policy; returns it."""
        if not _TENANT.match(tenant):
            raise ValueError(f"bad tenant name {tenant!r}")
        key = key or new_key()
        await self._redis.hset(self._names.api_keys, hash_key(key), tenant)
        return key


def _text(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw
