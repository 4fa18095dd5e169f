"""The pure parts of API keys and Redis access: expiry parsing, the pepper file, digests,
a key's policy, and the redis-py arguments and TLS context built from settings."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from services.edge.auth import (
    KeyRecord,
    Principal,
    hash_key,
    load_pepper,
    new_key,
    peppered_digest,
)
from services.edge.ratelimit import RateLimiter
from services.keys import parse_expiry, write_pepper
from shared.messages import Priority
from shared.redis_client import RedisAccess
from shared.settings import CommonSettings


def test_expiry_is_a_duration_or_an_iso_time() -> None:
    now = 1_000_000.0
    assert parse_expiry("90m", now) == now + 5400
    assert parse_expiry("30d", now) == now + 30 * 86_400
    assert parse_expiry("2w", now) == now + 14 * 86_400
    assert parse_expiry("2030-01-01T00:00:00", now) == 1_893_456_000  # naive: UTC
    assert parse_expiry("2030-01-01T01:00:00+01:00", now) == 1_893_456_000
    for bad in ("soon", "10y", "-5m", ""):
        with pytest.raises(ValueError, match="--expires"):
            parse_expiry(bad, now)


def test_pepper_file_is_private_and_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "pepper"
    assert write_pepper(path)
    first = path.read_text()
    assert len(first.strip()) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not write_pepper(path)
    assert path.read_text() == first
    assert load_pepper("", str(path)) == first.strip().encode()
    assert load_pepper("inline", str(path)) == b"inline"
    assert load_pepper("", "") == b""


def test_digests_depend_on_the_pepper() -> None:
    key = new_key()
    assert key.startswith("twk-") and len(key) > 30
    a, b = peppered_digest(key, b"one"), peppered_digest(key, b"two")
    assert a != b and len(a) == 64 and a != hash_key(key)


def test_a_records_policy() -> None:
    record = KeyRecord(
        id="0123456789abcdef",
        tenant="acme",
        created_at=0,
        expires_at=100,
        priorities=(Priority.BULK,),
        models=("m",),
    )
    assert record.expired(100) and not record.expired(99.9)
    assert KeyRecord.model_validate_json(record.model_dump_json()) == record
    who = Principal("acme", "{x}", priorities=frozenset(record.priorities or ()), models=None)
    assert who.may_use_priority(Priority.BULK) and not who.may_use_priority(Priority.INTERACTIVE)
    assert who.may_use_model("anything")
    assert not Principal("a", "k", models=frozenset({"m"})).may_use_model("other")
    with pytest.raises(ValueError):
        KeyRecord(id="x", tenant="bad tenant", created_at=0)


def test_a_keys_own_limits_override_the_defaults() -> None:
    limiter = RateLimiter.__new__(RateLimiter)
    limiter.requests_per_min, limiter.tokens_per_min = 600, 1000
    assert limiter.limits(None, None) == (600, 1000)
    assert limiter.limits(5, None) == (5, 1000)
    assert limiter.limits(None, 0) == (600, 0)


def test_redis_access_from_settings(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    plain = CommonSettings.from_env({"TW_REDIS_URL": "redis://:urlpw@h:1/0"}).redis
    assert plain.kwargs() == {"password": "urlpw"} and plain.ssl_context() is None
    acl = CommonSettings.from_env(
        {
            "TW_REDIS_URL": "rediss://h:1/0",
            "TW_REDIS_USERNAME": "tw-edge",
            "TW_REDIS_PASSWORD_FILE": str(secret),
        }
    ).redis
    assert acl.login() == ("tw-edge", "from-file")
    assert acl.kwargs()["ssl_cert_reqs"] == "required"
    assert acl.ssl_context() is not None
    assert "from-file" not in repr(acl) and "from-file" not in str(acl)
    assert RedisAccess("redis://u:p@h/0", username="v").login() == ("v", "p")
