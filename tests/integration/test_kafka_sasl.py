"""The pipeline on a Kafka broker of its own with SASL_SSL, SCRAM users and ACLs
(infra/kafka.sh with TW_KAFKA_SECURITY=sasl_ssl, infra/kafka-acl.conf), certificates made
now with openssl: every service logs in as its own user over TLS and an answer streams; a
wrong password is refused, and a batcher that has one keeps trying without crashing; a
backend service publishing for a tenant (or a priority) its topic may not carry ends in
the dead-letter topic with the reason, and so does one naming a reply topic it is not
allowed; each user reaches only its own topics, a service only its own completions. The worker
logs in on the broker's mTLS port with a client certificate (its user is the certificate's
CN), and a client without a certificate is refused there while it keeps trying. Then no
log of the run (the services' and the broker's) holds any password."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from services.bench.servers import Server, private_server
from services.ops.dlq import Letter, read_letters
from shared.kafka_io import make_consumer, make_producer
from shared.messages import GenerateRequest, Priority, ReplyTarget, SamplingParams
from shared.producer import Producer
from shared.settings import CommonSettings
from tests.conftest import new_prefix
from tests.integration.certs import client_cert, make_certs
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import Stack, dashboard_status, free_port, make_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "tokenwire-tiny"
# The backend service "billing" may speak for tenant acme, at bulk priority only; "audit"
# for tenant initech. Each may name its own completions topic for replies, no other.
SOURCES = "billing:acme:bulk;audit:initech"
USERS = ("tw-admin", "tw-edge", "tw-batcher", "tw-worker", "tw-svc-billing", "tw-svc-audit")


@dataclass
class Secured:
    """The SASL_SSL broker: where it is, its CA, the users' password files, the prefix
    its ACLs were made for."""

    server: Server
    bootstrap: str
    ca: str
    passwords: Path
    prefix: str
    mtls_bootstrap: str
    certs: Path

    def cert_env(self, user: str | None) -> dict[str, str]:
        """TLS with the client certificate of ``user`` (made now; None: no certificate)
        on the mTLS port, where the certificate's CN is the user."""
        files = client_cert(self.certs, user) if user else {"cert": "", "key": ""}
        return {
            "TW_KAFKA_BOOTSTRAP": self.mtls_bootstrap,
            "TW_KAFKA_SECURITY_PROTOCOL": "SSL",
            "TW_KAFKA_TLS_CA_FILE": self.ca,
            "TW_KAFKA_TLS_CERT_FILE": str(files["cert"]),
            "TW_KAFKA_TLS_KEY_FILE": str(files["key"]),
            "TW_KAFKA_USERNAME": "",
            "TW_KAFKA_PASSWORD_FILE": "",
        }

    def password(self, user: str) -> str:
        return (self.passwords / f"{user}.password").read_text().strip()

    def login_env(self, user: str) -> dict[str, str]:
        return {
            "TW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TW_KAFKA_TLS_CA_FILE": self.ca,
            "TW_KAFKA_USERNAME": user,
            "TW_KAFKA_PASSWORD_FILE": str(self.passwords / f"{user}.password"),
        }

    def settings(self, user: str, **overrides: str) -> CommonSettings:
        env = {"TW_KAFKA_BOOTSTRAP": self.bootstrap, "TW_TOPIC_PREFIX": self.prefix}
        return CommonSettings.from_env({**env, **self.login_env(user)}, **overrides)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("kafka-sasl")
    certs = make_certs(root / "certs", cn="tw-broker")
    prefix = new_prefix("ksasl")
    srv = private_server("kafka", root / "run")
    srv.env.update(
        TW_KAFKA_SECURITY="sasl_ssl",
        TW_KAFKA_SERVER_CERT_FILE=str(certs["cert"]),
        TW_KAFKA_SERVER_KEY_FILE=str(certs["key"]),
        TW_KAFKA_TLS_CA_FILE=str(certs["ca"]),
        TW_TOPIC_PREFIX=prefix,
        TW_REQUEST_SOURCES=SOURCES,
        TW_KAFKA_MTLS_PORT=str(free_port()),
    )
    srv.start()
    mtls = f"127.0.0.1:{srv.env['TW_KAFKA_MTLS_PORT']}"
    passwords = root / "run" / "kafka-acl"
    try:
        yield Secured(srv, srv.url, str(certs["ca"]), passwords, prefix, mtls, root / "certs")
    finally:
        srv.stop()


@pytest.fixture(scope="module")
async def stack(secured: Secured, infra: dict[str, str], model_dir: str) -> AsyncIterator[Stack]:
    """Worker, batcher and edge on the secured broker, each as its own Kafka user: the
    batcher and the edge log in with SCRAM, the worker with its client certificate."""
    ARTIFACTS.mkdir(exist_ok=True)
    st = make_stack(
        secured.prefix,
        {"TW_KAFKA_BOOTSTRAP": secured.bootstrap, "TW_REDIS_URL": infra["TW_REDIS_URL"]},
        model_dir,
        ARTIFACTS,
    )
    st.env.update(TW_REQUEST_SOURCES=SOURCES, **secured.login_env("tw-admin"))
    await st.create_topics()  # as the super user
    st.start("worker", **secured.cert_env("tw-worker"))
    for kind in ("batcher", "edge"):
        st.start(kind, **secured.login_env(f"tw-{kind}"))
    try:
        await st.wait_ready(within_s=180)
        yield st
    finally:
        st.stop_all()


async def test_pipeline_streams_over_sasl_ssl_with_acls(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.url("edge") + "/v1", api_key="-", max_retries=0)
    stream = await client.completions.create(
        model=MODEL, prompt="The function returns", max_tokens=8, temperature=0, stream=True
    )
    texts = [c.choices[0].text async for c in stream if c.choices]
    whole = await client.completions.create(
        model=MODEL, prompt="The function returns", max_tokens=8, temperature=0
    )
    await client.close()
    assert "".join(texts) == whole.choices[0].text and len(whole.choices[0].text) > 0
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    for name in stack.procs:
        log = (ARTIFACTS / f"{stack.prefix}-{name}.log").read_text()
        for refusal in ("AuthorizationFailed", "SaslAuthenticationFailed"):
            assert refusal not in log, f"{name}:\n{log[-3000:]}"


async def test_a_wrong_password_is_refused_and_the_service_keeps_trying(
    secured: Secured, stack: Stack
) -> None:
    wrong = "wrong-" + secrets.token_hex(8)  # must not be logged either
    producer = make_producer(secured.settings("tw-edge", kafka_password=wrong), client_id="t")
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()

    for kind in ("batcher", "edge"):
        env = {"TW_KAFKA_USERNAME": f"tw-{kind}", "TW_KAFKA_PASSWORD": wrong}
        log = await _refused_and_waiting(stack, kind, f"{kind}-wrong", env)
        assert "SaslAuthenticationFailed" in log and wrong not in log


async def _refused_and_waiting(stack: Stack, kind: str, name: str, env: dict[str, str]) -> str:
    """Start a service that Kafka refuses: it says so and keeps trying without crashing,
    and SIGTERM ends its waiting start at once. Returns its log."""
    proc = stack.start(kind, name, **env)
    log_path = ARTIFACTS / f"{stack.prefix}-{name}.log"
    deadline = time.monotonic() + 90
    while "Kafka does not let the" not in log_path.read_text():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        await asyncio.sleep(0.5)
    refused_at = time.monotonic()
    while time.monotonic() - refused_at < 8:  # several retries (backoff from 0.5 s)
        assert proc.poll() is None, log_path.read_text()[-3000:]
        await asyncio.sleep(0.5)
    assert "Traceback" not in log_path.read_text() and "trying again" in log_path.read_text()
    # A kill after 20 s would be -9; uvicorn ends the edge by the signal it caught, as
    # after serving.
    ended_by = 0 if kind == "batcher" else -signal.SIGTERM
    assert stack.stop(name) == ended_by, log_path.read_text()[-3000:]
    return log_path.read_text()


async def test_a_client_certificate_logs_in_as_its_cn(secured: Secured) -> None:
    """On the mTLS port a client's user is its certificate's CN: tw-worker's reads the
    batches topic (as the worker of the stack does), tw-edge's is refused it."""
    prefix = {"TW_TOPIC_PREFIX": secured.prefix}
    worker = CommonSettings.from_env({**secured.cert_env("tw-worker"), **prefix})
    edge = CommonSettings.from_env({**secured.cert_env("tw-edge"), **prefix})
    consumer = make_consumer(worker, worker.names.batches, group_id=None, client_id="t")
    try:
        await consumer.start()
        await consumer.getmany(timeout_ms=2000)
        assert consumer.assignment(), "tw-worker's certificate got no batches partition"
    finally:
        await consumer.stop()
    consumer = make_consumer(edge, edge.names.batches, group_id=None, client_id="t")
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await consumer.start()
            await consumer.getmany(timeout_ms=5000)
    finally:
        await consumer.stop()


async def test_a_client_without_a_certificate_is_refused_and_waits(
    secured: Secured, stack: Stack
) -> None:
    """The mTLS port refuses a TLS client that presents no certificate: the handshake
    fails (aiokafka sees a closed connection), the service's line says which login it
    tried, and it waits for a certificate rather than exiting."""
    bare = CommonSettings.from_env({**secured.cert_env(None), "TW_TOPIC_PREFIX": secured.prefix})
    producer = make_producer(bare, client_id="t")
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()

    log = await _refused_and_waiting(stack, "batcher", "batcher-nocert", secured.cert_env(None))
    assert "login: SSL without a client certificate" in log, log[-3000:]


def _request(tenant: str, priority: Priority, reply_topic: str | None = None) -> GenerateRequest:
    return GenerateRequest(
        prompt="The function returns",
        tenant=tenant,
        priority=priority,
        sampling=SamplingParams(max_tokens=4, temperature=0),
        reply=ReplyTarget(kafka_topic=reply_topic),
    )


async def _letters_for(settings: CommonSettings, rids: set[str], within_s: float) -> list[Letter]:
    deadline = time.monotonic() + within_s
    while True:
        found = [
            x for x in await read_letters(settings) if x.letter and x.letter.request_id in rids
        ]
        if {x.letter.request_id for x in found if x.letter} == rids or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def test_a_service_publishing_for_another_tenant_ends_in_the_dlq(
    secured: Secured, stack: Stack
) -> None:
    billing = secured.settings("tw-svc-billing", request_source="billing")

    async with Producer(billing, client_id="billing") as p:
        served = await p.submit(_request("acme", Priority.BULK))
        other_tenant = await p.submit(_request("globex", Priority.BULK))
        interactive = await p.submit(_request("acme", Priority.INTERACTIVE))
        done = [c async for c in p.completions({served}, timeout_s=90)]
    assert [(c.tenant, c.error) for c in done] == [("acme", None)] and done[0].text

    letters = await _letters_for(secured.settings("tw-admin"), {other_tenant, interactive}, 60)
    by_rid = {x.letter.request_id: x.letter for x in letters if x.letter}
    assert set(by_rid) == {other_tenant, interactive}, "refused requests not dead-lettered"
    assert by_rid[other_tenant].reason == "tenant_not_allowed"
    assert "globex" in by_rid[other_tenant].detail
    assert by_rid[interactive].reason == "priority_not_allowed"
    assert {d.topic for d in by_rid.values()} == {stack.names.requests_from("billing")}

    # Its user cannot write the edge's topic, which speaks for any tenant.
    producer = make_producer(billing, client_id="billing-direct")
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(stack.names.requests, b"{}")
    finally:
        await producer.stop()


async def test_a_reply_topic_the_service_may_not_name_ends_in_the_dlq(
    secured: Secured, stack: Stack
) -> None:
    """billing may have its replies written to its own completions topic only: a request
    naming audit's, or the shared one, is dead-lettered with the reason (the worker never
    sees it), and the batcher serves on."""
    billing = secured.settings("tw-svc-billing", request_source="billing")
    names = stack.names
    async with Producer(billing, client_id="billing") as p:
        others = {
            await p.submit(_request("acme", Priority.BULK, topic)): topic
            for topic in (names.completions_to("audit"), names.completions)
        }
        own = await p.submit(_request("acme", Priority.BULK, names.completions_to("billing")))
        done = [c async for c in p.completions({own}, timeout_s=90)]
    assert [(c.request_id, c.error) for c in done] == [(own, None)] and done[0].text

    letters = await _letters_for(secured.settings("tw-admin"), set(others), 60)
    by_rid = {x.letter.request_id: x.letter for x in letters if x.letter}
    assert set(by_rid) == set(others), "requests naming another's reply topic not dead-lettered"
    for rid, topic in others.items():
        assert by_rid[rid].reason == "reply_topic_not_allowed"
        assert repr(topic) in by_rid[rid].detail and "'billing'" in by_rid[rid].detail
    assert stack.procs["batcher"].poll() is None


@pytest.mark.parametrize(
    ("user", "topic"),
    [
        ("tw-edge", "batches"),
        ("tw-edge", "requests"),
        ("tw-worker", "requests"),
        ("tw-svc-billing", "batches"),
        # A service reads only its own completions (billing's, in the tests above): not
        # audit's, nor the shared topic.
        ("tw-svc-billing", "completions.to-audit"),
        ("tw-svc-billing", "completions"),
    ],
)
async def test_each_user_reads_only_its_own_topics(
    secured: Secured, stack: Stack, user: str, topic: str
) -> None:
    settings = secured.settings(user)
    name = f"{stack.prefix}.{topic}"
    consumer = make_consumer(settings, name, group_id=None, client_id="t")
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await consumer.start()
            await consumer.getmany(timeout_ms=5000)
    finally:
        await consumer.stop()


async def test_the_dashboard_reads_the_lags_as_the_edge_user(stack: Stack) -> None:
    """The edge's dashboard reads topics, end offsets and group offsets (the lags) within
    the tw-edge user's ACLs."""
    status = await dashboard_status(stack.url("edge"))
    assert status is not None and status["problems"] == []
    assert set(status["consumer_lag"]) == {stack.names.batcher_group, stack.names.worker_group}
    assert status["dlq"]["topic"] == stack.names.requests_dlq


def test_no_password_in_any_log(secured: Secured, stack: Stack) -> None:
    """After the tests above: the services' logs and the broker's hold no password (the
    broker's server.properties, 0600, holds its inter-broker one by design)."""
    kafka_logs = Path(secured.server.env["TW_RUN_DIR"]) / "kafka" / "logs"
    texts = {p.name: p.read_text(errors="replace") for p in kafka_logs.rglob("*") if p.is_file()}
    for name in [*stack.procs, "batcher-wrong", "batcher-nocert"]:
        path = ARTIFACTS / f"{stack.prefix}-{name}.log"
        texts[name] = path.read_text()
    for user in USERS:
        for name, text in texts.items():
            assert secured.password(user) not in text, f"{user}'s password in the {name} log"
