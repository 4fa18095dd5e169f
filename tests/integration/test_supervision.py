"""`infra/stack.sh` keeps a stack's services running: a whole stack of its own (Kafka,
Redis, worker, batcher, edge) on free ports, in a folder of its own and on a topic prefix
of its own, brought up and down by the script itself, so the session's shared servers are
never touched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, new_prefix
from tests.integration.harness import free_port

pytestmark = pytest.mark.integration

SERVICES = ("worker", "batcher", "edge")


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan waits for PID 1 to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _started_by(run_dir: Path) -> list[int]:
    """Every live process started for the stack in ``run_dir``: all of them, the JVM and
    redis-server included, inherit its TW_RUN_DIR."""
    mark = f"TW_RUN_DIR={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class OwnStack:
    def __init__(self, run_dir: Path, model_dir: str) -> None:
        self.run_dir = run_dir
        self.edge_port = free_port()
        self.redis_port = free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TW_")},
            "TW_STACK": "test",
            "TW_RUN_DIR": str(run_dir),
            "TW_KAFKA_PORT": str(free_port()),
            "TW_KAFKA_CONTROLLER_PORT": str(free_port()),
            "TW_REDIS_PORT": str(self.redis_port),
            "TW_EDGE_PORT": str(self.edge_port),
            "TW_TOPIC_PREFIX": new_prefix("sup"),
            "TW_MODEL_DIR": model_dir,
            # The demo's durable Redis, so its generated configuration is proven to load.
            "TW_REDIS_PERSIST": "aof",
        }

    def script(self, *args: str, timeout_s: float = 120, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            ["bash", "infra/stack.sh", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        assert result.returncode == 0, f"stack.sh {args}: {result.stdout}\n{result.stderr}"
        return result.stdout

    def pid(self, name: str) -> int:
        """From the pid file; 0 while there is none (a service between two runs)."""
        try:
            return int((self.run_dir / "pids" / f"{name}.pid").read_text())
        except FileNotFoundError:
            return 0

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / f"{name}.log").read_text(errors="replace")


@pytest.fixture
def own_stack(tmp_path: Path, model_dir: str) -> Iterator[OwnStack]:
    st = OwnStack(tmp_path / "run", model_dir)
    try:
        yield st
    finally:
        # Whatever the test got to: the script's own `down` on this stack's ports, then
        # anything of this stack still alive is killed, so a failure leaks nothing.
        subprocess.run(
            ["bash", "infra/stack.sh", "down"],
            cwd=ROOT,
            env=st.env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        for pid in _started_by(st.run_dir):
            os.kill(pid, signal.SIGKILL)


def _complete(port: int, prompt: str, key: str) -> str:
    """A completion's text; ``key`` empty: no key sent."""
    body = json.dumps({"model": "tokenwire-tiny", "prompt": prompt, "max_tokens": 4}).encode()
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers=headers
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["choices"][0]["text"])


def test_a_killed_service_is_restarted_and_down_leaves_nothing(own_stack: OwnStack) -> None:
    st = own_stack
    st.script("up")

    r = redis.Redis(port=st.redis_port)
    try:
        conf = {k: r.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy")}
        assert conf == {
            "appendonly": "yes",
            "appendfsync": "everysec",
            "maxmemory-policy": "noeviction",
        }
        assert r.config_get("maxmemory")["maxmemory"] == str(1024**3)
    finally:
        r.close()

    before = {s: st.pid(s) for s in SERVICES}
    supervisors = {s: st.pid(f"{s}.supervisor") for s in SERVICES}
    os.kill(before["batcher"], signal.SIGKILL)
    _wait_for(
        lambda: st.pid("batcher") not in (0, before["batcher"]) and _alive(st.pid("batcher")),
        timeout_s=15,
        what="the batcher's restart",
    )
    lines = [json.loads(x) for x in st.log("batcher").splitlines() if '"supervisor"' in x]
    (restart,) = [x for x in lines if "restart" in x]
    assert restart["exit_code"] == 137
    assert restart["delay_s"] == 1
    assert "batcher exited with code 137 (SIGKILL)" in restart["msg"]
    assert {s: st.pid(s) for s in ("worker", "edge")} == {s: before[s] for s in ("worker", "edge")}
    status = st.script("status")
    assert f"batcher: running (pid {st.pid('batcher')}" in status
    assert "restarts: 1, last exit 137" in status

    # The new batcher serves: a request goes through it to the worker and back.
    # Keys are required (the default); `up` made the stack's development key.
    key = (st.run_dir / "dev-api-key").read_text().strip()
    assert _complete(st.edge_port, "The function returns", key)

    # `up` again changes nothing: one supervisor per service, the same processes (the
    # profile's counts, given or read from the run folder, are not settings of theirs).
    st.script("up", "--brokers", "1", "--redis-cluster", "1")
    st.script("up")
    assert {s: st.pid(f"{s}.supervisor") for s in SERVICES} == supervisors

    # `up` with other settings restarts the services under them, and says why: the demo
    # (TW_AUTH=off) run on a stack already up with keys required answered its own sample
    # question 401, after printing "keys are off".
    running = {s: st.pid(s) for s in SERVICES}
    out = st.script("up", env={"TW_AUTH": "off"})
    for s in SERVICES:
        assert f"{s}: restarting, its settings changed since it started (TW_AUTH)" in out
        assert st.pid(s) not in (0, running[s])
    assert _complete(st.edge_port, "The function returns", key="")
    supervisors = {s: st.pid(f"{s}.supervisor") for s in SERVICES}

    ours = _started_by(st.run_dir)
    assert len(ours) >= 8  # Kafka, Redis, three supervisors, three services
    st.script("down")
    assert [pid for pid in ours if _alive(pid)] == []
    assert _started_by(st.run_dir) == []
    assert not list((st.run_dir / "pids").glob("*.pid"))
    assert all(not _alive(pid) for pid in supervisors.values())
    # Nothing was restarted while the stack went down.
    for s in SERVICES:
        assert st.log(s).count('"logger":"supervisor"') == (1 if s == "batcher" else 0), s


def test_the_stack_runs_on_the_secured_broker(own_stack: OwnStack) -> None:
    """TW_KAFKA_SECURITY=sasl_ssl: the script makes the broker's CA and certificate, the
    broker speaks SASL_SSL only with per-service ACLs, and each service logs in as its own
    user: an answer comes back, status finds everything up, no service was refused."""
    st = own_stack
    st.env["TW_KAFKA_SECURITY"] = "sasl_ssl"
    st.script("up", timeout_s=300)
    assert (st.run_dir / "kafka-tls" / "ca.crt").is_file()
    key = (st.run_dir / "dev-api-key").read_text().strip()
    _complete(st.edge_port, "The function returns", key)
    assert "kafka: not answering" not in st.script("status")
    for name in SERVICES:
        environ = Path(f"/proc/{st.pid(name)}/environ").read_bytes().split(b"\0")
        assert f"TW_KAFKA_USERNAME=tw-{name}".encode() in environ
        assert b"TW_KAFKA_SECURITY_PROTOCOL=SASL_SSL" in environ
        log = st.log(name)
        for refusal in ("AuthorizationFailed", "SaslAuthenticationFailed", "does not let"):
            assert refusal not in log, f"{name}:\n{log[-3000:]}"
