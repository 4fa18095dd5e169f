"""The dashboard in a real headless browser (Debian's chromium driven by Playwright): it
shows every service of the stack, and its numbers and charts move while load runs. Its
page and stream need no API key, like /metrics, where the API itself requires one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import orjson
import pytest
from playwright.async_api import Page, async_playwright

from tests.integration.harness import Stack
from tests.integration.test_edge_chat_page import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
LOAD_S = 10.0
LOAD_MAX_REQUESTS = 300
CONCURRENCY = 6


async def _load(url: str, until: float) -> int:
    """Streamed completions, ``CONCURRENCY`` at a time, until ``until`` (monotonic) or
    ``LOAD_MAX_REQUESTS``; returns how many finished."""
    done = 0
    body = {"model": "tokenwire-tiny", "prompt": "The function", "max_tokens": 48}
    body |= {"stream": True, "ignore_eos": True, "temperature": 0.8}

    async def one(http: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < until and done < LOAD_MAX_REQUESTS:
            async with http.stream("POST", url + "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    pass
            done += 1

    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(*(one(http) for _ in range(CONCURRENCY)))
    return done


async def _text(page: Page, selector: str) -> str:
    return (await page.text_content(selector)) or ""


async def _number(page: Page, selector: str) -> float | None:
    text = (await _text(page, selector)).split(" ")[0]
    return None if text in ("", "-") else float(text)


async def test_dashboard_needs_no_key_where_the_api_does(stack: Stack) -> None:
    stack.start("edge", "keyed", TW_AUTH="required")
    await stack.wait_ready()
    url = stack.url("keyed")
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(url + "/v1/models")).status_code == 401
        page = await http.get(url + "/dashboard")
        assert page.status_code == 200 and "/static/dashboard.js" in page.text
        async with http.stream("GET", url + "/dashboard/events") as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = []
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(orjson.loads(line[6:]))
                if len(events) == 2:
                    break
    assert "history" in events[0]
    status = events[1]["status"]
    assert [w["state"] for w in status["workers"]] == ["live"]
    assert {e["address"] for e in status["edges"]} == {stack.url(), url}
    assert "record" not in status["workers"][0]  # the page gets the rows, not raw records
    stack.stop("keyed")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
async def test_dashboard_renders_and_moves_under_load(stack: Stack) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 1000})
            await page.goto(stack.url() + "/dashboard")
            await page.wait_for_function("() => Number(document.body.dataset.updates) >= 2")
            assert await _text(page, "#conn") == "live"
            worker = await page.get_attribute("#workers tbody tr", "data-id")
            assert worker == f"{stack.prefix}-worker"
            assert await _text(page, "#workers tbody tr td:nth-child(2)") == "live"
            edge_row = await _text(page, "#edges tbody tr")
            assert stack.url() in edge_row and "live" in edge_row
            assert await _text(page, "#batchers tbody tr td:nth-child(2)") == "live"
            assert "redis memory" in await _text(page, "#bus")
            idle = await _number(page, "#total-tokens")

            load = asyncio.create_task(_load(stack.url(), time.monotonic() + LOAD_S))
            seen: list[float | None] = []
            ttft: list[float | None] = []
            streams: list[float | None] = []
            while not load.done():
                seen.append(await _number(page, "#total-tokens"))
                ttft.append(await _number(page, "#total-ttft-p50"))
                streams.append(await _number(page, "#total-streams"))
                if len(seen) == 12:
                    await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
                await asyncio.sleep(0.5)
            finished = await load
            tokens_path = await page.get_attribute(
                f'#chart-tokens path[data-series="{worker}"]', "d"
            )
            kv_path = await page.get_attribute(f'#chart-kv path[data-series="{worker}"]', "d")
            p50_path = await page.get_attribute('#chart-ttft path[data-series="p50"]', "d")
        finally:
            await browser.close()
    busy = [v for v in seen if v]
    assert finished > 0 and idle == 0.0
    assert busy and len(set(busy)) >= 2, seen  # tokens/s rose and changed under load
    assert any(v for v in ttft), ttft  # the fleet's TTFT p50 appeared
    assert any(v for v in streams), streams  # the edge's open streams were counted
    for path in (tokens_path, kv_path, p50_path):
        assert path and path.count("L") >= 3, path  # a drawn line, not a dot
