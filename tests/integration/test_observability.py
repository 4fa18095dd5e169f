"""Observability end to end: every metric named in the design is exposed and moves under
load, and the end-to-end benchmark's smoke configuration reports every figure."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.bench.prometheus import scrape
from shared.codec import encode
from shared.messages import GenerateRequest, SamplingParams
from tests.integration.harness import ROOT, Stack, StreamRecorder, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WORKER = [
    "tw_time_to_first_token_seconds_count",
    "tw_inter_token_latency_seconds_count",
    "tw_e2e_request_latency_seconds_count",
    "tw_request_queue_time_seconds_count",
    "tw_prompt_tokens_total",
    "tw_generation_tokens_total",
    "tw_prefix_cache_hit_tokens_total",
    "tw_engine_steps_total",
    "tw_engine_busy_seconds_total",
]
BATCHER = [
    "tw_batcher_batch_size_count",
    "tw_batcher_window_seconds_count",
    "tw_batcher_requests_total",
]
EXPOSED = {
    "worker": [
        "tw_kv_cache_usage_ratio",
        "tw_requests_running",
        "tw_worker_consumer_lag",
        "tw_preemptions_total",
        "tw_spec_draft_tokens_total",
    ],
    "batcher": [
        "tw_batcher_queue_depth",
        "tw_batcher_consumer_lag",
        "tw_batcher_paused",
        "tw_batcher_window_length_ms",
    ],
}


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


async def test_every_metric_is_exposed_and_moves_under_load(stack: Stack) -> None:
    wurl = f"http://127.0.0.1:{stack.metrics_ports['worker']}/metrics"
    burl = f"http://127.0.0.1:{stack.metrics_ports['batcher']}/metrics"
    before = {"worker": await scrape(wurl), "batcher": await scrape(burl)}
    prefix = "The module docstring explains that the function returns a list of values. " * 4
    reqs = [
        GenerateRequest(
            prompt=prefix + f"Case {i}:", sampling=SamplingParams(max_tokens=6, temperature=0)
        )
        for i in range(12)
    ]
    async with StreamRecorder(stack.env["TW_REDIS_URL"], stack.names) as rec:
        await produce(
            stack.env["TW_KAFKA_BOOTSTRAP"], stack.names.requests, [encode(r) for r in reqs]
        )
        await rec.wait_finished({r.request_id for r in reqs}, within_s=120, stack=stack)
        bad = [b"not json"]
        await produce(stack.env["TW_KAFKA_BOOTSTRAP"], stack.names.requests, bad)
    async with httpx.AsyncClient() as http:  # an edge request, so edge metrics move too
        body = {"model": "tokenwire-tiny", "prompt": "Return", "max_tokens": 3}
        assert (await http.post(stack.url() + "/v1/completions", json=body)).status_code == 200
    await asyncio.sleep(2.5)  # a heartbeat and a status refresh
    after = {"worker": await scrape(wurl), "batcher": await scrape(burl)}
    for svc, names in (("worker", WORKER), ("batcher", BATCHER)):
        for name in names:
            assert total(after[svc], name) > total(before[svc], name), f"{svc} {name} did not move"
    for svc, names in EXPOSED.items():
        for name in names:
            assert any(k == name or k.startswith(name + "{") for k in after[svc]), (
                f"{svc} lacks {name}"
            )
    for _ in range(20):  # the dead letter is counted once the batcher has handled it
        if total(await scrape(burl), "tw_batcher_dead_letters_total") >= 1:
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("tw_batcher_dead_letters_total did not move")
    edge = await scrape(stack.url() + "/metrics")
    assert any(k.startswith("tw_edge_") for k in edge)


def _numbers(obj: object) -> list[float]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v)]
    return [float(obj)] if isinstance(obj, int | float) else []


def test_bench_e2e_smoke_reports_every_figure(
    infra: dict[str, str], model_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "e2e"
    cmd = [
        sys.executable,
        "-m",
        "services.cli",
        "bench",
        "e2e",
        "--quick",
        "--preset",
        "tiny",
        "--model-dir",
        model_dir,
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, **infra},
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["warmup"]["requests"] == 8 and report["warmup"]["pipeline_s"] > 0
    for row in report["closed_loop"]:
        for key in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert set(row[key]) == {"p50", "p95", "p99"}
        assert row["tok_s"] > 0 and row["req_s"] > 0 and 0 <= row["prefix_hit_rate"] <= 1
        assert row["engine_alone_tok_s"] > 0 and 0 < row["engine_busy_share"] <= 1.05
        assert row["tok_s_whole"] > 0 and row["engine_alone_tok_s_whole"] > 0
        assert row["rounds"] and all(r["vs_engine_alone"] > 0 for r in row["rounds"])
        # Every other round runs the baselines first.
        assert [r["baselines_first"] for r in row["rounds"]] == [False, True]
        interval = row["vs_engine_alone_interval"]
        assert interval["low"] <= row["vs_engine_alone"] <= interval["high"]
    assert report["open_loop"] and all(r["e2e_ms"]["p50"] > 0 for r in report["open_loop"])
    stages = report["stages"]
    for key in (
        "kafka_and_batcher_ms",
        "batcher_window_ms",
        "engine_to_first_token_ms",
        "redis_relay_ms",
        "mean_batch_size",
    ):
        assert stages[key] is not None, key
    assert stages["batch_size_cumulative"]
    ratios = ("pipeline_vs_engine_alone", "pipeline_vs_serial_generate")
    assert set(report["ratios"]) == {*ratios, *(r + "_whole" for r in ratios)}
    assert set(report["ratio_intervals"]) == set(ratios)
    low = report["low_load"]
    assert low["ttft_p50_ms"] > 0 and low["engine_alone_ttft_p50_ms"] > 0
    assert math.isfinite(low["added_ttft_p50_ms"]) and math.isfinite(low["p50_difference_ms"])
    assert len(low["added_ttft_p50_ms_by_round"]) == len(report["closed_loop"][0]["rounds"])
    assert all(math.isfinite(x) for x in _numbers(report["ratios"]) + _numbers(report["baselines"]))
    for plot in report["plots"]:
        assert Path(plot).stat().st_size > 1000
