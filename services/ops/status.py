"""``tokenwire status``: one screen of the running system, from what its services publish.

- workers: their heartbeats (partitions, running and waiting requests, KV use, prefix-cache
  hit rate since start, tokens/s from the decoded-token counters of two heartbeats);
- batchers: their status (queue depth in all and by priority, queued tokens, the
  batching window they apply now, paused);
- edges: ``/readyz`` of each ``--edge URL`` (edges publish nothing to Redis);
- Kafka: consumer lag of the batcher and worker groups (committed offsets against the
  ends of their input topics), and the dead-letter topic's size;
- Redis: ``INFO memory``.

Live members are read from their registry indexes without pruning them. A member gone
silent (its heartbeat older than its TTL, or its key expired or withdrawn) stays on the
screen as ``silent`` with its last record: each run keeps the last record it saw of every
member in the hash ``<prefix>:status:seen`` (entries older than ``SEEN_KEEP_S`` dropped),
so a member seen live by an earlier run is never silently omitted."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from redis.exceptions import RedisError

from services.ops.dlq import partitions_of
from shared.names import Names
from shared.redis_client import redis_client
from shared.settings import CommonSettings, FleetSettings

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

SEEN_KEEP_S = 24 * 3600
BATCHER_TTL_S = 3.0  # batchers refresh their status several times within this


def seen_key(names: Names) -> str:
    """Hash of ``kind:id`` → the last record ``tokenwire status`` saw of that member."""
    return f"{names.prefix}:status:seen"


@dataclass
class Snapshot:
    """Everything one screen shows; ``as_json`` is what ``--json`` prints."""

    at: float
    workers: list[dict[str, Any]] = field(default_factory=list)
    batchers: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    lag: dict[str, dict[str, Any]] = field(default_factory=dict)
    dlq: dict[str, Any] = field(default_factory=dict)
    redis: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "workers": self.workers,
            "batchers": self.batchers,
            "edges": self.edges,
            "consumer_lag": self.lag,
            "dlq": self.dlq,
            "redis": self.redis,
            "problems": self.problems,
        }


# --- pure parts ----------------------------------------------------------------------------


def members(
    live: dict[str, dict[str, Any]],
    seen: dict[str, dict[str, Any]],
    ttl_s: float,
    now: float,
) -> list[dict[str, Any]]:
    """One row per member, live or last seen: ``state`` is ``live`` (its record is within
    ``ttl_s``) or ``silent`` (older, or only a last-seen record is left), with
    ``last_seen_s`` and the record itself."""
    rows = []
    for mid in sorted(live.keys() | seen.keys()):
        rec = live.get(mid) or seen[mid]
        age = max(0.0, now - float(rec.get("at", 0.0)))
        state = "live" if mid in live and age <= ttl_s else "silent"
        rows.append({"id": mid, "state": state, "last_seen_s": round(age, 1), "record": rec})
    return rows


def worker_view(row: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """A worker row with what its heartbeat implies: KV use, prefix-cache hit rate,
    tokens/s (from ``before``, an earlier heartbeat of the same worker)."""
    hb = row["record"]
    used, free = hb.get("kv_used_tokens", 0), hb.get("free_kv_tokens", 0)
    hit, computed = hb.get("prefix_hit_tokens", 0), hb.get("prefilled_tokens", 0)
    rate = None
    if before is not None and row["state"] == "live":
        dt = float(hb.get("at", 0)) - float(before.get("at", 0))
        if dt > 0:
            rate = round((hb.get("decoded_tokens", 0) - before.get("decoded_tokens", 0)) / dt, 1)
    return row | {
        "partitions": hb.get("partitions", []),
        "running": hb.get("running", 0),
        "waiting": hb.get("waiting", 0),
        "kv_used_pct": round(100 * used / (used + free), 1) if used + free else None,
        "prefix_hit_pct": round(100 * hit / (hit + computed), 1) if hit + computed else None,
        "tokens_per_s": rate,
    }


def batcher_view(row: dict[str, Any]) -> dict[str, Any]:
    rec = row["record"]
    return row | {
        "queued_requests": rec.get("queued_requests", 0),
        "queued_tokens": rec.get("queued_tokens", 0),
        "paused": rec.get("paused", False),
        "queued_by_priority": rec.get("queued_by_priority", {}),
        "window_ms": rec.get("window_ms"),
    }


def lag_of(committed: dict[int, int], ends: dict[int, int]) -> dict[str, Any]:
    """A group's lag per partition of its input topic (a partition it never committed on
    counts from 0: it reads from the earliest offset)."""
    per = {p: max(0, end - committed.get(p, 0)) for p, end in sorted(ends.items())}
    return {"total": sum(per.values()), "partitions": {str(p): n for p, n in per.items()}}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _seen(row: dict[str, Any]) -> str:
    return "live" if row["state"] == "live" else f"SILENT {row['last_seen_s']:.0f}s"


def render(snap: Snapshot) -> str:
    """The screen."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap.at))
    out = [f"tokenwire status  {at}", ""]
    out.append(
        f"{'WORKER':<28} {'STATE':<11} {'PARTS':<8} {'RUN':>4} {'WAIT':>5} {'KV':>5} "
        f"{'PREFIX HIT':>10} {'TOK/S':>7}"
    )
    for w in snap.workers:
        parts = ",".join(map(str, w["partitions"])) or "-"
        rate = "-" if w["tokens_per_s"] is None else f"{w['tokens_per_s']:.1f}"
        out.append(
            f"{w['id'][:28]:<28} {_seen(w):<11} {parts[:8]:<8} {w['running']:>4} "
            f"{w['waiting']:>5} {_pct(w['kv_used_pct']):>5} {_pct(w['prefix_hit_pct']):>10} "
            f"{rate:>7}"
        )
    if not snap.workers:
        out.append("(no worker has published a heartbeat)")
    out += [
        "",
        f"{'BATCHER':<28} {'STATE':<11} {'QUEUED':>7} {'TOKENS':>8} {'PAUSED':>7} "
        f"{'WINDOW':>8}  BY PRIORITY",
    ]
    for b in snap.batchers:
        window = "-" if b["window_ms"] is None else f"{b['window_ms']:.0f}ms"
        by = " ".join(f"{p}={n}" for p, n in b["queued_by_priority"].items()) or "-"
        out.append(
            f"{b['id'][:28]:<28} {_seen(b):<11} {b['queued_requests']:>7} "
            f"{b['queued_tokens']:>8} {'yes' if b['paused'] else 'no':>7} {window:>8}  {by}"
        )
    if not snap.batchers:
        out.append("(no batcher has published its status)")
    if snap.edges:
        out += ["", f"{'EDGE':<40} STATE"]
        out += [f"{e['url'][:40]:<40} {e['state']}" for e in snap.edges]
    out.append("")
    for group, lag in snap.lag.items():
        parts = " ".join(f"p{p}={n}" for p, n in lag.get("partitions", {}).items())
        out.append(f"lag {group:<24} {lag.get('total', '?'):>6}  {parts}")
    if snap.dlq:
        out.append(f"dead letters {snap.dlq['topic']}: {snap.dlq['size']}")
    if snap.redis:
        r = snap.redis
        cap = r["maxmemory_human"] if r.get("maxmemory") else "no limit"
        out.append(f"redis memory {r['used_memory_human']} (peak {r['peak_human']}, {cap})")
    out += [f"! {p}" for p in snap.problems]
    return "\n".join(out)


# --- reading what the services publish ----------------------------------------------------


async def _registry(client: Any, index: str, key_of: Any) -> dict[str, dict[str, Any]]:
    ids = [m.decode() for m in await client.zrange(index, 0, -1)]
    if not ids:
        return {}
    values = await client.mget([key_of(i) for i in ids])
    out = {}
    for mid, raw in zip(ids, values, strict=True):
        if isinstance(raw, bytes):
            try:
                out[mid] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
    return out


async def read_redis(
    settings: CommonSettings, snap: Snapshot, before: dict[str, dict[str, Any]]
) -> None:
    names = settings.names
    client = redis_client(settings)
    try:
        workers = await _registry(client, names.workers_index, names.heartbeat)
        batchers = await _registry(client, names.batchers_index, names.batcher_status)
        raw_seen = await client.hgetall(seen_key(names))
        seen: dict[str, dict[str, dict[str, Any]]] = {"worker": {}, "batcher": {}}
        stale = []
        for k, v in raw_seen.items():
            kind, _, mid = (k.decode() if isinstance(k, bytes) else k).partition(":")
            rec = orjson.loads(v)
            if snap.at - float(rec.get("at", 0)) > SEEN_KEEP_S:
                stale.append(k)
            elif kind in seen:
                seen[kind][mid] = rec
        pipe = client.pipeline(transaction=False)
        for kind, live in (("worker", workers), ("batcher", batchers)):
            for mid, rec in live.items():
                pipe.hset(seen_key(names), f"{kind}:{mid}", orjson.dumps(rec))
        if stale:
            pipe.hdel(seen_key(names), *stale)
        await pipe.execute()
        ttl = FleetSettings.model_fields["heartbeat_ttl_s"].default
        snap.workers = [
            worker_view(r, before.get(r["id"]) or seen["worker"].get(r["id"]))
            for r in members(workers, seen["worker"], ttl, snap.at)
        ]
        snap.batchers = [
            batcher_view(r) for r in members(batchers, seen["batcher"], BATCHER_TTL_S, snap.at)
        ]
        info = await client.info("memory")
        snap.redis = {
            "used_memory": info.get("used_memory"),
            "used_memory_human": info.get("used_memory_human"),
            "peak_human": info.get("used_memory_peak_human"),
            "maxmemory": info.get("maxmemory"),
            "maxmemory_human": info.get("maxmemory_human"),
        }
    except (RedisError, OSError) as exc:
        snap.problems.append(f"redis: {exc!r}")
    finally:
        await client.aclose()


async def read_kafka(settings: CommonSettings, snap: Snapshot) -> None:
    names = settings.names
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await consumer.start()
        await admin.start()
        topics = await consumer.topics()
        inputs = {names.batcher_group: names.requests, names.worker_group: names.batches}
        for group, topic in inputs.items():
            if topic not in topics:
                snap.problems.append(f"kafka: no topic {topic}")
                continue
            parts = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
            ends = await consumer.end_offsets(parts)
            got = await admin.list_consumer_group_offsets(group)
            committed = {tp.partition: o.offset for tp, o in got.items() if tp.topic == topic}
            snap.lag[group] = lag_of(committed, {tp.partition: n for tp, n in ends.items()})
        dlq = names.requests_dlq
        if dlq in topics:
            parts = [TopicPartition(dlq, p) for p in await partitions_of(consumer, dlq)]
            ends, starts = (
                await consumer.end_offsets(parts),
                await consumer.beginning_offsets(parts),
            )
            snap.dlq = {"topic": dlq, "size": sum(ends[tp] - starts[tp] for tp in parts)}
    except Exception as exc:  # Kafka away: the screen says so and shows the rest
        snap.problems.append(f"kafka: {exc!r}")
    finally:
        await admin.close()
        await consumer.stop()


async def read_edges(urls: list[str], snap: Snapshot) -> None:
    async def one(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
        try:
            r = await client.get(url.rstrip("/") + "/readyz")
        except httpx.HTTPError as exc:
            return {"url": url, "state": f"DOWN ({type(exc).__name__})"}
        return {
            "url": url,
            "state": "ready" if r.status_code == 200 else f"NOT READY ({r.status_code})",
        }

    async with httpx.AsyncClient(timeout=2.0) as client:
        snap.edges = list(await asyncio.gather(*(one(client, u) for u in urls)))


async def snapshot(
    settings: CommonSettings, edges: list[str], before: dict[str, dict[str, Any]]
) -> Snapshot:
    snap = Snapshot(at=time.time())
    await asyncio.gather(
        read_redis(settings, snap, before), read_kafka(settings, snap), read_edges(edges, snap)
    )
    return snap


async def run(args: argparse.Namespace, settings: CommonSettings) -> None:
    before: dict[str, dict[str, Any]] = {}
    if not args.watch:
        # Two readings a moment apart: tokens/s needs two heartbeats of each worker.
        first = await snapshot(settings, [], {})
        before = {w["id"]: w["record"] for w in first.workers}
        await asyncio.sleep(args.sample)
    while True:
        snap = await snapshot(settings, args.edge, before)
        before = {w["id"]: w["record"] for w in snap.workers}
        if args.json:
            print(json.dumps(snap.as_json()), flush=True)
        else:
            clear = "\x1b[H\x1b[2J" if args.watch and sys.stdout.isatty() else ""
            print(clear + render(snap), flush=True)
        if not args.watch:
            return
        await asyncio.sleep(args.interval)


def cmd_status(args: argparse.Namespace) -> None:
    try:
        asyncio.run(run(args, CommonSettings.from_env()))
    except KeyboardInterrupt:
        pass


def add_parser(sub: Subparsers) -> None:
    s = sub.add_parser(
        "status", help="one screen: workers, batchers, edges, consumer lag, DLQ, Redis memory"
    )
    s.add_argument(
        "--edge", action="append", default=[], metavar="URL", help="an edge to check (repeat)"
    )
    s.add_argument("--watch", action="store_true", help="refresh in place until interrupted")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    s.add_argument(
        "--sample", type=float, default=1.5, help="seconds between the two readings of one run"
    )
    s.add_argument("--json", action="store_true", help="JSON (one object per refresh)")
    s.set_defaults(fn=cmd_status)
