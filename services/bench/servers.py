"""Private Kafka and Redis servers, started by the project's own infra scripts on free
ports and in a folder of their own: for fault tests, which may stop, kill and restart them
(or one node of a Kafka or Redis cluster) without disturbing the session's shared servers,
and for the end-to-end benchmark's cluster profile."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from services.bench.cluster import ROOT, free_port


@dataclass(frozen=True)
class ClusterNode:
    """One node of a Redis cluster as ``infra/redis.sh nodes`` prints it."""

    number: int  # from 1, as the script's start/stop/kill take it
    port: int
    role: str  # master, replica, or "-" while the cluster does not know the node
    state: str  # up, suspect (past the node timeout as one node sees it), down
    slots: tuple[tuple[int, int], ...]  # a master's ranges, first and last slot
    master: int | None  # a replica's master's port

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


def _slot_ranges(text: str) -> tuple[tuple[int, int], ...]:
    if text == "-":
        return ()
    ranges = (part.split("-") for part in text.split(","))
    return tuple((int(r[0]), int(r[-1])) for r in ranges)


@dataclass
class Server:
    """One infra-script-managed server (``kind``: ``kafka`` or ``redis``)."""

    kind: str
    env: dict[str, str]

    def _run(self, verb: str, node: int | None = None) -> str:
        return subprocess.run(
            ["bash", f"infra/{self.kind}.sh", verb, *([str(node)] if node else [])],
            cwd=ROOT,
            env=self.env,
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout

    def start(self, node: int | None = None) -> None:
        """Start the server (a cluster: every node, or ``node``, from 1)."""
        self._run("start", node)

    def stop(self, node: int | None = None) -> None:
        """A clean stop (Redis: SHUTDOWN; Kafka: controlled shutdown)."""
        self._run("stop", node)

    def kill(self, node: int) -> None:
        """kill -9 of one node of a cluster: a crash, with no shutdown."""
        self._run("kill", node)

    def nodes(self) -> list[ClusterNode]:
        """A Redis cluster's nodes, as the first node that answers sees them."""
        out = []
        for line in self._run("nodes").splitlines():
            number, port, role, state, slots, master = line.split()
            out.append(
                ClusterNode(
                    int(number),
                    int(port),
                    role,
                    state,
                    _slot_ranges(slots),
                    None if master == "-" else int(master),
                )
            )
        return out

    @property
    def ports(self) -> list[int]:
        """A Redis server's client ports: one, or each node's of a cluster."""
        return [
            int(p) for p in self.env.get("TW_REDIS_PORTS", self.env["TW_REDIS_PORT"]).split(",")
        ]

    @property
    def url(self) -> str:
        if self.kind == "redis":
            return f"redis://127.0.0.1:{self.env['TW_REDIS_PORT']}/0"
        ports = self.env.get("TW_KAFKA_PORTS") or self.env["TW_KAFKA_PORT"]
        return ",".join(f"127.0.0.1:{port}" for port in ports.split(","))

    @property
    def client_env(self) -> dict[str, str]:
        """What a Kafka client needs in its environment: the bootstrap servers, and the
        replication the project's topics get (a cluster's)."""
        keys = ("TW_KAFKA_REPLICATION_FACTOR", "TW_KAFKA_MIN_INSYNC_REPLICAS")
        return {"TW_KAFKA_BOOTSTRAP": self.url} | {k: self.env[k] for k in keys if k in self.env}


def private_server(kind: str, run_dir: Path, *, persist: str = "off") -> Server:
    """A server of ``kind`` on free ports under ``run_dir`` (not started); a Redis keeps
    its data across restarts with ``persist="aof"``, as the demo stack's does."""
    env = {**os.environ, "TW_STACK": "test", "TW_RUN_DIR": str(run_dir)}
    if kind == "redis":
        env["TW_REDIS_PORT"] = str(free_port())
        env["TW_REDIS_PERSIST"] = persist
        for key in ("TW_REDIS_SHARDS", "TW_REDIS_PORTS", "TW_REDIS_BUS_PORTS"):
            env.pop(key, None)  # one node, on the port just chosen
    else:
        env["TW_KAFKA_PORT"] = str(free_port())
        env["TW_KAFKA_CONTROLLER_PORT"] = str(free_port())
        env["TW_KAFKA_WIPE"] = "0"
        for key in ("TW_KAFKA_BROKERS", "TW_KAFKA_PORTS", "TW_KAFKA_CONTROLLER_PORTS"):
            env.pop(key, None)  # one broker, on the ports just chosen
    return Server(kind, env)


def private_kafka_cluster(run_dir: Path, brokers: int = 3) -> Server:
    """A Kafka cluster of ``brokers`` nodes (infra/kafka.sh's cluster profile) on free
    ports under ``run_dir`` (not started): 3 replicas of each topic, 2 in sync for acks=all."""
    env = {**os.environ, "TW_STACK": "test", "TW_RUN_DIR": str(run_dir)}
    env["TW_KAFKA_BROKERS"] = str(brokers)
    env["TW_KAFKA_PORTS"] = ",".join(str(free_port()) for _ in range(brokers))
    env["TW_KAFKA_CONTROLLER_PORTS"] = ",".join(str(free_port()) for _ in range(brokers))
    env["TW_KAFKA_REPLICATION_FACTOR"] = str(min(brokers, 3))
    env["TW_KAFKA_MIN_INSYNC_REPLICAS"] = str(min(brokers - 1, 2) or 1)
    env["TW_KAFKA_WIPE"] = "0"
    return Server("kafka", env)


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def private_redis_cluster(run_dir: Path, shards: int = 3, replicas: int = 1) -> Server:
    """A Redis Cluster (infra/redis.sh's cluster profile) of ``shards`` masters with
    ``replicas`` replicas each, on free ports under ``run_dir`` (not started), nothing on
    disk but each node's nodes.conf; ``url`` is the first node's."""
    count = shards * (1 + replicas)
    ports = _free_ports(2 * count)  # client ports, then cluster bus ports
    env = {**os.environ, "TW_STACK": "test", "TW_RUN_DIR": str(run_dir)}
    env["TW_REDIS_SHARDS"] = str(shards)
    env["TW_REDIS_REPLICAS"] = str(replicas)
    env["TW_REDIS_PORTS"] = ",".join(map(str, ports[:count]))
    env["TW_REDIS_BUS_PORTS"] = ",".join(map(str, ports[count:]))
    env["TW_REDIS_PORT"] = str(ports[0])
    env["TW_REDIS_PERSIST"] = "off"
    return Server("redis", env)
