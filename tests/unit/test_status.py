"""The pure parts of ``tokenwire status`` and of the dashboard's feed: member states, what a
heartbeat implies, time-to-first-token quantiles, lag, and the screen."""

from __future__ import annotations

import pytest

from services.edge.dashboard import chart_point, fleet_ttft
from services.ops.status import (
    Snapshot,
    batcher_view,
    edge_view,
    lag_of,
    members,
    quantile,
    render,
    ttft_span,
    worker_view,
)


def test_a_member_is_live_within_its_ttl_and_silent_after_or_when_only_seen() -> None:
    live = {"w1": {"at": 99.0}, "w2": {"at": 90.0}}
    seen = {"w1": {"at": 80.0}, "w3": {"at": 50.0}}
    rows = {r["id"]: r for r in members(live, seen, ttl_s=3.0, now=100.0)}
    assert rows["w1"]["state"] == "live" and rows["w1"]["record"] == {"at": 99.0}
    assert rows["w2"]["state"] == "silent" and rows["w2"]["last_seen_s"] == 10.0
    assert rows["w3"]["state"] == "silent" and rows["w3"]["record"] == {"at": 50.0}


def test_a_worker_row_reads_kv_use_hit_rate_and_tokens_per_second() -> None:
    hb = {
        "at": 12.0,
        "partitions": [0, 1],
        "running": 2,
        "waiting": 1,
        "kv_used_tokens": 25,
        "free_kv_tokens": 75,
        "prefix_hit_tokens": 30,
        "prefilled_tokens": 90,
        "decoded_tokens": 500,
    }
    row = {"id": "w", "state": "live", "last_seen_s": 0.0, "record": hb}
    v = worker_view(row, {"at": 10.0, "decoded_tokens": 300})
    assert (v["kv_used_pct"], v["prefix_hit_pct"], v["tokens_per_s"]) == (25.0, 25.0, 100.0)
    assert worker_view(row, None)["tokens_per_s"] is None
    assert worker_view(row | {"state": "silent"}, {"at": 1.0})["tokens_per_s"] is None
    empty = worker_view({**row, "record": {"at": 1.0}}, None)
    assert (empty["kv_used_pct"], empty["prefix_hit_pct"]) == (None, None)


def test_lag_counts_from_zero_where_a_group_never_committed() -> None:
    assert lag_of({0: 5}, {0: 7, 1: 3}) == {"total": 5, "partitions": {"0": 2, "1": 3}}


def test_the_screen_shows_silent_members_and_problems() -> None:
    snap = Snapshot(at=0.0)
    w = {"id": "w1", "state": "live", "last_seen_s": 0.0, "record": {"at": 0.0, "running": 3}}
    rec = {"at": 0.0, "queued_by_priority": {"interactive": 2, "bulk": 5}, "window_ms": 12.0}
    b = {"id": "b1", "state": "silent", "last_seen_s": 42.0, "record": rec}
    snap.workers = [worker_view(w, None)]
    snap.batchers = [batcher_view(b)]
    snap.lag = {"tw.worker": lag_of({}, {0: 4})}
    snap.problems = ["kafka: away"]
    screen = render(snap)
    assert "w1" in screen and "live" in screen
    assert "b1" in screen and "SILENT 42s" in screen and "interactive=2 bulk=5" in screen
    assert "12ms" in screen
    assert "lag tw.worker" in screen and "p0=4" in screen and "! kafka: away" in screen


def test_a_record_that_carries_its_ttl_is_judged_by_it() -> None:
    live = {"e1": {"at": 95.0, "ttl_s": 10.0}, "e2": {"at": 95.0, "ttl_s": 2.0}}
    rows = {r["id"]: r["state"] for r in members(live, {}, ttl_s=3.0, now=100.0)}
    assert rows == {"e1": "live", "e2": "silent"}


def test_quantiles_interpolate_within_a_bucket_as_prometheus_does() -> None:
    le = [0.1, 0.5, 1.0]
    # 10 requests: 4 within 0.1 s, 4 more within 0.5 s, 2 more within 1 s, none beyond.
    counts = [4, 8, 10, 10]
    assert quantile(0.5, le, counts) == pytest.approx(0.1 + 0.4 * (1 / 4))
    assert quantile(0.2, le, counts) == pytest.approx(0.05)
    assert quantile(0.99, le, counts) == pytest.approx(0.5 + 0.5 * (1.9 / 2))
    assert quantile(0.99, le, [0, 0, 0, 3]) == 1.0  # beyond the last bound: that bound
    assert quantile(0.5, le, [0, 0, 0, 0]) is None


def test_a_ttft_span_needs_two_comparable_beats() -> None:
    hb = {"ttft_le": [0.1, 1.0], "ttft_counts": [3, 5, 6]}
    assert ttft_span(hb, {"ttft_le": [0.1, 1.0], "ttft_counts": [1, 2, 2]}) == [2, 3, 4]
    assert ttft_span(hb, None) is None
    assert ttft_span(hb, {"ttft_le": [0.2, 1.0], "ttft_counts": [1, 2, 2]}) is None
    assert ttft_span(hb, {"ttft_le": [0.1, 1.0], "ttft_counts": [9, 9, 9]}) is None  # restarted
    assert ttft_span({"at": 1.0}, {"at": 0.0}) is None  # an older worker: no buckets


def test_a_worker_row_has_its_ttft_quantiles_between_two_beats() -> None:
    hb = {"at": 2.0, "ttft_le": [0.1, 1.0], "ttft_counts": [10, 10, 10]}
    row = {"id": "w", "state": "live", "last_seen_s": 0.0, "record": hb}
    v = worker_view(row, {"at": 1.0, "ttft_le": [0.1, 1.0], "ttft_counts": [0, 0, 0]})
    assert v["ttft_p50_ms"] == 50.0 and v["ttft_p99_ms"] == 99.0
    idle = worker_view(row, {"at": 1.0, "ttft_le": [0.1, 1.0], "ttft_counts": [10, 10, 10]})
    assert (idle["ttft_p50_ms"], idle["ttft_p99_ms"]) == (None, None)


def test_an_edge_row_reads_rates_and_uptime_from_two_beats() -> None:
    hb = {
        "at": 110.0,
        "started_at": 50.0,
        "address": "http://e1:8000",
        "open_streams": 4,
        "requests": 300,
        "submitted": 120,
        "serving": True,
    }
    row = {"id": "e1", "state": "live", "last_seen_s": 0.0, "record": hb}
    v = edge_view(row, {"at": 108.0, "requests": 100, "submitted": 20})
    assert (v["requests_per_s"], v["submitted_per_s"]) == (100.0, 50.0)
    assert (v["uptime_s"], v["open_streams"], v["address"]) == (60.0, 4, "http://e1:8000")
    assert edge_view(row | {"state": "silent"}, {"at": 1.0})["requests_per_s"] is None


def test_the_screen_shows_edges_live_silent_and_probed() -> None:
    snap = Snapshot(at=0.0)
    rec = {"at": 0.0, "started_at": 0.0, "address": "http://e1:8000", "open_streams": 2}
    live = {"id": "e1", "state": "live", "last_seen_s": 0.0, "record": rec}
    dead = {"id": "e2", "state": "silent", "last_seen_s": 9.0, "record": rec}
    snap.edges = [edge_view(live, None), edge_view(dead, None)]
    snap.probes = [{"url": "http://e3:8000", "state": "DOWN (ConnectError)"}]
    lines = render(snap).splitlines()
    e1 = next(line for line in lines if line.startswith("e1 "))
    e2 = next(line for line in lines if line.startswith("e2 "))
    assert "live" in e1 and "http://e1:8000" in e1
    assert "SILENT 9s" in e2
    assert "probe http://e3:8000: DOWN (ConnectError)" in lines


def test_the_fleet_ttft_sums_the_workers_buckets() -> None:
    le = [0.1, 1.0]
    then = {
        "a": {"ttft_le": le, "ttft_counts": [0, 0, 0]},
        "b": {"ttft_le": le, "ttft_counts": [0, 0, 0]},
    }
    now = {
        "a": {"ttft_le": le, "ttft_counts": [10, 10, 10]},  # all fast
        "b": {"ttft_le": le, "ttft_counts": [0, 10, 10]},  # all slow
        "c": {"ttft_le": le, "ttft_counts": [5, 5, 5]},  # new: no earlier beat, left out
    }
    p50, p99 = fleet_ttft(now, then)
    assert p50 == 100.0  # half the fleet's first tokens within 0.1 s
    assert p99 == pytest.approx(1000 * (0.1 + 0.9 * (19.8 - 10) / 10))
    assert fleet_ttft(now, now) == (None, None)


def test_a_chart_point_counts_live_members_only() -> None:
    snap = Snapshot(at=5.0)
    w = {"id": "w1", "state": "live", "last_seen_s": 0.0, "record": {"at": 5.0}}
    gone = {"id": "w2", "state": "silent", "last_seen_s": 9.0, "record": {"at": 0.0}}
    snap.workers = [worker_view(w, None), worker_view(gone, None)]
    rec = {"at": 5.0, "queued_requests": 7}
    snap.batchers = [
        batcher_view({"id": "b1", "state": "live", "last_seen_s": 0.0, "record": rec}),
        batcher_view({"id": "b2", "state": "silent", "last_seen_s": 9.0, "record": rec}),
    ]
    point = chart_point(snap, (1.0, 2.0))
    assert point["tokens_per_s"].keys() == {"w1"} and point["queue_depth"] == 7
    assert (point["ttft_p50_ms"], point["ttft_p99_ms"]) == (1.0, 2.0)


def test_memory_reads_as_redis_writes_it() -> None:
    from services.ops.status import human_bytes

    assert human_bytes(512) == "512B"
    assert human_bytes(7.09 * 1024**2) == "7.09M"
    assert human_bytes(3 * 1024**3) == "3.00G"
