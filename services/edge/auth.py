"""API keys: stored only as SHA-256 hex digests (in settings or a Redis hash), each mapped
to a tenant. A caller is a ``Principal``: its tenant, and the id its rate limits key on."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

import redis.asyncio as aioredis

from services.edge.errors import unauthorized
from shared.names import Names

KEY_PREFIX = "twk-"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ANONYMOUS = "default"


def new_key() -> str:
    """A fresh API key (shown once; only its hash is stored)."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


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


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant its requests belong to and the id of its key."""

    tenant: str
    key_id: str


def bearer_token(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class KeyStore:
    """Resolves API keys to principals: the settings' digests first, then Redis."""

    def __init__(
        self, redis: aioredis.Redis, names: Names, static: dict[str, str], *, required: bool
    ) -> None:
        self._redis = redis
        self._names = names
        self._static = static
        self.required = required

    async def authenticate(self, key: str | None) -> Principal:
        """The caller with ``key``. Where keys are required, a missing or unknown key is a
        401 ``ApiError``; otherwise it runs as the anonymous tenant (OpenAI clients always
        send some key, so a development edge must not refuse theirs)."""
        if key is None:
            if self.required:
                raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
            return Principal(ANONYMOUS, "anonymous")
        digest = hash_key(key)
        tenant = self._static.get(digest)
        if tenant is None:
            raw = await self._redis.hget(self._names.api_keys, digest)
            tenant = _text(raw)
        if tenant is None or not _TENANT.match(tenant):
            if not self.required:
                return Principal(ANONYMOUS, "anonymous")
            raise unauthorized("invalid API key")
        # A digest prefix names the key in rate-limit buckets; braces make the two buckets
        # of one key a Redis Cluster hash tag, so one script can update both atomically.
        return Principal(tenant, "{" + digest[:16] + "}")

    async def add(self, tenant: str, key: str | None = None) -> str:
        """Register a key (a fresh one by default) for ``tenant`` in Redis; returns it."""
        if not _TENANT.match(tenant):
            raise ValueError(f"bad tenant name {tenant!r}")
        key = key or new_key()
        await self._redis.hset(self._names.api_keys, hash_key(key), tenant)
        return key


def _text(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw
