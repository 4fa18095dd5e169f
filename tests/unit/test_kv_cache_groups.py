"""KV layer groups on plain lists (``LayerGroupsKV``): one block pool, a block table per
group, sliding groups holding only their window, prefix hits only as far as every group
can go on; and a property test that random admissions, steps, preemptions and finishes
never serve a block holding other tokens' KV and never leak or double-free a block."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.worker.engine.kv_cache import (
    HOLE,
    KVCacheManager,
    LayerGroupsKV,
    OutOfBlocks,
    kv_cache_for,
)
from shared.prefix_hash import AFFINITY_DEPTH

BS = 4


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_one_group_is_the_plain_manager_and_several_share_one_pool() -> None:
    assert isinstance(kv_cache_for([None], 8, BS, True), KVCacheManager)
    assert isinstance(kv_cache_for([6], 8, BS, True), KVCacheManager)
    kv = kv_cache_for([6, None], 8, BS, True)
    assert isinstance(kv, LayerGroupsKV)
    assert kv.num_blocks == 8 and all(g._pool is kv.pool for g in kv.groups)


def test_the_sliding_group_holds_a_window_the_full_group_everything() -> None:
    kv = LayerGroupsKV(64, BS, True, [None, 6])
    ids = toks(0, 60)
    done = 0
    for n in [5, 3, *[1] * 52]:  # a prefill in two chunks, then decodes
        kv.allocate("s", ids, done + n)
        done += n
        kv.commit("s", ids, done)
        full, sliding = kv.group_tables("s")
        assert len(full) == len(sliding) == kv.blocks_for(done)
        assert HOLE not in full
        behind = max(0, done - 5) // BS  # position `done` sees (done - 6, done]
        assert sliding[:behind] == (HOLE,) * behind and HOLE not in sliding[behind:]
        assert kv.stats.used_blocks == len(full) + len(sliding) - behind
        assert not set(full) & set(sliding)  # a block holds one group's layers
    # The most a 60-token sequence ever holds, prefilled 5 tokens at a time at most.
    assert kv.max_blocks(60, 5) == 15 + 4
    assert kv.stats.peak_used_blocks <= 15 + 4
    kv.free("s")
    assert kv.num_free_blocks == 64


def test_the_same_bytes_admit_more_tokens_than_one_table_for_every_layer() -> None:
    """Two layers (one sliding, one full), a budget of 16 blocks of both layers: before,
    16 blocks of 4 tokens, 64 tokens at most. As two groups, the same bytes are 32
    one-layer blocks: the full group takes a block per 4 tokens, the sliding one at most
    blocks_for(6 - 1 + 4) + 1 = 4, so 28 blocks of full layer: 112 tokens."""
    old = KVCacheManager(16, BS)
    kv = LayerGroupsKV(32, BS, True, [6, None])
    assert old.max_blocks(64, 4) <= 16 < old.max_blocks(65, 4)
    assert kv.max_blocks(112, 4) <= 32 < kv.max_blocks(113, 4)
    ids = toks(0, 112)
    done = 0
    while done < len(ids):  # it runs in the pool, 4 tokens a step
        kv.allocate("s", ids, done + 4)
        done += 4
        kv.commit("s", ids, done)
    assert kv.stats.peak_used_blocks <= 32  # it never ran out


def test_the_routing_summary_comes_from_a_full_group() -> None:
    """A running sequence's leading blocks stay in the full group; the sliding group has
    released them."""
    kv = LayerGroupsKV(32, BS, True, [4, None])
    ids = toks(0, 40)
    kv.allocate("s", ids, 40)
    kv.commit("s", ids, 40)
    assert kv.summary_hashes(100) == kv.groups[1].summary_hashes(100)
    assert len(kv.summary_hashes(100)) == min(10, AFFINITY_DEPTH)


def test_a_hit_needs_only_the_window_of_a_sliding_group() -> None:
    kv = LayerGroupsKV(16, BS, True, [None, 4])
    prompt = toks(0, 20)  # five full blocks in each group
    kv.allocate("a", prompt, 20)
    kv.commit("a", prompt, 20)
    kv.free("a")
    # Another sequence takes 8 blocks: the six never used, then the sliding group's two
    # oldest (released first, when the prompt moved past them).
    kv.allocate("b", toks(100, 16), 16)
    assert kv.groups[1].cached_prefix_blocks(prompt)[:2] == [HOLE, HOLE]
    again = [*prompt, 99]
    # Position 20 sees (16, 20]: the sliding group needs only block 4, still cached.
    assert kv.allocate("c", again, 21) == 20
    full, sliding = kv.group_tables("c")
    assert len(full) == len(sliding) == 6
    assert sliding[:4] == (HOLE,) * 4 and HOLE not in full
    assert kv.stats.prefix_hit_tokens == 20 and kv.stats.prefix_queries == 3


def test_a_hit_counts_only_as_far_as_every_group_can_go_on() -> None:
    kv = LayerGroupsKV(8, BS, True, [None, 8])
    prompt = toks(0, 12)  # three full blocks: full group 0, 1, 2; sliding group 3, 4, 5
    kv.allocate("a", prompt, 12)
    kv.commit("a", prompt, 12)  # position 12 sees (4, 12]: sliding block 3 is released
    kv.free("a")
    # Four blocks taken: the two never used, then the oldest cached ones, the sliding
    # group's first block (released first) and the full group's last.
    kv.allocate("b", toks(100, 8), 8)
    again = [*prompt, 99]
    # Alone, the full group could go on from block 2, the sliding one from block 3 (it
    # needs blocks 1 and 2 there); from block 2 the sliding group would need its block 0,
    # from block 1 too: nothing is common.
    assert len(kv.groups[0].cached_prefix_blocks(again)) == 2
    assert len(kv.groups[1].cached_prefix_blocks(again)) == 3
    assert kv.cached_prefix_blocks(again) == []
    kv.free("b")
    assert kv.allocate("c", again, 13) == 0


def test_out_of_blocks_leaves_every_group_unchanged() -> None:
    kv = LayerGroupsKV(4, BS, True, [None, 4])
    ids = toks(0, 12)
    assert not kv.can_allocate("s", ids, 12)  # 3 full + 3 sliding blocks
    try:
        kv.allocate("s", ids, 12)
    except OutOfBlocks:
        pass
    assert kv.num_free_blocks == 4 and not kv.holds("s")


# --- property: random runs on a small pool ----------------------------------------------------
VOCAB = 3  # few distinct tokens: prompts share prefixes often
OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "step", "step", "step", "preempt", "finish", "churn"]),
        st.integers(0, 2),  # few sequences: each runs far, and comes back after finishing
    ),
    min_size=1,
    max_size=80,
)
# Prompts that start like one of two long ones (so prefix hits are frequent), then differ.
BASES = [[(i * i + 1) % 97 for i in range(24)], [(i * 5 + 3) % 89 for i in range(24)]]
PROMPTS = st.lists(
    st.builds(
        lambda base, n, tail: BASES[base][:n] + tail,
        st.integers(0, 1),
        st.integers(0, 24),
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
    ),
    min_size=3,
    max_size=3,
)
WINDOWS = st.sampled_from([(None, 6), (5, None, 5), (None, 9, None), (6, 6), (None, 4)])


class _Run:
    """A sequence driven as the scheduler drives one, and the KV each of its blocks holds."""

    def __init__(self, kv: LayerGroupsKV, windows: tuple[int | None, ...]) -> None:
        self.kv, self.windows = kv, windows
        self.done: dict[str, int] = {}
        self.ids: dict[str, list[int]] = {}
        self.content: dict[int, tuple[int, tuple[int, ...]]] = {}  # block → (group, prefix)

    def check_tables(self, seq: str, upto: int) -> None:
        """Every block a group reads for positions before ``upto`` holds that group's KV
        of exactly this sequence's tokens (the prefix ending with the block)."""
        tables = self.kv.group_tables(seq)
        for g, table in enumerate(tables):
            w = self.windows[g]
            first = 0 if w is None else max(0, upto - w + 1) // BS
            for i in range(first, upto // BS):
                assert table[i] != HOLE, (g, i)
                assert self.content.get(table[i]) == (g, tuple(self.ids[seq][: (i + 1) * BS]))

    def write(self, seq: str, start: int, end: int) -> None:
        """Record the KV a forward pass writes into the blocks of positions start..end-1."""
        tables = self.kv.group_tables(seq)
        for g, table in enumerate(tables):
            for i in range(start // BS, -(-end // BS)):
                assert table[i] != HOLE
                if (i + 1) * BS <= end:  # full: its content is fixed from now on
                    self.content[table[i]] = (g, tuple(self.ids[seq][: (i + 1) * BS]))
                else:
                    self.content.pop(table[i], None)

    def invariants(self) -> None:
        kv = self.kv
        refs = [0] * kv.num_blocks
        owner: dict[int, int] = {}
        for seq in self.done:
            for g, table in enumerate(kv.group_tables(seq)):
                for b in table:
                    if b != HOLE:
                        refs[b] += 1
                        assert owner.setdefault(b, g) == g  # a block serves one group
        assert refs == [b.ref for b in kv.pool.blocks]
        assert set(kv.pool.free) == {i for i, r in enumerate(refs) if r == 0}
        assert kv.stats.used_blocks == kv.num_blocks - kv.num_free_blocks


@settings(max_examples=300, deadline=None)
@given(OPS, PROMPTS, WINDOWS, st.integers(6, 16))
def test_random_runs_never_serve_wrong_kv_nor_leak_blocks(
    ops: list[tuple[str, int]],
    prompts: list[list[int]],
    windows: tuple[int | None, ...],
    num_blocks: int,
) -> None:
    kv = LayerGroupsKV(num_blocks, BS, True, windows)
    run = _Run(kv, windows)
    for op, k in ops:
        seq = f"s{k}"
        if op == "admit" and seq not in run.done:
            ids = prompts[k]
            cached = len(kv.cached_prefix_blocks(ids)) * BS
            n = min(len(ids) - cached, 5)
            if kv.can_allocate(seq, ids, cached + n):
                run.ids[seq] = list(ids)
                hit = kv.allocate(seq, ids, cached + n)
                assert hit == cached and hit < len(ids)
                run.done[seq] = hit
                run.check_tables(seq, hit)
                run.write(seq, hit, hit + n)
                run.done[seq] = hit + n
                kv.commit(seq, ids, hit + n)
        elif op == "step" and seq in run.done:
            ids, done = run.ids[seq], run.done[seq]
            if done == len(ids):
                ids.append((done * 7 + k) % VOCAB)  # a sampled token
            n = min(len(ids) - done, 3)
            if kv.can_allocate(seq, ids, done + n):
                kv.allocate(seq, ids, done + n)
                run.check_tables(seq, done)
                run.write(seq, done, done + n)
                run.done[seq] = done + n
                kv.commit(seq, ids, done + n)
        elif op in ("preempt", "finish") and seq in run.done:
            kv.free(seq)
            del run.done[seq]
            if op == "preempt":  # it comes back later with what it generated
                prompts[k] = run.ids[seq]
        elif op == "churn":  # an unrelated request passes through: the oldest cached go
            blocks = max(1, kv.num_free_blocks * (k + 1) // (3 * len(windows)))
            other = [1000 + k * 100 + i for i in range(BS * blocks)]
            if kv.can_allocate("churn", other, len(other)):
                kv.allocate("churn", other, len(other))
                kv.free("churn")
        run.invariants()
    for seq in list(run.done):
        kv.free(seq)
    assert kv.num_free_blocks == num_blocks
