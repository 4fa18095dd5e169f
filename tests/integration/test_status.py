"""``tokenwire status`` against the real stack: every service on the screen while it runs,
and a stopped batcher and edge, and a killed edge, still on it as silent (the probed edge
as down)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import time
from typing import Any

import pytest

from services.cli import main
from shared.codec import encode
from shared.messages import GenerateRequest, SamplingParams
from tests.integration.harness import Stack, produce, read_topic


async def _status(stack: Stack, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    for k, v in stack.env.items():
        if k.startswith("TW_"):
            monkeypatch.setenv(k, v)
    out = io.StringIO()

    def call() -> None:
        with contextlib.redirect_stdout(out):
            main(["status", "--sample", "1.2", "--edge", stack.url(), *args])

    await asyncio.to_thread(call)
    return out.getvalue()


async def test_status_shows_every_service_and_keeps_a_stopped_one(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack.start("edge", "edge2")
    await stack.wait_ready()
    reqs = [
        GenerateRequest(prompt="The value", sampling=SamplingParams(max_tokens=8)) for _ in range(3)
    ]
    late = GenerateRequest(prompt="late", deadline=time.time() - 1)  # a dead letter
    bootstrap = stack.settings.kafka_bootstrap
    await produce(bootstrap, stack.names.requests, [encode(r) for r in [*reqs, late]])
    assert await read_topic(bootstrap, stack.names.requests_dlq, bool, 60)
    snap: dict[str, Any] = json.loads(await _status(stack, monkeypatch, "--json"))
    (worker,) = snap["workers"]
    assert worker["state"] == "live" and worker["partitions"] and worker["kv_used_pct"] is not None
    assert worker["tokens_per_s"] is not None  # two heartbeats were read
    (batcher,) = snap["batchers"]
    assert batcher["state"] == "live" and batcher["queued_requests"] >= 0
    assert batcher["queued_by_priority"].keys() == {"interactive", "bulk"}
    assert batcher["window_ms"] >= 0
    assert snap["edge_probes"] == [{"url": stack.url(), "state": "ready"}]
    edges = {e["address"]: e for e in snap["edges"]}
    assert edges.keys() == {stack.url(), stack.url("edge2")}
    edge, edge2 = edges[stack.url()], edges[stack.url("edge2")]
    assert edge["state"] == "live" and edge["serving"] and edge["record"]["requests"] > 0
    assert edge["requests_per_s"] is not None and edge["open_streams"] == 0
    groups = {stack.names.batcher_group, stack.names.worker_group}
    assert snap["consumer_lag"].keys() == groups
    for lag in snap["consumer_lag"].values():  # 2 partitions per input topic
        assert lag["partitions"].keys() == {"0", "1"} and lag["total"] >= 0
    assert snap["dlq"] == {"topic": stack.names.requests_dlq, "size": 1}
    assert snap["redis"]["used_memory"] > 0 and snap["problems"] == []
    screen = await _status(stack, monkeypatch)
    assert worker["id"] in screen and batcher["id"] in screen and "redis memory" in screen

    assert edge["id"] in screen and edge2["id"] in screen

    stack.stop("batcher")  # withdraws its status key: only the last-seen record is left
    stack.stop("edge")  # withdraws its heartbeat too
    stack.stop("edge2", signal.SIGKILL)  # its heartbeat expires, still in the edges' index
    await asyncio.sleep(edge2["record"]["ttl_s"] + 0.5)
    snap = json.loads(await _status(stack, monkeypatch, "--json"))
    (gone,) = snap["batchers"]
    assert gone["id"] == batcher["id"] and gone["state"] == "silent"
    assert gone["record"]["batcher_id"] == batcher["id"] and gone["last_seen_s"] >= 0
    assert [w["state"] for w in snap["workers"]] == ["live"]
    edges = {e["id"]: e for e in snap["edges"]}
    assert edges.keys() == {edge["id"], edge2["id"]}
    assert all(e["state"] == "silent" and e["requests_per_s"] is None for e in edges.values())
    assert edges[edge2["id"]]["last_seen_s"] >= edge2["record"]["ttl_s"]
    assert snap["edge_probes"][0]["state"].startswith("DOWN")
    screen = await _status(stack, monkeypatch)
    assert f"{batcher['id']}" in screen and "SILENT" in screen and "DOWN" in screen
    assert sum(edge_id in screen for edge_id in edges) == 2
