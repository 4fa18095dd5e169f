"""The deployment stays valid: the compose file, the Redis settings of every stack, and the
supervisor that restarts the services of `infra/stack.sh`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def test_the_tested_versions_pin_every_dependency_within_its_range() -> None:
    # infra/constraints.txt holds what CI passed with; a range changed in pyproject.toml
    # without `TW_RELOCK=1 infra/bootstrap.sh` would fail the install, or leave a package
    # unpinned for a fresh machine to resolve to whatever was published since.
    from packaging.requirements import Requirement

    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "infra/constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    pins = {_pypi_name(name): version for name, version in pins.items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    wanted = [
        *project["project"]["dependencies"],
        *extras["dev"],
        *extras["cpu"],
        *project["tool"]["tokenwire"]["no-deps"],
    ]
    for spec in wanted:
        req = Requirement(spec)
        version = pins.get(_pypi_name(req.name))
        assert version is not None, f"{req.name} has no tested version"
        assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version}"


def _pypi_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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


def _base_env() -> dict[str, str]:
    """This environment without tokenwire settings: the scripts' own defaults apply."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TW_")}


def _redis_config(**env: str) -> dict[str, str]:
    """The settings ``infra/redis.sh start`` writes for a stack with ``env``."""
    result = subprocess.run(
        ["bash", "infra/redis.sh", "config"],
        cwd=ROOT,
        env={**_base_env(), "TW_RUN_DIR": "/nonexistent/run", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    pairs = (line.split(" ", 1) for line in result.stdout.splitlines() if line[:1] not in ("", "#"))
    return {k: v for k, v in pairs}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_demo_redis_is_durable_and_never_evicts() -> None:
    conf = _redis_config(TW_STACK="demo")
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"
    assert conf["save"] == '""'
    assert conf["maxmemory"] == "1gb"
    # Every tokenwire key that matters carries a TTL: volatile-* would evict them.
    assert conf["maxmemory-policy"] == "noeviction"
    assert not os.path.exists("/nonexistent/run"), "printing the config creates nothing"


def test_test_redis_is_capped_without_persistence() -> None:
    conf = _redis_config(TW_STACK="test")
    assert conf["appendonly"] == "no"
    assert "appendfsync" not in conf
    assert conf["maxmemory"] == "1gb"
    assert conf["maxmemory-policy"] == "noeviction"
    conf = _redis_config(TW_STACK="test", TW_REDIS_PERSIST="aof", TW_REDIS_MAXMEMORY="64mb")
    assert (conf["appendonly"], conf["appendfsync"], conf["maxmemory"]) == (
        "yes",
        "everysec",
        "64mb",
    )


def test_unknown_redis_persistence_mode_is_refused() -> None:
    result = subprocess.run(
        ["bash", "infra/redis.sh", "config"],
        cwd=ROOT,
        env={**_base_env(), "TW_STACK": "demo", "TW_REDIS_PERSIST": "yes"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "TW_REDIS_PERSIST" in result.stderr


def test_compose_redis_is_durable_and_never_evicts() -> None:
    command = _compose()["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--appendonly"] == "yes"
    assert flags["--appendfsync"] == "everysec"
    assert flags["--save"] == ""
    assert flags["--maxmemory-policy"] == "noeviction"
    # ${TW_REDIS_MAXMEMORY:-1gb}: the same setting and default as infra/redis.sh.
    default = re.fullmatch(r"\$\{TW_REDIS_MAXMEMORY:-(\w+)\}", flags["--maxmemory"])
    assert default is not None and default.group(1) == "1gb"


def test_compose_restarts_every_long_running_service() -> None:
    services = _compose()["services"]
    # init creates the topics, pepper the API-key pepper; the others wait for both to succeed
    one_shot = {"init", "pepper"}
    assert one_shot <= services.keys()
    for name, svc in services.items():
        if name in one_shot:
            assert svc.get("restart") == "no", name
        else:
            policy = str(svc.get("restart", "no"))
            assert policy in {"unless-stopped", "always"} or policy.startswith("on-failure"), name


# --- the stack's supervisor (infra/stack.sh supervise), around a stand-in service -----------

FAKE_SERVICE = """#!/usr/bin/env bash
# Stands in for `tokenwire NAME`: says it started, runs FAKE_RUN_S, exits FAKE_RC.
echo "started $1 $$" >&2
sleep "${FAKE_RUN_S:-0.05}"
exit "${FAKE_RC:-3}"
"""


@dataclass
class Supervised:
    run_dir: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> Path:
        return self.run_dir / "logs" / "batcher.log"

    def pid(self, which: str) -> int | None:
        try:
            return int((self.run_dir / "pids" / f"batcher{which}.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def restarts(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        docs = [json.loads(line) for line in lines if line.startswith("{")]
        return [d for d in docs if d["logger"] == "supervisor" and "restart" in d]

    def starts(self) -> int:
        return self.log.read_text().count("started batcher")

    def wait_for(self, cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.02)


def _alive(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, TypeError):
        return False


@contextlib.contextmanager
def _supervisor(tmp_path: Path, **env: str) -> Iterator[Supervised]:
    """``stack.sh supervise batcher`` running the stand-in; every process it started is
    killed at the end (they share its new process group)."""
    fake = tmp_path / "tokenwire"
    fake.write_text(FAKE_SERVICE)
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    full_env = {
        **_base_env(),
        "TW_STACK": "unit",
        "TW_RUN_DIR": str(run_dir),
        "TW_BIN": str(fake),
        "TW_MODEL_DIR": str(tmp_path),
        # Ports of nothing: `down` below must never reach a real stack's servers.
        "TW_KAFKA_PORT": "1",
        "TW_KAFKA_CONTROLLER_PORT": "2",
        "TW_REDIS_PORT": "3",
        "TW_EDGE_PORT": "4",
        "TW_RESTART_MIN_S": "0.1",
        "TW_RESTART_MAX_S": "0.4",
        **env,
    }
    with (run_dir / "logs" / "batcher.log").open("ab") as log:
        proc = subprocess.Popen(
            ["bash", "infra/stack.sh", "supervise", "batcher"],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Supervised(run_dir, full_env, proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_supervisor_restarts_with_capped_exponential_backoff(tmp_path: Path) -> None:
    with _supervisor(tmp_path) as sup:
        sup.wait_for(lambda: len(sup.restarts()) >= 5)
        os.kill(sup.proc.pid, signal.SIGTERM)
        assert sup.proc.wait(timeout=5) == 0
        restarts = sup.restarts()
        assert [r["delay_s"] for r in restarts[:5]] == [0.1, 0.2, 0.4, 0.4, 0.4]
        assert [r["restart"] for r in restarts] == list(range(1, len(restarts) + 1))
        assert {r["exit_code"] for r in restarts} == {3}
        assert "batcher exited with code 3" in restarts[0]["msg"]
        assert (sup.run_dir / "pids" / "batcher.restarts").read_text().split()[0] == str(
            len(restarts)
        )
        starts = sup.starts()
        time.sleep(0.6)  # longer than the largest delay: a stopped supervisor starts nothing
        assert sup.starts() == starts
        assert sup.pid(".supervisor") is None


def test_supervisor_resets_the_delay_after_a_long_run(tmp_path: Path) -> None:
    with _supervisor(tmp_path, FAKE_RUN_S="0.3", TW_RESTART_RESET_S="0.25") as sup:
        sup.wait_for(lambda: len(sup.restarts()) >= 3)
        assert [r["delay_s"] for r in sup.restarts()[:3]] == [0.1, 0.1, 0.1]


def test_signal_exits_are_named(tmp_path: Path) -> None:
    with _supervisor(tmp_path, FAKE_RUN_S="30") as sup:
        sup.wait_for(lambda: _alive(sup.pid("")))
        first = sup.pid("")
        assert first is not None
        os.kill(first, signal.SIGKILL)
        sup.wait_for(lambda: sup.pid("") not in (None, first) and _alive(sup.pid("")))
        (restart,) = sup.restarts()
        assert restart["exit_code"] == 137
        assert "SIGKILL" in restart["msg"]
        assert "Killed" not in sup.log.read_text(), "no shell job notice in the JSON log"
        status = subprocess.run(
            ["bash", "infra/stack.sh", "status"],
            cwd=ROOT,
            env=sup.env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        assert f"batcher: running (pid {sup.pid('')}, supervisor pid {sup.proc.pid}" in status
        assert "restarts: 1, last exit 137" in status


def test_down_stops_the_supervisor_before_the_service(tmp_path: Path) -> None:
    with _supervisor(tmp_path, FAKE_RUN_S="30") as sup:
        sup.wait_for(lambda: _alive(sup.pid("")) and _alive(sup.pid(".supervisor")))
        service = sup.pid("")
        subprocess.run(
            ["bash", "infra/stack.sh", "down"], cwd=ROOT, env=sup.env, check=True, timeout=30
        )
        assert sup.proc.wait(timeout=5) == 0
        assert not _alive(service)
        assert sup.restarts() == [], "nothing restarted while the stack went down"
        assert sup.starts() == 1
        assert not list((sup.run_dir / "pids").glob("*.pid"))


def test_supervisor_adopts_a_service_it_did_not_start(tmp_path: Path) -> None:
    # A process whose last argument is the service's name, as `tokenwire batcher` has;
    # "; :" keeps bash from exec-ing sleep in its place.
    orphan = subprocess.Popen(
        ["bash", "-c", "sleep 30; :", "bash", "batcher"], start_new_session=True
    )
    try:
        (tmp_path / "run" / "pids").mkdir(parents=True)
        (tmp_path / "run" / "pids" / "batcher.pid").write_text(f"{orphan.pid}\n")
        with _supervisor(tmp_path, FAKE_RUN_S="30") as sup:
            sup.wait_for(lambda: "already running" in sup.log.read_text())
            assert sup.starts() == 0
            os.killpg(orphan.pid, signal.SIGKILL)
            orphan.wait()
            sup.wait_for(lambda: sup.starts() == 1)
            (restart,) = sup.restarts()
            assert restart["exit_code"] is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(orphan.pid, signal.SIGKILL)
        orphan.wait()


def test_a_stale_pid_file_naming_another_process_is_ignored(tmp_path: Path) -> None:
    # After a reboot a pid file may name an unrelated process: neither adopted nor killed.
    (tmp_path / "run" / "pids").mkdir(parents=True)
    (tmp_path / "run" / "pids" / "batcher.pid").write_text(f"{os.getpid()}\n")
    with _supervisor(tmp_path, FAKE_RUN_S="30") as sup:
        sup.wait_for(lambda: sup.starts() == 1)
        assert "already running" not in sup.log.read_text()
        assert sup.pid("") != os.getpid()
