"""Private Kafka and Redis servers for fault tests: started by the project's own infra
scripts on free ports and in a folder of their own, so a test may stop, kill and restart
them without disturbing the session's shared servers (or other tests using them)."""

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

    def _run(self, verb: str) -> None:
        subprocess.run(
            ["bash", f"infra/{self.kind}.sh", verb],
            cwd=ROOT,
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> None:
        self._run("start")

    def stop(self) -> None:
        """A clean stop (Redis: SHUTDOWN; Kafka: controlled shutdown)."""
        self._run("stop")

    @property
    def url(self) -> str:
        if self.kind == "redis":
            return f"redis://127.0.0.1:{self.env['TW_REDIS_PORT']}/0"
        return f"127.0.0.1:{self.env['TW_KAFKA_PORT']}"


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
    return Server(kind, env)
