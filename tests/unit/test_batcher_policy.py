"""The batcher's pure policies: when a batch goes out (WindowPolicy), to which worker each
request goes (Router), which Kafka partition carries it (partition_for), how a group is cut
into batches under the message limit (pack), and how failed sends go back in the queue."""

from __future__ import annotations

import zlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.batcher.fair_queue import FairQueue, Queued
from services.batcher.routing import (
    Refusal,
    Router,
    RoutingMode,
    WorkerView,
    admit,
    partition_for,
    refusal,
)
from services.batcher.sizing import pack, request_room
from services.batcher.window import WindowPolicy
from shared.codec import encode
from shared.kafka_io import MAX_VALUE_BYTES
from shared.messages import Batch, GenerateRequest, SamplingParams, WorkerHeartbeat
from shared.prefix_hash import AFFINITY_DEPTH, BLOCK_SIZE, block_hashes

POLICY = WindowPolicy(min_ms=50.0, max_ms=100.0, max_requests=8, target_wait_ms=200.0)
EPS = 0.01  # ms


# --- window length -----------------------------------------------------------------------------
def test_window_is_min_at_zero_saturation_and_max_at_full_saturation() -> None:
    assert POLICY.window_ms(0.0, 0.0) == 50.0
    assert POLICY.window_ms(1.0, 0.0) == 100.0
    assert POLICY.window_ms(0.5, 0.0) == 75.0


def test_saturation_outside_zero_one_is_clamped() -> None:
    assert POLICY.window_ms(-3.0, 0.0) == 50.0
    assert POLICY.window_ms(7.0, 0.0) == 100.0


def test_window_shrinks_toward_min_as_the_oldest_wait_nears_the_target() -> None:
    lengths = [POLICY.window_ms(1.0, wait) for wait in (0.0, 50.0, 100.0, 150.0, 200.0)]
    assert lengths == [100.0, 87.5, 75.0, 62.5, 50.0]
    assert POLICY.window_ms(1.0, 10_000.0) == 50.0  # past the target: the short window
    assert POLICY.window_ms(0.0, 150.0) == 50.0  # an idle system is already at the minimum


def test_default_policy_is_bounded() -> None:
    p = WindowPolicy()
    assert 0 < p.min_ms <= p.max_ms
    assert p.max_requests >= 1
    assert p.target_wait_ms > 0


bounds = st.tuples(
    st.floats(0.0, 1_000.0, allow_nan=False), st.floats(0.0, 1_000.0, allow_nan=False)
).map(sorted)


@settings(max_examples=300, deadline=None)
@given(
    bounds,
    st.floats(1.0, 5_000.0, allow_nan=False),
    st.floats(-10.0, 10.0, allow_nan=False),
    st.floats(-1_000.0, 1e7, allow_nan=False),
)
def test_window_never_leaves_its_bounds(
    mm: list[float], target: float, saturation: float, wait: float
) -> None:
    p = WindowPolicy(min_ms=mm[0], max_ms=mm[1], target_wait_ms=target)
    w = p.window_ms(saturation, wait)
    assert p.min_ms <= w <= p.max_ms + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.0, 1.0, allow_nan=False),
    st.floats(0.0, 1.0, allow_nan=False),
    st.floats(0.0, 1_000.0, allow_nan=False),
    st.floats(0.0, 1_000.0, allow_nan=False),
)
def test_window_grows_with_saturation_and_shrinks_with_wait(
    s1: float, s2: float, t1: float, t2: float
) -> None:
    lo_s, hi_s = sorted((s1, s2))
    lo_t, hi_t = sorted((t1, t2))
    assert POLICY.window_ms(lo_s, lo_t) <= POLICY.window_ms(hi_s, lo_t) + 1e-9
    assert POLICY.window_ms(hi_s, hi_t) <= POLICY.window_ms(hi_s, lo_t) + 1e-9


# --- when to dispatch --------------------------------------------------------------------------
@pytest.mark.parametrize("free", [None, 0, 5, 100])
def test_an_empty_queue_is_never_dispatched(free: int | None) -> None:
    assert not POLICY.should_dispatch(0, 10_000.0, free, 1.0)
    assert not POLICY.should_dispatch(0, 0.0, free, 0.0)


def test_an_idle_system_dispatches_at_once_when_the_workers_have_room() -> None:
    assert POLICY.should_dispatch(1, 0.0, 1, 0.0)
    assert POLICY.should_dispatch(3, 0.0, 3, 0.0)
    assert POLICY.should_dispatch(3, 0.0, 10, 0.9)


def test_without_room_for_everything_queued_the_window_applies() -> None:
    assert not POLICY.should_dispatch(3, 0.0, 2, 0.0)
    assert not POLICY.should_dispatch(3, 50.0 - EPS, 2, 0.0)
    assert POLICY.should_dispatch(3, 50.0, 2, 0.0)


@pytest.mark.parametrize("free", [None, -3, 0, 1])
def test_a_full_batch_goes_at_once(free: int | None) -> None:
    assert POLICY.should_dispatch(8, 0.0, free, 1.0)
    assert POLICY.should_dispatch(9, 0.0, free, 1.0)
    assert not POLICY.should_dispatch(7, 0.0, free, 1.0)


def test_with_no_worker_known_dispatch_waits_for_the_short_window_when_idle() -> None:
    assert not POLICY.should_dispatch(1, 0.0, None, 0.0)
    assert not POLICY.should_dispatch(1, 50.0 - EPS, None, 0.0)
    assert POLICY.should_dispatch(1, 50.0, None, 0.0)


@pytest.mark.parametrize("free", [None, 0, -2])
def test_a_saturated_system_dispatches_where_wait_meets_the_shrinking_window(
    free: int | None,
) -> None:
    # At full saturation the window is 100 - 50 * wait / 200, which the wait meets at 80 ms:
    # later than the short window, sooner than the long one.
    assert not POLICY.should_dispatch(2, 50.0 + EPS, free, 1.0)
    assert not POLICY.should_dispatch(2, 80.0 - EPS, free, 1.0)
    assert POLICY.should_dispatch(2, 80.0, free, 1.0)
    assert POLICY.should_dispatch(2, 100.0, free, 1.0)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 7),
    st.floats(0.0, 1.0, allow_nan=False),
    st.floats(0.0, 1_000.0, allow_nan=False),
    st.floats(0.0, 1_000.0, allow_nan=False),
)
def test_with_no_worker_known_dispatch_is_exactly_the_window_and_stays_on(
    queued: int, saturation: float, t1: float, t2: float
) -> None:
    go = POLICY.should_dispatch(queued, t1, None, saturation)
    assert go == (t1 >= POLICY.window_ms(saturation, t1))
    if t1 >= POLICY.min_ms and saturation == 0.0:
        assert go
    if t1 >= POLICY.max_ms:
        assert go  # the long window is an upper bound on any request's wait
    if go and t2 >= t1:
        assert POLICY.should_dispatch(queued, t2, None, saturation)  # once due, stays due


# --- routing -----------------------------------------------------------------------------------
def view(
    wid: str,
    free: int = 4,
    kv: int = 1_000,
    hashes: list[int] | None = None,
    parts: list[int] | None = None,
) -> WorkerView:
    hb = WorkerHeartbeat(
        worker_id=wid,
        partitions=parts if parts is not None else [],
        free_slots=free,
        free_kv_tokens=kv,
        prefix_hashes=hashes or [],
    )
    return WorkerView.of(hb)


PROMPT = list(range(1, 65))
H = block_hashes(PROMPT, 16)  # four chained leading-block hashes


def test_worker_view_copies_the_heartbeat() -> None:
    w = view("a", free=3, kv=700, hashes=[1, 2], parts=[4])
    assert (w.worker_id, w.free_slots, w.free_tokens, w.hashes) == ("a", 3, 700, {1, 2})
    w.free_slots -= 1  # spent locally; the heartbeat is untouched
    assert w.hb.free_slots == 3


def test_a_request_goes_to_the_worker_holding_its_deepest_prefix() -> None:
    ws = [
        view("shallow", free=8, hashes=H[:1]),
        view("deep", free=1, hashes=H[:3]),
        view("idle", free=16),
    ]
    assert Router().route(H, ws).worker_id == "deep"
    assert Router().route(H[:1], ws).worker_id in {"shallow", "deep"}


def test_several_holders_of_the_deepest_prefix_share_by_load() -> None:
    ws = [
        view("a", free=2, hashes=H[:2]),
        view("b", free=5, hashes=H[:2]),
        view("c", free=9, hashes=H[:1]),
        view("d", free=20),
    ]
    assert Router().route(H, ws).worker_id == "b"


def test_a_holder_without_a_free_slot_is_passed_over() -> None:
    ws = [view("full", free=0, hashes=H), view("half", free=3, hashes=H[:1]), view("x", free=9)]
    assert Router().route(H, ws).worker_id == "half"


def test_the_home_worker_is_stable_and_independent_of_listing_order() -> None:
    ws = [view(f"w{i}", free=4) for i in range(5)]
    router = Router()
    home = router.route(H, ws).worker_id
    for _ in range(5):
        assert router.route(H, ws).worker_id == home
    assert Router().route(H, list(reversed(ws))).worker_id == home
    assert Router().route(H, ws[2:] + ws[:2]).worker_id == home


def test_a_preamble_every_prompt_shares_does_not_send_them_all_to_one_worker() -> None:
    """Chat templates open every prompt alike (a fixed system header, the tools preamble):
    the home is keyed by the deepest leading block, where prompts differ, and of the
    workers holding the shared blocks each prompt's own home ranks first."""
    preamble = list(range(1000, 1032))  # two blocks every prompt starts with
    prompts = [block_hashes(preamble + [p] * 32, 16) for p in range(400)]
    ws = [view(f"w{i}", free=4) for i in range(4)]
    cold = Counter(Router().route(h, ws).worker_id for h in prompts)
    assert set(cold) == {w.worker_id for w in ws} and min(cold.values()) >= 50, cold
    warm = [view(w.worker_id, free=4, hashes=prompts[0][:2]) for w in ws]  # all cached it
    spread = Counter(Router().route(h, warm).worker_id for h in prompts)
    assert set(spread) == {w.worker_id for w in ws} and min(spread.values()) >= 50, spread
    # The same prompt goes to the same worker, cold or warm.
    assert [Router().route(h, ws).worker_id for h in prompts[:20]] == [
        Router().route(h, warm).worker_id for h in prompts[:20]
    ]


def test_different_prefixes_spread_over_the_workers() -> None:
    ws = [view(f"w{i}", free=4) for i in range(4)]
    homes = Counter(Router().route(block_hashes([p] * 16, 16), ws).worker_id for p in range(400))
    assert set(homes) == {w.worker_id for w in ws}
    assert min(homes.values()) >= 50  # about 100 each; no worker hogs the prefixes


def test_an_overloaded_home_hands_the_request_to_the_least_loaded() -> None:
    ids = [f"w{i}" for i in range(4)]
    home = Router().route(H, [view(i) for i in ids]).worker_id
    spare = next(i for i in ids if i != home)
    for full in (0, -2):  # free_slots goes negative as the batcher spends it locally
        slots = {i: full if i == home else 7 if i == spare else 2 for i in ids}
        assert Router().route(H, [view(i, free=slots[i]) for i in ids]).worker_id == spare


def test_no_hashes_go_to_the_least_loaded() -> None:
    ws = [view("a", free=2, hashes=H), view("b", free=9), view("c", free=5)]
    assert Router().route([], ws).worker_id == "b"


def test_least_loaded_breaks_ties_on_free_tokens_then_worker_id() -> None:
    ws = [view("a", free=4, kv=100), view("b", free=4, kv=900)]
    assert Router().route([], ws).worker_id == "b"
    ws = [view("a", free=4, kv=5), view("b", free=4, kv=5)]
    assert Router().route([], ws).worker_id == Router().route([], ws[::-1]).worker_id


def test_least_loaded_mode_ignores_the_prefix() -> None:
    ws = [view("holder", free=1, hashes=H), view("b", free=9)]
    assert Router(RoutingMode.LEAST_LOADED).route(H, ws).worker_id == "b"
    assert Router(RoutingMode.AFFINITY).route(H, ws).worker_id == "holder"


def test_round_robin_cycles_through_the_workers_with_room() -> None:
    ws = [view("a", hashes=H), view("b", free=100), view("c", free=2)]
    router = Router(RoutingMode.ROUND_ROBIN)
    picks = [router.route(H, ws).worker_id for _ in range(9)]
    assert Counter(picks) == {"a": 3, "b": 3, "c": 3}
    assert picks[:3] == picks[3:6] == picks[6:]
    assert len(set(picks[:3])) == 3
    full = [view("a"), view("b", free=0)]
    assert {router.route(H, full).worker_id for _ in range(4)} == {"a"}


def test_affinity_tolerates_a_bounded_imbalance_only() -> None:
    router = Router(RoutingMode.AFFINITY, tolerance=2)
    # The holder has 1 free slot fewer than the idlest worker: within tolerance.
    assert (
        router.route(H, [view("holder", free=3, hashes=H), view("b", free=4)]).worker_id == "holder"
    )
    # Two fewer: affinity would idle b, so b takes it.
    assert router.route(H, [view("holder", free=2, hashes=H), view("b", free=4)]).worker_id == "b"
    # Full everywhere: the holder may queue up to the tolerance, no further.
    assert (
        router.route(H, [view("holder", free=-1, hashes=H), view("b", free=0)]).worker_id
        == "holder"
    )
    assert router.route(H, [view("holder", free=-2, hashes=H), view("b", free=0)]).worker_id == "b"


def test_routing_modes_parse_from_settings_strings() -> None:
    assert RoutingMode("affinity") is RoutingMode.AFFINITY
    assert RoutingMode("round_robin") is RoutingMode.ROUND_ROBIN
    assert RoutingMode("least_loaded") is RoutingMode.LEAST_LOADED


# --- workers that hash prompts otherwise are refused --------------------------------------------
def beat(wid: str, block_size: int = BLOCK_SIZE, depth: int = AFFINITY_DEPTH) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=wid, partitions=[0], free_slots=4, block_size=block_size, affinity_depth=depth
    )


def test_a_worker_hashing_as_the_batcher_does_is_routable() -> None:
    assert refusal(beat("w"), BLOCK_SIZE) is None
    assert refusal(beat("w", 32), 32) is None


def test_a_worker_with_another_block_size_or_depth_is_refused_and_says_which() -> None:
    assert refusal(beat("w", block_size=32), 16) is Refusal.BLOCK_SIZE
    assert refusal(beat("w", block_size=16), 32) is Refusal.BLOCK_SIZE
    assert refusal(beat("w", depth=AFFINITY_DEPTH + 1), BLOCK_SIZE) is Refusal.AFFINITY_DEPTH
    assert refusal(beat("w", depth=2), BLOCK_SIZE, affinity_depth=2) is None
    # Both differ: one reason (the block size: its hashes match nothing at any depth).
    assert refusal(beat("w", 32, 2), 16) is Refusal.BLOCK_SIZE


def test_a_worker_that_does_not_advertise_is_not_refused_for_it() -> None:
    older = WorkerHeartbeat(worker_id="w", partitions=[0])  # before the fields existed
    assert (older.block_size, older.affinity_depth) == (0, 0)
    assert refusal(older, 16) is None
    assert refusal(beat("w", block_size=0, depth=3), 16) is Refusal.AFFINITY_DEPTH


def test_admit_keeps_the_matching_workers_in_order_and_names_the_refused() -> None:
    beats = [beat("a"), beat("b", block_size=8), beat("c"), beat("d", depth=1), beat("e", 0, 0)]
    admitted, refused = admit(beats, BLOCK_SIZE)
    assert [hb.worker_id for hb in admitted] == ["a", "c", "e"]
    assert refused == {"b": Refusal.BLOCK_SIZE, "d": Refusal.AFFINITY_DEPTH}
    assert admit(beats, 8) == (
        [beats[1], beats[4]],
        {"a": Refusal.BLOCK_SIZE, "c": Refusal.BLOCK_SIZE, "d": Refusal.BLOCK_SIZE},
    )
    assert admit([], BLOCK_SIZE) == ([], {})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 8, 16, 32]), st.sampled_from([0, 2, 4])),
        max_size=8,
    ),
    st.sampled_from([8, 16, 32]),
)
def test_a_refused_worker_is_never_routed_to(pairs: list[tuple[int, int]], bs: int) -> None:
    beats = [
        WorkerHeartbeat(
            worker_id=f"w{i}",
            partitions=[i],
            free_slots=10 - i,
            prefix_hashes=H,
            block_size=b,
            affinity_depth=d,
        )
        for i, (b, d) in enumerate(pairs)
    ]
    admitted, refused = admit(beats, bs)
    assert len(admitted) + len(refused) == len(beats)
    for hb in admitted:
        assert hb.block_size in (0, bs) and hb.affinity_depth in (0, AFFINITY_DEPTH)
    views = [WorkerView.of(hb) for hb in admitted]
    for mode in RoutingMode:
        if views:
            assert Router(mode).route(H, views).worker_id not in refused


# --- choosing a partition ----------------------------------------------------------------------
def test_partition_belongs_to_the_chosen_worker_and_is_stable() -> None:
    w = view("a", parts=[3, 5, 11])
    keys = [f"req-{i}" for i in range(200)]
    chosen = [partition_for(w, k, 16) for k in keys]
    assert set(chosen) == {3, 5, 11}  # spread over all of the worker's partitions
    assert chosen == [partition_for(w, k, 16) for k in keys]


def test_a_worker_owning_no_partition_falls_back_to_the_stable_hash() -> None:
    assert partition_for(view("a", parts=[]), "req-x", 6) == zlib.crc32(b"req-x") % 6


def test_without_a_worker_the_partition_is_a_stable_hash() -> None:
    assert partition_for(None, "req-x", 6) == zlib.crc32(b"req-x") % 6
    parts = {partition_for(None, f"k{i}", 6) for i in range(200)}
    assert parts == set(range(6))


def test_unknown_partition_count_falls_back_to_partition_zero() -> None:
    assert partition_for(None, "anything", 0) == 0


# --- batches under the message limit -----------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 100), max_size=40), st.integers(100, 400))
def test_pack_keeps_the_order_and_fills_each_batch_as_far_as_it_fits(
    sizes: list[int], room: int
) -> None:
    runs = pack(sizes, room)
    assert [i for run in runs for i in run] == list(range(len(sizes)))
    used = [sum(sizes[i] for i in run) + len(run) - 1 for run in runs]
    assert all(u <= room for u in used)
    # Greedy: the next run's first request would not have fitted in the run before it.
    assert all(used[k] + 1 + sizes[runs[k + 1][0]] > room for k in range(len(runs) - 1))


def test_a_request_over_the_room_gets_a_batch_of_its_own() -> None:
    assert pack([5, 50, 5], 20) == [[0], [1], [2]]
    assert pack([], 20) == []


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=300), min_size=1, max_size=12), st.text(max_size=40))
def test_a_batch_encodes_to_its_envelope_plus_its_requests_and_commas(
    prompts: list[str], batcher_id: str
) -> None:
    reqs = [GenerateRequest(prompt=p, sampling=SamplingParams(seed=7)) for p in prompts]
    sizes = [len(encode(r)) for r in reqs]
    batch = encode(Batch(batcher_id=batcher_id, requests=reqs))
    envelope = len(batch) - (sum(sizes) + len(sizes) - 1)
    assert 0 < envelope <= MAX_VALUE_BYTES - request_room(batcher_id)


# --- failed sends go back to the front of the queue ---------------------------------------------
def test_requeued_requests_go_out_first_and_in_their_order() -> None:
    q: FairQueue[str] = FairQueue(quantum=10)
    for name in ("a1", "a2", "a3"):
        q.push(Queued(name, "a", 0, 1, 0.0))
    taken = q.pop(2)
    q.requeue(taken)
    assert (len(q), q.tokens) == (3, 3)
    assert [x.item for x in q.pop(3)] == ["a1", "a2", "a3"]
