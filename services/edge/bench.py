"""Edge relay benchmark: how many token events one edge relays per second, and how much
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

    python -m services.edge.bench [--concurrency 1 64] [--quick] [--out reports/bench_edge.json]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis.asyncio as aioredis

from shared.messages import FinishReason, TokenEvent
from shared.names import Names
from shared.resp import RespParser, RespWriter, command, connect
from shared.settings import CommonSettings
from shared.token_stream import event_commands

ROOT = Path(__file__).resolve().parents[2]
_TEXT = re.compile(rb'"text":"(\d+)"')


@dataclass
class BenchConfig:
    concurrencies: tuple[int, ...] = (1, 64)
    latency_steps: int = 400
    step_ms: float = 5.0
    flood_events: int = 200_000  # per concurrency level, spread over its streams


@dataclass
class LevelResult:
    concurrency: int
    events_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)  # publish → client (p50/p99)
    redis_only_ms: dict[str, float] = field(default_factory=dict)  # publish → subscriber
    added_ms: dict[str, float] = field(default_factory=dict)  # the difference


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    if not s:
        return {}
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"p50": round(pick(0.50), 3), "p99": round(pick(0.99), 3), "n": len(s)}


# --- the edge under test ---------------------------------------------------------------
def start_edge(
    settings: CommonSettings, prefix: str, log: Path
) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **os.environ,
        "TW_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TW_REDIS_URL": settings.redis_url,
        "TW_TOPIC_PREFIX": prefix,
        "TW_PORT": str(port),
        "TW_AUTH": "off",
        "TW_RATE_REQUESTS_PER_MIN": "0",
        "TW_RATE_TOKENS_PER_MIN": "0",
        "TW_LOG_LEVEL": "WARNING",
    }
    out = open(log, "ab")  # handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "edge"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    return proc, port


async def wait_healthy(
    port: int, proc: subprocess.Popen[bytes], log: Path, within_s: float = 60
) -> None:
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = await asyncio.to_thread(_tail, log)
                raise RuntimeError(f"edge exited with {proc.returncode}:\n{tail}")
            try:
                if (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("edge did not start")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.is_file() else ""


# --- a minimal SSE client ----------------------------------------------------------------
class RawStream:
    """One SSE resume stream read off the socket with no HTTP library in the way: counts
    events and, for latency, parses the publish time each event carries as its text."""

    def __init__(self, port: int, request_id: str) -> None:
        self.port = port
        self.request_id = request_id
        self.events = 0
        self.latencies_ms: list[float] = []
        self.first_at = self.last_at = 0.0
        self.done = asyncio.Event()

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(
            f"GET /v1/requests/{self.request_id}/stream HTTP/1.1\r\nHost: bench\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")  # sent once the edge has subscribed
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"stream refused: {head[:200]!r}")

    async def read(self, timed: bool) -> None:
        buf = b""
        while True:
            data = await self.reader.read(262_144)
            now = time.monotonic_ns()
            if not data:
                break
            buf += data
            cut = buf.rfind(b"\n\n")
            if cut < 0:
                continue
            frames, buf = buf[: cut + 2], buf[cut + 2 :]
            n = frames.count(b"id: ")
            if n and not self.events:
                self.first_at = now / 1e9
            self.events += n
            self.last_at = now / 1e9
            if timed:
                self.latencies_ms += [(now - int(t)) / 1e6 for t in _TEXT.findall(frames)]
            if b"data: [DONE]" in frames:
                break
        self.writer.close()
        self.done.set()


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
        await writer.execute([command(*c) for c in event_commands(names, events)])
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


# --- one level ---------------------------------------------------------------------------
async def run_level(
    settings: CommonSettings, prefix: str, port: int, concurrency: int, cfg: BenchConfig
) -> LevelResult:
    names = Names(prefix)
    client = aioredis.Redis.from_url(settings.redis_url)
    writer = RespWriter(settings.redis_url, name="tw-bench-publisher")
    result = LevelResult(concurrency)
    try:
        # Latency: realistic pacing, timestamps in the events. First the same clients
        # subscribed straight to Redis (one connection per stream, as the edge streams
        # have), then through the edge: the difference is the edge's hop.
        rids = await _owned_ids(client, names, concurrency, "lat")
        direct = [DirectStream(settings.redis_url, names.token_channel(r)) for r in rids]
        await asyncio.gather(*(d.open() for d in direct))
        readers = [asyncio.create_task(d.read()) for d in direct]
        await publish_steps(writer, names, rids, cfg.latency_steps, cfg.step_ms)
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        rids = await _owned_ids(client, names, concurrency, "lat")
        streams = await _open(port, rids)
        readers = [asyncio.create_task(s.read(timed=True)) for s in streams]
        await publish_steps(writer, names, rids, cfg.latency_steps, cfg.step_ms)
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        result.latency_ms = percentiles([x for s in streams for x in s.latencies_ms])
        result.redis_only_ms = percentiles([x for d in direct for x in d.latencies_ms])
        result.added_ms = {
            k: round(result.latency_ms[k] - result.redis_only_ms[k], 3) for k in ("p50", "p99")
        }
        # Throughput: flood from another process.
        rids = await _owned_ids(client, names, concurrency, "tp")
        streams = await _open(port, rids)
        readers = [asyncio.create_task(s.read(timed=False)) for s in streams]
        per_stream = max(1, cfg.flood_events // concurrency)
        proc = multiprocessing.get_context("spawn").Process(
            target=flood, args=(settings.redis_url, prefix, rids, per_stream)
        )
        proc.start()
        await asyncio.wait_for(asyncio.gather(*readers), 300)
        await asyncio.to_thread(proc.join)
        total = sum(s.events for s in streams)
        span = max(s.last_at for s in streams) - min(s.first_at for s in streams)
        result.events_per_s = round(total / span) if span > 0 else 0.0
        expected = (per_stream + 1) * concurrency
        if total != expected:
            print(f"warning: {total} of {expected} events relayed", file=sys.stderr)
    finally:
        await writer.aclose()
        await client.aclose()
    return result


async def _owned_ids(client: aioredis.Redis, names: Names, n: int, tag: str) -> list[str]:
    rids = [f"cmpl-bench{tag}{uuid.uuid4().hex[:12]}" for _ in range(n)]
    pipe = client.pipeline(transaction=False)
    for rid in rids:
        pipe.set(names.owner(rid), "default", ex=600)
    await pipe.execute()
    return rids


async def _open(port: int, rids: list[str]) -> list[RawStream]:
    streams = [RawStream(port, r) for r in rids]
    await asyncio.gather(*(s.open() for s in streams))
    return streams


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


async def run(cfg: BenchConfig, out: Path | None) -> list[LevelResult]:
    settings = CommonSettings.from_env()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    log = Path(out).parent / "bench_edge.log" if out else Path("/tmp/tokenwire-bench-edge.log")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    proc, port = start_edge(settings, prefix, log)
    results = []
    try:
        await wait_healthy(port, proc, log)
        for c in cfg.concurrencies:
            r = await run_level(settings, prefix, port, c, cfg)
            results.append(r)
            print(
                f"streams={c:3d}  relayed {r.events_per_s:>9,.0f} events/s   "
                f"publish→client p50 {r.latency_ms['p50']:.3f} ms p99 {r.latency_ms['p99']:.3f} ms   "
                f"redis only p50 {r.redis_only_ms['p50']:.3f} p99 {r.redis_only_ms['p99']:.3f}   "
                f"added by the edge p50 {r.added_ms['p50']:.3f} ms p99 {r.added_ms['p99']:.3f} ms",
                flush=True,
            )
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
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


def main(argv: list[str] | None = None) -> None:
    """``tokenwire bench edge``: see the module docstring."""
    p = argparse.ArgumentParser(
        prog="tokenwire bench edge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    p.add_argument("--steps", type=int, default=400, help="latency events per stream")
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--flood-events", type=int, default=200_000)
    p.add_argument("--quick", action="store_true", help="a smoke run: few events")
    p.add_argument("--out", default="reports/bench_edge.json")
    args = p.parse_args(argv)
    cfg = BenchConfig(tuple(args.concurrency), args.steps, args.step_ms, args.flood_events)
    if args.quick:
        cfg = BenchConfig(tuple(args.concurrency), 20, args.step_ms, 2_000)
    asyncio.run(run(cfg, Path(args.out) if args.out else None))


if __name__ == "__main__":
    main()
