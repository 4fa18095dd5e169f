"""The multi-container deployment file stays valid."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="Debian's docker-compose is installed by infra/test.sh",
)
def test_docker_compose_validates() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_compose_runs_every_service() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    commands = {" ".join(s["command"]) for s in services.values() if "command" in s}
    assert {
        "tokenwire edge",
        "tokenwire batcher",
        "tokenwire worker",
        "tokenwire topics create",
    } <= commands
    assert {"kafka", "redis"} <= services.keys()
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert "gpu" in gpu["capabilities"]
