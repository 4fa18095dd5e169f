"""API keys on a stack started with the edge's defaults (keys required): the openai client
without a key, keys made and revoked with ``tokenwire keys`` (a revoked key refused by a
second edge within a second), each key's policy (priorities, models, rate, expiry), and
tenants kept apart over HTTP and the WebSocket."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import orjson
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from services.bench import cluster
from services.edge.auth import KeyStore
from shared.messages import Priority
from shared.model_config import folder_context
from tests.conftest import ROOT, new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "tokenwire-tiny"
BODY = {"model": MODEL, "prompt": "The function", "max_tokens": 3, "temperature": 0}


@dataclass
class Secure:
    stack: Stack
    redis: aioredis.Redis
    store: KeyStore
    pepper: str

    def url(self, edge: str) -> str:
        return self.stack.url(edge)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``tokenwire keys …`` with the stack's settings."""
        return subprocess.run(
            [sys.executable, "-m", "services.cli", "keys", *args],
            env=self.stack.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(scope="module")
async def secure(infra: dict[str, str], model_dir: str) -> AsyncIterator[Secure]:
    """A worker, a batcher and edges ``a``, ``b`` (4 KiB bodies) and ``bare`` (no model
    folder), all with default settings but those and the pepper: keys are required."""
    ARTIFACTS.mkdir(exist_ok=True)
    st = cluster.make_stack(new_prefix("keys"), infra, model_dir, ARTIFACTS)
    pepper = secrets.token_hex(32)
    st.env["TW_KEY_PEPPER"] = pepper
    st.env.pop("TW_AUTH", None)  # the default: keys required
    await st.create_topics()
    st.start("worker")
    st.start("batcher")
    st.start("edge", name="a")
    st.start("edge", name="b", TW_MAX_BODY_BYTES="4096")
    st.start("edge", name="bare", TW_MODEL_DIR="")  # knows the context from heartbeats only
    client = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
    store = KeyStore(client, st.names, {}, required=True, pepper=pepper.encode())
    try:
        await st.wait_ready(within_s=180)  # four edges start at once on a busy machine
        yield Secure(st, client, store, pepper)
    finally:
        st.stop_all()
        await client.aclose()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_openai_client_needs_a_key(secure: Secure) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(secure.url("a") + "/v1/completions", json=BODY)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.AsyncOpenAI(base_url=secure.url("a") + "/v1", api_key="twk-x", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.models.list()
    key, _ = await secure.store.create("acme")
    client = openai.AsyncOpenAI(base_url=secure.url("a") + "/v1", api_key=key, max_retries=0)
    done = await client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None and done.usage.completion_tokens == 2
    assert await secure.redis.get(secure.stack.names.owner(done.id)) == b"acme"
    for c in (wrong, client):
        await c.close()


async def test_cli_creates_lists_and_revokes_on_every_edge_within_a_second(
    secure: Secure,
) -> None:
    made = secure.cli("create", "--tenant", "cli-tenant", "--rpm", "100", "--expires", "1d")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("twk-") and "shown only now" in made.stderr
    key_id = made.stderr.split()[1]
    listed = secure.cli("list", "--tenant", "cli-tenant")
    assert listed.returncode == 0 and key_id in listed.stdout and "rpm=100" in listed.stdout
    assert key not in listed.stdout + listed.stderr
    # Only the peppered digest is stored: neither the key nor its plain SHA-256.
    stored = await secure.redis.hgetall(secure.stack.names.api_keys)
    assert all(key.encode() not in k + v for k, v in stored.items())
    async with httpx.AsyncClient(timeout=30) as http:
        for edge in ("a", "b"):
            r = await http.post(secure.url(edge) + "/v1/completions", json=BODY, headers=auth(key))
            assert r.status_code == 200, r.text
        gone = secure.cli("revoke", key_id)
        assert gone.returncode == 0, gone.stderr
        revoked_at = time.monotonic()
        while True:
            r = await http.post(secure.url("b") + "/v1/completions", json=BODY, headers=auth(key))
            if r.status_code == 401:
                break
            assert r.status_code == 200
        print(f"revoked key refused by edge b {time.monotonic() - revoked_at:.3f} s after")
        assert time.monotonic() - revoked_at < 1.0
    assert secure.cli("revoke", key_id).returncode == 1


async def test_a_keys_policy_is_enforced(secure: Secure) -> None:
    bulk_only, _ = await secure.store.create("acme", priorities=[Priority.BULK])
    other_model, _ = await secure.store.create("acme", models=["another-model"])
    expired, _ = await secure.store.create("acme", expires_at=time.time() - 1)
    one_per_min, _ = await secure.store.create("acme", requests_per_min=1)
    url = secure.url("a") + "/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key=bulk_only, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert "interactive" in str(denied.value)
    done = await client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=2, extra_body={"priority": "bulk", "ignore_eos": True}
    )
    assert done.choices[0].finish_reason == "length"
    await client.close()
    client = openai.AsyncOpenAI(base_url=url, api_key=other_model, max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert missing.value.code == "model_not_found"
    await client.close()
    client = openai.AsyncOpenAI(base_url=url, api_key=expired, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="expired"):
        await client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    await client.close()
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.post(url + "/completions", json=BODY, headers=auth(one_per_min))
        second = await http.post(url + "/completions", json=BODY, headers=auth(one_per_min))
    assert first.status_code == 200, first.text
    assert second.status_code == 429 and int(second.headers["retry-after"]) > 1


async def test_another_tenant_cannot_follow_resume_or_cancel(secure: Secure) -> None:
    a_key, _ = await secure.store.create("tenant-a")
    b_key, _ = await secure.store.create("tenant-b")
    long = {**BODY, "max_tokens": 400, "ignore_eos": True, "resumable": True}
    async with httpx.AsyncClient(base_url=secure.url("a"), timeout=30) as http:
        async with http.stream("POST", "/v1/completions", json=long, headers=auth(a_key)) as r:
            rid = r.headers["x-request-id"]
            for path in (f"/v1/requests/{rid}/stream",):
                assert (await http.get(path, headers=auth(b_key))).status_code == 404
            cancel = await http.post(f"/v1/requests/{rid}/cancel", headers=auth(b_key))
            assert cancel.status_code == 404
            ws_url = secure.url("b").replace("http://", "ws://") + "/v1/ws"
            async with ws_connect(ws_url, additional_headers=auth(b_key)) as ws:
                for msg in (
                    {"type": "resume", "request_id": rid, "last_event_id": -1},
                    {"type": "cancel", "request_id": rid},
                ):
                    await ws.send(orjson.dumps(msg))
                    frame = orjson.loads(await ws.recv())
                    assert (frame["type"], frame["status"]) == ("error", 404), frame
            # The owner can: cancel over the WebSocket of the other edge.
            async with ws_connect(ws_url, additional_headers=auth(a_key)) as ws:
                await ws.send(orjson.dumps({"type": "cancel", "request_id": rid}))
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
                assert frame["type"] == "cancelled", frame


async def test_websocket_messages_have_the_http_body_limit(secure: Secure) -> None:
    key, _ = await secure.store.create("acme")
    big = {**BODY, "prompt": "x" * 5000}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(secure.url("b") + "/v1/completions", json=big, headers=auth(key))
    assert r.status_code == 413, r.text
    url = secure.url("b").replace("http://", "ws://") + "/v1/ws"
    async with ws_connect(url, additional_headers=auth(key)) as ws:
        await ws.send(orjson.dumps({"type": "completions", "body": BODY}))
        assert orjson.loads(await ws.recv())["type"] == "request"
        await ws.send(orjson.dumps({"type": "completions", "body": big}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_an_edge_without_the_model_folder_checks_the_context(
    secure: Secure, model_dir: str
) -> None:
    context = folder_context(model_dir)
    assert context is not None
    key, _ = await secure.store.create("acme")
    url = secure.url("bare") + "/v1/completions"
    async with httpx.AsyncClient(timeout=30) as http:
        too_many = await http.post(url, json={**BODY, "max_tokens": context + 1}, headers=auth(key))
        assert too_many.status_code == 400, too_many.text
        assert too_many.json()["error"]["param"] == "max_tokens"
        long = {**BODY, "prompt": "word " * context}  # estimated: more than the context
        too_long = await http.post(url, json=long, headers=auth(key))
        assert too_long.status_code == 400, too_long.text
        assert too_long.json()["error"]["code"] == "context_length_exceeded"
        fits = await http.post(url, json=BODY, headers=auth(key))
        assert fits.status_code == 200, fits.text


async def test_schemathesis_without_a_key_finds_no_server_errors(secure: Secure) -> None:
    """Every operation, called without a key on an edge that requires one: no 5xx."""
    args = [
        "run",
        f"{secure.url('a')}/openapi.json",
        "--checks=not_a_server_error",
        "--max-examples=10",
        "--seed=7",
        "--workers=1",
        "--phases=examples,fuzzing",
        "--request-timeout=20",
        "--suppress-health-check=all",
        "--generation-database=none",
        "--no-color",
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(ROOT / ".venv/bin/schemathesis"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ARTIFACTS,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    report = out.decode(errors="replace")
    (ARTIFACTS / "edge-schemathesis-no-key.txt").write_text(report)
    assert proc.returncode == 0, report[-8000:]
