"""The KV block manager on plain lists: chained prefix hashing, ref counts, LRU eviction."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from services.worker.engine import kv_cache
from services.worker.engine.kv_cache import KVCacheManager, OutOfBlocks
from shared.prefix_hash import AFFINITY_DEPTH, block_hashes, chain_hash

BS = 4


def toks(start: int, n: int) -> list[int]:
    """``n`` distinct token ids from ``start`` (prompts built from disjoint ranges never share)."""
    return list(range(start, start + n))


def run_and_free(kv: KVCacheManager, seq_id: str, ids: list[int]) -> None:
    """A sequence that prefills all of ``ids``, commits them and finishes."""
    kv.allocate(seq_id, ids, len(ids))
    kv.commit(seq_id, ids, len(ids))
    kv.free(seq_id)


# --- hashing -------------------------------------------------------------------------------
def test_chain_hash_is_deterministic_and_depends_on_parent() -> None:
    assert chain_hash(None, [1, 2, 3, 4]) == chain_hash(None, (1, 2, 3, 4))
    root = chain_hash(None, [1, 2, 3, 4])
    assert chain_hash(root, [5, 6, 7, 8]) != chain_hash(None, [5, 6, 7, 8])
    assert chain_hash(root, [5, 6, 7, 8]) != chain_hash(root + 1, [5, 6, 7, 8])
    assert chain_hash(None, [1, 2, 3, 4]) != chain_hash(None, [1, 2, 3, 5])


def test_same_block_under_a_different_parent_is_not_a_hit() -> None:
    kv = KVCacheManager(16, BS)
    a, b, c = toks(0, BS), toks(100, BS), toks(200, BS)
    run_and_free(kv, "s1", [*a, *b, 9])
    assert len(kv.cached_prefix_blocks([*a, *b, 9])) == 2
    # Block ``b`` is cached, but only as the child of ``a``.
    assert kv.cached_prefix_blocks([*b, 9]) == []
    assert kv.cached_prefix_blocks([*c, *b, 9]) == []
    # A diverging first block stops the chain even if later blocks match.
    assert kv.cached_prefix_blocks([*a[:-1], 999, *b, 9]) == []


# --- prefix hits ---------------------------------------------------------------------------
def test_full_blocks_hit_but_the_last_token_stays_uncomputed() -> None:
    kv = KVCacheManager(16, BS)
    ids = toks(0, 3 * BS)
    run_and_free(kv, "s1", ids)
    assert kv.stats.cached_blocks == 3
    # Exactly three full blocks: the third would cover the last token, so it is not served.
    assert len(kv.cached_prefix_blocks(ids)) == 2
    # One more token after them: all three are served.
    assert len(kv.cached_prefix_blocks([*ids, 7])) == 3
    # Shorter prompts get only the blocks strictly before their last token.
    assert len(kv.cached_prefix_blocks(ids[: 2 * BS + 1])) == 2
    assert len(kv.cached_prefix_blocks(ids[:BS])) == 0
    assert kv.cached_prefix_blocks(ids[:1]) == []
    assert kv.cached_prefix_blocks([]) == []


def test_allocate_attaches_the_cached_prefix_and_reports_it() -> None:
    kv = KVCacheManager(16, BS)
    prefix = toks(0, 2 * BS)
    run_and_free(kv, "s1", [*prefix, 50, 51])
    first_blocks = kv.cached_prefix_blocks([*prefix, 0])
    hit = kv.allocate("s2", [*prefix, 60], 2 * BS + 1)
    assert hit == 2 * BS
    assert kv.table("s2").block_ids[:2] == tuple(first_blocks)
    assert len(kv.table("s2").block_ids) == 3
    assert kv.stats.prefix_queries == 2
    assert kv.stats.prefix_hit_tokens == 2 * BS
    # A second allocate for a held sequence only extends it: no new prefix query, no hit.
    assert kv.allocate("s2", [*prefix, 60, 61], 2 * BS + 2) == 0
    assert kv.stats.prefix_queries == 2


def test_hits_are_verified_by_token_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every block hashes alike: only the token comparison can tell them apart.
    monkeypatch.setattr(kv_cache, "chain_hash", lambda parent, tokens: 42)
    kv = KVCacheManager(16, BS)
    a = toks(0, BS)
    run_and_free(kv, "s1", [*a, 9])
    assert len(kv.cached_prefix_blocks([*a, 9])) == 1
    other = toks(100, BS)
    assert kv.cached_prefix_blocks([*other, 9]) == []
    assert kv.allocate("s2", [*other, 9], BS + 1) == 0
    assert set(kv.table("s2").block_ids).isdisjoint(kv.cached_prefix_blocks([*a, 9]))


def test_commit_registers_only_full_computed_blocks() -> None:
    kv = KVCacheManager(16, BS)
    ids = toks(0, 3 * BS)
    kv.allocate("s1", ids, len(ids))
    kv.commit("s1", ids, BS + 2)  # one full block computed, the second half done
    assert len(kv.cached_prefix_blocks(ids)) == 1
    kv.commit("s1", ids, 3 * BS)
    assert len(kv.cached_prefix_blocks([*ids, 0])) == 3
    # Committing again is idempotent.
    kv.commit("s1", ids, 3 * BS)
    kv.free("s1")
    assert kv.stats.cached_blocks == 3


def test_commit_updates_cached_blocks_stat() -> None:
    kv = KVCacheManager(16, BS)
    ids = toks(0, 2 * BS)
    kv.allocate("s1", ids, len(ids))
    kv.commit("s1", ids, len(ids))
    # The cache now holds two blocks; the stat reported to operators should say so
    # without waiting for the next allocate/free.
    assert kv.stats.cached_blocks == 2


def test_duplicate_content_computed_twice_is_cached_once() -> None:
    kv = KVCacheManager(16, BS)
    ids = toks(0, 2 * BS)
    # Two sequences prefill the same prompt concurrently (neither saw the other's blocks).
    kv.allocate("s1", ids, len(ids))
    kv.allocate("s2", ids, len(ids))
    kv.commit("s1", ids, len(ids))
    kv.commit("s2", ids, len(ids))
    kv.free("s1")
    kv.free("s2")
    assert kv.stats.cached_blocks == 2
    assert kv.num_free_blocks == 16
    assert kv.cached_prefix_blocks([*ids, 0]) == [0, 1]


def test_a_duplicate_block_is_cached_once_its_twin_is_evicted() -> None:
    kv = KVCacheManager(8, BS)
    ids = toks(0, 2 * BS)
    for sid in ("s1", "s2"):  # the same prompt, computed twice at once
        kv.allocate(sid, ids, len(ids))
    kv.commit("s1", ids, len(ids))
    kv.commit("s2", ids, len(ids))  # its blocks' content is cached already: s1's
    kv.free("s1")
    kv.allocate("s3", toks(100, 6 * BS), 6 * BS)  # every free block: s1's are evicted
    assert kv.cached_prefix_blocks([*ids, 0]) == []
    kv.commit("s2", ids, len(ids))
    assert kv.cached_prefix_blocks([*ids, 0]) == list(kv.table("s2").block_ids)


class FullRescan(KVCacheManager):
    """The commit as it was first written: every full block hashed from the first, every
    step (what the incremental commit must match)."""

    def commit(self, seq_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        table, bs, parent = self._tables[seq_id], self.block_size, None
        for i in range(min(num_computed // bs, len(table))):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = parent = chain_hash(parent, chunk)
            if self._blocks[table[i]].hash is None and h not in self._by_hash:
                self._pool.register(table[i], self._by_hash, h, chunk, i)
        self.stats.cached_blocks = self._pool.cached


def test_commit_from_the_settled_blocks_on_caches_what_a_full_rescan_caches() -> None:
    """Random traffic over a small pool (shared prefixes, the same prompt computed twice at
    once, decodes a token at a time, frees, evictions): after every step both managers
    hold the same hash index and the same hash on every block."""
    rng = random.Random(5)
    fast, ref = KVCacheManager(24, BS), FullRescan(24, BS)
    prefixes = [toks(1000 * k, rng.randrange(1, 3 * BS)) for k in range(3)]
    live: dict[str, tuple[list[int], int]] = {}  # seq → its ids, tokens computed
    for step in range(600):
        if len(live) < 4 and rng.random() < 0.3:
            ids = [*rng.choice(prefixes), *toks(10_000 + step * 50, rng.randrange(0, 2 * BS))]
            if live and rng.random() < 0.4:  # what a live sequence holds, perhaps uncommitted
                ids = list(live[rng.choice(sorted(live))][0])
            sid = f"s{step}"
            try:
                got = [kv.allocate(sid, ids, len(ids)) for kv in (fast, ref)]
            except OutOfBlocks:
                continue
            assert got[0] == got[1]
            live[sid] = (ids, got[0])
        elif live:
            sid = rng.choice(sorted(live))
            ids, done = live[sid]
            if rng.random() < 0.1:
                for kv in (fast, ref):
                    kv.free(sid)
                del live[sid]
                continue
            upto = min(len(ids), done + rng.choice([1, 1, 1, BS + 1]))
            if upto == len(ids):  # decoding: one more token
                ids.append(rng.randrange(100))
                try:
                    for kv in (fast, ref):
                        kv.allocate(sid, ids, len(ids))
                except OutOfBlocks:
                    ids.pop()
                    continue
            for kv in (fast, ref):
                kv.commit(sid, ids, upto)
            live[sid] = (ids, upto)
        assert fast._by_hash == ref._by_hash
        assert [b.hash for b in fast._blocks] == [b.hash for b in ref._blocks]
    assert fast.stats.evictions > 10 and fast.stats.prefix_hit_tokens > 0


# --- ref counts ----------------------------------------------------------------------------
def test_shared_blocks_are_ref_counted() -> None:
    kv = KVCacheManager(8, BS)
    prefix = toks(0, 2 * BS)
    kv.allocate("a", [*prefix, 1], 2 * BS + 1)
    kv.commit("a", [*prefix, 1], 2 * BS + 1)
    assert kv.num_free_blocks == 5
    assert kv.allocate("b", [*prefix, 2], 2 * BS + 1) == 2 * BS
    shared = kv.table("a").block_ids[:2]
    assert kv.table("b").block_ids[:2] == shared
    assert kv.num_free_blocks == 4  # only b's own tail block is new
    kv.free("a")
    # b still references the shared blocks: only a's tail came back.
    assert kv.num_free_blocks == 5
    assert kv.stats.used_blocks == 3
    kv.free("b")
    assert kv.num_free_blocks == 8
    assert kv.stats.used_blocks == 0
    assert kv.cached_prefix_blocks([*prefix, 3]) == list(shared)


def test_free_keeps_full_blocks_cached_and_forgets_the_table() -> None:
    kv = KVCacheManager(8, BS)
    ids = toks(0, 2 * BS + 2)
    kv.allocate("s", ids, len(ids))
    kv.commit("s", ids, len(ids))
    kv.free("s")
    assert not kv.holds("s")
    assert kv.table("s").block_ids == ()
    assert kv.num_free_blocks == 8
    assert kv.stats.cached_blocks == 2  # the partial third block is not cached
    assert len(kv.cached_prefix_blocks(ids)) == 2
    kv.free("s")  # freeing twice is harmless
    assert kv.num_free_blocks == 8


def test_summary_hashes_list_referenced_blocks_first_then_recently_freed() -> None:
    kv = KVCacheManager(8, BS)
    cold, warm, hot = toks(0, BS), toks(50, BS), toks(100, BS)
    run_and_free(kv, "cold", [*cold, 1])
    run_and_free(kv, "warm", [*warm, 1])
    kv.allocate("hot", [*hot, 1], BS + 1)
    kv.commit("hot", [*hot, 1], BS + 1)
    hashes = kv.summary_hashes(10)
    assert hashes == [chain_hash(None, hot), chain_hash(None, warm), chain_hash(None, cold)]
    assert kv.summary_hashes(1) == [chain_hash(None, hot)]


def test_summary_hashes_keep_only_leading_blocks() -> None:
    kv = KVCacheManager(8, BS)
    ids = toks(0, 3 * BS)
    run_and_free(kv, "a", [*ids, 1])
    first = chain_hash(None, ids[:BS])
    second = chain_hash(first, ids[BS : 2 * BS])
    assert set(kv.summary_hashes(10, max_depth=2)) == {first, second}


def test_the_summary_reaches_exactly_as_deep_as_the_batcher_hashes() -> None:
    kv = KVCacheManager(16, BS)
    ids = toks(0, (AFFINITY_DEPTH + 2) * BS)
    run_and_free(kv, "a", [*ids, 1])
    assert set(kv.summary_hashes(100)) == set(block_hashes(ids, BS, AFFINITY_DEPTH))


# --- eviction --------------------------------------------------------------------------------
def test_uncached_free_blocks_are_reused_before_cached_ones() -> None:
    kv = KVCacheManager(4, BS)
    a = toks(0, 2 * BS + 1)  # two full blocks and one partial
    run_and_free(kv, "a", a)
    assert kv.num_free_blocks == 4
    # Two blocks are free and uncached (a's partial tail, one never used): they go first.
    kv.allocate("b", toks(100, 2 * BS), 2 * BS)
    assert kv.stats.evictions == 0
    assert len(kv.cached_prefix_blocks(a)) == 2
    kv.allocate("b", toks(100, 3 * BS), 3 * BS)
    assert kv.stats.evictions == 1


def test_older_cached_blocks_are_evicted_first_and_leave_the_hash_table() -> None:
    kv = KVCacheManager(4, BS)
    a, b = toks(0, 2 * BS), toks(100, 2 * BS)
    run_and_free(kv, "a", a)
    run_and_free(kv, "b", b)
    assert kv.stats.cached_blocks == 4
    kv.allocate("c", toks(200, BS), BS)
    assert kv.stats.evictions == 1
    assert kv.stats.cached_blocks == 3
    # a was freed first, and within a its tail goes before its root, so a's root survives.
    assert len(kv.cached_prefix_blocks([*a, 0])) == 1
    assert len(kv.cached_prefix_blocks([*b, 0])) == 2
    kv.allocate("c", toks(200, 2 * BS), 2 * BS)
    assert kv.stats.evictions == 2
    assert kv.cached_prefix_blocks([*a, 0]) == []
    assert len(kv.cached_prefix_blocks([*b, 0])) == 2
    assert chain_hash(None, a) not in kv.summary_hashes(10)
    assert kv.stats.cached_blocks == 2


def test_a_reused_prefix_becomes_most_recently_used() -> None:
    kv = KVCacheManager(4, BS)
    a, b = toks(0, 2 * BS), toks(100, 2 * BS)
    run_and_free(kv, "a", a)
    run_and_free(kv, "b", b)
    # Touch a again: now b is the least recently used.
    kv.allocate("a2", [*a, 0], 2 * BS)
    kv.free("a2")
    kv.allocate("c", toks(200, 2 * BS), 2 * BS)
    assert kv.stats.evictions == 2
    assert len(kv.cached_prefix_blocks([*a, 0])) == 2
    assert kv.cached_prefix_blocks([*b, 0]) == []


def test_evicted_block_content_is_not_served_after_reuse() -> None:
    kv = KVCacheManager(2, BS)
    a = toks(0, BS)
    run_and_free(kv, "a", [*a, 1])
    kv.allocate("b", toks(100, 2 * BS), 2 * BS)  # needs both blocks: evicts a's block
    kv.commit("b", toks(100, 2 * BS), 2 * BS)
    kv.free("b")
    assert kv.cached_prefix_blocks([*a, 1]) == []
    assert kv.allocate("a", [*a, 1], BS + 1) == 0


# --- accounting ----------------------------------------------------------------------------
def test_can_allocate_counts_free_hit_blocks() -> None:
    kv = KVCacheManager(3, BS)
    prefix = toks(0, 2 * BS)
    run_and_free(kv, "a", [*prefix, 1])  # 2 cached blocks + 1 uncached, all free
    ids = [*prefix, 2]
    # Two free hit blocks get referenced (leaving the pool) plus one new block: 3 of 3.
    assert kv.can_allocate("b", ids, len(ids))
    kv.allocate("x", toks(100, 1), 1)  # takes the uncached block
    assert kv.num_free_blocks == 2
    # Now both free blocks are b's hits, leaving nothing for its tail.
    assert not kv.can_allocate("b", ids, len(ids))
    with pytest.raises(OutOfBlocks):
        kv.allocate("b", ids, len(ids))
    assert not kv.holds("b")
    assert kv.num_free_blocks == 2
    # But the cached part alone fits, without evicting the hits themselves.
    assert kv.can_allocate("b", ids, 2 * BS)
    assert kv.allocate("b", ids, 2 * BS) == 2 * BS
    assert kv.stats.evictions == 0
    assert kv.num_free_blocks == 0


def test_hit_blocks_held_by_others_cost_nothing() -> None:
    kv = KVCacheManager(3, BS)
    prefix = toks(0, 2 * BS)
    kv.allocate("a", [*prefix, 1], 2 * BS + 1)
    kv.commit("a", [*prefix, 1], 2 * BS + 1)
    assert kv.num_free_blocks == 0
    assert not kv.can_allocate("b", [*prefix, 2], 2 * BS + 1)  # needs a fresh tail block
    assert kv.can_allocate("b", [*prefix, 2], 2 * BS)  # the shared blocks are free of charge
    assert kv.allocate("b", [*prefix, 2], 2 * BS) == 2 * BS
    assert kv.num_free_blocks == 0


def test_growing_a_held_table_needs_only_the_extra_blocks() -> None:
    kv = KVCacheManager(3, BS)
    ids = toks(0, 3 * BS)
    kv.allocate("s", ids, BS)
    assert kv.num_free_blocks == 2
    assert kv.can_allocate("s", ids, BS)  # already covered
    assert kv.can_allocate("s", ids, 3 * BS)
    assert not kv.can_allocate("s", [*ids, 0], 3 * BS + 1)
    kv.allocate("s", ids, 3 * BS)
    assert len(kv.table("s").block_ids) == 3
    with pytest.raises(OutOfBlocks, match="no room"):
        kv.allocate("s", [*ids, 0], 3 * BS + 1)
    assert len(kv.table("s").block_ids) == 3


def test_out_of_blocks_leaves_state_unchanged() -> None:
    kv = KVCacheManager(2, BS)
    with pytest.raises(OutOfBlocks):
        kv.allocate("s", toks(0, 3 * BS), 3 * BS)
    assert not kv.holds("s")
    assert kv.num_free_blocks == 2
    assert kv.stats.used_blocks == 0
    assert kv.stats.prefix_queries == 0


def test_peak_used_blocks_tracks_the_high_water_mark() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("a", toks(0, 3 * BS), 3 * BS)
    kv.allocate("b", toks(100, 2 * BS), 2 * BS)
    assert kv.stats.used_blocks == kv.stats.peak_used_blocks == 5
    kv.free("a")
    assert kv.stats.used_blocks == 2
    assert kv.stats.peak_used_blocks == 5
    kv.allocate("c", toks(200, BS), BS)
    assert kv.stats.peak_used_blocks == 5
    assert kv.free_tokens == 5 * BS


def test_blocks_for_rounds_up() -> None:
    kv = KVCacheManager(8, BS)
    assert [kv.blocks_for(n) for n in (0, 1, BS, BS + 1, 2 * BS)] == [0, 1, 1, 2, 2]


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        KVCacheManager(0, BS)
    with pytest.raises(ValueError):
        KVCacheManager(4, 0)


# --- prefix cache off --------------------------------------------------------------------------
def test_disabled_prefix_cache_never_hits_and_reuses_every_block() -> None:
    kv = KVCacheManager(3, BS, enable_prefix_cache=False)
    ids = toks(0, 2 * BS + 1)
    run_and_free(kv, "a", ids)
    assert kv.stats.cached_blocks == 0
    assert kv.cached_prefix_blocks(ids) == []
    assert kv.summary_hashes(5) == []
    assert kv.can_allocate("b", ids, len(ids))
    assert kv.allocate("b", ids, len(ids)) == 0
    assert kv.stats.prefix_hit_tokens == 0
    assert kv.stats.evictions == 0
    assert kv.num_free_blocks == 0


# --- sliding windows ---------------------------------------------------------------------------
def test_blocks_behind_the_window_are_released_as_the_sequence_moves_on() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, window=6)
    ids = toks(0, 40)
    done = 0
    for n in [5, 3, *[1] * 32]:  # a prefill in two chunks, then decodes
        kv.allocate("s", ids, done + n)
        done += n
        kv.commit("s", ids, done)
        # Position `done` attends to (done - 6, done]: blocks wholly before done - 5 go.
        table = kv.table("s").block_ids
        behind = max(0, done - 5) // BS
        assert all(b == kv_cache.HOLE for b in table[:behind])
        assert kv_cache.HOLE not in table[behind:]
        assert kv.stats.used_blocks == len(table) - behind <= kv.max_blocks(40, 5)
    assert kv.max_blocks(40, 5) == 4 < kv.blocks_for(40)  # 6 - 1 + 5 = 10 tokens: 3 blocks + 1
    assert kv.stats.peak_used_blocks <= 4
    kv.free("s")
    assert kv.num_free_blocks == 8  # holes are not released twice


def test_prefix_hits_behind_the_window_are_holes_and_cost_no_room() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=BS, window=4)
    prompt = toks(0, 20)  # five full blocks
    run_and_free(kv, "a", prompt)
    again = [*prompt, 99]
    # Every block is cached, so 20 tokens are hits; position 20 sees (16, 20]: block 4 only.
    assert kv.can_allocate("b", again, 21)
    assert kv.allocate("b", again, 21) == 20
    table = kv.table("b").block_ids
    assert table[:4] == (kv_cache.HOLE,) * 4 and kv_cache.HOLE not in table[4:]
    assert kv.stats.used_blocks == 2  # block 4 (hit) and the new one for position 20
    # The holes' blocks stay cached for the next sequence that starts the same way.
    assert len(kv.cached_prefix_blocks(again)) == 5


def test_without_a_window_nothing_is_released_early() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    ids = toks(0, 20)
    kv.allocate("s", ids, 20)
    kv.commit("s", ids, 20)
    assert kv_cache.HOLE not in kv.table("s").block_ids
    assert kv.max_blocks(20, 5) == kv.blocks_for(20) == 5
