"""``tokenwire bench infra``: what one Redis core and one Kafka broker take, with the
project's own messages, for the capacity plan.

- **Redis**: token events written as a worker writes them (``event_commands``: the replay
  log's XADD, its EXPIRE on the first and final events, the PUBLISH), one pipeline per step
  of ``--streams`` streams, while one subscriber (as an edge) takes every channel. Redis
  runs commands on one thread, so its CPU seconds (``INFO cpu``, the main thread's where
  Redis reports it) over the run, per event, give the events/s one core takes. The server
  may serve others at the same time: their commands count against the figure, which can
  only make it lower.
- **Kafka**: ``--records`` request records (an encoded ``GenerateRequest`` of a 100-word
  prompt) and as many batch records (a ``Batch`` of 8 such requests) produced to a fresh
  one-partition topic by the project's producer (idempotent, acks=all): records/s by the
  clock, which on a small machine the Python client bounds, not the broker. When the
  broker's process is local (``--broker-pid``, or the pid file of the ``TW_STACK`` stack),
  its CPU seconds per record too.

``--costs PATH`` merges ``redis_events_per_s`` and ``kafka_records_per_s`` (the request
records' rate by the clock: the figure the plan uses) and the rest into a costs file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from services.bench.cpu import cpu_seconds
from services.ops.costs import Cost, add_costs_option, measured, merge_costs
from shared.codec import encode
from shared.kafka_io import ensure_topics, make_admin, make_producer
from shared.messages import Batch, FinishReason, GenerateRequest, SamplingParams, TokenEvent
from shared.names import Names
from shared.resp import RespParser, RespWriter, command, connect
from shared.settings import CommonSettings
from shared.token_stream import event_commands

PROMPT = " ".join(["the quick brown fox jumps over the lazy dog and"] * 10)  # 100 words


@dataclass
class InfraConfig:
    """Streams and steps of the Redis run, records of each Kafka run."""

    streams: int = 256
    steps: int = 200
    records: int = 20_000


# --- Redis -----------------------------------------------------------------------------------
async def _redis_cpu(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    if "used_cpu_user_main_thread" in info:
        return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _subscriber(
    redis_url: str, channels: list[str], finals: int, subscribed: asyncio.Event
) -> None:
    """One connection subscribed to every channel (``subscribed`` set once Redis confirmed
    them all), reading until ``finals`` final events."""
    reader, writer = await connect(redis_url, name="tw-bench-infra-sub", timeout_s=10)
    parser = RespParser()
    writer.write(command(b"SUBSCRIBE", *(c.encode() for c in channels)))
    confirmed = seen = 0
    try:
        while seen < finals:
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("Redis closed the subscriber's connection")
            for r in parser.feed(data):
                confirmed += r[0] == b"subscribe"
                seen += r[0] == b"message" and b"finish_reason" in r[2]
            if confirmed == len(channels):
                subscribed.set()
    finally:
        writer.close()


async def redis_run(settings: CommonSettings, cfg: InfraConfig) -> dict[str, Any]:
    """Events per Redis CPU second (and by the clock) of a worker-like write load."""
    names = Names(f"bench-infra-{uuid.uuid4().hex[:8]}")
    rids = [f"cmpl-infra{i:05d}" for i in range(cfg.streams)]
    channels = [names.token_channel(r) for r in rids]
    client = aioredis.Redis.from_url(settings.redis_url)
    writer = RespWriter(settings.redis_url, name="tw-bench-infra")
    subscribed = asyncio.Event()
    sub = asyncio.create_task(_subscriber(settings.redis_url, channels, len(rids), subscribed))
    try:
        await asyncio.wait_for(subscribed.wait(), 30)
        cpu0, t0 = await _redis_cpu(client), time.perf_counter()
        for seq in range(cfg.steps + 1):
            final = seq == cfg.steps
            step = [
                TokenEvent(
                    request_id=r,
                    seq=seq,
                    text=" tok",
                    token_ids=[seq],
                    finish_reason=FinishReason.LENGTH if final else None,
                )
                for r in rids
            ]
            await writer.execute(event_commands(names, step))
        await asyncio.wait_for(sub, 120)
        wall, cpu = time.perf_counter() - t0, await _redis_cpu(client) - cpu0
        await client.delete(*(names.token_log(r) for r in rids))
    finally:
        sub.cancel()
        await writer.aclose()
        await client.aclose()
    events = cfg.streams * (cfg.steps + 1)
    return {
        "events": events,
        "redis_cpu_s": cpu,
        "events_per_cpu_s": events / cpu,
        "events_per_s_wall": events / wall,
    }


# --- Kafka -----------------------------------------------------------------------------------
def broker_pid(explicit: int) -> int | None:
    """The local broker's pid: ``explicit``, else the pid file of this ``TW_STACK``'s stack."""
    if explicit:
        return explicit
    cache = Path(os.environ.get("TOKENWIRE_CACHE", Path.home() / ".cache/tokenwire"))
    run_dir = Path(os.environ.get("TW_RUN_DIR", cache / "run" / os.environ.get("TW_STACK", "")))
    try:
        pid = int((run_dir / "kafka" / "kafka.pid").read_text())
        cpu_seconds(pid)
    except (OSError, ValueError):
        return None
    return pid


def records() -> dict[str, bytes]:
    """A request record and a batch record (8 requests), as the project encodes them."""
    req = GenerateRequest(prompt=PROMPT, sampling=SamplingParams(max_tokens=256))
    return {"request": encode(req), "batch": encode(Batch(requests=[req] * 8))}


async def kafka_run(settings: CommonSettings, cfg: InfraConfig, pid: int | None) -> dict[str, Any]:
    """Records/s of request and batch records through the project's producer."""
    topic = f"bench-infra-{uuid.uuid4().hex[:8]}.records"
    await ensure_topics(settings, {topic: 1})
    producer = make_producer(settings, client_id="tw-bench-infra", linger_ms=5)
    await producer.start()
    out: dict[str, Any] = {}
    try:
        await producer.send_and_wait(topic, b"warm-up")
        for kind, value in records().items():
            cpu0 = cpu_seconds(pid) if pid else 0.0
            t0 = time.perf_counter()
            futs = [await producer.send(topic, value) for _ in range(cfg.records)]
            await asyncio.gather(*futs)
            wall = time.perf_counter() - t0
            row: dict[str, Any] = {"bytes": len(value), "records_per_s": cfg.records / wall}
            if pid:
                cpu = cpu_seconds(pid) - cpu0
                row |= {"broker_cpu_s": cpu, "records_per_broker_cpu_s": cfg.records / cpu}
            out[kind] = row
    finally:
        await producer.stop()
        admin = make_admin(settings, client_id="tw-bench-infra")
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()
    return out


# --- the command -----------------------------------------------------------------------------
def costs_of(report: dict[str, Any]) -> dict[str, Cost]:
    r, k = report["redis"], report["kafka"]
    out = {
        "redis_events_per_s": measured(
            r["events_per_cpu_s"],
            "token events/s one Redis core appends and publishes",
            f"{report['config']['streams']} streams, one subscriber of every channel; "
            "events over the Redis main thread's CPU seconds",
        ),
        "kafka_records_per_s": measured(
            k["request"]["records_per_s"],
            "request records/s one broker takes (acks=all, one partition)",
            f"{k['request']['bytes']}-byte records from one Python producer by the clock: "
            "a lower bound, the client is the limit on a small machine",
        ),
        "kafka_batch_records_per_s": measured(
            k["batch"]["records_per_s"],
            "batch records/s one broker takes (acks=all, one partition)",
            f"{k['batch']['bytes']}-byte records (8 requests each), one Python producer",
        ),
    }
    if "records_per_broker_cpu_s" in k["request"]:
        out["kafka_records_per_broker_cpu_s"] = measured(
            k["request"]["records_per_broker_cpu_s"],
            "request records per CPU second of the broker's process",
            "the broker's JVM, all its threads, over the request-record run",
        )
    return out


async def measure(cfg: InfraConfig, pid: int | None) -> dict[str, Any]:
    settings = CommonSettings.from_env()
    report: dict[str, Any] = {"config": cfg.__dict__, "cpus": os.cpu_count()}
    report["redis"] = await redis_run(settings, cfg)
    print("redis", orjson.dumps(report["redis"]).decode(), flush=True)
    report["kafka"] = await kafka_run(settings, cfg, pid)
    print("kafka", orjson.dumps(report["kafka"]).decode(), flush=True)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokenwire bench infra",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--streams", type=int, default=256, help="Redis: streams per step")
    p.add_argument("--steps", type=int, default=200, help="Redis: events per stream")
    p.add_argument("--records", type=int, default=20_000, help="Kafka: records of each kind")
    p.add_argument("--broker-pid", type=int, default=0, help="the local broker's pid")
    p.add_argument("--quick", action="store_true", help="a smoke run: few events and records")
    p.add_argument(
        "--out", default="reports/bench_infra.json", help="the JSON report ('' for none)"
    )
    add_costs_option(p, "redis_events_per_s, kafka_records_per_s and the rest")
    return p


def main(argv: list[str] | None = None) -> None:
    """``tokenwire bench infra``: see the module docstring."""
    args = build_parser().parse_args(argv)
    cfg = InfraConfig(args.streams, args.steps, args.records)
    if args.quick:
        cfg = InfraConfig(16, 20, 500)
    report = asyncio.run(measure(cfg, broker_pid(args.broker_pid)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.out}")
    if args.costs:
        merge_costs(Path(args.costs), costs_of(report))
