"""The running stack as its own scripts see it: the environment ``infra/env.sh`` gives
them (ports, run folder), its services' pid files, and the scripts themselves, called
with that same environment."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from services.bench.cluster import ROOT
from shared import registry
from shared.codec import DecodeError, decode
from shared.messages import WorkerHeartbeat
from shared.retry import REDIS_DOWN
from shared.settings import CommonSettings

SERVICES = ("worker", "batcher", "edge")


class ChaosError(RuntimeError):
    """The stack is not there, or did not come back after a scenario."""


def stack_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` as the stack's scripts see it: ``infra/env.sh`` fills in what is unset
    (TW_STACK, the ports, TW_RUN_DIR) exactly as it does for ``infra/stack.sh``."""
    done = subprocess.run(
        ["bash", "-c", "source infra/env.sh && env -0"],
        cwd=ROOT,
        env=dict(environ),
        capture_output=True,
        check=True,
    )
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass(frozen=True)
class Snapshot:
    """Each service's pid (0: none running) and its supervisor's restart count."""

    pids: dict[str, int]
    restarts: dict[str, int]


def exits_between(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """Exits of each service between two snapshots: the restarts its supervisor counted,
    or at least one if its pid changed."""
    out = {}
    for name in before.pids:
        counted = after.restarts.get(name, 0) - before.restarts.get(name, 0)
        moved = int(before.pids[name] != after.pids.get(name, 0))
        out[name] = max(counted, moved)
    return out


def check_profile(run_dir: Path) -> None:
    """Refuse a stack of more than one of anything: the scenarios stop its one Redis and
    its one broker, and kill its one worker and edge. What ``infra/stack.sh up`` records
    of the cluster profile (``kafka-brokers``, ``redis-shards``, ``service-counts``) says
    which it runs; a file missing counts as one."""

    def counts(name: str) -> list[int]:
        try:
            return [int(n) for n in (run_dir / name).read_text().split()]
        except (FileNotFoundError, ValueError):
            return []

    named = {
        "Kafka brokers": counts("kafka-brokers"),
        "Redis masters": counts("redis-shards"),
        "workers, batchers and edges": counts("service-counts"),
    }
    more = [f"{'/'.join(map(str, n))} {what}" for what, n in named.items() if any(c > 1 for c in n)]
    if more:
        raise ChaosError(
            "the scenarios run against the one-node stack (`infra/stack.sh up`), and this "
            f"one runs the cluster profile ({', '.join(more)}): a broker or Redis master "
            "killed there is tested by tests/integration/test_kafka_cluster.py and "
            "test_redis_cluster.py"
        )


class Stack:
    """A stack started by ``infra/stack.sh up`` with this environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.settings = CommonSettings.from_env(env)
        self.names = self.settings.names
        self.run_dir = Path(env["TW_RUN_DIR"])
        self.edge_url = f"http://127.0.0.1:{env['TW_EDGE_PORT']}"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Stack:
        stack = cls(stack_env(os.environ if environ is None else environ))
        check_profile(stack.run_dir)
        return stack

    def api_key(self) -> str | None:
        """TW_API_KEY, else the stack's development key (``stack.sh up`` writes it)."""
        if self.env.get("TW_API_KEY"):
            return self.env["TW_API_KEY"]
        path = self.run_dir / "dev-api-key"
        return path.read_text().strip() if path.exists() else None

    def pid(self, name: str) -> int:
        """The service's pid from its pid file while that process is ``tokenwire NAME``;
        0 otherwise (between two runs, or stopped)."""
        try:
            pid = int((self.run_dir / "pids" / f"{name}.pid").read_text())
            last = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").rsplit(b"\0", 1)[-1]
        except (FileNotFoundError, ValueError):
            return 0
        return pid if alive(pid) and last == name.encode() else 0

    def restarts(self, name: str) -> int:
        try:
            return int((self.run_dir / "pids" / f"{name}.restarts").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return 0

    def snapshot(self) -> Snapshot:
        return Snapshot({s: self.pid(s) for s in SERVICES}, {s: self.restarts(s) for s in SERVICES})

    def kill(self, name: str) -> int:
        """SIGKILL a service (its supervisor restarts it); returns the pid killed."""
        pid = self.pid(name)
        if not pid:
            raise ChaosError(f"{name} is not running (no live pid in {self.run_dir}/pids)")
        os.kill(pid, signal.SIGKILL)
        return pid

    async def script(self, name: str, *args: str) -> None:
        """Run ``infra/NAME.sh ARGS`` with the stack's environment."""
        proc = await asyncio.create_subprocess_exec(
            "bash",
            str(ROOT / "infra" / f"{name}.sh"),
            *args,
            cwd=ROOT,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = out.decode(errors="replace")[-2000:]
            raise ChaosError(f"infra/{name}.sh {' '.join(args)} failed:\n{tail}")

    async def wait_restarted(self, name: str, old_pid: int, within_s: float) -> float:
        """Wait until a new process of ``name`` runs; returns when (monotonic)."""
        deadline = time.monotonic() + within_s
        while self.pid(name) in (0, old_pid):
            if time.monotonic() > deadline:
                raise ChaosError(f"{name} was not restarted within {within_s:.0f} s")
            await asyncio.sleep(0.1)
        return time.monotonic()

    async def wait_ready(self, within_s: float = 180.0, since: float = 0.0) -> None:
        """Every service runs, the edge is ready (Kafka and Redis answer it) and a worker
        with partitions has beaten since ``since`` (unix time)."""
        deadline = time.monotonic() + within_s
        client = aioredis.Redis.from_url(self.settings.redis_url, socket_timeout=2.0)
        try:
            async with httpx.AsyncClient(timeout=5.0) as http:
                while not await self._ready(http, client, since):
                    if time.monotonic() > deadline:
                        down = [s for s in SERVICES if not self.pid(s)]
                        raise ChaosError(
                            f"the stack at {self.edge_url} was not ready within {within_s:.0f} s"
                            + (f" ({', '.join(down)} not running)" if down else "")
                        )
                    await asyncio.sleep(0.5)
        finally:
            await client.aclose()

    async def _ready(self, http: httpx.AsyncClient, client: aioredis.Redis, since: float) -> bool:
        if not all(self.pid(s) for s in SERVICES):
            return False
        try:
            if (await http.get(self.edge_url + "/readyz")).status_code != 200:
                return False
            beats = await registry.read_live(
                client, self.names.workers_index, self.names.heartbeat, 3.0
            )
        except httpx.TransportError:
            return False
        except REDIS_DOWN:
            return False
        return any(_serving_since(raw, since) for raw in beats)


def _serving_since(raw: bytes, since: float) -> bool:
    try:
        beat = decode(WorkerHeartbeat, raw)
    except DecodeError:
        return False
    return beat.at >= since and bool(beat.partitions)
