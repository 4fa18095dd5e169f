"""``tokenwire bench edge``: how many token events one edge relays per second, and how much
latency it adds per token (Redis publish → client receive), at 1 and 64 concurrent streams.

It starts one edge process on a fresh prefix (Kafka and Redis of the chosen stack must be
up), records owners for synthetic request ids, opens SSE resume streams
(``GET /v1/requests/{id}/stream``) with a minimal raw-socket client, and publishes events
straight into Redis the way workers do — no model, batcher or worker in the loop:

- **latency**: every ``step_ms`` one event per stream in one pipeline (XADD + PUBLISH, as
  a worker's engine step), carrying its publish time (``CLOCK_MONOTONIC``, shared by all
  processes). The same clients subscribed straight to Redis (one connection per stream)
  measure the path without the edge; the difference is what the edge adds.
- **throughput**: a separate process floods PUBLISHes as fast as Redis takes them; events/s
  is what the clients received from the first event to the last.

The edge process's CPU seconds over the flood, per event relayed, are its CPU cost per
event. ``--costs PATH`` merges the top level's events/s and CPU per event into a costs file
(``tokenwire plan`` reads it).

    tokenwire bench edge [--concurrency 1 64] [--quick] [--out reports/bench_edge.json]
                         [--costs reports/costs.json]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from services.bench.cluster import Stack
from services.bench.cpu import cpu_seconds
from services.bench.sse_client import EventStream, OnFrames
from services.bench.stats import pct
from services.ops.costs import Cost, add_costs_option, measured, merge_costs
from shared.messages import FinishReason, TokenEvent
from shared.names import Names
from shared.resp import RespParser, RespWriter, command, connect
from shared.settings import CommonSettings
from shared.token_stream import event_commands

_TEXT = re.compile(rb'"text":"(\d+)"')


@dataclass
class BenchConfig:
    """The edge benchmark's concurrency levels, latency steps and flood size."""

    concurrencies: tuple[int, ...] = (1, 64)
    latency_steps: int = 400
    step_ms: float = 5.0
    flood_events: int = 200_000  # per concurrency level, spread over its streams


@dataclass
class LevelResult:
    """What one concurrency level measured: events relayed per second, latency publish to client and to a bare subscriber, and what the edge adds."""

    concurrency: int
    events_per_s: float = 0.0
    cpu_us_per_event: float = 0.0  # the edge process's CPU over the flood, per event
    latency_ms: dict[str, float] = field(default_factory=dict)  # publish → client (p50/p99)
    redis_only_ms: dict[str, float] = field(default_factory=dict)  # publish → subscriber
    added_ms: dict[str, float] = field(default_factory=dict)  # the difference


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 (ms, to the microsecond) and the number of samples; empty for none."""
    if not samples:
        return {}
    return {
        "p50": round(pct(samples, 0.5), 3),
        "p99": round(pct(samples, 0.99), 3),
        "n": len(samples),
    }


# --- the edge under test ---------------------------------------------------------------
async def start_edge(settings: CommonSettings, prefix: str, log_dir: Path) -> Stack:
    """One edge process on ``prefix``, with no auth and no rate limits, answering /healthz."""
    env = {
        **os.environ,
        "TW_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TW_REDIS_URL": settings.redis_url,
        "TW_TOPIC_PREFIX": prefix,
        "TW_AUTH": "off",
        "TW_RATE_REQUESTS_PER_MIN": "0",
        "TW_RATE_TOKENS_PER_MIN": "0",
        "TW_LOG_LEVEL": "WARNING",
    }
    stack = Stack(prefix, env, log_dir)
    stack.start("edge")
    try:
        await stack.wait_ready(within_s=60, workers=0)
    except BaseException:
        stack.stop_all()
        raise
    return stack


def _latency_recorder(into: list[float]) -> OnFrames:
    """An ``on_frames`` callback: the publish time each event carries as its text, taken
    from its arrival time, appended to ``into`` in ms."""

    def on_frames(frames: bytes, now_ns: int) -> None:
        into.extend((now_ns - int(t)) / 1e6 for t in _TEXT.findall(frames))

    return on_frames


async def _open(port: int, rids: list[str], latencies: list[float] | None) -> list[EventStream]:
    on_frames = _latency_recorder(latencies) if latencies is not None else None
    streams = [EventStream("127.0.0.1", port, f"/v1/requests/{r}/stream", on_frames) for r in rids]
    await asyncio.gather(*(s.open() for s in streams))
    return streams


# --- publishers ----------------------------------------------------------------------------
def _event(rid: str, seq: int, text: str, final: bool = False) -> bytes:
    ev: dict[str, Any] = {"request_id": rid, "seq": seq, "text": text, "token_ids": [seq]}
    if final:
        ev["finish_reason"] = "stop"
    return orjson.dumps(ev)


async def publish_steps(
    writer: RespWriter, names: Names, rids: list[str], steps: int, step_ms: float
) -> None:
    """One event per stream per step, written as a worker writes a step's events."""
    for seq in range(steps + 1):
        final = seq == steps
        stamp = str(time.monotonic_ns())
        events = [
            TokenEvent(
                request_id=rid,
                seq=seq,
                text="" if final else stamp,
                token_ids=[seq],
                finish_reason=FinishReason.STOP if final else None,
            )
            for rid in rids
        ]
        await writer.execute(event_commands(names, events))
        await asyncio.sleep(step_ms / 1000)


def flood(redis_url: str, prefix: str, rids: list[str], per_stream: int) -> None:
    """Publish ``per_stream`` events to each stream as fast as Redis takes them (run in
    its own process so the publisher does not compete with the clients)."""
    from redis.connection import parse_url

    u = parse_url(redis_url)
    names = Names(prefix)
    sock = socket.create_connection((u.get("host", "127.0.0.1"), u.get("port", 6379)))
    sent = acked = 0
    parser = RespParser()
    batch = 2048
    chans = [names.token_channel(r).encode() for r in rids]
    for seq in range(per_stream + 1):
        final = seq == per_stream
        out = [
            command(b"PUBLISH", ch, _event(r, seq, "x", final))
            for ch, r in zip(chans, rids, strict=True)
        ]
        sock.sendall(b"".join(out))
        sent += len(out)
        while sent - acked > batch:  # bounded in-flight: read replies
            acked += len(parser.feed(sock.recv(1 << 20)))
    while acked < sent:
        acked += len(parser.feed(sock.recv(1 << 20)))
    sock.close()


class DirectStream:
    """A plain Redis subscriber of one stream's channel: the path without the edge."""

    def __init__(self, redis_url: str, channel: str) -> None:
        self.redis_url = redis_url
        self.channel = channel.encode()
        self.latencies_ms: list[float] = []

    async def open(self) -> None:
        self.reader, self.writer = await connect(
            self.redis_url, name="tw-bench-direct", timeout_s=10
        )
        self.parser = RespParser()
        self.writer.write(command(b"SUBSCRIBE", self.channel))
        while not any(r[0] == b"subscribe" for r in self.parser.feed(await self.reader.read(4096))):
            pass

    async def read(self) -> None:
        done = False
        while not done:
            data = await self.reader.read(262_144)
            now = time.monotonic_ns()
            if not data:
                break
            for reply in self.parser.feed(data):
                m = _TEXT.search(reply[2])
                if m:
                    self.latencies_ms.append((now - int(m.group(1))) / 1e6)
                elif b"finish_reason" in reply[2]:
                    done = True
        self.writer.close()


# --- one level ---------------------------------------------------------------------------
async def _owned_ids(client: aioredis.Redis, names: Names, n: int, tag: str) -> list[str]:
    rids = [f"cmpl-bench{tag}{uuid.uuid4().hex[:12]}" for _ in range(n)]
    pipe = client.pipeline(transaction=False)
    for rid in rids:
        pipe.set(names.owner(rid), "default", ex=600)
    await pipe.execute()
    return rids


@dataclass
class _Level:
    """One concurrency level against the edge on ``port``, with its Redis connections."""

    settings: CommonSettings
    names: Names
    port: int
    concurrency: int
    cfg: BenchConfig
    client: aioredis.Redis
    writer: RespWriter
    edge_pid: int

    async def latency(self, result: LevelResult) -> None:
        """Realistic pacing, timestamps in the events. First the same clients subscribed
        straight to Redis (one connection per stream, as the edge streams have), then
        through the edge: the difference is the edge's hop."""
        names, cfg = self.names, self.cfg
        rids = await _owned_ids(self.client, names, self.concurrency, "lat")
        direct = [DirectStream(self.settings.redis_url, names.token_channel(r)) for r in rids]
        await asyncio.gather(*(d.open() for d in direct))
        readers = [asyncio.create_task(d.read()) for d in direct]
        await publish_steps(self.writer, names, rids, cfg.latency_steps, cfg.step_ms)
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        rids = await _owned_ids(self.client, names, self.concurrency, "lat")
        through_edge: list[float] = []
        streams = await _open(self.port, rids, through_edge)
        readers = [asyncio.create_task(s.read()) for s in streams]
        await publish_steps(self.writer, names, rids, cfg.latency_steps, cfg.step_ms)
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        result.latency_ms = percentiles(through_edge)
        result.redis_only_ms = percentiles([x for d in direct for x in d.latencies_ms])
        result.added_ms = {
            k: round(result.latency_ms[k] - result.redis_only_ms[k], 3) for k in ("p50", "p99")
        }

    async def throughput(self, result: LevelResult) -> None:
        """A flood from another process; events/s as the clients received them."""
        rids = await _owned_ids(self.client, self.names, self.concurrency, "tp")
        streams = await _open(self.port, rids, None)
        readers = [asyncio.create_task(s.read()) for s in streams]
        per_stream = max(1, self.cfg.flood_events // self.concurrency)
        proc = multiprocessing.get_context("spawn").Process(
            target=flood, args=(self.settings.redis_url, self.names.prefix, rids, per_stream)
        )
        cpu0 = cpu_seconds(self.edge_pid)
        proc.start()
        await asyncio.wait_for(asyncio.gather(*readers), 300)
        cpu1 = cpu_seconds(self.edge_pid)
        await asyncio.to_thread(proc.join)
        total = sum(s.events for s in streams)
        result.cpu_us_per_event = round((cpu1 - cpu0) * 1e6 / max(1, total), 3)
        span = max(s.last_at for s in streams) - min(s.first_at for s in streams)
        result.events_per_s = round(total / span) if span > 0 else 0.0
        expected = (per_stream + 1) * self.concurrency
        if total != expected:
            print(f"warning: {total} of {expected} events relayed", file=sys.stderr)


async def run_level(
    settings: CommonSettings, prefix: str, edge: Stack, concurrency: int, cfg: BenchConfig
) -> LevelResult:
    client = aioredis.Redis.from_url(settings.redis_url)
    writer = RespWriter(settings.redis_url, name="tw-bench-publisher")
    port, pid = edge.edge_ports["edge"], edge.procs["edge"].pid
    level = _Level(settings, Names(prefix), port, concurrency, cfg, client, writer, pid)
    result = LevelResult(concurrency)
    try:
        await level.latency(result)
        await level.throughput(result)
    finally:
        await writer.aclose()
        await client.aclose()
    return result


def _print_level(r: LevelResult) -> None:
    print(
        f"streams={r.concurrency:3d}  relayed {r.events_per_s:>9,.0f} events/s   "
        f"publish→client p50 {r.latency_ms['p50']:.3f} ms p99 {r.latency_ms['p99']:.3f} ms   "
        f"redis only p50 {r.redis_only_ms['p50']:.3f} p99 {r.redis_only_ms['p99']:.3f}   "
        f"added by the edge p50 {r.added_ms['p50']:.3f} ms p99 {r.added_ms['p99']:.3f} ms   "
        f"edge CPU {r.cpu_us_per_event:.1f} us/event",
        flush=True,
    )


async def run(cfg: BenchConfig, out: Path | None) -> list[LevelResult]:
    settings = CommonSettings.from_env()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    log_dir = Path(out).parent / "logs" if out else Path("/tmp")
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = await start_edge(settings, prefix, log_dir)
    results = []
    try:
        for c in cfg.concurrencies:
            r = await run_level(settings, prefix, stack, c, cfg)
            results.append(r)
            _print_level(r)
    finally:
        await asyncio.to_thread(stack.stop_all)
    if out:
        report = {
            "config": asdict(cfg),
            "cpus": os.cpu_count(),
            "levels": [asdict(r) for r in results],
        }
        await asyncio.to_thread(
            Path(out).write_bytes, orjson.dumps(report, option=orjson.OPT_INDENT_2)
        )
        print(f"wrote {out}")
    return results


def costs_of(results: list[LevelResult]) -> dict[str, Cost]:
    """The top concurrency level's events/s and edge CPU per event, as costs."""
    top = max(results, key=lambda r: r.concurrency)
    note = f"{top.concurrency} streams, a flood of PUBLISHes from another process"
    return {
        "edge_events_per_s": measured(top.events_per_s, "events/s one edge relays", note),
        "edge_cpu_us_per_event": measured(top.cpu_us_per_event, "us CPU per event", note),
    }


def build_parser() -> argparse.ArgumentParser:
    """The options of ``tokenwire bench edge``."""
    p = argparse.ArgumentParser(
        prog="tokenwire bench edge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 64],
        help="concurrent streams, one level each (default: 1 64)",
    )
    p.add_argument(
        "--steps", type=int, default=400, help="latency events per stream (default: 400)"
    )
    p.add_argument(
        "--step-ms",
        type=float,
        default=5.0,
        help="ms between latency steps, as a worker's engine steps (default: 5)",
    )
    p.add_argument(
        "--flood-events",
        type=int,
        default=200_000,
        help="events flooded per level for throughput, over all its streams (default: 200000)",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: few events")
    p.add_argument(
        "--out",
        default="reports/bench_edge.json",
        help="the JSON report (default: reports/bench_edge.json; the edge's log goes to "
        "logs/ beside it)",
    )
    add_costs_option(p, "edge_events_per_s and edge_cpu_us_per_event")
    return p


def main(argv: list[str] | None = None) -> None:
    """``tokenwire bench edge``: see the module docstring."""
    args = build_parser().parse_args(argv)
    cfg = BenchConfig(tuple(args.concurrency), args.steps, args.step_ms, args.flood_events)
    if args.quick:
        cfg = BenchConfig(tuple(args.concurrency), 20, args.step_ms, 2_000)
    results = asyncio.run(run(cfg, Path(args.out) if args.out else None))
    if args.costs:
        merge_costs(Path(args.costs), costs_of(results))


if __name__ == "__main__":
    main()
