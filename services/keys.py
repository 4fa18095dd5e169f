"""``tokenwire keys``: create, list and revoke the edge's API keys, and make the pepper.

Keys live in the Redis hash ``<prefix>:apikeys`` as HMAC-SHA-256 digests under the
deployment's pepper (``TW_KEY_PEPPER`` or ``TW_KEY_PEPPER_FILE``); a created key is printed
once and cannot be shown again. A revoked key is deleted from the hash, and every edge
refuses it from its next request (edges look keys up per request, with no cache).

    tokenwire keys pepper --file /run/tokenwire/key-pepper   # once per deployment
    tokenwire keys create --tenant acme --rpm 60 --priority bulk --expires 30d
    tokenwire keys list [--tenant acme]
    tokenwire keys revoke <id>
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from shared.messages import Priority

if TYPE_CHECKING:
    from services.edge.auth import KeyRecord, KeyStore

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_expiry(value: str, now: float) -> float:
    """An expiry as epoch seconds: a duration from ``now`` (``90m``, ``12h``, ``30d``,
    ``2w``) or an ISO 8601 time (UTC when it names no zone)."""
    m = _DURATION.match(value.strip())
    if m:
        return now + int(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"--expires {value!r}: expected a duration (90m, 12h, 30d, 2w) or an ISO time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _priorities(value: str) -> list[Priority]:
    try:
        return [Priority(v) for v in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: priorities are {', '.join(p.value for p in Priority)}"
        ) from None


def write_pepper(path: Path) -> bool:
    """Create ``path`` holding a fresh 256-bit pepper (mode 0600) unless it exists;
    True when it was created. Keys made under one pepper fail under another, so an
    existing file is never replaced."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return True


def _describe(record: KeyRecord | str) -> str:
    if isinstance(record, str):
        kind, _, rest = record.partition(":")
        key_id, _, tenant = rest.partition("=")
        return f"{key_id}  tenant={tenant}  {kind} (unpeppered SHA-256, edge defaults)"
    parts = [record.id, f"tenant={record.tenant}"]
    if record.requests_per_min is not None:
        parts.append(f"rpm={record.requests_per_min}")
    if record.tokens_per_min is not None:
        parts.append(f"tpm={record.tokens_per_min}")
    if record.priorities is not None:
        parts.append("priority=" + ",".join(p.value for p in record.priorities))
    if record.models is not None:
        parts.append("models=" + ",".join(record.models))
    if record.expires_at is not None:
        when = datetime.fromtimestamp(record.expires_at, UTC).isoformat(timespec="seconds")
        expired = " (expired)" if record.expired(time.time()) else ""
        parts.append(f"expires={when}{expired}")
    return "  ".join(parts)


async def _with_store(action: str, args: argparse.Namespace) -> int:
    from services.edge.auth import KeyStore, load_pepper
    from services.edge.config import EdgeSettings
    from shared.redis_client import redis_client

    settings = EdgeSettings.from_env()
    pepper = load_pepper(settings.key_pepper, settings.key_pepper_file)
    redis = redis_client(settings)
    store = KeyStore(redis, settings.names, {}, required=True, pepper=pepper)
    try:
        return await _run(action, store, args)
    finally:
        await redis.aclose()


async def _run(action: str, store: KeyStore, args: argparse.Namespace) -> int:
    if action == "create":
        expires = None if args.expires is None else parse_expiry(args.expires, time.time())
        key, record = await store.create(
            args.tenant,
            requests_per_min=args.rpm,
            tokens_per_min=args.tpm,
            priorities=args.priority,
            models=args.models,
            expires_at=expires,
        )
        print(key)
        print(f"created {_describe(record)}; the key above is shown only now", file=sys.stderr)
        return 0
    if action == "list":
        for entry in await store.records():
            tenant = entry.tenant if not isinstance(entry, str) else entry.rsplit("=", 1)[1]
            if args.tenant is None or tenant == args.tenant:
                print(_describe(entry))
        return 0
    if await store.revoke(args.id):
        print(f"revoked {args.id}")
        return 0
    print(f"no key with id {args.id!r}", file=sys.stderr)
    return 1


def cmd_keys(args: argparse.Namespace) -> None:
    if args.keys == "pepper":
        made = write_pepper(Path(args.file))
        print(f"{'created' if made else 'kept the existing'} pepper file {args.file}")
        return
    try:
        code = asyncio.run(_with_store(args.keys, args))
    except ValueError as exc:
        sys.exit(f"tokenwire keys {args.keys}: {exc}")
    sys.exit(code)


def add_keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tokenwire keys …``: the parsers of the key commands."""
    k = sub.add_parser(
        "keys",
        help="create, list and revoke API keys (Redis at $TW_REDIS_URL, pepper "
        "$TW_KEY_PEPPER or $TW_KEY_PEPPER_FILE)",
    )
    ksub = k.add_subparsers(dest="keys", required=True)
    c = ksub.add_parser("create", help="make a key for a tenant; prints it once")
    c.add_argument("--tenant", required=True, help="the tenant its requests run as")
    c.add_argument("--rpm", type=int, help="requests per minute (default: the edge's)")
    c.add_argument("--tpm", type=int, help="prompt+max tokens per minute (default: the edge's)")
    c.add_argument(
        "--priority",
        type=_priorities,
        help="priorities it may use, comma-separated: interactive,bulk (default: both); "
        "another is refused with 403",
    )
    c.add_argument(
        "--models",
        type=_csv,
        help="model ids it may use, comma-separated (default: all); another is a 404",
    )
    c.add_argument(
        "--expires",
        help="a duration (90m, 12h, 30d, 2w) or an ISO 8601 time; after it the key is a 401",
    )
    ls = ksub.add_parser("list", help="every key: id, tenant and policy (never the key)")
    ls.add_argument("--tenant", help="only this tenant's keys")
    r = ksub.add_parser("revoke", help="delete a key by id; every edge refuses it at once")
    r.add_argument("id", help="the key's id, as 'keys list' and 'keys create' show it")
    p = ksub.add_parser("pepper", help="create the pepper file if it does not exist (0600)")
    p.add_argument("--file", required=True, help="where the pepper is kept")
    k.set_defaults(fn=cmd_keys)
