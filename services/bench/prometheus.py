"""The services' own Prometheus metrics, scraped over HTTP: the time each stage adds and
the engine's busy time, as the worker, batcher and edge count them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.bench.cluster import Stack

# engine_counters: the gap between two readings that must agree (longer than the worker's
# default 1 s heartbeat, so a beat comes between them), and the longest wait.
SETTLE_S = 1.2
SETTLE_WITHIN_S = 6.0


async def scrape(url: str) -> dict[str, float]:
    """Prometheus samples of one /metrics page, name{labels} → value."""
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(url)).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (
                "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                if s.labels
                else ""
            )
            out[key] = s.value
    return out


def _mean(m: dict[str, float], name: str) -> float | None:
    count = m.get(f"{name}_count", 0.0)
    return m[f"{name}_sum"] / count if count else None


Scrapes = tuple[dict[str, float], dict[str, float], dict[str, float]]


async def scrape_stack(stack: Stack) -> Scrapes:
    """The worker's, batcher's and edge's metrics, in that order."""
    return (
        await scrape(f"http://127.0.0.1:{stack.metrics_ports['worker']}/metrics"),
        await scrape(f"http://127.0.0.1:{stack.metrics_ports['batcher']}/metrics"),
        await scrape(stack.url() + "/metrics"),
    )


async def stage_times(stack: Stack, since: Scrapes) -> dict[str, Any]:
    """Mean time each stage adds, from the services' own histograms, over the requests
    served after the scrapes ``since`` (histogram samples only grow, so they subtract)."""
    w, b, e = (
        {k: v - before.get(k, 0.0) for k, v in now.items()}
        for now, before in zip(await scrape_stack(stack), since, strict=True)
    )
    queue = _mean(w, "tw_request_queue_time_seconds")
    worker_ttft = _mean(w, "tw_time_to_first_token_seconds")
    edge_ttft = _mean(e, "tw_edge_first_event_seconds")
    sizes = {
        k.split("le=")[1].rstrip("}"): v
        for k, v in b.items()
        if k.startswith("tw_batcher_batch_size_bucket")
    }
    ms = lambda x: None if x is None else x * 1000  # noqa: E731
    return {
        "kafka_and_batcher_ms": ms(queue),
        "batcher_window_ms": ms(_mean(b, "tw_batcher_window_seconds")),
        "engine_to_first_token_ms": ms(worker_ttft - queue if worker_ttft and queue else None),
        "redis_relay_ms": ms(edge_ttft - worker_ttft if edge_ttft and worker_ttft else None),
        "batch_size_cumulative": sizes,
        "mean_batch_size": _mean(b, "tw_batcher_batch_size"),
    }


async def engine_counters(stack: Stack) -> tuple[float, float]:
    """The worker's engine busy seconds and steps so far, once the work before is counted:
    the worker refreshes its metrics on the heartbeat that follows finished requests, and
    on a loaded machine that beat can come later than a fixed wait (a stale first reading
    counted the warm-up's last steps in the next window: a busy share of 116%). Read until
    two readings ``SETTLE_S`` apart agree (the stack is idle when this is called), within
    ``SETTLE_WITHIN_S``."""
    url = f"http://127.0.0.1:{stack.metrics_ports['worker']}/metrics"
    last = await _counters(url)
    for _ in range(int(SETTLE_WITHIN_S / SETTLE_S)):
        await asyncio.sleep(SETTLE_S)
        now = await _counters(url)
        if now == last:
            break
        last = now
    return last


async def _counters(url: str) -> tuple[float, float]:
    m = await scrape(url)
    return m.get("tw_engine_busy_seconds_total", 0.0), m.get("tw_engine_steps_total", 0.0)
