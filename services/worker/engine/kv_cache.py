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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class KVBlocks:
    """What the model runner needs of one sequence: its block table (opaque to the scheduler)."""

    block_ids: tuple[int, ...]


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


@dataclass
class KVCacheManager:
    """Owns the KV block pool: every sequence's block table, the prefix cache's hash index, the free list."""

    num_blocks: int
    block_size: int = 16
    enable_prefix_cache: bool = True
    window: int | None = None  # every layer's attention window; None: the whole history
    _blocks: list[_Block] = field(init=False)
    _free: OrderedDict[int, None] = field(init=False)  # ref == 0, oldest first
    _by_hash: dict[int, int] = field(init=False)
    _tables: dict[str, list[int]] = field(init=False)
    stats: KVStats = field(init=False)

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        self._free = OrderedDict((i, None) for i in range(self.num_blocks))
        self._by_hash = {}
        self._tables = {}
        self.stats = KVStats(num_blocks=self.num_blocks)

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

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids``, leaving at least the
        last token uncomputed (its logits are needed to sample the next token)."""
        if not self.enable_prefix_cache:
            return []
        hits: list[int] = []
        parent: int | None = None
        bs = self.block_size
        for start in range(0, len(token_ids) - 1 - bs + 1, bs):
            chunk = tuple(token_ids[start : start + bs])
            h = chain_hash(parent, chunk)
            bid = self._by_hash.get(h)
            if bid is None or self._blocks[bid].tokens != chunk:
                break
            hits.append(bid)
            parent = h
        return hits

    def summary_hashes(self, limit: int, max_depth: int = AFFINITY_DEPTH) -> list[int]:
        """Hashes of cached leading blocks (chain depth < ``max_depth``) for routing:
        blocks in use first, then the most recently freed."""
        used = [b for b in self._blocks if b.ref > 0 and b.hash is not None]
        recent = [self._blocks[i] for i in reversed(self._free)]
        ranked = [b for b in used + recent if b.hash is not None and b.depth < max_depth]
        return [b.hash for b in ranked[:limit] if b.hash is not None]

    # --- allocation ----------------------------------------------------------------------
    def can_allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> bool:
        """Whether the sequence's table can be extended to hold ``upto`` tokens."""
        return self._blocks_needed(seq_id, token_ids, upto) <= len(self._free)

    def _blocks_needed(self, seq_id: str, token_ids: Sequence[int], upto: int) -> int:
        table = self._tables.get(seq_id)
        if table is not None:
            return max(0, self.blocks_for(upto) - len(table))
        hits = self.cached_prefix_blocks(token_ids)
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

    def allocate(self, seq_id: str, token_ids: Sequence[int], upto: int) -> int:
        """Extend the sequence's table to hold ``upto`` tokens. On the first allocation the
        cached prefix is attached; returns the number of tokens it covers."""
        if not self.can_allocate(seq_id, token_ids, upto):
            raise OutOfBlocks(f"{seq_id}: no room for {upto} tokens")
        hit_tokens = 0
        table = self._tables.get(seq_id)
        if table is None:
            table = []
            hits = self.cached_prefix_blocks(token_ids)
            self.stats.prefix_queries += 1
            behind = self._behind(len(hits) * self.block_size)
            table.extend([HOLE] * behind)  # hits behind the window: never read
            for bid in hits[behind:]:
                self._ref(bid)
                table.append(bid)
            hit_tokens = len(hits) * self.block_size
            self.stats.prefix_hit_tokens += hit_tokens
            self._tables[seq_id] = table
        while len(table) < self.blocks_for(upto):
            table.append(self._take_free())
        self._note_usage()
        return hit_tokens

    def commit(self, seq_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Register the sequence's full, computed blocks in the prefix cache; with a
        window, then release the blocks no position from ``num_computed`` on attends to."""
        table = self._tables[seq_id]
        bs = self.block_size
        if self.enable_prefix_cache:
            parent: int | None = None
            for i in range(min(num_computed // bs, len(table))):
                chunk = tuple(token_ids[i * bs : (i + 1) * bs])
                h = chain_hash(parent, chunk)
                parent = h
                if table[i] == HOLE:
                    continue
                block = self._blocks[table[i]]
                if block.hash is None and h not in self._by_hash:
                    block.hash, block.tokens, block.depth = h, chunk, i
                    self._by_hash[h] = block.block_id
            self.stats.cached_blocks = len(self._by_hash)
        if self.window is not None:
            # Position p attends to (p - window, p]: blocks wholly before the first
            # position the next query sees are never read again.
            for i in range(min(self._behind(num_computed), len(table))):
                if table[i] != HOLE:
                    self._unref(table[i])
                    table[i] = HOLE
            self._note_usage()

    def free(self, seq_id: str) -> None:
        """Release the sequence's blocks; full ones stay cached until evicted."""
        for bid in reversed(self._tables.pop(seq_id, [])):
            if bid != HOLE:
                self._unref(bid)
        self._note_usage()

    # --- internals -------------------------------------------------------------------------
    def _ref(self, bid: int) -> None:
        block = self._blocks[bid]
        if block.ref == 0:
            self._free.pop(bid, None)
        block.ref += 1

    def _unref(self, bid: int) -> None:
        block = self._blocks[bid]
        block.ref -= 1
        if block.ref == 0:
            self._free[bid] = None
            if block.hash is None:
                self._free.move_to_end(bid, last=False)  # uncached: reuse first

    def _take_free(self) -> int:
        bid, _ = self._free.popitem(last=False)
        block = self._blocks[bid]
        if block.hash is not None:
            self._by_hash.pop(block.hash, None)
            block.hash, block.tokens = None, ()
            self.stats.evictions += 1
        block.ref = 1
        return bid

    def _note_usage(self) -> None:
        used = self.num_blocks - len(self._free)
        self.stats.used_blocks = used
        self.stats.peak_used_blocks = max(self.stats.peak_used_blocks, used)
        self.stats.cached_blocks = len(self._by_hash)
