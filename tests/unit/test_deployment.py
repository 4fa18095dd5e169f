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


def test_dashboard_and_scrape_config_name_only_real_metrics() -> None:
    import json
    import re

    from services.batcher.metrics import BatcherMetrics
    from services.edge.metrics import EdgeMetrics
    from services.worker.metrics import WorkerMetrics

    exposed = set()
    for reg in (WorkerMetrics("w").registry, BatcherMetrics().registry, EdgeMetrics().registry):
        for fam in reg.collect():
            exposed |= {s.name for s in fam.samples} | {fam.name + "_total", fam.name}
    dash = json.loads((ROOT / "infra/grafana/dashboards/tokenwire.json").read_text())
    used = {
        m
        for p in dash["panels"]
        for t in p["targets"]
        for m in re.findall(r"tw_[a-z0-9_]+", t["expr"])
    }
    assert used, "the dashboard queries tokenwire metrics"
    assert used <= exposed, sorted(used - exposed)
    scrape = yaml.safe_load((ROOT / "infra/prometheus/prometheus.yml").read_text())
    assert {j["job_name"] for j in scrape["scrape_configs"]} == {"edge", "batcher", "worker"}
