"""Private Kafka and Redis servers for fault tests: started by the project's own infra
scripts on free ports and in a folder of their own, so a test may stop, kill and restart
them (or one node of a Kafka cluster) without disturbing the session's shared servers (or
other tests using them)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT
from tests.integration.harness import free_port


@dataclass
class Server:
    """One infra-script-managed server (``kind``: ``kafka`` or ``redis``)."""

    kind: str
    env: dict[str, str]

    def _run(self, verb: str, node: int | None = None) -> None:
        subprocess.run(
            ["bash", f"infra/{self.kind}.sh", verb, *([str(node)] if node else [])],
            cwd=ROOT,
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self, node: int | None = None) -> None:
        """Start the server (a Kafka cluster: every node, or ``node``, from 1)."""
        self._run("start", node)

    def stop(self, node: int | None = None) -> None:
        """A clean stop (Redis: SHUTDOWN; Kafka: controlled shutdown)."""
        self._run("stop", node)

    def kill(self, node: int) -> None:
        """kill -9 of one Kafka node: a crash, with no controlled shutdown."""
        self._run("kill", node)

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
