"""``tokenwire cache purge``: forget a tenant's cached answers at once.

A purge bumps the tenant's cache generation, so every edge stops serving its earlier
answers (exact and semantic) from the next lookup on, then deletes the old entries.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TypeAlias

import redis.asyncio as aioredis

from shared.cache.keys import SHARED_SCOPE
from shared.settings import CommonSettings

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def cmd_purge(args: argparse.Namespace) -> None:
    from services.edge.cache import purge  # the semantic cache's FAISS: only to run it

    settings = CommonSettings.from_env()
    scope = SHARED_SCOPE if args.shared else args.tenant

    async def run() -> int:
        client = aioredis.Redis.from_url(settings.redis_url)
        try:
            return await purge(client, settings.names, scope)
        finally:
            await client.aclose()

    deleted = asyncio.run(run())
    print(
        f"purged the response cache of {'all tenants (shared)' if args.shared else scope}: "
        f"{deleted} keys deleted"
    )


def add_parser(sub: Subparsers) -> None:
    c = sub.add_parser("cache", help="the response caches (exact and semantic)")
    csub = c.add_subparsers(dest="cache", required=True)
    p = csub.add_parser(
        "purge", help="make a tenant's cached answers unreachable at once and delete them"
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="the tenant whose answers go")
    who.add_argument(
        "--shared", action="store_true", help="the scope all tenants share (TW_CACHE_SHARED)"
    )
    p.set_defaults(fn=cmd_purge)
