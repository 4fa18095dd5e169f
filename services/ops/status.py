"""``tokenwire status``: one screen of the running system, from what its services publish.

- workers: their heartbeats (partitions, running and waiting requests, KV use, prefix-cache
  hit rate since start, tokens/s and time-to-first-token p50/p99 from two heartbeats);
- batchers: their status (queue depth in all and by priority, queued tokens, the
  batching window they apply now, paused);
- edges: their heartbeats (address, open streams, requests/s and submissions/s from two
  heartbeats, uptime), and ``/readyz`` of each ``--edge URL``;
- Kafka: consumer lag of the batcher and worker groups (committed offsets against the
  ends of their input topics), and the dead-letter topic's size;
- Redis: ``INFO memory``.

Live members are read from their registry indexes without pruning them. A member gone
silent (its heartbeat older than its TTL, or its key expired or withdrawn) stays on the
screen as ``silent`` with its last record: each run keeps the last record it saw of every
member in the hash ``<prefix>:status:seen`` (entries older than ``SEEN_KEEP_S`` dropped),
so a member seen live by an earlier run is never silently omitted.

``Collector`` reads one snapshot after another over long-lived clients: the command uses it,
and so does the edge's dashboard (``services/edge/dashboard.py``)."""

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
from shared import registry
from shared.kafka_io import make_admin, make_consumer
from shared.names import Names
from shared.redis_client import redis_client
from shared.settings import CommonSettings, FleetSettings

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

SEEN_KEEP_S = 24 * 3600
BATCHER_TTL_S = 3.0  # batchers refresh their status several times within this
KAFKA_TIMEOUT_S = 5.0  # a reading waits no longer for Kafka (a refresh a second must go on)


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
    probes: list[dict[str, Any]] = field(default_factory=list)
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
            "edge_probes": self.probes,
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
    its TTL: the record's own ``ttl_s`` where it carries one, else ``ttl_s``) or ``silent``
    (older, or only a last-seen record is left), with ``last_seen_s`` and the record."""
    rows = []
    for mid in sorted(live.keys() | seen.keys()):
        rec = live.get(mid) or seen[mid]
        age = max(0.0, now - float(rec.get("at", 0.0)))
        state = "live" if mid in live and age <= float(rec.get("ttl_s", ttl_s)) else "silent"
        rows.append({"id": mid, "state": state, "last_seen_s": round(age, 1), "record": rec})
    return rows


def rate(row: dict[str, Any], before: dict[str, Any] | None, counter: str) -> float | None:
    """Per second growth of a record's ``counter`` since ``before``, an earlier record of
    the same live member (None without one, or for a silent member)."""
    rec = row["record"]
    if before is None or row["state"] != "live":
        return None
    dt = float(rec.get("at", 0)) - float(before.get("at", 0))
    if dt <= 0:
        return None
    return round((rec.get(counter, 0) - before.get(counter, 0)) / dt, 1)


def ttft_span(hb: dict[str, Any], before: dict[str, Any] | None) -> list[int] | None:
    """The time-to-first-token bucket counts of the requests between two heartbeats of one
    worker (None when either has none, their buckets differ, or the counts went back: the
    worker restarted under the same id)."""
    if before is None or not hb.get("ttft_counts") or hb.get("ttft_le") != before.get("ttft_le"):
        return None
    now, then = hb["ttft_counts"], before.get("ttft_counts") or []
    if len(now) != len(then):
        return None
    span = [a - b for a, b in zip(now, then, strict=True)]
    return span if min(span) >= 0 else None


def quantile(q: float, le: list[float], counts: list[int]) -> float | None:
    """The ``q`` quantile of a cumulative histogram (``counts``: one per bound of ``le``,
    then the total), interpolated within its bucket as Prometheus's
    ``histogram_quantile`` does; None when it is empty. A quantile beyond the last finite
    bound is that bound."""
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0
    for bound, n in zip(le, counts, strict=False):
        if n >= rank:
            inside = n - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, n
    return le[-1] if le else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def worker_view(row: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """A worker row with what its heartbeat implies: KV use, prefix-cache hit rate,
    tokens/s and time-to-first-token p50/p99 (from ``before``, an earlier heartbeat of the
    same worker)."""
    hb = row["record"]
    used, free = hb.get("kv_used_tokens", 0), hb.get("free_kv_tokens", 0)
    hit, computed = hb.get("prefix_hit_tokens", 0), hb.get("prefilled_tokens", 0)
    span = ttft_span(hb, before) if row["state"] == "live" else None
    le = hb.get("ttft_le", [])
    return row | {
        "partitions": hb.get("partitions", []),
        "running": hb.get("running", 0),
        "waiting": hb.get("waiting", 0),
        "kv_used_pct": round(100 * used / (used + free), 1) if used + free else None,
        "prefix_hit_pct": round(100 * hit / (hit + computed), 1) if hit + computed else None,
        "tokens_per_s": rate(row, before, "decoded_tokens"),
        "ttft_p50_ms": _ms(quantile(0.5, le, span)) if span else None,
        "ttft_p99_ms": _ms(quantile(0.99, le, span)) if span else None,
    }


def edge_view(row: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """An edge row from its heartbeat: address, open streams, uptime, and requests/s and
    submissions/s (from ``before``, an earlier heartbeat of the same edge)."""
    hb = row["record"]
    return row | {
        "address": hb.get("address", "?"),
        "open_streams": hb.get("open_streams", 0),
        "serving": hb.get("serving", True),
        "uptime_s": round(max(0.0, float(hb.get("at", 0)) - float(hb.get("started_at", 0))), 1),
        "requests_per_s": rate(row, before, "requests"),
        "submitted_per_s": rate(row, before, "submitted"),
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


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _seen(row: dict[str, Any]) -> str:
    return "live" if row["state"] == "live" else f"SILENT {row['last_seen_s']:.0f}s"


def render(snap: Snapshot) -> str:
    """The screen."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap.at))
    out = [f"tokenwire status  {at}", ""]
    out.append(
        f"{'WORKER':<28} {'STATE':<11} {'PARTS':<8} {'RUN':>4} {'WAIT':>5} {'KV':>5} "
        f"{'PREFIX HIT':>10} {'TOK/S':>7} {'TTFT P50':>9} {'P99':>7}"
    )
    for w in snap.workers:
        parts = ",".join(map(str, w["partitions"])) or "-"
        p50, p99 = w.get("ttft_p50_ms"), w.get("ttft_p99_ms")
        out.append(
            f"{w['id'][:28]:<28} {_seen(w):<11} {parts[:8]:<8} {w['running']:>4} "
            f"{w['waiting']:>5} {_pct(w['kv_used_pct']):>5} {_pct(w['prefix_hit_pct']):>10} "
            f"{_num(w['tokens_per_s']):>7} "
            f"{'-' if p50 is None else f'{p50:.0f}ms':>9} {'-' if p99 is None else f'{p99:.0f}ms':>7}"
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
    out += [
        "",
        f"{'EDGE':<28} {'STATE':<11} {'ADDRESS':<24} {'STREAMS':>7} {'REQ/S':>6} "
        f"{'SUBMIT/S':>8} {'UP':>7}",
    ]
    for e in snap.edges:
        state = _seen(e) if e["serving"] else "NOT SERVING"
        out.append(
            f"{e['id'][:28]:<28} {state:<11} {e['address'][:24]:<24} {e['open_streams']:>7} "
            f"{_num(e['requests_per_s']):>6} {_num(e['submitted_per_s']):>8} "
            f"{e['uptime_s']:>6.0f}s"
        )
    if not snap.edges:
        out.append("(no edge has published a heartbeat)")
    out += [f"probe {p['url']}: {p['state']}" for p in snap.probes]
    out.append("")
    for group, lag in snap.lag.items():
        parts = " ".join(f"p{p}={n}" for p, n in lag.get("partitions", {}).items())
        out.append(f"lag {group:<24} {lag.get('total', '?'):>6}  {parts}")
    if snap.dlq:
        out.append(f"dead letters {snap.dlq['topic']}: {snap.dlq['size']}")
    if snap.redis:
        r = snap.redis
        cap = r["maxmemory_human"] if r.get("maxmemory") else "no limit"
        over = f", over {r['masters']} masters" if r.get("masters") else ""
        out.append(f"redis memory {r['used_memory_human']} (peak {r['peak_human']}, {cap}{over})")
    out += [f"! {p}" for p in snap.problems]
    return "\n".join(out)


# --- reading what the services publish ----------------------------------------------------


async def redis_memory(client: Any, *, cluster: bool) -> dict[str, Any]:
    """Redis's memory: used, peak and cap; a cluster's summed over its masters."""
    if not cluster:
        info = await client.info("memory")
        return {
            "used_memory": info.get("used_memory"),
            "used_memory_human": info.get("used_memory_human"),
            "peak_human": info.get("used_memory_peak_human"),
            "maxmemory": info.get("maxmemory"),
            "maxmemory_human": info.get("maxmemory_human"),
        }
    per_node = await client.info("memory", target_nodes="primaries")
    infos = (
        list(per_node.values())
        if all(isinstance(v, dict) for v in per_node.values())
        else [per_node]
    )

    def total(key: str) -> int:
        return sum(int(i.get(key) or 0) for i in infos)

    used, cap = total("used_memory"), total("maxmemory")
    return {
        "used_memory": used,
        "used_memory_human": human_bytes(used),
        "peak_human": human_bytes(total("used_memory_peak")),
        "maxmemory": cap,
        "maxmemory_human": human_bytes(cap),
        "masters": len(infos),
    }


def human_bytes(n: float) -> str:
    """Bytes as Redis writes them in INFO: 7.09M, 1.00G."""
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n:.2f}{unit}" if unit != "B" else f"{int(n)}B"
        n /= 1024
    raise AssertionError("unreachable")


KINDS = ("worker", "batcher", "edge")


async def _registry(client: Any, index: str, key_of: Any) -> dict[str, dict[str, Any]]:
    ids = [m.decode() for m in await client.zrange(index, 0, -1)]
    if not ids:
        return {}
    values = await registry.get_each(client, [key_of(i) for i in ids])
    out = {}
    for mid, raw in zip(ids, values, strict=True):
        if isinstance(raw, bytes):
            try:
                out[mid] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
    return out


class Collector:
    """Reads snapshots of the running system, one after another, over clients that live
    as long as it does (``close`` ends them). Each snapshot's rates come from the records
    of the one before. ``redis`` is a client of the caller's (kept open on ``close``);
    without one it makes its own. A Kafka client that failed is made afresh next time."""

    def __init__(
        self, settings: CommonSettings, redis: Any = None, probe_urls: list[str] | None = None
    ) -> None:
        self.settings = settings
        self._own_redis = redis is None
        self._redis = redis if redis is not None else redis_client(settings)
        self._probe_urls = probe_urls or []
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._before: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in KINDS}

    async def snapshot(self, *, probes: bool = True) -> Snapshot:
        """What the services publish now (``probes``: with the ``/readyz`` of the edges
        named at construction)."""
        snap = Snapshot(at=time.time())
        await asyncio.gather(
            self._read_redis(snap),
            self._read_kafka(snap),
            self._probe(snap, self._probe_urls if probes else []),
        )
        return snap

    async def close(self) -> None:
        await self._close_kafka()
        if self._own_redis:
            await self._redis.aclose()

    async def _read_redis(self, snap: Snapshot) -> None:
        names, client = self.settings.names, self._redis
        try:
            live = {
                "worker": await _registry(client, names.workers_index, names.heartbeat),
                "batcher": await _registry(client, names.batchers_index, names.batcher_status),
                "edge": await _registry(client, names.edges_index, names.edge_heartbeat),
            }
            seen = await self._remember(live, snap.at)
            ttl = FleetSettings.model_fields["heartbeat_ttl_s"].default
            before = self._before
            snap.workers = [
                worker_view(r, before["worker"].get(r["id"]) or seen["worker"].get(r["id"]))
                for r in members(live["worker"], seen["worker"], ttl, snap.at)
            ]
            snap.batchers = [
                batcher_view(r)
                for r in members(live["batcher"], seen["batcher"], BATCHER_TTL_S, snap.at)
            ]
            snap.edges = [
                edge_view(r, before["edge"].get(r["id"]) or seen["edge"].get(r["id"]))
                for r in members(live["edge"], seen["edge"], ttl, snap.at)
            ]
            self._before = {k: dict(v) for k, v in live.items()}
            snap.redis = await redis_memory(client, cluster=self.settings.redis_cluster)
        except (RedisError, OSError) as exc:
            snap.problems.append(f"redis: {exc!r}")

    async def _remember(
        self, live: dict[str, dict[str, dict[str, Any]]], now: float
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """The last-seen records of every member (before this reading), with this
        reading's live records stored as the new last-seen ones and old ones dropped."""
        key = seen_key(self.settings.names)
        seen: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in KINDS}
        stale = []
        for k, v in (await self._redis.hgetall(key)).items():
            kind, _, mid = (k.decode() if isinstance(k, bytes) else k).partition(":")
            rec = orjson.loads(v)
            if now - float(rec.get("at", 0)) > SEEN_KEEP_S:
                stale.append(k)
            elif kind in seen:
                seen[kind][mid] = rec
        pipe = self._redis.pipeline(transaction=False)
        for kind, records in live.items():
            for mid, rec in records.items():
                pipe.hset(key, f"{kind}:{mid}", orjson.dumps(rec))
        if stale:
            pipe.hdel(key, *stale)
        await pipe.execute()
        return seen

    async def _kafka(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        if self._consumer is None or self._admin is None:
            self._consumer = make_consumer(self.settings, group_id=None, client_id="tw-status")
            self._admin = make_admin(self.settings, client_id="tw-status")
            await self._consumer.start()
            await self._admin.start()
        return self._consumer, self._admin

    async def _close_kafka(self) -> None:
        consumer, admin = self._consumer, self._admin
        self._consumer = self._admin = None
        if admin is not None:
            await admin.close()
        if consumer is not None:
            await consumer.stop()

    async def _read_kafka(self, snap: Snapshot) -> None:
        try:
            async with asyncio.timeout(KAFKA_TIMEOUT_S):
                await self._read_offsets(snap)
        except TimeoutError:
            snap.problems.append(f"kafka: no answer within {KAFKA_TIMEOUT_S:.0f} s")
            await self._close_kafka()
        except Exception as exc:  # Kafka away: the screen says so, shows the rest, and retries
            snap.problems.append(f"kafka: {exc!r}")
            await self._close_kafka()

    async def _read_offsets(self, snap: Snapshot) -> None:
        names = self.settings.names
        consumer, admin = await self._kafka()
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

    async def _probe(self, snap: Snapshot, urls: list[str]) -> None:
        async def one(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
            try:
                r = await client.get(url.rstrip("/") + "/readyz")
            except httpx.HTTPError as exc:
                return {"url": url, "state": f"DOWN ({type(exc).__name__})"}
            return {
                "url": url,
                "state": "ready" if r.status_code == 200 else f"NOT READY ({r.status_code})",
            }

        if urls:
            async with httpx.AsyncClient(timeout=2.0) as client:
                snap.probes = list(await asyncio.gather(*(one(client, u) for u in urls)))


async def run(args: argparse.Namespace, settings: CommonSettings) -> None:
    collector = Collector(settings, probe_urls=args.edge)
    try:
        if not args.watch:
            # Two readings a moment apart: rates need two heartbeats of each member.
            await collector.snapshot(probes=False)
            await asyncio.sleep(args.sample)
        while True:
            snap = await collector.snapshot()
            if args.json:
                print(json.dumps(snap.as_json()), flush=True)
            else:
                clear = "\x1b[H\x1b[2J" if args.watch and sys.stdout.isatty() else ""
                print(clear + render(snap), flush=True)
            if not args.watch:
                return
            await asyncio.sleep(args.interval)
    finally:
        await collector.close()


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
        "--edge",
        action="append",
        default=[],
        metavar="URL",
        help="an edge whose /readyz to probe too (repeat)",
    )
    s.add_argument("--watch", action="store_true", help="refresh in place until interrupted")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    s.add_argument(
        "--sample", type=float, default=1.5, help="seconds between the two readings of one run"
    )
    s.add_argument("--json", action="store_true", help="JSON (one object per refresh)")
    s.set_defaults(fn=cmd_status)
