"""KV-cache block manager with prefix reuse (pure: no torch, no I/O).

Memory is a pool of fixed-size blocks of token slots. Each running sequence owns a block
table. A *full* block is registered under a hash chained with its parent block's hash, so
any later sequence whose tokens start the same way reuses it without recomputation (token
ids are compared on a hit, so a hash collision can never serve wrong KV). Blocks are
reference-counted; a block nobody references stays cached until the allocator needs it,
least recently freed first.

With a ``window`` (a model whose every layer attends to the last ``window`` positions
only), a block that has fallen behind the window of every position still to be computed
is released as soon as the sequence moves past it: its table keeps a ``HOLE`` at that
index, and a sequence holds about a window of blocks however long it grows.

A model that interleaves sliding and full-attention layers (Gemma 2/3, Qwen 2 with sliding
layers) has one manager per *layer group* (``LayerGroupsKV``), all drawing on one
``BlockPool``: each group keeps its own block tables and prefix index, the sliding groups
release what falls behind their window, and a prefix hit counts only as far as every group
has the blocks it needs to go on from there (a sliding group only those in the window).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from shared.prefix_hash import AFFINITY_DEPTH, chain_hash

# A table entry whose block was released: behind the window, never read unmasked again.
HOLE = -1


class OutOfBlocks(RuntimeError):
    """Raised when an allocation was attempted without checking ``can_allocate`` first."""


@dataclass(slots=True)
class _Block:
    block_id: int
    ref: int = 0
    hash: int | None = None
    tokens: tuple[int, ...] = ()
    depth: int = 0  # position of the block in its chain (0: the first block of a prompt)
    index: dict[int, int] | None = None  # the prefix index it is registered in


class KVBlocks(NamedTuple):  # a tuple: immutable and built per sequence per step, cheaply
    """What the model runner needs of one sequence (opaque to the scheduler): its block
    table, or one table per layer group (``LayerGroupsKV``)."""

    block_ids: tuple[int, ...] | tuple[tuple[int, ...], ...]


@dataclass(slots=True)
class KVStats:
    """The block pool's occupancy and the prefix cache's hits and evictions."""

    num_blocks: int = 0
    used_blocks: int = 0
    peak_used_blocks: int = 0
    cached_blocks: int = 0
    prefix_queries: int = 0
    prefix_hit_tokens: int = 0
    evictions: int = 0


class _Chain:
    """The chained hashes of one token list's full blocks, computed as far as asked."""

    def __init__(self, ids: tuple[int, ...], block_size: int) -> None:
        self.ids, self.block_size = ids, block_size
        self.items: list[tuple[int, tuple[int, ...]]] = []

    def block(self, i: int) -> tuple[int, tuple[int, ...]]:
        """Block ``i``'s hash (chained with its parents') and its token ids."""
        bs = self.block_size
        while len(self.items) <= i:
            j = len(self.items)
            chunk = self.ids[j * bs : (j + 1) * bs]
            parent = self.items[-1][0] if self.items else None
            self.items.append((chain_hash(parent, chunk), chunk))
        return self.items[i]


class ChainMemo:
    """The block hashes of the last token list asked about: the scheduler asks about the
    same waiting prompt several times a step, and each layer group in turn."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._last: _Chain | None = None

    def of(self, token_ids: Sequence[int]) -> _Chain:
        ids = tuple(token_ids)
        if self._last is None or self._last.ids != ids:
            self._last = _Chain(ids, self.block_size)
        return self._last


class BlockPool:
    """The blocks, their reference counts and the free list (least recently freed first,
    uncached blocks before cached ones), shared by the managers of one model's layer groups."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be positive")
        self.blocks = [_Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.stats = KVStats(num_blocks=num_blocks)
        self.cached = 0  # blocks registered in some prefix index

    def ref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref == 0:
            self.free.pop(bid, None)
        block.ref += 1

    def unref(self, bid: int) -> None:
        block = self.blocks[bid]
        block.ref -= 1
        if block.ref == 0:
            self.free[bid] = None
            if block.hash is None:
                self.free.move_to_end(bid, last=False)  # uncached: reuse first

    def take(self) -> int:
        """A free block, evicted from its prefix index if it was cached."""
        bid, _ = self.free.popitem(last=False)
        block = self.blocks[bid]
        if block.hash is not None:
            if block.index is not None:
                block.index.pop(block.hash, None)
            block.hash, block.tokens, block.index = None, (), None
            self.cached -= 1
            self.stats.evictions += 1
        block.ref = 1
        return bid

    def register(
        self, bid: int, index: dict[int, int], h: int, chunk: tuple[int, ...], depth: int
    ) -> None:
        block = self.blocks[bid]
        block.hash, block.tokens, block.depth, block.index = h, chunk, depth, index
        index[h] = bid
        self.cached += 1

    def note_usage(self) -> None:
        used = len(self.blocks) - len(self.free)
        self.stats.used_blocks = used
        self.stats.peak_used_blocks = max(self.stats.peak_used_blocks, used)
        self.stats.cached_blocks = self.cached


@dataclass
class KVCacheManager:
    """Owns one layer group's KV blocks (every layer, for most models): every sequence's
    block table and the prefix cache's hash index, over its own ``BlockPool`` or one it
    shares with the model's other layer groups."""

    num_blocks: int
    block_size: int = 16
    enable_prefix_cache: bool = True
    window: int | None = None  # every layer's attention window; None: the whole history
    pool: BlockPool | None = None  # shared with other layer groups; None: a pool of its own
    count_queries: bool = True  # False when the groups' owner counts prefix queries once
    chains: ChainMemo | None = None  # shared by the layer groups of one model
    _pool: BlockPool = field(init=False)
    _chains: ChainMemo = field(init=False)
    _by_hash: dict[int, int] = field(init=False)
    _tables: dict[str, list[int]] = field(init=False)
    # Per sequence, its leading blocks that are settled in the prefix cache (registered,
    # or released behind the window) and the chained hash of the last of them: a commit
    # hashes on from there instead of from the first block every step.
    _settled: dict[str, tuple[int, int | None]] = field(init=False)
    stats: KVStats = field(init=False)

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self._pool = self.pool if self.pool is not None else BlockPool(self.num_blocks)
        self._chains = self.chains if self.chains is not None else ChainMemo(self.block_size)
        self._by_hash = {}
        self._tables = {}
        self._settled = {}
        self.stats = self._pool.stats

    @property
    def _blocks(self) -> list[_Block]:
        return self._pool.blocks

    @property
    def _free(self) -> OrderedDict[int, None]:
        return self._pool.free

    # --- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: str) -> KVBlocks:
        return KVBlocks(tuple(self._tables.get(seq_id, ())))

    def holds(self, seq_id: str) -> bool:
        return seq_id in self._tables

    def cached_prefix_blocks(self, token_ids: Sequence[int], limit: int | None = None) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids`` (at most ``limit``
        blocks), leaving at least the last token uncomputed (its logits are needed to
        sample the next token). With a window, blocks behind the prefix's window need not
        be cached: they are ``HOLE`` when they are not."""
        if not self.enable_prefix_cache:
            return []
        present = self._present(token_ids, limit)
        usable = self.usable_prefixes(token_ids, present)
        n = max(i for i, ok in enumerate(usable[: None if limit is None else limit + 1]) if ok)
        return [HOLE if b is None else b for b in present[:n]]

    def usable_prefixes(
        self,
        token_ids: Sequence[int],
        present: list[int | None] | None = None,
        limit: int | None = None,
    ) -> list[bool]:
        """``usable[n]``: the cache holds every block this group needs to compute
        ``token_ids`` on from block ``n`` (the first ``n`` blocks, or with a window only
        those the window of position ``n * block_size`` reaches into); ``n`` up to
        ``limit`` at most."""
        if not self.enable_prefix_cache:
            return [True]
        if present is None:
            present = self._present(token_ids, limit)
        usable, run = [True], 0
        for i, bid in enumerate(present):
            run = run + 1 if bid is not None else 0
            n = i + 1
            usable.append(run >= n - self._behind(n * self.block_size))
        return usable

    def _hits(self, token_ids: Sequence[int], hit: int | None) -> list[int]:
        return (
            self.cached_prefix_blocks(token_ids) if hit is None else self.blocks_at(token_ids, hit)
        )

    def usable_at(self, token_ids: Sequence[int], n: int) -> bool:
        """Whether the cache holds what this group needs to go on from block ``n``."""
        if n == 0:
            return True
        if not self.enable_prefix_cache or n > max(0, len(token_ids) - 1) // self.block_size:
            return False
        chain = self._chains.of(token_ids)
        return all(self._lookup(*chain.block(i)) is not None for i in range(self._first(n), n))

    def blocks_at(self, token_ids: Sequence[int], n: int) -> list[int]:
        """The first ``n`` blocks of ``token_ids`` as a prefix hit, ``HOLE`` behind the
        window; the caller has checked ``usable_at(token_ids, n)``."""
        if n == 0:
            return []
        chain = self._chains.of(token_ids)
        first = self._first(n)
        found = [self._lookup(*chain.block(i)) for i in range(first, n)]
        if None in found:
            raise ValueError(f"blocks {first}..{n - 1} of the prefix are not all cached")
        return [HOLE] * first + [b for b in found if b is not None]

    def _first(self, n: int) -> int:
        """The first block the group reads to go on from block ``n``."""
        return self._behind(n * self.block_size)

    def _lookup(self, h: int, chunk: tuple[int, ...]) -> int | None:
        bid = self._by_hash.get(h)
        return None if bid is None or self._blocks[bid].tokens != chunk else bid

    def _present(self, token_ids: Sequence[int], limit: int | None = None) -> list[int | None]:
        """For each full block before the last token (the first ``limit`` at most), the
        cached block holding it (token ids verified) or None; without a window, up to
        the first miss."""
        found: list[int | None] = []
        count = max(0, len(token_ids) - 1) // self.block_size
        if limit is not None:
            count = min(count, limit)
        if count == 0:
            return found
        chain = self._chains.of(token_ids)
        for i in range(count):
            h, chunk = chain.block(i)
            bid = self._by_hash.get(h)
            if bid is None or self._blocks[bid].tokens != chunk:
                if self.window is None:
                    break
                bid = None
            found.append(bid)
        return found

    def summary_hashes(self, limit: int, max_depth: int = AFFINITY_DEPTH) -> list[int]:
        """Hashes of cached leading blocks (chain depth < ``max_depth``) for routing:
        blocks in use first, then the most recently freed."""
        mine = self._by_hash
        used = [b for b in self._blocks if b.ref > 0 and b.index is mine]
        recent = [self._blocks[i] for i in reversed(self._free)]
        ranked = [b for b in used + recent if b.index is mine and b.depth < max_depth]
        return [b.hash for b in ranked[:limit] if b.hash is not None]

    # --- allocation ----------------------------------------------------------------------
    def can_allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> bool:
        """Whether the sequence's table can be extended to hold ``upto`` tokens."""
        if self._holds(seq_id, upto):
            return True
        return self.blocks_needed(seq_id, token_ids, upto) <= len(self._free)

    def _holds(self, seq_id: str, upto: int) -> bool:
        """Whether the sequence's blocks hold ``upto`` tokens already (a decode, most steps:
        checked before counting blocks)."""
        held = self._tables.get(seq_id)
        return held is not None and len(held) * self.block_size >= upto

    def blocks_needed(
        self, seq_id: str, token_ids: Sequence[int], upto: int, hit: int | None = None
    ) -> int:
        """Free blocks that extending the table to ``upto`` tokens takes (the longest
        cached prefix attached first, or the first ``hit`` blocks: see ``blocks_at``)."""
        table = self._tables.get(seq_id)
        if table is not None:
            return max(0, self.blocks_for(upto) - len(table))
        hits = self._hits(token_ids, hit)
        kept = hits[self._behind(len(hits) * self.block_size) :]
        hits_free = sum(1 for b in kept if self._blocks[b].ref == 0)
        return max(0, self.blocks_for(upto) - len(hits)) + hits_free

    def _behind(self, num_computed: int) -> int:
        """How many leading blocks no position from ``num_computed`` on attends to."""
        if self.window is None:
            return 0
        return max(0, num_computed - self.window + 1) // self.block_size

    def max_blocks(self, num_tokens: int, chunk: int) -> int:
        """The most blocks a sequence of ``num_tokens`` ever holds, computed ``chunk``
        tokens at a time at most."""
        whole = self.blocks_for(num_tokens)
        if self.window is None:
            return whole
        return min(whole, self.blocks_for(self.window - 1 + chunk) + 1)

    def allocate(
        self, seq_id: str, token_ids: Sequence[int], upto: int, hit: int | None = None
    ) -> int:
        """Extend the sequence's table to hold ``upto`` tokens. On the first allocation the
        longest cached prefix (or the first ``hit`` blocks: see ``blocks_at``) is
        attached; returns the number of tokens it covers."""
        if self._holds(seq_id, upto):
            return 0
        if self.blocks_needed(seq_id, token_ids, upto, hit) > len(self._free):
            raise OutOfBlocks(f"{seq_id}: no room for {upto} tokens")
        hit_tokens = 0
        table = self._tables.get(seq_id)
        if table is None:
            table = []
            hits = self._hits(token_ids, hit)
            behind = self._behind(len(hits) * self.block_size)
            table.extend([HOLE] * behind)  # hits behind the window: never read
            for bid in hits[behind:]:
                self._pool.ref(bid)
                table.append(bid)
            hit_tokens = len(hits) * self.block_size
            if self.count_queries:
                self.stats.prefix_queries += 1
                self.stats.prefix_hit_tokens += hit_tokens
            self._tables[seq_id] = table
        while len(table) < self.blocks_for(upto):
            table.append(self._pool.take())
        self._pool.note_usage()
        return hit_tokens

    def commit(self, seq_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Register the sequence's full, computed blocks in the prefix cache; with a
        window, then release the blocks no position from ``num_computed`` on attends to."""
        table = self._tables[seq_id]
        bs = self.block_size
        if self.enable_prefix_cache:
            start, parent = self._settled.get(seq_id, (0, None))
            settled = (start, parent)
            for i in range(start, min(num_computed // bs, len(table))):
                chunk = tuple(token_ids[i * bs : (i + 1) * bs])
                h = chain_hash(parent, chunk)
                parent = h
                if table[i] != HOLE and self._blocks[table[i]].hash is None:
                    if h in self._by_hash:
                        # Another block holds this content: try again next step (it may
                        # be evicted by then), and every block after it with it.
                        continue
                    self._pool.register(table[i], self._by_hash, h, chunk, i)
                if settled[0] == i:
                    settled = (i + 1, h)
            self._settled[seq_id] = settled
            self.stats.cached_blocks = self._pool.cached
        if self.window is not None:
            # Position p attends to (p - window, p]: blocks wholly before the first
            # position the next query sees are never read again.
            for i in range(min(self._behind(num_computed), len(table))):
                if table[i] != HOLE:
                    self._pool.unref(table[i])
                    table[i] = HOLE
            self._pool.note_usage()

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Shrink the sequence's table to the blocks its first ``num_tokens`` tokens take
        (speculation's rollback): the blocks past them held only rejected draft tokens,
        never registered in the prefix cache, and go back to the pool."""
        table = self._tables[seq_id]
        keep = self.blocks_for(num_tokens)
        if self._settled.get(seq_id, (0, None))[0] > keep:
            del self._settled[seq_id]
        while len(table) > keep:
            bid = table.pop()
            if bid != HOLE:
                self._pool.unref(bid)
        self._pool.note_usage()

    def free(self, seq_id: str) -> None:
        """Release the sequence's blocks; full ones stay cached until evicted."""
        self._settled.pop(seq_id, None)
        for bid in reversed(self._tables.pop(seq_id, [])):
            if bid != HOLE:
                self._pool.unref(bid)
        self._pool.note_usage()


class KVCache(Protocol):
    """What the scheduler and the engine use of a KV manager: ``KVCacheManager`` (one
    layer group) or ``LayerGroupsKV`` (several)."""

    @property
    def block_size(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def enable_prefix_cache(self) -> bool: ...
    @property
    def stats(self) -> KVStats: ...
    def table(self, seq_id: str) -> KVBlocks: ...
    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> list[int]: ...
    def summary_hashes(self, limit: int, max_depth: int = AFFINITY_DEPTH) -> list[int]: ...
    def can_allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> bool: ...
    def allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> int: ...
    def commit(self, seq_id: str, token_ids: Sequence[int], num_computed: int) -> None: ...
    def truncate(self, seq_id: str, num_tokens: int) -> None: ...
    def free(self, seq_id: str) -> None: ...
    def max_blocks(self, num_tokens: int, chunk: int) -> int: ...


class LayerGroupsKV:
    """The KV of a model whose layers attend over different windows: one
    ``KVCacheManager`` per layer group (``windows[g]``: group ``g``'s window, None for
    the whole history), every group drawing on one ``BlockPool`` of ``num_blocks``.

    A block holds ``block_size`` tokens of one group's layers, so a full-attention group
    takes a block per ``block_size`` tokens of a sequence and a sliding group about a
    window of blocks however long the sequence grows. A prefix hit covers the longest
    prefix that every group can go on from."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_cache: bool,
        windows: Sequence[int | None],
    ) -> None:
        if not windows:
            raise ValueError("at least one layer group")
        self.pool = BlockPool(num_blocks)
        chains = ChainMemo(block_size)
        self.groups = [
            KVCacheManager(
                num_blocks,
                block_size,
                enable_prefix_cache,
                w,
                pool=self.pool,
                count_queries=False,
                chains=chains,
            )
            for w in windows
        ]
        self.block_size, self.num_blocks = block_size, num_blocks
        self.stats = self.pool.stats

    @property
    def num_free_blocks(self) -> int:
        return len(self.pool.free)

    @property
    def enable_prefix_cache(self) -> bool:
        return self.groups[0].enable_prefix_cache

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: str) -> KVBlocks:
        """One block table per group, in the groups' order."""
        return KVBlocks(self.group_tables(seq_id))

    def group_tables(self, seq_id: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(g._tables.get(seq_id, ())) for g in self.groups)

    def holds(self, seq_id: str) -> bool:
        return self.groups[0].holds(seq_id)

    def _hit_blocks(self, token_ids: Sequence[int]) -> int:
        """The longest prefix (in blocks) every group holds what it needs to go on from:
        no further than the full groups' first miss, then down from there until every
        sliding group holds its window's blocks."""
        if not self.groups[0].enable_prefix_cache:
            return 0
        limit = max(0, len(token_ids) - 1) // self.block_size
        sliding = []
        for g in self.groups:
            if g.window is None:
                limit = min(limit, len(g._present(token_ids, limit)))
            else:
                sliding.append(g)
        for n in range(limit, 0, -1):
            if all(g.usable_at(token_ids, n) for g in sliding):
                return n
        return 0

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> list[int]:
        """The first group's blocks of the prefix every group can go on from (its length
        is what the scheduler reads)."""
        return self.groups[0].blocks_at(token_ids, self._hit_blocks(token_ids))

    def summary_hashes(self, limit: int, max_depth: int = AFFINITY_DEPTH) -> list[int]:
        """The routing summary of a full-attention group (it keeps a prompt's leading
        blocks while the sequence runs), else of the first group."""
        full = [g for g in self.groups if g.window is None]
        return (full or self.groups)[0].summary_hashes(limit, max_depth)

    def _needed(self, seq_id: str, token_ids: Sequence[int], upto: int) -> tuple[int, int]:
        n = self._hit_blocks(token_ids) if not self.holds(seq_id) else 0
        return n, sum(g.blocks_needed(seq_id, token_ids, upto, n) for g in self.groups)

    def can_allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> bool:
        return self._needed(seq_id, token_ids, upto)[1] <= len(self.pool.free)

    def allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> int:
        """Extend every group's table to ``upto`` tokens (attaching the common cached
        prefix first); returns the tokens the prefix covers."""
        first = not self.holds(seq_id)
        n, needed = self._needed(seq_id, token_ids, upto)
        if needed > len(self.pool.free):
            raise OutOfBlocks(f"{seq_id}: no room for {upto} tokens")
        if first:  # every group's hits are held before any group takes (evicts) a block
            for g in self.groups:
                g.allocate(seq_id, token_ids, n * self.block_size, n)
            self.stats.prefix_queries += 1
            self.stats.prefix_hit_tokens += n * self.block_size
        for g in self.groups:
            g.allocate(seq_id, token_ids, upto)
        return n * self.block_size if first else 0

    def commit(self, seq_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        for g in self.groups:
            g.commit(seq_id, token_ids, num_computed)

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        for g in self.groups:
            g.truncate(seq_id, num_tokens)

    def free(self, seq_id: str) -> None:
        for g in self.groups:
            g.free(seq_id)

    def max_blocks(self, num_tokens: int, chunk: int) -> int:
        """The most blocks a sequence ever holds, over all groups."""
        return sum(g.max_blocks(num_tokens, chunk) for g in self.groups)


def kv_cache_for(
    windows: Sequence[int | None], num_blocks: int, block_size: int, enable_prefix_cache: bool
) -> KVCache:
    """The KV manager of a model with one layer group per entry of ``windows``."""
    if len(windows) == 1:
        return KVCacheManager(num_blocks, block_size, enable_prefix_cache, window=windows[0])
    return LayerGroupsKV(num_blocks, block_size, enable_prefix_cache, windows)
