"""The pipeline on a Redis of its own with the project's ACL users (infra/redis-acl.conf)
and TLS only, certificates made now with openssl: every service logs in as its own user
over TLS and an answer streams; wrong or missing credentials are refused; each user holds
only what it needs (the edge cannot SET a claim, the worker cannot write an API key). Then
no log of the run (the services' and Redis's) holds any password, key or the pepper."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, ConnectionError, NoPermissionError

from services.bench import cluster
from services.bench.servers import Server, private_server
from shared.redis_client import RedisAccess
from tests.conftest import ROOT, new_prefix
from tests.integration.certs import make_certs
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack, dashboard_status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "tokenwire-tiny"
USERS = ("tw-edge", "tw-worker", "tw-batcher", "tw-keys", "tw-admin")


@dataclass
class Locked:
    """The ACL+TLS Redis: its URL, CA and the users' password files."""

    server: Server
    url: str
    ca: str
    passwords: Path

    def password(self, user: str) -> str:
        return (self.passwords / f"{user}.password").read_text().strip()

    def access(self, user: str, password: str | None = None) -> RedisAccess:
        return RedisAccess(
            self.url, user, self.password(user) if password is None else password, self.ca
        )

    def login_env(self, user: str) -> dict[str, str]:
        return {
            "TW_REDIS_USERNAME": user,
            "TW_REDIS_PASSWORD_FILE": str(self.passwords / f"{user}.password"),
        }


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Locked]:
    root = tmp_path_factory.mktemp("redis-acl")
    certs = make_certs(root / "certs")
    srv = private_server("redis", root / "run")
    srv.env.update(
        TW_REDIS_ACL="on",
        TW_REDIS_TLS="on",
        TW_REDIS_SERVER_CERT_FILE=str(certs["cert"]),
        TW_REDIS_SERVER_KEY_FILE=str(certs["key"]),
        TW_REDIS_TLS_CA_FILE=str(certs["ca"]),
    )
    srv.start()
    try:
        yield Locked(
            srv,
            f"rediss://127.0.0.1:{srv.env['TW_REDIS_PORT']}/0",
            str(certs["ca"]),
            root / "run" / "redis-acl",
        )
    finally:
        srv.stop()


@pytest.fixture(scope="module")
async def stack(locked: Locked, infra: dict[str, str], model_dir: str) -> AsyncIterator[Stack]:
    """Worker, batcher and edge on the locked Redis, each as its own user, keys required."""
    ARTIFACTS.mkdir(exist_ok=True)
    st = cluster.make_stack(
        new_prefix("acl"),
        {"TW_KAFKA_BOOTSTRAP": infra["TW_KAFKA_BOOTSTRAP"], "TW_REDIS_URL": locked.url},
        model_dir,
        ARTIFACTS,
    )
    st.env.pop("TW_AUTH", None)
    st.env.update(
        TW_REDIS_TLS_CA_FILE=locked.ca,
        TW_KEY_PEPPER=secrets.token_hex(32),
        **locked.login_env("tw-admin"),  # the harness's own reads
    )
    await st.create_topics()
    for kind in ("worker", "batcher", "edge"):
        st.start(kind, **locked.login_env(f"tw-{kind}"))
    try:
        await st.wait_ready(within_s=180)
        yield st
    finally:
        st.stop_all()


async def test_pipeline_streams_with_acl_users_over_tls(locked: Locked, stack: Stack) -> None:
    made = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.cli", "keys", "create", "--tenant", "acme"],
        env={**stack.env, **locked.login_env("tw-keys")},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    client = openai.AsyncOpenAI(base_url=stack.url("edge") + "/v1", api_key=key, max_retries=0)
    stream = await client.completions.create(
        model=MODEL, prompt="The function returns", max_tokens=8, temperature=0, stream=True
    )
    texts = [c.choices[0].text async for c in stream if c.choices]
    whole = await client.completions.create(
        model=MODEL, prompt="The function returns", max_tokens=8, temperature=0
    )
    await client.close()
    bogus = "twk-" + secrets.token_urlsafe(24)  # a refused key must not be logged either
    refused = openai.AsyncOpenAI(base_url=stack.url("edge") + "/v1", api_key=bogus, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await refused.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    await refused.close()
    assert "".join(texts) == whole.choices[0].text and len(whole.choices[0].text) > 0
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    logs = {n: (ARTIFACTS / f"{stack.prefix}-{n}.log").read_text() for n in stack.procs}
    for name, text in logs.items():
        assert "NOPERM" not in text and "NOAUTH" not in text, f"{name}:\n{text[-3000:]}"

    # No secret of this run in any log: the services', the CLI's and Redis's own.
    secrets_used = {key, bogus, stack.env["TW_KEY_PEPPER"], *map(locked.password, USERS)}
    redis_log = Path(locked.server.env["TW_RUN_DIR"]) / "redis" / "redis.log"
    texts_seen = {**logs, "keys cli stderr": made.stderr, "redis": redis_log.read_text()}
    for name, text in texts_seen.items():
        for secret in secrets_used:
            assert secret not in text, f"a secret appears in the {name} log"


async def test_the_dashboard_reads_all_it_shows_as_the_edge_user(stack: Stack) -> None:
    """The edge's heartbeat, and the dashboard's reads (INFO, the last-seen records), are
    within the tw-edge user's ACL."""
    status = await dashboard_status(stack.url("edge"))
    assert status is not None and status["problems"] == []
    assert status["redis"]["used_memory"] > 0
    assert [e["state"] for e in status["edges"]] == ["live"]
    assert [w["state"] for w in status["workers"]] == ["live"]


async def test_wrong_or_missing_credentials_are_refused(locked: Locked) -> None:
    wrong = locked.access("tw-edge", password="not-the-password").client()
    with pytest.raises(AuthenticationError):
        await wrong.ping()
    await wrong.aclose()
    anonymous = RedisAccess(locked.url, ca_file=locked.ca).client()
    with pytest.raises(AuthenticationError):
        await anonymous.ping()
    await anonymous.aclose()
    # Without TLS the port does not answer at all.
    plain = aioredis.Redis.from_url(
        locked.url.replace("rediss://", "redis://"),
        username="tw-edge",
        password=locked.password("tw-edge"),
        socket_timeout=2,
    )
    with pytest.raises(ConnectionError):
        await plain.ping()
    await plain.aclose()


async def test_each_service_user_holds_only_what_it_needs(locked: Locked) -> None:
    edge = locked.access("tw-edge").client()
    worker = locked.access("tw-worker").client()
    keys = locked.access("tw-keys").client()
    try:
        assert await edge.set("tw:owner:r1", "acme")
        with pytest.raises(NoPermissionError):
            await edge.set("tw:claim:r1", "edge")
        with pytest.raises(NoPermissionError):
            await edge.hset("tw:apikeys", "digest", "tenant")
        assert await worker.set("tw:claim:r1", "worker-1")
        with pytest.raises(NoPermissionError):
            await worker.hset("tw:apikeys", "digest", "tenant")
        with pytest.raises(NoPermissionError):
            await worker.set("tw:owner:r1", "someone")
        assert await keys.hset("tw:apikeys", "digest", "tenant") == 1
        with pytest.raises(NoPermissionError):
            await keys.get("tw:claim:r1")
        with pytest.raises(NoPermissionError):
            await edge.flushall()
    finally:
        for c in (edge, worker, keys):
            await c.aclose()
