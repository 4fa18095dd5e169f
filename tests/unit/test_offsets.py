"""Which Kafka offsets a worker may commit: contiguous finished batches only."""

from __future__ import annotations

import random

from services.worker.offsets import OffsetTracker


def test_a_batch_is_committable_only_when_every_request_finished() -> None:
    t = OffsetTracker()
    t.add(0, 10, ["a", "b"])
    assert t.committable() == {}
    t.done("a")
    assert t.committable() == {}
    t.done("b")
    assert t.committable() == {0: 11}  # Kafka commits the *next* offset to read
    assert t.committable() == {}  # nothing new since
    assert t.unfinished() == 0


def test_commits_are_contiguous_per_partition() -> None:
    t = OffsetTracker()
    t.add(0, 10, ["a"])
    t.add(0, 11, ["b"])
    t.add(0, 12, ["c"])
    t.done("c")
    t.done("b")
    assert t.committable() == {}  # 10 is still running: a crash must redeliver it
    t.done("a")
    assert t.committable() == {0: 13}


def test_out_of_order_completion_advances_to_the_first_gap() -> None:
    t = OffsetTracker()
    for off, rid in enumerate("abcd"):
        t.add(0, off, [rid])
    t.done("b")
    t.done("d")
    assert t.committable() == {}
    t.done("a")
    assert t.committable() == {0: 2}  # c (offset 2) is still open
    t.done("c")
    assert t.committable() == {0: 4}


def test_sparse_offsets() -> None:
    t = OffsetTracker()
    t.add(0, 3, ["a"])
    t.add(0, 7, ["b"])  # offsets in between belonged to nothing this worker tracks
    t.done("b")
    t.done("a")
    assert t.committable() == {0: 8}


def test_empty_batches_commit_at_once_but_not_past_an_open_one() -> None:
    t = OffsetTracker()
    t.add(0, 0, [])
    assert t.committable() == {0: 1}
    t.add(0, 1, ["a"])
    t.add(0, 2, [])  # e.g. every request in it was already done
    assert t.committable() == {}
    t.done("a")
    assert t.committable() == {0: 3}


def test_partitions_are_independent() -> None:
    t = OffsetTracker()
    t.add(0, 5, ["a"])
    t.add(1, 9, ["b"])
    t.add(2, 1, ["c"])
    t.done("b")
    assert t.committable() == {1: 10}
    t.done("a")
    t.done("c")
    assert t.committable() == {0: 6, 2: 2}


def test_unknown_and_repeated_done_are_harmless() -> None:
    t = OffsetTracker()
    t.add(0, 0, ["a", "b"])
    t.done("zzz")
    t.done("a")
    t.done("a")
    assert t.unfinished() == 1
    assert t.committable() == {}


def test_drop_partition_returns_its_unfinished_requests() -> None:
    t = OffsetTracker()
    t.add(0, 0, ["a", "b"])
    t.add(0, 1, ["c"])
    t.add(1, 0, ["d"])
    t.done("b")
    assert sorted(t.drop_partition(0)) == ["a", "c"]
    assert t.unfinished() == 1
    t.done("a")  # finishing a request of a revoked partition changes nothing
    assert t.committable() == {}
    assert t.drop_partition(0) == []
    assert t.drop_partition(7) == []
    t.done("d")
    assert t.committable() == {1: 1}


def test_a_reassigned_partition_starts_afresh() -> None:
    t = OffsetTracker()
    t.add(0, 10, ["a"])
    t.done("a")
    assert t.committable() == {0: 11}
    t.add(0, 11, ["b"])
    t.drop_partition(0)
    # Assigned back: offset 11 is redelivered and committed again once done.
    t.add(0, 11, ["b"])
    t.done("b")
    assert t.committable() == {0: 12}


def test_redelivered_batch_replaces_the_pending_one() -> None:
    t = OffsetTracker()
    t.add(0, 4, ["a", "b"])
    t.done("a")
    t.add(0, 4, ["b"])  # the same batch seen again: only b is still to finish
    t.done("b")
    assert t.committable() == {0: 5}


def test_random_completion_order_never_commits_an_unfinished_batch() -> None:
    rng = random.Random(7)
    t = OffsetTracker()
    batches = {off: [f"r{off}-{i}" for i in range(rng.randint(0, 3))] for off in range(40)}
    for off, rids in batches.items():
        t.add(0, off, rids)
    owner = {rid: off for off, rids in batches.items() for rid in rids}
    order = list(owner)
    rng.shuffle(order)
    finished: set[str] = set()
    committed = 0
    for rid in order:
        t.done(rid)
        finished.add(rid)
        got = t.committable().get(0)
        if got is not None:
            assert got > committed
            committed = got
        # Every batch below the committed position is finished; the one at it is not.
        assert all(set(batches[o]) <= finished for o in range(committed))
        if committed < 40:
            assert not set(batches[committed]) <= finished
    assert committed == 40
    assert t.unfinished() == 0


def test_a_request_delivered_in_two_batches_finishes_both() -> None:
    # The same request id can arrive twice at different offsets (a batcher that crashed
    # before committing re-batches its requests; a producer retries a publish). Finishing
    # it must not leave the older batch waiting forever and block the partition's commits.
    t = OffsetTracker()
    t.add(0, 1, ["x"])
    t.add(0, 2, ["x"])
    t.done("x")
    assert t.committable() == {0: 3}
    assert t.unfinished() == 0


def test_a_failed_commit_is_offered_again() -> None:
    t = OffsetTracker()
    t.add(0, 5, ["a"])
    t.done("a")
    assert t.committable() == {0: 6}
    t.not_committed({0: 6})  # e.g. a rebalance was in flight
    assert t.committable() == {0: 6}
    assert t.committable() == {}
    t.add(0, 6, ["b"])
    t.not_committed({0: 6})
    t.done("b")
    assert t.committable() == {0: 7}  # the newer position supersedes the failed one
    t.not_committed({0: 6})  # a stale failure is not offered again
    assert t.committable() == {}
