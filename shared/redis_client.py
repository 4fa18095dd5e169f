"""How every service reaches Redis: the URL, the ACL user and its password, and TLS.

``RedisAccess`` is built once from a service's settings (``CommonSettings.redis``) and
makes both kinds of connection the project opens: redis-py clients (``client``,
``pool_kwargs``) and the raw RESP connections of the hot paths (``shared.resp``). A
password in the URL still works; ``TW_REDIS_USERNAME`` and ``TW_REDIS_PASSWORD`` (or
``TW_REDIS_PASSWORD_FILE``) override it. ``rediss://`` turns TLS on, verified against
``TW_REDIS_TLS_CA_FILE`` (the system's CAs when empty), with a client certificate when
``TW_REDIS_TLS_CERT_FILE`` and ``TW_REDIS_TLS_KEY_FILE`` are set.

``TW_REDIS_CLUSTER`` says the URL names a node of a Redis Cluster: redis-py clients are then
``RedisCluster`` (which follows the slots' owners and their failovers) and the raw RESP paths
route each command to its slot's master (``shared.resp.Topology``). Every key a command or
script touches together shares a hash tag (``shared.names``), so it works on both.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shared.credentials import client_tls, secret

if TYPE_CHECKING:
    from shared.settings import CommonSettings


class _Connection(aioredis.Connection):
    """A connection closed under a command by another task raises ``ConnectionError``, as
    one the network lost does. redis-py's cluster client disconnects a node's connections,
    busy ones too, when it reads the slots' owners again after a failover; a command then
    writing on one met its writer gone (``AttributeError``; on Python 3.12 and later a
    closed transport raises ``TypeError``), or, on uvloop, as the services run, its
    transport closed (``RuntimeError``: "the handler is closed"), which no retry and no
    outage handling catches: an edge's stream read through it broke off mid-body, and a
    request opening its stream then was answered 500."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except (AttributeError, TypeError, RuntimeError) as exc:
            if not _closed_under_us(exc):
                raise
            raise redis_errors.ConnectionError(f"connection closed while in use ({exc})") from exc


def _closed_under_us(exc: Exception) -> bool:
    if isinstance(exc, RuntimeError):
        return "handler is closed" in str(exc)  # uvloop's write on a closed transport
    return "'NoneType'" in str(exc)


class _SSLConnection(_Connection, aioredis.SSLConnection):
    """The same over TLS."""


@dataclass(frozen=True, slots=True)
class RedisAccess:
    """Where Redis is and how to log in: the URL plus the credentials and TLS files."""

    url: str
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    cluster: bool = False

    @classmethod
    def of(cls, settings: CommonSettings) -> RedisAccess:
        password = secret(settings.redis_password, settings.redis_password_file)
        return cls(
            settings.redis_url,
            settings.redis_username,
            password,
            settings.redis_tls_ca_file,
            settings.redis_tls_cert_file,
            settings.redis_tls_key_file,
            settings.redis_cluster,
        )

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    def login(self) -> tuple[str | None, str | None]:
        """(username, password): the settings', else the URL's."""
        parts = urlsplit(self.url)
        user = self.username or (unquote(parts.username) if parts.username else None)
        password = self.password or (unquote(parts.password) if parts.password else None)
        return user or None, password or None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for redis-py's ``from_url`` (client or pool)."""
        user, password = self.login()
        out: dict[str, Any] = {}
        if user:
            out["username"] = user
        if password:
            out["password"] = password
        if self.tls:
            out["ssl_cert_reqs"] = "required"
            if self.ca_file:
                out["ssl_ca_certs"] = self.ca_file
            if self.cert_file:
                out["ssl_certfile"] = self.cert_file
                out["ssl_keyfile"] = self.key_file or None
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a raw connection (None without ``rediss://``)."""
        if not self.tls:
            return None
        return client_tls(self.ca_file, self.cert_file, self.key_file)

    def client(self, **options: Any) -> aioredis.Redis:
        """A redis-py client (``options``: timeouts, retry, …); a ``RedisCluster`` on a
        cluster. It is typed as ``Redis``: the project calls only commands both serve, on
        keys that share a slot wherever one call touches several."""
        if self.cluster:
            # A cluster client reads the slots' owners again only between its own retries
            # (redis-py closes it after a failed try): with none, it would keep calling a
            # lost master after its replica took over.
            retry = options.get("retry")
            if retry is not None and retry.get_retries() < 1:
                options["retry"] = Retry(NoBackoff(), 1)
            cluster = RedisCluster.from_url(self.url, **self.kwargs(), **options)
            # Its constructor takes no connection class: the nodes it knows and those it
            # finds later are given this one (nothing is connected yet).
            cluster.connection_kwargs["connection_class"] = self._connection_class
            for node in cluster.startup_nodes:
                node.connection_class = self._connection_class
            return cast(aioredis.Redis, cluster)
        return aioredis.Redis.from_url(
            self.url, **self.kwargs(), connection_class=self._connection_class, **options
        )

    @property
    def _connection_class(self) -> type[aioredis.Connection]:
        return _SSLConnection if self.tls else _Connection

    def __repr__(self) -> str:  # never print the password
        user, _ = self.login()
        host = urlsplit(self.url).hostname
        return f"RedisAccess({host!r}, user={user!r}, tls={self.tls}, cluster={self.cluster})"


async def initialized(client: aioredis.Redis) -> aioredis.Redis:
    """``client``, with the slots' owners read if it is a cluster's: its pub/sub needs them
    before the first subscribe (its commands read them themselves)."""
    if isinstance(client, RedisCluster):
        await client.initialize()
    return client


def as_access(target: str | RedisAccess) -> RedisAccess:
    """A bare URL (tests, tools) as access with no other credentials."""
    return target if isinstance(target, RedisAccess) else RedisAccess(target)


def redis_client(settings: CommonSettings, **options: Any) -> aioredis.Redis:
    """A redis-py client for ``settings``'s Redis, logged in as its user."""
    return RedisAccess.of(settings).client(**options)
