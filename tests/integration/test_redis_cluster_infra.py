"""infra/redis.sh's Redis Cluster profile, through the script itself: three masters with a
replica each on loopback ports.

- Every slot is served, by exactly one master; each replica follows a master.
- A key written through redis-py's cluster client is read back, and reaches its replica.
- The master serving that key's slot killed with SIGKILL: its replica takes over the
  slots (the script's ``nodes`` verb shows it) within a bounded wait, and the key is
  still readable and writable through the cluster client; the killed node started again
  rejoins as a replica of the new master and copies what was written meanwhile.
- A second ``start`` changes nothing; ``stop`` leaves no redis-server behind.
- With ACLs and TLS on, replicas copy their masters as ``tw-replica`` over TLS, and a
  service's user reaches its keys through the cluster client but cannot change the cluster.
- The scripts of the profile parse, and pass shellcheck where it is installed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoPermissionError

from services.bench.servers import ClusterNode, Server, private_redis_cluster
from tests.conftest import ROOT
from tests.integration.certs import make_certs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SLOTS = 16384
FAILOVER_WAIT_S = 30  # generous: a failover takes the node timeout (2 s) plus an election


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Server]:
    srv = private_redis_cluster(tmp_path / "run", shards=3, replicas=1)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def pids(srv: Server) -> dict[int, str]:
    run = Path(srv.env["TW_RUN_DIR"]) / "redis"
    return {
        int(p.parent.name.split("-")[1]): p.read_text().strip()
        for p in run.glob("node-*/redis.pid")
    }


def redis_servers_on(ports: list[int]) -> list[str]:
    """The command lines of live redis-server processes listening on any of ``ports``
    (redis titles itself "redis-server 127.0.0.1:PORT"; a zombie has no command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(cmd.startswith(f"redis-server 127.0.0.1:{port} ") for port in ports):
            found.append(cmd)
    return found


def check_layout(nodes: list[ClusterNode]) -> tuple[list[ClusterNode], list[ClusterNode]]:
    """Masters and replicas, all up; every slot served by exactly one master."""
    masters = [n for n in nodes if n.role == "master"]
    replicas = [n for n in nodes if n.role == "replica"]
    assert len(masters) == 3 and len(replicas) == 3, nodes
    assert all(n.state == "up" for n in nodes), nodes
    served = sorted(s for m in masters for first, last in m.slots for s in range(first, last + 1))
    assert served == list(range(SLOTS)), "each slot served exactly once"
    assert {r.master for r in replicas} == {m.port for m in masters}, "one replica per master"
    return masters, replicas


async def replica_value(port: int, key: str, within_s: float = 10) -> bytes | None:
    """``key`` as the replica on ``port`` holds it, once it holds anything (READONLY: a
    replica answers reads of its master's slots instead of redirecting them)."""
    r = aioredis.Redis(port=port)
    try:
        await r.execute_command("READONLY")
        for _ in range(int(within_s / 0.05)):
            if (value := await r.get(key)) is not None:
                return value
            await asyncio.sleep(0.05)
        return None
    finally:
        await r.aclose()


def by_port(nodes: list[ClusterNode], port: int) -> ClusterNode:
    return next(n for n in nodes if n.port == port)


async def test_failover_rejoin_restart_and_stop(cluster: Server) -> None:
    masters, _ = check_layout(cluster.nodes())
    key = "tw:log:{req-cluster-infra}"
    slot = key_slot(key.encode())
    owner = next(m for m in masters if m.serves(slot))
    replica = next(n for n in cluster.nodes() if n.master == owner.port)

    rc = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        await rc.set(key, "before")
        assert await rc.get(key) == b"before"
        # Replication is asynchronous: the kill comes once the replica has the key.
        assert await replica_value(replica.port, key) == b"before"

        started = time.monotonic()
        cluster.kill(owner.number)
        while True:
            now = by_port(cluster.nodes(), replica.port)
            if now.role == "master" and now.serves(slot):
                break
            assert time.monotonic() - started < FAILOVER_WAIT_S, cluster.nodes()
            await asyncio.sleep(0.1)
        failover_s = time.monotonic() - started
        print(
            f"failover: the replica serves the killed master's slots {failover_s:.1f} s after the kill"
        )
        assert by_port(cluster.nodes(), owner.port).state in ("suspect", "down")

        assert await rc.get(key) == b"before"
        await rc.set(key, "after")
        assert await rc.get(key) == b"after"
    finally:
        await rc.aclose()

    cluster.start(owner.number)
    back = by_port(cluster.nodes(), owner.port)
    assert (back.role, back.state, back.master, back.slots) == ("replica", "up", replica.port, ())
    # It copied the new master's data, the write made while it was away included.
    assert await replica_value(owner.port, key) == b"after"
    check_layout(cluster.nodes())

    before, layout = pids(cluster), cluster.nodes()
    cluster.start()
    assert pids(cluster) == before and len(before) == 6, "a second start starts nothing"
    assert cluster.nodes() == layout, "and changes nothing in the cluster"

    cluster.stop()
    assert pids(cluster) == {}
    assert redis_servers_on(cluster.ports) == []


async def test_acl_and_tls_cluster(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    srv = private_redis_cluster(tmp_path / "run", shards=3, replicas=1)
    srv.env.update(
        TW_REDIS_ACL="on",
        TW_REDIS_TLS="on",
        TW_REDIS_SERVER_CERT_FILE=str(certs["cert"]),
        TW_REDIS_SERVER_KEY_FILE=str(certs["key"]),
        TW_REDIS_TLS_CA_FILE=str(certs["ca"]),
    )
    passwords = tmp_path / "run" / "redis-acl"
    srv.start()  # returns once every replica has copied its master
    try:
        masters, replicas = check_layout(srv.nodes())
        for n in replicas:
            conf = tmp_path / "run" / "redis" / f"node-{n.number}" / "replication.conf"
            assert conf.stat().st_mode & 0o077 == 0, "the replication password is the owner's"

        def login(user: str, port: int) -> aioredis.Redis:
            password = (passwords / f"{user}.password").read_text().strip()
            return aioredis.Redis(
                port=port, username=user, password=password, ssl=True, ssl_ca_certs=str(certs["ca"])
            )

        admin = login("tw-admin", masters[0].port)
        try:
            clients = await admin.client_list()
            links = [c for c in clients if "S" in c["flags"]]  # its replica's connection
            assert [c["user"] for c in links] == ["tw-replica"], clients
        finally:
            await admin.aclose()

        replica_user = login("tw-replica", masters[0].port)
        try:
            with pytest.raises(NoPermissionError):
                await replica_user.get("tw:apikeys")
        finally:
            await replica_user.aclose()

        worker_password = (passwords / "tw-worker.password").read_text().strip()
        rc = RedisCluster(
            host="127.0.0.1",
            port=srv.ports[0],
            username="tw-worker",
            password=worker_password,
            ssl=True,
            ssl_ca_certs=str(certs["ca"]),
        )
        try:
            keys = [f"tw:log:{{req-{i}}}" for i in range(12)]  # spread over the shards
            assert (
                len({next(m.port for m in masters if m.serves(key_slot(k.encode()))) for k in keys})
                == 3
            )
            for k in keys:
                await rc.set(k, k)
            assert [await rc.get(k) for k in keys] == [k.encode() for k in keys]
        finally:
            await rc.aclose()
        worker = login("tw-worker", masters[0].port)
        try:
            assert len(await worker.execute_command("CLUSTER", "SLOTS")) == 3  # the map: yes
            for change in (("FORGET", "0" * 40), ("ADDSLOTS", "0"), ("FAILOVER",)):
                with pytest.raises(NoPermissionError):
                    await worker.execute_command("CLUSTER", *change)
        finally:
            await worker.aclose()
    finally:
        srv.stop()
    assert redis_servers_on(srv.ports) == []


PROFILE_SCRIPTS = ["infra/env.sh", "infra/redis.sh", "infra/stack.sh"]


def test_infra_scripts_parse() -> None:
    for script in sorted(ROOT.glob("infra/*.sh")):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_profile_scripts_pass_shellcheck() -> None:
    result = subprocess.run(
        ["shellcheck", "--severity=warning", "--external-sources", *PROFILE_SCRIPTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    assert result.returncode == 0, result.stdout
