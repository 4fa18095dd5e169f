"""The pure parts of ``tokenwire status``: member states, what a heartbeat implies, lag,
and the screen."""

from __future__ import annotations

from services.ops.status import Snapshot, batcher_view, lag_of, members, render, worker_view


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
