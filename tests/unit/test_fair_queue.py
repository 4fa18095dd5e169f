"""The batcher's queue: interactive before bulk, and tenants share dispatch fairly by tokens
(deficit round-robin), however unequal their load."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from services.batcher.fair_queue import FairQueue, Queued

INTERACTIVE, BULK = 0, 1


def q(
    name: str, tenant: str = "t", prio: int = INTERACTIVE, cost: int = 100, at: float = 0.0
) -> Queued[str]:
    return Queued(name, tenant, prio, cost, at)


def names(items: list[Queued[str]]) -> list[str]:
    return [x.item for x in items]


def drain(fq: FairQueue[str], per_pop: int, max_tokens: int | None = None) -> list[Queued[str]]:
    out: list[Queued[str]] = []
    while len(fq):
        got = fq.pop(per_pop, max_tokens)
        assert got, "a non-empty queue must give at least one item"
        out += got
    return out


# --- bookkeeping -------------------------------------------------------------------------------
def test_an_empty_queue() -> None:
    fq: FairQueue[str] = FairQueue()
    assert (len(fq), fq.count, fq.tokens, fq.oldest()) == (0, 0, 0, None)
    assert fq.pop(10) == []
    assert fq.pop(10, max_tokens=1_000) == []


def test_push_counts_requests_and_tokens() -> None:
    fq: FairQueue[str] = FairQueue()
    fq.push(q("a", cost=30))
    fq.push(q("b", tenant="u", prio=BULK, cost=70))
    assert (len(fq), fq.tokens) == (2, 100)
    assert sorted(names(list(fq))) == ["a", "b"]
    assert fq.depth_by_class() == [1, 1]
    fq.pop(1)
    assert (len(fq), fq.tokens) == (1, 70)
    assert fq.depth_by_class() == [0, 1]


def test_pop_of_zero_items_takes_nothing() -> None:
    fq: FairQueue[str] = FairQueue()
    fq.push(q("a"))
    assert fq.pop(0) == []
    assert len(fq) == 1


def test_oldest_is_the_earliest_enqueued_across_tenants_and_classes() -> None:
    fq: FairQueue[str] = FairQueue()
    fq.push(q("i1", tenant="a", at=5.0))
    fq.push(q("b1", tenant="b", prio=BULK, at=2.0))
    fq.push(q("i2", tenant="c", at=3.0))
    assert fq.oldest() == 2.0
    fq.pop(2)  # the two interactive ones
    assert fq.oldest() == 2.0
    fq.pop(1)
    assert fq.oldest() is None


# --- priority classes --------------------------------------------------------------------------
def test_interactive_goes_before_bulk_even_when_bulk_came_first() -> None:
    fq: FairQueue[str] = FairQueue()
    for i in range(3):
        fq.push(q(f"b{i}", tenant="a", prio=BULK, at=float(i)))
    for i in range(3):
        fq.push(q(f"i{i}", tenant="b", at=10.0 + i))
    assert names(fq.pop(4)) == ["i0", "i1", "i2", "b0"]


def test_bulk_is_taken_only_when_no_interactive_waits() -> None:
    fq: FairQueue[str] = FairQueue()
    fq.push(q("b0", prio=BULK))
    fq.push(q("i0"))
    assert names(fq.pop(1)) == ["i0"]
    fq.push(q("i1", tenant="other"))
    assert names(fq.pop(1)) == ["i1"]
    assert names(fq.pop(1)) == ["b0"]


def test_a_tenants_own_interactive_request_overtakes_its_bulk_backlog() -> None:
    fq: FairQueue[str] = FairQueue(quantum=100)
    for i in range(20):
        fq.push(q(f"b{i}", prio=BULK))
    fq.pop(3)
    fq.push(q("now"))
    assert names(fq.pop(1)) == ["now"]


# --- fairness between tenants ------------------------------------------------------------------
def _first_popped(fq: FairQueue[str], per_pop: int, n: int) -> list[Queued[str]]:
    """The first ``n`` requests taken, popped ``per_pop`` at a time as a batcher would."""
    out: list[Queued[str]] = []
    while len(out) < n:
        out += fq.pop(min(per_pop, n - len(out)))
    return out


def _tokens(items: list[Queued[str]]) -> Counter[str]:
    share: Counter[str] = Counter()
    for x in items:
        share[x.tenant] += x.cost
    return share


def test_a_flooding_tenant_gets_no_more_tokens_than_a_light_one() -> None:
    fq: FairQueue[str] = FairQueue(quantum=512)
    for i in range(20):  # the heavy tenant sends 10 requests for each light one
        for j in range(10):
            fq.push(q(f"h{i}.{j}", tenant="heavy", at=float(i)))
        fq.push(q(f"l{i}", tenant="light", at=float(i)))
    first = _first_popped(fq, per_pop=4, n=30)
    assert sum(x.tenant == "light" for x in fq) > 0  # both still backlogged
    share = _tokens(first)
    assert 2 / 3 <= share["heavy"] / share["light"] <= 3 / 2  # near 1:1, far from 10:1


def test_fairness_is_by_tokens_not_by_requests() -> None:
    fq: FairQueue[str] = FairQueue(quantum=512)
    for i in range(60):
        fq.push(q(f"big{i}", tenant="big", cost=300))
        fq.push(q(f"small{i}", tenant="small", cost=100))
    first = _first_popped(fq, per_pop=5, n=40)
    assert {x.tenant for x in fq} == {"big", "small"}  # both still backlogged
    share = _tokens(first)
    assert 2 / 3 <= share["big"] / share["small"] <= 3 / 2
    requests = Counter(x.tenant for x in first)
    assert requests["small"] >= 2 * requests["big"]  # about 3:1 in requests


def test_a_request_costlier_than_the_quantum_is_still_served() -> None:
    fq: FairQueue[str] = FairQueue(quantum=64)
    fq.push(q("huge", cost=100_000))
    assert names(fq.pop(1)) == ["huge"]
    assert (len(fq), fq.tokens) == (0, 0)


def test_a_costly_request_is_not_starved_by_a_flood_of_cheap_ones() -> None:
    fq: FairQueue[str] = FairQueue(quantum=100)
    fq.push(q("huge", tenant="big", cost=5_000))
    for i in range(2_000):
        fq.push(q(f"s{i}", tenant="small", cost=10))
    cheap_tokens_first = 0
    while True:
        got = fq.pop(8)
        if "huge" in names(got):
            break
        cheap_tokens_first += sum(x.cost for x in got)
    # DRR: the costly request waits for about its own cost in others' tokens, no more
    assert cheap_tokens_first <= 5_000 + 2 * 100


# --- token budget ------------------------------------------------------------------------------
def test_max_tokens_bounds_a_pop() -> None:
    fq: FairQueue[str] = FairQueue(quantum=1_000)
    for i in range(10):
        fq.push(q(f"r{i}", cost=100))
    got = fq.pop(10, max_tokens=350)
    assert names(got) == ["r0", "r1", "r2"]
    assert (len(fq), fq.tokens) == (7, 700)


def test_the_first_request_is_taken_even_over_the_budget() -> None:
    fq: FairQueue[str] = FairQueue(quantum=1_000)
    fq.push(q("big", cost=5_000))
    fq.push(q("small", cost=1))
    assert names(fq.pop(10, max_tokens=100)) == ["big"]
    assert names(fq.pop(10, max_tokens=100)) == ["small"]


# --- removal -----------------------------------------------------------------------------------
def test_remove_if_takes_matching_requests_and_updates_the_totals() -> None:
    fq: FairQueue[str] = FairQueue()
    for i in range(6):
        fq.push(q(f"a{i}", tenant="a", cost=10 + i, at=float(i)))
    fq.push(q("b0", tenant="b", prio=BULK, cost=50, at=0.5))
    gone = fq.remove_if(lambda x: x.item in {"a0", "a3", "b0"})
    assert sorted(names(gone)) == ["a0", "a3", "b0"]
    assert (len(fq), fq.count, fq.tokens) == (4, 4, 11 + 12 + 14 + 15)
    assert fq.oldest() == 1.0
    assert names(drain(fq, 10)) == ["a1", "a2", "a4", "a5"]
    assert fq.tokens == 0


def test_remove_if_of_nothing_changes_nothing() -> None:
    fq: FairQueue[str] = FairQueue()
    fq.push(q("a"))
    assert fq.remove_if(lambda x: False) == []
    assert (len(fq), fq.tokens) == (1, 100)


def test_a_tenant_emptied_by_remove_if_keeps_no_credit() -> None:
    # An idle tenant keeps no credit (fair_queue.pop drops it when the tenant empties); a
    # tenant emptied by remove_if should come back on the same footing as a new one.
    fq: FairQueue[str] = FairQueue(quantum=100)
    for i in range(3):
        fq.push(q(f"a{i}", tenant="a", cost=50))
    assert names(fq.pop(1)) == ["a0"]  # "a" now holds 50 credit
    fq.remove_if(lambda x: x.tenant == "a")
    fq.push(q("b0", tenant="b", cost=50))
    fq.push(q("a3", tenant="a", cost=50))
    fresh: FairQueue[str] = FairQueue(quantum=100)
    fresh.push(q("b0", tenant="b", cost=50))
    fresh.push(q("a3", tenant="a", cost=50))
    assert names(fq.pop(1)) == names(fresh.pop(1)) == ["b0"]


# --- properties --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Push:
    tenant: str
    prio: int
    cost: int


@dataclass(frozen=True)
class Pop:
    max_items: int
    max_tokens: int | None


@dataclass(frozen=True)
class Drop:
    residue: int  # remove requests whose step number is this mod 7


pushes = st.builds(
    Push, st.sampled_from("abcd"), st.sampled_from([INTERACTIVE, BULK]), st.integers(0, 2_000)
)
pops = st.builds(Pop, st.integers(1, 6), st.one_of(st.none(), st.integers(0, 3_000)))
ops = st.lists(st.one_of(pushes, pops, st.builds(Drop, st.integers(0, 6))), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 700))
def test_every_request_leaves_exactly_once_in_fifo_order_per_tenant(
    script: list[Push | Pop | Drop], quantum: int
) -> None:
    fq: FairQueue[str] = FairQueue(quantum=quantum)
    pushed: list[str] = []
    popped: list[Queued[str]] = []
    removed: list[Queued[str]] = []
    for step, op in enumerate(script):
        match op:
            case Push(tenant, prio, cost):
                fq.push(q(f"r{step}", tenant, prio, cost, at=float(step)))
                pushed.append(f"r{step}")
            case Pop(max_items, max_tokens):
                before = len(fq)
                got = fq.pop(max_items, max_tokens)
                _check_pop(fq, got, before, op)
                popped += got
            case Drop(residue):
                removed += fq.remove_if(_step_is(residue))
        assert len(fq) == fq.count == len(pushed) - len(popped) - len(removed)
        assert fq.tokens == sum(x.cost for x in fq)
        waits = [x.enqueued_at for x in fq]
        assert fq.oldest() == (min(waits) if waits else None)
    popped += drain(fq, 4)

    assert sorted(names(popped + removed)) == sorted(pushed)  # each exactly once
    assert (len(fq), fq.tokens, fq.oldest()) == (0, 0, None)
    # FIFO within a tenant's class (its interactive requests rightly overtake its bulk ones)
    order: dict[tuple[str, int], list[float]] = defaultdict(list)
    for x in popped:
        order[(x.tenant, x.priority)].append(x.enqueued_at)
    assert all(seq == sorted(seq) for seq in order.values())


def _step_is(residue: int) -> Callable[[Queued[str]], bool]:
    return lambda x: int(x.item[1:]) % 7 == residue


def _check_pop(fq: FairQueue[str], got: list[Queued[str]], before: int, op: Pop) -> None:
    assert len(got) <= min(before, op.max_items)
    assert got or before == 0  # a non-empty queue always gives something
    if op.max_tokens is not None and len(got) > 1:
        assert sum(x.cost for x in got) <= op.max_tokens  # only a lone first may exceed it
    prios = [x.priority for x in got]
    assert prios == sorted(prios)
    if BULK in prios:
        assert all(x.priority == BULK for x in fq)  # no interactive request was left waiting


def test_bulk_takes_only_the_spare_room_it_is_given() -> None:
    fq: FairQueue[str] = FairQueue(quantum=100)
    for i in range(5):
        fq.push(q(f"b{i}", "t", prio=1))
    fq.push(q("i0", "t", prio=0))
    taken = fq.pop(4, max_bulk=2)
    assert names(taken) == ["i0", "b0", "b1"]
    assert names(fq.pop(4, max_bulk=0)) == []
    assert names(fq.pop(4)) == ["b2", "b3", "b4"]
