"""Edge fault handling without I/O: what a request carries for the worker to cancel it
when nobody follows its stream, how a stream waits out a replay log that Redis cannot
serve for a while, and how Redis's health turns into 503s and one log line per outage."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
import redis.exceptions

from services.edge.config import EdgeSettings
from services.edge.errors import ApiError
from services.edge.health import RedisHealth
from services.edge.hub import RESYNC, Mailbox
from services.edge.metrics import EdgeMetrics
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.relay import EventStream
from shared.names import Names
from shared.retry import backoff


@pytest.mark.parametrize("resumable", [False, True])
def test_only_requests_a_disconnect_cancels_carry_an_unfollowed_grace(resumable: bool) -> None:
    completion = CompletionBody.model_validate(
        {"model": "m", "prompt": "x", "resumable": resumable}
    )
    chat = ChatBody.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "resumable": resumable}
    )
    for body in (completion, chat):
        req = body.to_request("cmpl-1", "acme", 4, unfollowed_grace_s=7.5)
        # A resumable request lives on without a follower: its client may come back.
        assert req.reply.unfollowed_grace_s == (None if resumable else 7.5)
        assert req.reply.redis and req.reply.kafka_topic is None


def test_the_grace_is_an_edge_setting() -> None:
    assert EdgeSettings.from_env({}).unfollowed_grace_s == 10.0
    assert EdgeSettings.from_env({"TW_UNFOLLOWED_GRACE_S": "2.5"}).unfollowed_grace_s == 2.5
    with pytest.raises(ValueError, match="TW_UNFOLLOWED_GRACE_S"):
        EdgeSettings.from_env({"TW_UNFOLLOWED_GRACE_S": "0"})


# --- the replay log while Redis is away ------------------------------------------------------
class _Hub:
    """Stands in for the shared subscriber: holds the stream's mailbox so the test can
    deliver to it."""

    def __init__(self) -> None:
        self.box: Mailbox | None = None

    async def subscribe(self, channel: bytes, box: Mailbox) -> None:
        self.box = box

    def unsubscribe(self, channel: bytes, box: Mailbox) -> None:
        self.box = None


class _FlakyLog:
    """A replay log read through ``xrange``; the next ``failures`` reads fail as redis-py
    fails while Redis is away."""

    def __init__(self, *events: bytes) -> None:
        self.entries = list(events)
        self.failures = 0

    async def xrange(self, key: str, min: str, max: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        if self.failures:
            self.failures -= 1
            raise redis.exceptions.ConnectionError("Error 111 connecting: Connection refused")
        start = int(min.split("-")[1]) - 1
        return [(b"", {b"d": e}) for e in self.entries if orjson.loads(e)["seq"] >= start]


def _ev(seq: int, final: bool = False) -> bytes:
    ev: dict[str, object] = {"request_id": "r", "seq": seq, "text": str(seq)}
    if final:
        ev["finish_reason"] = "stop"
    return orjson.dumps(ev)


def _stream(hub: _Hub, log: _FlakyLog, retries: list[int]) -> EventStream:
    return EventStream(
        hub,  # type: ignore[arg-type]
        log,  # type: ignore[arg-type]
        Names("t"),
        "r",
        after_seq=-1,
        on_retry=lambda: retries.append(1),
    )


async def _drain(stream: EventStream, wait_s: float) -> list[int]:
    got: list[int] = []
    while not stream.finished:
        got += [e["seq"] for e in await stream.next(wait_s)]
    return got


async def test_a_resync_while_redis_is_away_retries_the_log_until_it_answers() -> None:
    hub, log, retries = _Hub(), _FlakyLog(_ev(0)), []
    stream = await _stream(hub, log, retries).open()
    assert [e["seq"] for e in await stream.next(1.0)] == [0]
    # The hub reconnected; meanwhile 1-3 were published; the log fails three times more.
    log.entries += [_ev(1), _ev(2), _ev(3, final=True)]
    log.failures = 3
    assert hub.box is not None
    hub.box.put_nowait(RESYNC)
    assert await asyncio.wait_for(_drain(stream, 5.0), 5) == [1, 2, 3]
    assert len(retries) == 3


async def test_a_stream_left_behind_catches_up_without_a_new_live_event() -> None:
    hub, log, retries = _Hub(), _FlakyLog(_ev(0)), []
    stream = await _stream(hub, log, retries).open()
    await stream.next(1.0)
    log.entries += [_ev(1), _ev(2, final=True)]
    log.failures = 1_000_000
    assert hub.box is not None
    hub.box.put_nowait(_ev(2, final=True))  # a gap: 1 went out while unsubscribed
    # Each call gives up at its deadline with nothing (the relay sends a keep-alive)...
    assert await stream.next(0.05) == []
    assert await stream.next(0.05) == []
    assert not stream.finished and retries
    # ...and once Redis answers, the next call reads the log with no live event to prompt it.
    log.failures = 0
    assert [e["seq"] for e in await stream.next(1.0)] == [1, 2]
    assert stream.finished


async def test_a_stream_whose_log_cannot_be_read_at_open_raises_and_unsubscribes() -> None:
    hub, log = _Hub(), _FlakyLog()
    log.failures = 1
    stream = _stream(hub, log, [])
    with pytest.raises(redis.exceptions.ConnectionError):
        await stream.open()
    assert hub.box is None


def test_backoff_doubles_to_its_cap_with_jitter() -> None:
    waits = [backoff(n, first_s=0.1, cap_s=1.0) for n in range(8)]
    for n, wait in enumerate(waits):
        ceiling = min(1.0, 0.1 * 2**n)
        assert ceiling / 2 <= wait <= ceiling
    assert backoff(10_000, cap_s=2.0) <= 2.0


# --- Redis health ---------------------------------------------------------------------------
class _Pinged:
    """Answers ``ping`` while ``up``; fails as redis-py does while Redis is away."""

    def __init__(self) -> None:
        self.up = True

    async def ping(self) -> bool:
        if not self.up:
            raise redis.exceptions.ConnectionError("Error 111 connecting: Connection refused")
        return True


def _gauge(metrics: EdgeMetrics) -> float | None:
    return metrics.registry.get_sample_value("tw_edge_redis_up")


async def test_an_outage_is_logged_once_and_refuses_new_requests_with_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis_, metrics, subscribed = _Pinged(), EdgeMetrics(), [True]
    health = RedisHealth(redis_, lambda: subscribed[0], metrics)  # type: ignore[arg-type]
    assert health.serving and _gauge(metrics) == 1
    redis_.up = False
    with caplog.at_level(logging.INFO, logger="services.edge.health"):
        for _ in range(3):
            assert not await health.probe()
        assert not health.serving and _gauge(metrics) == 0
        with pytest.raises(ApiError) as refused:
            health.check("cmpl-1")
        assert refused.value.status == 503 and refused.value.code == "stream_unavailable"
        assert int(refused.value.headers["Retry-After"]) >= 1
        redis_.up = True
        assert await health.probe() and await health.probe()
    assert health.serving and _gauge(metrics) == 1
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    subscribed[0] = False  # the shared subscriber is reconnecting: not yet serving
    assert not health.serving


def test_the_guard_maps_only_an_outage_to_503() -> None:
    health = RedisHealth(_Pinged(), lambda: True, EdgeMetrics())  # type: ignore[arg-type]
    for exc in (
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.TimeoutError("no reply"),
        ConnectionResetError(),
        TimeoutError(),
    ):
        with pytest.raises(ApiError) as refused, health.guard("owner lookup", "cmpl-1"):
            raise exc
        assert refused.value.status == 503
    with pytest.raises(redis.exceptions.ResponseError), health.guard("rate limit"):
        raise redis.exceptions.ResponseError("WRONGTYPE")  # a bug, not an outage


async def test_a_relay_whose_work_loses_a_cancel_still_ends_when_its_client_goes() -> None:
    """A client gone cancels the relay's work; a Redis read inside it can lose that cancel
    (see ``shared/tasks.py``). The relay cancels again rather than wait out the stream."""
    from services.edge.responses import _until_disconnect

    async def receive() -> dict[str, str]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    cancels: list[int] = []

    async def work() -> None:  # loses its first cancel, as a read under wait_for can
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancels.append(1)
        await asyncio.sleep(3600)

    assert await asyncio.wait_for(_until_disconnect(receive, work()), 5) is False
    assert cancels == [1]


async def test_a_fault_of_the_edge_is_a_json_500_logged_as_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A request that hits a bug is answered in the API's error shape, and uvicorn's report
    # of it (with the traceback) reaches the service's JSON log: it was a plain-text
    # "Internal Server Error" and a plain-text traceback in the middle of the JSON lines.
    import httpx
    import uvicorn
    from fastapi import FastAPI

    from services.bench.cluster import free_port
    from services.edge.app import add_error_handlers
    from services.edge.server import server_config

    app = FastAPI()
    add_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    settings = EdgeSettings.from_env().model_copy(update={"port": free_port()})
    server = uvicorn.Server(server_config(app, settings))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(200):  # started within 10 s
            if server.started:
                break
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient() as http:
            r = await http.get(f"http://127.0.0.1:{settings.port}/boom")
    finally:
        server.should_exit = True
        await serving
    assert r.status_code == 500
    assert r.json()["error"] == {
        "message": "internal error: the edge failed on this request (its log has the cause)",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    [report] = [x for x in caplog.records if x.exc_info and x.name.startswith("uvicorn")]
    assert "a bug" in logging.Formatter().formatException(report.exc_info)
