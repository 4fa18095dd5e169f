"""The Grafana dashboard stays true: after a short run through the stack, every metric its
PromQL queries name is offered by some service's /metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.harness import ROOT, Stack
from tests.promql import dashboard_queries, exposed_series

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GRAFANA = ROOT / "infra" / "grafana"


async def test_every_metric_the_grafana_dashboard_queries_is_exposed(stack: Stack) -> None:
    queries = dashboard_queries(GRAFANA)
    assert queries and all(queries.values()), queries  # every query names some metric
    body = {"model": "tokenwire-tiny", "prompt": "Return the", "max_tokens": 8}
    async with httpx.AsyncClient(timeout=60) as http:
        answers = await asyncio.gather(
            *(http.post(stack.url() + "/v1/completions", json=body) for _ in range(4))
        )
        assert [r.status_code for r in answers] == [200] * 4
        urls = {
            "edge": stack.url() + "/metrics",
            **{
                name: f"http://127.0.0.1:{port}/metrics"
                for name, port in stack.metrics_ports.items()
            },
        }
        assert urls.keys() == {"edge", "worker", "batcher"}
        series: dict[str, str] = {}
        for name, url in urls.items():
            page = await http.get(url)
            assert page.status_code == 200, name
            offered = exposed_series(page.text)
            assert offered, name
            series |= offered
    missing = {expr: sorted(n for n in names if n not in series) for expr, names in queries.items()}
    assert not {e: m for e, m in missing.items() if m}, "queries naming no exposed metric"
