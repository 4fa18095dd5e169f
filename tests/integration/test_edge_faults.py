"""The edge under faults, against real Kafka and Redis and a real edge process, with no
model: a publisher in the test writes token events into Redis the way workers do
(``services.edge.bench``), so the edge relays streams that nothing generates.

- 10,000 requests through one edge leave its per-request maps and its memory flat.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest

from services.edge.bench import publish_steps
from shared.resp import RespWriter
from tests.conftest import new_prefix
from tests.integration.harness import Stack, make_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
MODEL = "tokenwire-tiny"
UNLIMITED = {"TW_RATE_REQUESTS_PER_MIN": "100000000", "TW_RATE_TOKENS_PER_MIN": "1000000000"}


@contextlib.asynccontextmanager
async def edge_only(infra: dict[str, str], tag: str, **env: str) -> AsyncIterator[Stack]:
    """One edge (no batcher, no worker, no model) on a fresh prefix of ``infra``."""
    ARTIFACTS.mkdir(exist_ok=True)
    st = make_stack(new_prefix(tag), infra, "", ARTIFACTS)
    await st.create_topics(partitions=1)
    st.start("edge", **env)
    try:
        await st.wait_ready(workers=0)
        yield st
    finally:
        st.stop_all()


def body(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **extra}


async def tracked(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The edge's ``tw_edge_tracked_entries`` gauges, by map."""
    text = (await http.get(url + "/metrics")).text
    found = re.findall(r'^tw_edge_tracked_entries\{map="(\w+)"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# --- 10,000 requests ---------------------------------------------------------------------
class KeepAlive:
    """One keep-alive HTTP/1.1 connection posting streamed completions, read off the socket
    with no HTTP library in the way: on two cores the client must cost far less than the
    edge it measures."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._buf = b""

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def post(self) -> str:
        """Send one streamed request; its id, once the edge has answered 200."""
        data = orjson.dumps(body(stream=True))
        self.writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head[:200]
        found = re.search(rb"(?im)^x-request-id: (\S+)", head)
        assert found is not None, head
        return found.group(1).decode()

    async def finish(self) -> bytes:
        """The rest of the streamed (chunked) body, up to its last chunk."""
        body = b""
        while not body.endswith(b"\r\n0\r\n\r\n"):
            chunk = await self.reader.read(65_536)
            assert chunk, "connection closed mid-stream"
            body += chunk
        return body

    def close(self) -> None:
        self.writer.close()


async def _round(conns: list[KeepAlive], writer: RespWriter, st: Stack) -> None:
    """A streamed request on each connection at once; each gets two events (a token, then
    the end) from the publisher."""
    rids = await asyncio.gather(*(c.post() for c in conns))
    await publish_steps(writer, st.names, rids, 1, 0.0)
    bodies = await asyncio.gather(*(c.finish() for c in conns))
    assert all(b"data: [DONE]" in b for b in bodies)


async def _settled(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The tracked sizes once the last streams' clean-up has run."""
    deadline = time.monotonic() + 5
    sizes = await tracked(http, url)
    while any(sizes.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        sizes = await tracked(http, url)
    return sizes


async def _requests(st: Stack, writer: RespWriter, count: int, concurrency: int = 50) -> None:
    """``count`` streamed requests, ``concurrency`` at a time."""
    conns = [KeepAlive(st.edge_ports["edge"]) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    try:
        for _ in range(count // concurrency):
            await _round(conns, writer, st)
    finally:
        for c in conns:
            c.close()


async def test_ten_thousand_requests_leave_the_edge_flat(infra: dict[str, str]) -> None:
    async with edge_only(infra, "flat", **UNLIMITED) as st:
        writer = RespWriter(st.env["TW_REDIS_URL"], name="tw-test-publisher")
        samples = []
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                for count in (2_000, 8_000):
                    await _requests(st, writer, count)
                    sizes = await _settled(http, st.url())
                    samples.append((sizes, rss_bytes(st.procs["edge"].pid)))
        finally:
            await writer.aclose()
        (maps_early, rss_early), (maps_late, rss_late) = samples
        growth = rss_late - rss_early
        assert set(maps_late) >= {"hub_sinks", "hub_ready", "hub_acks", "background_tasks"}
        assert maps_late == {k: 0.0 for k in maps_late}, (maps_early, maps_late)
        # 8,000 more requests may not grow the process by more than a few hundred bytes
        # each. One leaked map entry per request (a dict slot, its key, an empty deque)
        # grew it by 8.2 MB here; without a leak it grows by about 0.1 MB.
        assert growth < 8_000 * 256, f"RSS grew {growth / 1e6:.1f} MB ({rss_early / 1e6:.0f} MB)"
