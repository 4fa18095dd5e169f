from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.bench.servers import Server, private_kafka_cluster, private_server
from tests.conftest import new_prefix
from tests.integration.harness import Stack, make_stack

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="module")
async def stack(
    infra: dict[str, str], model_dir: str, request: pytest.FixtureRequest
) -> AsyncIterator[Stack]:
    """One worker, batcher and edge on a fresh topic prefix, shared by a test module."""
    ARTIFACTS.mkdir(exist_ok=True)
    st = make_stack(
        new_prefix(request.module.__name__.rsplit(".", 1)[-1][:12]), infra, model_dir, ARTIFACTS
    )
    await st.create_topics()
    st.start("worker")
    st.start("batcher")
    st.start("edge")
    try:
        await st.wait_ready()
        yield st
    finally:
        st.stop_all()


@pytest.fixture
async def bare(
    infra: dict[str, str], model_dir: str, request: pytest.FixtureRequest
) -> AsyncIterator[Stack]:
    """A fresh topic prefix (2 partitions) with no processes yet: the test starts, kills and
    restarts its own."""
    ARTIFACTS.mkdir(exist_ok=True)
    tag = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:10]
    st = make_stack(new_prefix(tag), infra, model_dir, ARTIFACTS)
    await st.create_topics(partitions=2)
    try:
        yield st
    finally:
        st.stop_all()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Server]:
    """A Redis server of this test's own, which it may stop and start (with the demo
    stack's durability: an append-only file, so a restart keeps the data)."""
    srv = private_server("redis", tmp_path / "redis-run", persist="aof")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[Server]:
    """A Kafka broker of this test's own, which it may stop and start."""
    srv = private_server("kafka", tmp_path / "kafka-run")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[Server]:
    """Three Kafka nodes of this test's own, which it may kill and start one by one."""
    srv = private_kafka_cluster(tmp_path / "kafka-cluster-run", brokers=3)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
