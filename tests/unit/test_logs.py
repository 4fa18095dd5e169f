"""Structured logs: a client library's per-retry errors during an outage are kept once per
window, with a count of what was held back; the service's own lines are never held."""

from __future__ import annotations

import logging

from shared.logs import RepeatFilter


def record(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_flood_of_client_library_errors_is_one_line_per_window() -> None:
    now = [0.0]
    f = RepeatFilter(("aiokafka",), window_s=30, clock=lambda: now[0])
    template = "Unable connect to node with id %s: %s"
    shown = []
    for i in range(1000):  # an outage: one error per reconnect, every 30 ms
        now[0] = i * 0.03
        r = record("aiokafka", template, 1, "Connection refused")
        if f.filter(r):
            shown.append(r.getMessage())
    assert len(shown) == 1  # 30 s of the same error
    now[0] = 31.0
    r = record("aiokafka", template, 1, "Connection refused")
    assert f.filter(r)
    assert r.getMessage().endswith("(and 999 more like it in the last 31 s)")
    # Another kind of message, or another logger of the library, has its own window.
    assert f.filter(record("aiokafka.consumer.fetcher", "Failed fetch messages from %s", 1))
    assert f.filter(record("aiokafka", template, 1, "x", level=logging.WARNING))


def test_the_services_own_lines_are_never_held() -> None:
    f = RepeatFilter(("aiokafka",), window_s=30, clock=lambda: 0.0)
    for name in ("services.worker.service", "aiokafkaesque", "shared.retry"):
        assert all(f.filter(record(name, "kafka is unreachable (%r)", "x")) for _ in range(5))
