"""Local service processes (worker, batcher, edge) on one topic prefix, and a recorder of
every token event as clients receive them: what the benchmarks run against a real Kafka and
Redis. The integration tests build on these (``tests/integration/harness.py`` adds the
checks of a stream's events)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.batcher.sources import parse_sources
from services.edge.auth import hash_key, new_key
from services.edge.hub import RESYNC, Hub, Mailbox
from shared import registry
from shared.codec import decode
from shared.kafka_io import ensure_topics
from shared.messages import TokenEvent
from shared.names import Names
from shared.redis_client import RedisAccess
from shared.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel gives outgoing connections their local ports from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# Ports handed out by this process (a port is picked, then bound later by the service).
_GIVEN: set[int] = set()
# Below this: the fixed ports of the stacks (Kafka 9092 and 19092 on, Redis, the edges).
PORT_FLOOR = 20_000


def free_port() -> int:
    """A port for a service to bind, free now, never given before by this process, and
    below the ephemeral range: a port from ``bind(0)`` comes out of that range, where an
    outgoing connection opened before the service binds (its own Kafka client's) can take
    it, as a worker's metrics port once was in CI."""
    low, _ = ephemeral_ports()
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(PORT_FLOOR, max(PORT_FLOOR + 1000, low))
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port found in {PORT_FLOOR}..{low}")


@dataclass
class Stack:
    """A set of service processes sharing one topic prefix."""

    prefix: str
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    edge_ports: dict[str, int] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # worker/batcher /metrics

    @property
    def names(self) -> Names:
        return self.settings.names

    @property
    def settings(self) -> CommonSettings:
        return CommonSettings.from_env(self.env)

    def auth_headers(self) -> dict[str, str]:
        key = self.env.get("TW_BENCH_API_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def url(self, edge: str = "edge") -> str:
        return f"http://127.0.0.1:{self.edge_ports[edge]}"

    async def create_topics(self, partitions: int = 2) -> None:
        n = self.names
        topics = {n.requests: partitions, n.batches: partitions, n.completions: 1}
        for source in parse_sources(self.env.get("TW_REQUEST_SOURCES", "")):
            topics[n.requests_from(source.name)] = partitions
            topics[n.completions_to(source.name)] = 1
        await ensure_topics(self.settings, {**topics, n.requests_dlq: 1})

    def start(
        self, kind: str, name: str | None = None, **extra_env: str
    ) -> subprocess.Popen[bytes]:
        name = name or kind
        env = {**self.env, **extra_env}
        if kind == "edge":
            port = free_port()
            env["TW_PORT"] = str(port)
            self.edge_ports[name] = port
        if kind == "worker":
            env.setdefault("TW_WORKER_ID", f"{self.prefix}-{name}")
        if kind in ("worker", "batcher"):
            env["TW_METRICS_PORT"] = str(free_port())
            self.metrics_ports[name] = int(env["TW_METRICS_PORT"])
        log = open(self.log_dir / f"{self.prefix}-{name}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", kind],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.procs[name] = proc
        return proc

    async def wait_ready(self, within_s: float = 180.0, workers: int = 1) -> None:
        """Every edge answers /healthz and ``workers`` workers have a heartbeat."""
        deadline = time.monotonic() + within_s
        client = self.settings.redis.client()
        try:
            async with httpx.AsyncClient() as http:
                while time.monotonic() < deadline:
                    self.check_alive()
                    hbs = await registry.read_live(
                        client, self.names.workers_index, self.names.heartbeat, 3.0
                    )
                    edges_ok = True
                    for name in self.edge_ports:
                        try:
                            edges_ok &= (
                                await http.get(self.url(name) + "/healthz")
                            ).status_code == 200
                        except httpx.TransportError:
                            edges_ok = False
                    if edges_ok and len(hbs) >= workers:
                        return
                    await asyncio.sleep(0.2)
        finally:
            await client.aclose()
        raise TimeoutError(f"stack {self.prefix} not ready in {within_s}s:\n{self.logs()}")

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.logs(name)}")

    def logs(self, name: str | None = None, tail: int = 40) -> str:
        names = [name] if name else list(self.procs)
        out = []
        for n in names:
            path = self.log_dir / f"{self.prefix}-{n}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {n} ---\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        p = self.procs.pop(name)
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_stuck(p)
        return p.returncode

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def kill_stuck(p: subprocess.Popen[bytes]) -> None:
    """Kill a service that did not stop when asked, after asking it for its threads' and
    tasks' stacks (SIGUSR1: they go to its log), so its log says what it waited on."""
    p.send_signal(signal.SIGUSR1)
    try:
        p.wait(2)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def make_stack(prefix: str, infra: dict[str, str], model_dir: str, log_dir: Path) -> Stack:
    """A stack whose edges require keys (their default) and know one, ``auth_headers``'s
    (``TW_BENCH_API_KEY``, made here unless set), as a SHA-256 digest of tenant ``bench``."""
    key = os.environ.get("TW_BENCH_API_KEY") or new_key()
    env = {
        **os.environ,
        "TW_BENCH_API_KEY": key,
        "TW_API_KEYS": f"{hash_key(key)}=bench",
        **infra,
        "TW_TOPIC_PREFIX": prefix,
        "TW_MODEL_DIR": model_dir,
        "TW_MODEL_NAME": "tokenwire-tiny",
        "TW_TORCH_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return Stack(prefix, env, log_dir)


class StreamRecorder:
    """Records every token event published under a prefix (one pattern subscription), as a
    client would receive them, duplicates included, and when each stream's first and last
    events arrived.

    Sharded pub/sub (a Redis Cluster, ``Names.sharded``) has no pattern subscriptions:
    there the recorder hears only the requests it is told of with ``watch`` (before they
    are sent), through the edge's own cluster-aware subscriber."""

    def __init__(self, redis_url: str, names: Names) -> None:
        self.access = RedisAccess(redis_url, cluster=names.sharded)
        self.client = self.access.client()
        self.names = names
        self.raw: dict[str, list[TokenEvent]] = {}
        self.first_at: dict[str, float] = {}  # wall time the first event arrived
        self.last_at: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._hub: Hub | None = None
        self._box = Mailbox()

    async def __aenter__(self) -> StreamRecorder:
        if self.names.sharded:
            self._hub = Hub(self.access, name="tw-recorder")
            await self._hub.start()
            self._task = asyncio.create_task(self._drain())
            return self
        pubsub = self.client.pubsub()
        await pubsub.psubscribe(self.names.token_channel("*"))
        self._task = asyncio.create_task(self._listen(pubsub))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._hub is not None:
            await self._hub.stop()
        await self.client.aclose()

    async def watch(self, request_ids: Iterable[str]) -> None:
        """Hear these requests' events from now on (with pattern subscriptions, every
        request's already)."""
        if self._hub is None:
            return
        hub = self._hub
        channels = [self.names.token_channel(r).encode() for r in request_ids]
        await asyncio.gather(*(hub.subscribe(c, self._box) for c in channels))

    def _record(self, data: bytes) -> None:
        ev = decode(TokenEvent, data)
        self.raw.setdefault(ev.request_id, []).append(ev)
        self.first_at.setdefault(ev.request_id, time.time())
        self.last_at[ev.request_id] = time.time()

    async def _listen(self, pubsub: Any) -> None:
        try:
            async for msg in pubsub.listen():
                if msg["type"] == "pmessage":
                    self._record(msg["data"])
        finally:
            await pubsub.aclose()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._box.wait(loop.time() + 3600)
            for data in self._box.take():
                if data != RESYNC:  # a reconnect: what went by is in the logs, not heard
                    self._record(data)

    def finished(self) -> set[str]:
        return {rid for rid, evs in self.raw.items() if any(e.final for e in evs)}

    async def wait_finished(
        self, request_ids: set[str], within_s: float, stack: Stack | None = None
    ) -> None:
        deadline = time.monotonic() + within_s
        while not request_ids <= self.finished():
            if stack is not None:
                stack.check_alive()
            if time.monotonic() > deadline:
                missing = sorted(request_ids - self.finished())
                logs = stack.logs() if stack else ""
                raise TimeoutError(f"{len(missing)} streams unfinished, e.g. {missing[:3]}\n{logs}")
            await asyncio.sleep(0.1)

    def final_event(self, request_id: str) -> TokenEvent:
        """The final event of a finished stream (its usage), as first received."""
        return next(e for e in self.raw[request_id] if e.final)
