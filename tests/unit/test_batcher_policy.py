"""The batcher's pure policies: when a batch goes out, and to which worker partition."""

from __future__ import annotations

import zlib

import pytest

from services.batcher.routing import pick_partition, pick_worker
from services.batcher.window import WindowPolicy
from shared.messages import WorkerHeartbeat

POLICY = WindowPolicy(min_ms=50.0, max_ms=100.0, max_requests=8)
T0 = 1_700_000_000.0  # a realistic wall-clock time
EPS = 0.01  # ms; float time arithmetic is not exact at this magnitude


def after(ms: float) -> float:
    return T0 + ms / 1000.0


def worker(wid: str, parts: list[int], free: int = 0, kv: int = 0) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=wid, partitions=parts, free_slots=free, free_kv_tokens=kv)


# --- window ------------------------------------------------------------------------------------
def test_window_is_longer_when_saturated() -> None:
    assert POLICY.window_ms(saturated=False) == 50.0
    assert POLICY.window_ms(saturated=True) == 100.0


def test_an_empty_batch_is_never_dispatched() -> None:
    assert not POLICY.should_dispatch(0, T0, after(10_000), free_slots=100)
    assert not POLICY.should_dispatch(0, T0, after(10_000), free_slots=None)


def test_an_idle_worker_gets_the_batch_at_once() -> None:
    assert POLICY.should_dispatch(1, T0, T0, free_slots=1)
    assert POLICY.should_dispatch(3, T0, T0, free_slots=10)


def test_a_full_batch_goes_at_once_even_to_a_saturated_worker() -> None:
    assert POLICY.should_dispatch(8, T0, T0, free_slots=0)
    assert POLICY.should_dispatch(9, T0, T0, free_slots=None)
    assert not POLICY.should_dispatch(7, T0, T0, free_slots=0)


@pytest.mark.parametrize("free", [None, 1, 4])
def test_without_room_for_all_the_short_window_applies(free: int | None) -> None:
    size = 5
    assert not POLICY.should_dispatch(size, T0, after(0), free)
    assert not POLICY.should_dispatch(size, T0, after(50 - EPS), free)
    assert POLICY.should_dispatch(size, T0, after(50 + EPS), free)
    assert POLICY.should_dispatch(size, T0, after(75), free)


@pytest.mark.parametrize("free", [0, -3])
def test_a_saturated_worker_waits_the_long_window(free: int) -> None:
    # free_slots goes negative when the batcher counts its own dispatches between heartbeats
    assert not POLICY.should_dispatch(2, T0, after(50 + EPS), free)
    assert not POLICY.should_dispatch(2, T0, after(100 - EPS), free)
    assert POLICY.should_dispatch(2, T0, after(100 + EPS), free)


def test_the_window_boundary_is_inclusive() -> None:
    assert POLICY.should_dispatch(2, 0.0, 0.05, free_slots=1)
    assert POLICY.should_dispatch(2, 0.0, 0.1, free_slots=0)


def test_default_policy_is_bounded() -> None:
    p = WindowPolicy()
    assert 0 < p.min_ms <= p.max_ms
    assert p.max_requests >= 1


# --- choosing a worker ---------------------------------------------------------------------------
def test_no_worker_without_partitions() -> None:
    assert pick_worker([], 1) is None
    assert pick_worker([worker("a", [], free=10)], 1) is None


def test_the_worker_with_most_free_slots_wins() -> None:
    ws = [worker("a", [0], free=2), worker("b", [1], free=7), worker("c", [2], free=5)]
    chosen = pick_worker(ws, 3)
    assert chosen is not None and chosen.worker_id == "b"


def test_a_worker_holding_no_partition_is_skipped_however_idle() -> None:
    ws = [worker("a", [0], free=1), worker("idle", [], free=64)]
    chosen = pick_worker(ws, 1)
    assert chosen is not None and chosen.worker_id == "a"


def test_ties_break_on_free_kv_then_worker_id() -> None:
    ws = [worker("a", [0], free=4, kv=100), worker("b", [1], free=4, kv=900)]
    chosen = pick_worker(ws, 1)
    assert chosen is not None and chosen.worker_id == "b"
    ws = [worker("b", [1], free=4, kv=5), worker("a", [0], free=4, kv=5)]
    first = pick_worker(ws, 1)
    assert first is not None and first.worker_id == "b"
    again = pick_worker(list(reversed(ws)), 1)
    assert again is not None and again.worker_id == "b"  # independent of listing order


# --- choosing a partition ----------------------------------------------------------------------
def test_partition_belongs_to_the_chosen_worker_and_is_stable() -> None:
    w = worker("a", [3, 5, 11])
    keys = [f"bat-{i}" for i in range(200)]
    chosen = [pick_partition(w, k, 16) for k in keys]
    assert set(chosen) == {3, 5, 11}  # spread over all of the worker's partitions
    assert chosen == [pick_partition(w, k, 16) for k in keys]


def test_without_a_worker_the_partition_is_a_stable_hash() -> None:
    assert pick_partition(None, "bat-x", 6) == zlib.crc32(b"bat-x") % 6
    parts = {pick_partition(None, f"k{i}", 6) for i in range(200)}
    assert parts == set(range(6))


def test_unknown_partition_count_falls_back_to_partition_zero() -> None:
    assert pick_partition(None, "anything", 0) == 0
