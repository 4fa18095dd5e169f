"""The shared slot ledger's rules (pure): no sequence of reservations by several batchers,
each holding its own (possibly stale) heartbeat of the worker, fills the worker beyond the
free slots it advertised."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from services.batcher.slots import Grant, SlotLedger

MARGIN_S = 0.02


@dataclass
class Worker:
    """A worker of ``capacity`` slots: requests reach it within the transit margin, and
    its heartbeat advertises the slots its queue leaves free."""

    capacity: int
    queue: int = 0
    in_transit: list[tuple[float, int]] = field(default_factory=list)  # (arrives at, slots)

    def arrive(self, now: float) -> None:
        self.queue += sum(n for at, n in self.in_transit if at <= now)
        self.in_transit = [(at, n) for at, n in self.in_transit if at > now]

    def heartbeat(self, now: float) -> tuple[float, int]:
        return now, self.capacity - self.queue


step = st.one_of(
    st.tuples(st.just("beat"), st.just(0), st.just(0)),
    st.tuples(st.just("see"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(1, 6)),
    st.tuples(st.just("finish"), st.just(0), st.integers(1, 4)),
)


@settings(max_examples=1000, deadline=None)
@given(
    capacity=st.integers(0, 8),
    steps=st.lists(
        st.tuples(step, st.sampled_from([0.001, 0.005, 0.015, 0.03]), st.floats(0, 0.999)),
        min_size=1,
        max_size=80,
    ),
)
def test_no_sequence_of_reservations_overfills_the_worker(
    capacity: int, steps: list[tuple[tuple[str, int, int], float, float]]
) -> None:
    worker = Worker(capacity)
    ledger = SlotLedger()
    now = 0.0
    beats = [worker.heartbeat(now)]
    views = [beats[0]] * 3  # the heartbeat each batcher last read
    for seq, ((op, batcher, n), dt, transit) in enumerate(steps):
        now += dt
        worker.arrive(now)
        if op == "beat":
            beats.append(worker.heartbeat(now))
        elif op == "see":  # the newest heartbeat, or one of the few before it
            views[batcher] = beats[max(0, len(beats) - 1 - n)]
        elif op == "reserve":
            hb_at, hb_free = views[batcher]
            g = ledger.reserve(hb_at, hb_free, now, n, MARGIN_S, f"b{batcher}:{seq}")
            assert 0 <= g.granted <= n
            if g.granted:
                worker.in_transit.append((now + transit * MARGIN_S, g.granted))
        else:
            worker.queue -= min(n, worker.queue)
        in_flight = sum(n for _, n in worker.in_transit)
        assert worker.queue + in_flight <= capacity, (worker, ledger)


def test_a_fresh_heartbeat_grants_its_free_slots_once() -> None:
    ledger = SlotLedger()
    assert ledger.reserve(10.0, 3, 10.001, 2, MARGIN_S, "a:0") == Grant(2, 1)
    assert ledger.reserve(10.0, 3, 10.002, 2, MARGIN_S, "b:0") == Grant(1, 0)
    assert ledger.reserve(10.0, 3, 10.003, 1, MARGIN_S, "a:1") == Grant(0, 0)


def test_a_newer_heartbeat_releases_what_it_counts_and_a_stale_one_changes_nothing() -> None:
    ledger = SlotLedger()
    ledger.reserve(10.0, 3, 10.001, 3, MARGIN_S, "a:0")
    # The next heartbeat, taken after the three arrived, counts them (1 left free).
    assert ledger.reserve(11.0, 1, 11.001, 2, MARGIN_S, "b:0") == Grant(1, 0)
    # A batcher still holding the first heartbeat is answered from the newer one.
    assert ledger.reserve(10.0, 3, 11.002, 2, MARGIN_S, "a:1") == Grant(0, 0)


def test_a_reservation_just_before_a_heartbeat_stays_held() -> None:
    ledger = SlotLedger()
    ledger.reserve(10.0, 2, 10.995, 2, MARGIN_S, "a:0")
    # The heartbeat at 11.0 may have been taken before those two arrived.
    assert ledger.reserve(11.0, 2, 11.001, 2, MARGIN_S, "b:0") == Grant(0, 0)
