"""The only torch code of the engine: paged KV storage and the forward pass.

KV lives in a pool of fixed-size blocks per layer, ``[num_blocks, block_size, kv_heads,
head_dim]``; a sequence's block table (from the cache manager) says which blocks hold its
tokens, so prefix blocks are shared physically and the KV budget is the pool's size. The pool
is the source of truth: every new key/value is written into its block.

Two ways to hand KV to the model's attention, by the shape of the work:

- **Prefill** (several tokens per row): a small cache object writes the new keys/values into
  their blocks and gathers each row's blocks into a padded batch for SDPA, with an explicit
  4D mask. A batch of fresh prompts (nothing cached before them) skips the gather.
The runner builds the attention masks itself, from the model's ``AttentionLayout``: causal,
bounded below by each layer's sliding window (one mask per layer type when the layers
differ), boolean for SDPA and additive for eager attention. It calls the model's whole
forward (only the last position of each row projected to logits), so whatever the model
does after its LM head (final-logit softcapping) is kept.

- **Decode** (one token per row): gathering every row's whole history on every step cost
  more than the attention itself (CPU, 32 rows of ~150 tokens: ~11% of a step; memory-bound,
  so worst when the machine is busy). Decoding rows therefore also keep a dense copy of their
  KV, ``[slots, kv_heads, capacity, head_dim]`` per layer, that each step appends to in place.
  A row keeps its slot while it decodes; a row that joins is copied from the pool once; rows
  that left free their slots for the next ones. The copy is derived from the pool and never
  larger than it (KV memory stays within twice the budget); rows that would need more are
  gathered from the pool as in prefill.

For plain Llama-family models the decode pass itself runs on the model's weights directly
(``direct.py``: the same operations, bit-identical, without transformers' module calls,
which were most of a small model's decode step). Speculation's verification, a few tokens
per decoding row (its draft), runs over the same dense slots, on the weights directly where
that too is bit-identical and through the model's forward otherwise. It was a prefill over
the gathered pool: two to three decode steps' time on the tiny model, 1.4 to 2 on small,
and the next decode loaded every row from the pool again.

On a GPU, decode passes replay from CUDA graphs (``graphs.py``): rows padded to a bucket,
attention over the slots' whole capacity, padding rows' KV written to a spare block of
the pool.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import torch

from services.worker.engine.alibi import alibi_forward
from services.worker.engine.direct import direct_decoder
from services.worker.engine.graphs import DecodeGraphs, bucket_rows
from services.worker.engine.kv_cache import HOLE
from services.worker.engine.layout import AttentionLayout, UnsupportedModel, attention_layout

# The most tokens a row may bring to a verification through the dense slots (a decode and
# its draft); longer rows go through the model's forward.
MAX_VERIFY_TOKENS = 17


class RunItem(NamedTuple):  # a tuple: immutable and built per row per step, cheaply
    """Tokens ``token_ids`` at positions ``start, start+1, …`` of a sequence with blocks
    ``block_ids``; KV for positions before ``start`` is already in those blocks. For a
    model with several KV layer groups (``ModelRunner.group_windows``), ``block_ids`` holds
    one block table per group.

    ``row_key`` names the sequence across steps (unique per admission of a request), so a
    decoding row can keep its dense KV copy from one step to the next; without it the
    row's KV is gathered from the pool. A key's tokens before ``start`` are always the
    ones it had there before (a rollback moves ``start`` back, never changes them)."""

    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[Any]
    row_key: Hashable | None = None


Pools = tuple[list[torch.Tensor], list[torch.Tensor]]


class _PagedCache:
    """Duck-typed transformers cache for prefill: ``update`` stores new KV into the pool and
    returns every row's full keys/values, padded to a common length."""

    def __init__(
        self,
        pools: Pools,
        group_of: Sequence[int],
        write_blocks: list[torch.Tensor],
        write_offsets: torch.Tensor,
        write_rows: torch.Tensor,
        write_cols: torch.Tensor,
        gather: list[torch.Tensor] | None,
        kv_len: int,
    ) -> None:
        self.k_pool, self.v_pool = pools
        self.group_of = group_of  # layer → its KV group; write_blocks and gather per group
        self.write_blocks, self.write_offsets = write_blocks, write_offsets
        self.write_rows, self.write_cols = write_rows, write_cols
        self.gather = gather  # [rows, blocks_per_row]; None: the new tokens are all there is
        self.kv_len = kv_len

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        group = self.group_of[layer_idx]
        for pool, new in (
            (self.k_pool[layer_idx], key_states),
            (self.v_pool[layer_idx], value_states),
        ):
            # new: [rows, heads, q, dim] → the valid (row, q) tokens into their slots.
            pool[self.write_blocks[group], self.write_offsets] = new[
                self.write_rows, :, self.write_cols
            ]
            if self.gather is None:
                out.append(new)
                continue
            rows, nblk = self.gather[group].shape
            # index_select on a flat index is several times faster than pool[gather] on CPU.
            full = pool.index_select(0, self.gather[group].view(-1))
            full = full.view(rows, nblk * pool.shape[1], pool.shape[2], pool.shape[3])
            out.append(full[:, : self.kv_len].transpose(1, 2))
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len


class _DenseCache:
    """Duck-typed transformers cache for decode: ``update`` writes each row's new token
    into the pool and into the row's dense slot, and returns the dense slots as they are.
    Rows of several new tokens (speculation's verification, rows shorter than the longest
    padded) name each written token's ``rows`` and ``cols``; ``positions`` and the write
    blocks and offsets then are per written token."""

    def __init__(
        self,
        pools: Pools,
        dense: Pools,
        group_of: Sequence[int],
        write_blocks: list[torch.Tensor],
        write_offsets: torch.Tensor,
        positions: torch.Tensor,
        kv_len: int,
        written: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ) -> None:
        self.k_pool, self.v_pool = pools
        self.k_dense, self.v_dense = dense
        self.group_of = group_of  # layer → its KV group; write_blocks per group
        self.write_blocks, self.write_offsets = write_blocks, write_offsets
        self.positions = positions  # [rows]: where row r's new token goes (row r = slot r)
        self.kv_len = kv_len
        if written is None:
            self.rows = torch.arange(len(positions), device=positions.device)
            self.cols: torch.Tensor | None = None
            self.num_rows = len(positions)
        else:
            self.rows, self.cols, self.num_rows = written
        # Where each written token goes, as row numbers of the buffers seen as 2-D (found on
        # first use, shared by every layer): one index_copy_ a buffer, which costs about
        # two thirds of an indexed write by (block, offset) or (row, :, position).
        self._pool_at: dict[int, torch.Tensor] = {}
        self._dense_at: dict[tuple[int, int], torch.Tensor] = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        group = self.group_of[layer_idx]
        for pool, dense, new in (
            (self.k_pool[layer_idx], self.k_dense[layer_idx], key_states),
            (self.v_pool[layer_idx], self.v_dense[layer_idx], value_states),
        ):
            # [tokens, heads, dim]
            token = new[:, :, 0] if self.cols is None else new[self.rows, :, self.cols]
            tokens, heads, dim = token.shape
            pool.view(-1, heads * dim).index_copy_(
                0, self._pool_index(group, pool.shape[1]), token.reshape(tokens, heads * dim)
            )
            dense.view(-1, dim).index_copy_(
                0, self._dense_index(heads, dense.shape[2]), token.reshape(tokens * heads, dim)
            )
            out.append(dense[: self.num_rows, :, : self.kv_len])
        return out[0], out[1]

    def _pool_index(self, group: int, block_size: int) -> torch.Tensor:
        """Each written token's row of the pool seen as ``[blocks * block_size, ...]``."""
        at = self._pool_at.get(group)
        if at is None:
            at = self._pool_at[group] = self.write_blocks[group] * block_size + self.write_offsets
        return at

    def _dense_index(self, heads: int, capacity: int) -> torch.Tensor:
        """Each written token's row, head by head, of the dense slots seen as
        ``[slots * heads * capacity, head_dim]``."""
        at = self._dense_at.get((heads, capacity))
        if at is None:
            head = torch.arange(heads, device=self.rows.device)
            at = (self.rows.unsqueeze(1) * heads + head) * capacity + self.positions.unsqueeze(1)
            at = self._dense_at[(heads, capacity)] = at.view(-1)
        return at

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len


class _ShapeProbe:
    """Duck-typed cache that records the KV shape each layer hands it, ``(kv_heads,
    key_dim, value_dim)``, whatever the config calls them."""

    def __init__(self) -> None:
        self.shapes: dict[int, tuple[int, int, int]] = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.shapes[layer_idx] = (key_states.shape[1], key_states.shape[3], value_states.shape[3])
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _DecodeSlots:
    """Dense per-row KV of the decoding sequences: ``[slots, kv_heads, capacity, head_dim]``
    per layer, slot ``r`` holding positions ``0 … lengths[r]-1`` of sequence ``keys[r]``.
    Never larger than ``limit_tokens`` slot-tokens (the pool's size).

    Each layer's keys and values are views of one zeroed buffer of that size, allocated with
    the pool: a batch that grows never waits on fresh memory. A new buffer per regrowth,
    copied into, cost more than the copy: on 128 rows joining a few a step, regrowths into
    fresh memory took 0.05-0.6 s each on this machine (page faults, on a VM that hands
    freed pages back to its host). Slots lie one after another, so more slots of the same
    capacity extend the views with nothing to move; another capacity lays the held rows
    out again."""

    def __init__(
        self,
        group_of: Sequence[int],
        kv_heads: int,
        head_dim: int,
        block_size: int,
        limit_tokens: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.group_of = group_of  # layer → the KV group whose block table it reads
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.block_size = block_size
        self.limit_tokens = limit_tokens
        # Zeros: stale slots are masked out, but NaN garbage would leak through the value
        # product (0 * NaN).
        n = limit_tokens * kv_heads * head_dim
        self._flat = tuple(
            [torch.zeros(n, dtype=dtype, device=device) for _ in group_of] for _ in range(2)
        )
        self._device = self._flat[0][0].device
        self.release()

    def release(self) -> None:
        """Forget every row (the buffers stay, for the next rows)."""
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slots = self.capacity = 0
        self.keys: list[Hashable | None] = []
        self.lengths: list[int] = []

    def place(
        self,
        items: Sequence[RunItem],
        pools: Pools,
        tables: Callable[[RunItem], Sequence[Sequence[int]]],
    ) -> list[int] | None:
        """Give every item a slot in ``0 … len(items)-1`` holding its KV before ``start`` and
        return each item's slot; None (and nothing held) when the rows don't fit the limit."""
        rows = len(items)
        ends = [it.start + len(it.token_ids) for it in items]  # after this step's tokens
        need = max(ends)
        if self._steady(items, need):
            self.lengths[:rows] = ends
            return list(range(rows))
        size = self._size_for(rows, need, max(len(it.token_ids) for it in items))
        if size is None:
            self.release()
            return None
        slot, kept, loads = self._assign(items)
        self._fit(size, rows, need, [(kept[i], slot[i]) for i in kept])
        if loads:
            picked = [items[i] for i in loads]
            self._load(picked, [slot[i] for i in loads], pools, [tables(it) for it in picked])
        self.keys = [None] * self.slots
        self.lengths = [0] * self.slots
        for i, it in enumerate(items):
            self.keys[slot[i]] = it.row_key
            self.lengths[slot[i]] = ends[i]
        return slot

    def _steady(self, items: Sequence[RunItem], need: int) -> bool:
        """Whether the items are the rows of the last step, in their slots' order, each
        one token further (or back, after a rollback), with room for it: nothing to move,
        load or resize."""
        rows = len(items)
        held = len(self.keys) - self.keys.count(None)
        return (
            held == rows
            and need <= self.capacity
            and self.keys[:rows] == [it.row_key for it in items]
            and all(map(operator.ge, self.lengths, [it.start for it in items]))
        )

    def _size_for(self, rows: int, need: int, width: int = 1) -> tuple[int, int] | None:
        """Slots and capacity for a new buffer, for rows of ``width`` new tokens a step.
        Rows join a few per step while prompts are prefilled, so leave room for half as many
        again. Capacity, on a CPU, for decodes (one token a step): the next block boundary
        past ``need``, or a 32nd more past 32 blocks. SDPA's CPU kernel reads a row's slot
        more slowly the more unused capacity lies between rows (6 layers of 128 rows of 200
        positions, one thread: 7.2 ms with none, 8.1 ms with 8, 9.6 ms with 56), and that
        cost more than the copy of every row a new buffer takes: 128 rows of 128 to 256
        tokens decoded about 6% faster with a block of room than with four. Long rows are
        copied less often: 8 rows of 4,000 took 10 ms to copy and read no slower with 1,000
        of room. Elsewhere, and for rows that verify drafts (several tokens a step): a
        quarter more, at least four blocks (fewer copies, where room was not measured to
        cost)."""
        bs = self.block_size

        def up(n: int) -> int:
            return -(-n // bs) * bs

        by_block = width == 1 and self._device.type == "cpu"
        room = (1 if need < 32 * bs else need // 32) if by_block else max(4 * bs, need // 4)
        slots, cap = max(8, -(-rows * 3 // 2)), up(need + room)
        if slots * cap <= self.limit_tokens:
            return slots, cap
        if rows * up(need) > self.limit_tokens:
            return None
        # Near the limit: the rows with as much of that headroom as fits, capacity first
        # (every row grows each step; rows join only while the batch fills).
        cap = min(cap, self.limit_tokens // rows // bs * bs)
        return min(slots, self.limit_tokens // cap), cap

    def _assign(self, items: Sequence[RunItem]) -> tuple[list[int], dict[int, int], list[int]]:
        """Each item's slot, which items already hold a slot (item → that slot) and which
        must be loaded from the pool. A held slot counts if it has the tokens before the
        item's ``start`` (more, after a rollback: a position's KV depends only on the
        tokens up to it, and the positions past ``start`` are masked until written over);
        held rows keep their slot when it is low enough."""
        rows = len(items)
        where = {key: s for s, key in enumerate(self.keys) if key is not None}
        kept: dict[int, int] = {}
        for i, it in enumerate(items):
            s = where.get(it.row_key)
            if s is not None and self.lengths[s] >= it.start:
                kept[i] = s
        slot = [-1] * rows
        for i, s in kept.items():
            if s < rows:
                slot[i] = s
        taken = set(slot)
        free = iter(s for s in range(rows) if s not in taken)
        loads = []
        for i in range(rows):
            if slot[i] < 0:
                slot[i] = next(free)
                if i not in kept:
                    loads.append(i)
        return slot, kept, loads

    def _fit(
        self,
        size: tuple[int, int],
        rows: int,
        need: int,
        keep: list[tuple[int, int]],
    ) -> None:
        """Make room for ``rows`` slots of ``need`` tokens, carrying the ``keep`` rows from
        their old slot to their new one: in the views held, or in views of ``size`` when
        those are too small."""
        dev = self._device
        moves = [(a, b) for a, b in keep if a != b]
        if rows > self.slots or need > self.capacity:
            slots, cap = size
            if cap == self.capacity:  # more slots: the held ones stay where they are
                self.k, self.v = self._views(slots, cap)
            else:
                self._relayout(slots, cap, keep)
                moves = []
            self.slots, self.capacity = slots, cap
        if moves:
            src = torch.tensor([a for a, _ in moves], device=dev)
            dst = torch.tensor([b for _, b in moves], device=dev)
            for buf in (*self.k, *self.v):
                buf[dst] = buf.index_select(0, src)

    def _views(self, slots: int, cap: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each layer's keys and values as ``[slots, kv_heads, cap, head_dim]`` views of the
        buffers."""
        end = slots * cap * self.kv_heads * self.head_dim
        shape = (slots, self.kv_heads, cap, self.head_dim)
        k, v = ([flat[:end].view(shape) for flat in bufs] for bufs in self._flat)
        return k, v

    def _relayout(self, slots: int, cap: int, keep: list[tuple[int, int]]) -> None:
        """Views of another capacity, the ``keep`` rows' tokens carried from their old slot
        to their new one (taken out of the buffer first: the new views overlap the old)."""
        n = min(cap, self.capacity)
        old = (self.k, self.v)
        self.k, self.v = self._views(slots, cap)
        if not keep:
            return
        src = torch.tensor([a for a, _ in keep], device=self._device)
        dst = torch.tensor([b for _, b in keep], device=self._device)
        for olds, news in zip(old, (self.k, self.v), strict=True):
            for o, b in zip(olds, news, strict=True):
                b[dst, :, :n] = o[:, :, :n].index_select(0, src)

    def _load(
        self,
        items: list[RunItem],
        slots: list[int],
        pools: Pools,
        tables: list[Sequence[Sequence[int]]],
    ) -> None:
        """Copy the items' KV before ``start`` from their pool blocks (``tables``: each
        item's block table per KV group) into their slots."""
        bs = self.block_size
        nblk = max(1, max(-(-it.start // bs) for it in items))
        device = self.k[0].device
        gathers = [
            torch.tensor([_padded(t[g], nblk) for t in tables], dtype=torch.long, device=device)
            for g in range(len(tables[0]))
        ]
        dst = torch.tensor(slots, dtype=torch.long, device=device)
        rows = len(items)
        for pool_list, dense_list in ((pools[0], self.k), (pools[1], self.v)):
            for layer, (pool, dense) in enumerate(zip(pool_list, dense_list, strict=True)):
                blocks = pool.index_select(0, gathers[self.group_of[layer]].view(-1))
                blocks = blocks.view(rows, nblk * bs, self.kv_heads, self.head_dim)
                # Positions past a row's start are stale, but masked and finite.
                dense[dst, :, : nblk * bs] = blocks.transpose(1, 2)


class ModelRunner:
    """Runs a Hugging Face causal LM over paged KV blocks."""

    def __init__(
        self,
        model: Any,
        num_blocks: int,
        block_size: int,
        *,
        budget_bytes: int | None = None,
        cuda_graphs: bool = True,
        pad_products: bool = True,
    ) -> None:
        """A pool of ``num_blocks`` blocks, or of as many as ``budget_bytes`` holds.
        ``cuda_graphs``: replay decode steps from CUDA graphs on a GPU. ``pad_products``:
        pad a direct pass's products to more rows where that is measured faster
        (``direct.py``)."""
        self.model = model
        self.block_size = block_size
        cfg = model.config
        self.layout: AttentionLayout = attention_layout(cfg)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._eager = getattr(cfg, "_attn_implementation", "sdpa") == "eager"
        # Later transformers 5 releases renamed the ``past_key_values`` argument to ``cache``;
        # a cache passed under a name the model ignores would silently be dropped.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._alibi = alibi_forward(model)
        kv_heads, head_dim = self._kv_shape()
        layers = len(self.layout.windows)
        self.kv_heads, self.head_dim = kv_heads, head_dim
        # KV groups (layout.groups): a block holds block_size tokens of one group's layers;
        # layer j of every group shares one pool tensor, each group using its own blocks.
        groups = self.layout.groups
        self.group_windows = tuple(self.layout.group_window(g) for g in groups)
        self._group_of, slot_of = [0] * layers, [0] * layers
        for g, members in enumerate(groups):
            for j, layer in enumerate(members):
                self._group_of[layer], slot_of[layer] = g, j
        per_layer = 2 * kv_heads * head_dim * param.element_size()  # one token, keys and values
        self.block_bytes = per_layer * len(groups[0]) * block_size
        # What a token costs in the layers that keep it for the sequence's life: every layer
        # in one group; the full-attention layers when sliding ones hold only their window.
        kept = [layer for g in groups if self.layout.group_window(g) is None for layer in g]
        self.bytes_per_token = per_layer * (len(kept) if len(groups) > 1 and kept else layers)
        if budget_bytes is not None:
            num_blocks = max(1, budget_bytes // self.block_bytes)
        self.num_blocks = num_blocks
        # One block more than the KV manager hands out: padding rows of a graphed decode
        # write their keys and values there.
        self.spare_block = num_blocks
        shape = (num_blocks + 1, block_size, kv_heads, head_dim)
        # Zeros, not empty: padded slots are masked out, but NaN garbage would leak through
        # the value product (0 * NaN).
        k_slots, v_slots = (
            [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in groups[0]]
            for _ in range(2)
        )
        self.k_pool = [k_slots[slot_of[layer]] for layer in range(layers)]
        self.v_pool = [v_slots[slot_of[layer]] for layer in range(layers)]
        # The dense copies hold every layer's whole history: sized so they never exceed
        # the pool's bytes.
        limit = num_blocks * block_size * len(groups[0]) // layers
        self._slots = _DecodeSlots(
            self._group_of, kv_heads, head_dim, block_size, limit, self.dtype, self.device
        )
        # Decode steps on the weights directly where that reproduces the model exactly.
        self._direct = (
            None if self._alibi is not None else direct_decoder(model, self._run, pad_products)
        )
        use = cuda_graphs and self.device.type == "cuda"
        self._graphs = self.decode_graphs(replay=True) if use else None

    def decode_graphs(self, replay: bool) -> DecodeGraphs:
        """Graphs of this runner's padded decode pass (``replay`` off: run eagerly on the
        same buffers, as on a CPU)."""
        fields = 3 + len(self.group_windows)  # ids, positions, offsets, blocks per group
        return DecodeGraphs(self._padded_pass, fields, self.device, replay=replay)

    @property
    def padded_products(self) -> dict[int, int]:
        """The row counts whose products the direct pass pads, and to how many rows."""
        return dict(self._direct.pad) if self._direct is not None else {}

    @property
    def graph_replays(self) -> int:
        """Decode steps served from a CUDA graph so far."""
        return 0 if self._graphs is None else self._graphs.replays

    def _tables(self, item: RunItem) -> Sequence[Sequence[int]]:
        """The item's block table of each KV group."""
        return item.block_ids if len(self.group_windows) > 1 else (item.block_ids,)

    @torch.inference_mode()
    def _kv_shape(self) -> tuple[int, int]:
        """KV heads and head size, as the layers produce them (one token through the model):
        configs name them differently (Falcon's ``num_kv_heads``, multi-query flags)."""
        probe = _ShapeProbe()
        one = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self._run(one, one, 1, probe, 1)
        layout, shapes = self.layout, set(probe.shapes.values())
        if len(probe.shapes) != len(layout.windows):
            raise UnsupportedModel(
                layout.model_type, f"{len(probe.shapes)} of {len(layout.windows)} layers cache KV"
            )
        if len(shapes) != 1:
            raise UnsupportedModel(layout.model_type, f"layers with different KV shapes {shapes}")
        ((kv_heads, key_dim, value_dim),) = shapes
        if key_dim != value_dim:
            raise UnsupportedModel(layout.model_type, "keys and values of different sizes")
        return kv_heads, key_dim

    def _mask(self, positions: torch.Tensor, kv_len: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Attention masks ``[rows, 1, q, kv_len]`` for queries at ``positions`` (``[rows,
        q]``): column ``c`` is seen iff ``pos - window < c <= pos``. One per layer type when
        the layers' windows differ. Boolean for SDPA; additive for eager attention, which
        adds the mask to the scores."""
        built = self._seen(positions, kv_len)
        for window, seen in built.items():
            if self._eager:
                blocked = torch.finfo(self.dtype).min
                seen = torch.zeros(seen.shape, dtype=self.dtype, device=seen.device).masked_fill(
                    ~seen, blocked
                )
            built[window] = seen
        if not self.layout.by_type:
            return built[self.layout.windows[0]]
        return {
            t: built[w] for t, w in zip(self.layout.layer_types, self.layout.windows, strict=True)
        }

    def _seen(self, positions: torch.Tensor, kv_len: int) -> dict[int | None, torch.Tensor]:
        """For each window of the layout, which columns the queries see (boolean)."""
        cols = torch.arange(kv_len, device=positions.device).view(1, 1, 1, -1)
        pos = positions.view(positions.shape[0], 1, positions.shape[1], 1)
        causal = cols <= pos
        return {
            w: causal if w is None else causal & (cols > pos - w) for w in set(self.layout.windows)
        }

    def forget_rows(self) -> None:
        """Drop the decoding rows' dense KV copies (after a failed pass): each is loaded
        again from the pool, which stays the source of truth."""
        self._slots.release()

    @torch.inference_mode()
    def forward(self, items: Sequence[RunItem], every_position: bool = False) -> torch.Tensor:
        """Logits of the last token of each item, shape ``[len(items), vocab]``; with
        ``every_position``, of each of its tokens, ``[len(items), longest, vocab]`` (rows
        padded at the end: speculation's verification reads one per draft token)."""
        if every_position:
            if all(
                len(it.token_ids) <= MAX_VERIFY_TOKENS and it.row_key is not None for it in items
            ):
                slot = self._slots.place(items, (self.k_pool, self.v_pool), self._tables)
                if slot is not None:
                    return self._verify(items, slot)
            return self._prefill(items, every_position=True)
        if all(len(it.token_ids) == 1 and it.row_key is not None for it in items):
            slot = self._slots.place(items, (self.k_pool, self.v_pool), self._tables)
            if slot is not None:
                return self._decode(items, slot)
        return self._prefill(items)

    def _decode(self, items: Sequence[RunItem], slot: list[int]) -> torch.Tensor:
        """One new token per row, row ``slot[i]`` for item ``i``, attending over the rows'
        dense slots."""
        dev, bs = self.device, self.block_size
        rows = len(items)
        ordered = list(items)  # ordered[s]: the item in slot s
        for it, s in zip(items, slot, strict=True):
            ordered[s] = it
        ids = [it.token_ids[0] for it in ordered]
        pos = [it.start for it in ordered]
        tables = [self._tables(it) for it in ordered]
        blocks = [
            [t[g][p // bs] for t, p in zip(tables, pos, strict=True)]
            for g in range(len(self.group_windows))
        ]
        graphs, cap = self._graphs, self._slots.capacity
        padded = None if graphs is None else bucket_rows(rows, graphs.largest)
        if padded is not None and padded * cap > self._slots.limit_tokens:
            padded = None
        # One host→device copy for all the small index vectors. For a graph, rows past the
        # batch: token 0 at position 0, written to the spare block and to slots no row
        # holds (a slot is loaded in full before a row takes it).
        pad = [0] * ((padded or rows) - rows)
        host = torch.tensor(
            [
                ids + pad,
                pos + pad,
                [p % bs for p in pos] + pad,
                *(b + [self.spare_block] * len(pad) for b in blocks),
            ],
            dtype=torch.long,
        )
        out = None if graphs is None or padded is None else graphs.run(host, cap)
        if out is not None:
            logits = out[:rows].float()
            if logits.data_ptr() == out.data_ptr():  # the graph's own buffer: a copy
                logits = logits.clone()
            return _in_item_order(logits, slot)
        ids_t, pos_t, off_t, *blk_t = host[:, :rows].to(dev).unbind(0)
        kv_len = max(pos) + 1
        cache = self._dense_cache(blk_t, off_t, pos_t, kv_len)
        ids_t, pos_t = ids_t.view(rows, 1), pos_t.view(rows, 1)
        direct = self._direct
        mask = self._mask(pos_t, kv_len) if direct is not None else None
        if direct is not None and isinstance(mask, torch.Tensor):  # one mask for every layer
            logits = direct(ids_t, pos_t, mask, cache)
        else:
            logits = self._run(ids_t, pos_t, kv_len, cache, 1)[:, 0]
        return _in_item_order(logits.float(), slot)

    def _padded_pass(self, inputs: torch.Tensor, cap: int) -> torch.Tensor:
        """The decode of ``inputs`` (``[3 + groups, rows]``: token ids, positions, offsets in
        their blocks, then the block of each KV group; rows past the batch padded) over
        ``rows`` slots of capacity ``cap``, attending over every column up to ``cap``
        (masked past each row's position): the pass a CUDA graph records. On the weights
        directly where the runner decodes so, else through the model's own forward."""
        rows = inputs.shape[1]
        ids, pos, off, *blk = inputs.unbind(0)
        cache = self._dense_cache(blk, off, pos, cap, dense=self._slots._views(rows, cap))
        ids, positions = ids.view(rows, 1), pos.view(rows, 1)
        if self._direct is not None:
            mask = self._mask(positions, cap)
            if isinstance(mask, torch.Tensor):  # one mask for every layer
                return self._direct(ids, positions, mask, cache)
        return self._run(ids, positions, cap, cache, 1)[:, 0]

    def _dense_cache(
        self,
        blocks: list[torch.Tensor],
        offsets: torch.Tensor,
        positions: torch.Tensor,
        kv_len: int,
        written: tuple[torch.Tensor, torch.Tensor, int] | None = None,
        dense: Pools | None = None,
    ) -> _DenseCache:
        """The cache of a pass over the decode slots (see ``_DenseCache``): the slots'
        current views, or ``dense``."""
        return _DenseCache(
            (self.k_pool, self.v_pool),
            dense or (self._slots.k, self._slots.v),
            self._group_of,
            blocks,
            offsets,
            positions,
            kv_len,
            written,
        )

    def _verify(self, items: Sequence[RunItem], slot: list[int]) -> torch.Tensor:
        """A few new tokens per row (a decode and its draft), row ``slot[i]`` for item
        ``i``, attending over the rows' dense slots: logits ``[rows, longest, vocab]`` of
        every position, rows padded at the end."""
        dev, bs = self.device, self.block_size
        rows = len(items)
        order = [0] * rows  # order[s]: the item in slot s
        for i, s in enumerate(slot):
            order[s] = i
        width = max(len(it.token_ids) for it in items)
        ids, pos, w_rows, w_cols, w_pos = [], [], [], [], []
        blocks: list[list[int]] = [[] for _ in self.group_windows]
        for s, i in enumerate(order):
            it = items[i]
            n, start = len(it.token_ids), it.start
            ids.append([*it.token_ids, *[0] * (width - n)])
            pos.append(list(range(start, start + width)))  # padding: masked, never written
            tables = self._tables(it)
            for t in range(n):
                p = start + t
                w_rows.append(s)
                w_cols.append(t)
                w_pos.append(p)
                for g, table in enumerate(tables):
                    blocks[g].append(table[p // bs])
        ids_t = torch.tensor(ids, dtype=torch.long).to(dev)
        pos_t = torch.tensor(pos, dtype=torch.long).to(dev)
        flat = torch.tensor([w_rows, w_cols, w_pos, [p % bs for p in w_pos], *blocks])
        rows_t, cols_t, wpos_t, off_t, *blk_t = flat.to(dev).unbind(0)
        kv_len = max(it.start + len(it.token_ids) for it in items)
        cache = self._dense_cache(blk_t, off_t, wpos_t, kv_len, (rows_t, cols_t, rows))
        direct = self._direct if self._direct is not None and self._direct.verifies else None
        mask = self._mask(pos_t, kv_len) if direct is not None else None
        if direct is not None and isinstance(mask, torch.Tensor):  # one mask for every layer
            logits = direct.rows(ids_t, pos_t, mask, cache).float()
        else:
            logits = self._run(ids_t, pos_t, kv_len, cache, 0).float()
        return _in_item_order(logits, slot)

    def _prefill(self, items: Sequence[RunItem], every_position: bool = False) -> torch.Tensor:
        """Rows of several tokens each (any mix), padded to the longest."""
        dev, bs = self.device, self.block_size
        rows = len(items)
        lens = [len(it.token_ids) for it in items]
        starts = [it.start for it in items]
        q = max(lens)
        kv_len = max(s + n for s, n in zip(starts, lens, strict=True))
        fresh = all(s == 0 for s in starts)
        lens_t = torch.tensor(lens)
        starts_t = torch.tensor(starts)
        cols = torch.arange(q).view(1, -1)
        valid = cols < lens_t.view(-1, 1)
        input_ids = torch.zeros((rows, q), dtype=torch.long)
        input_ids[valid] = torch.tensor([t for it in items for t in it.token_ids], dtype=torch.long)
        # Padding queries repeat the row's last position; their outputs are never used.
        positions = starts_t.view(-1, 1) + torch.minimum(cols, (lens_t - 1).view(-1, 1))
        w_rows, w_cols = valid.nonzero(as_tuple=True)
        w_pos = positions[w_rows, w_cols]
        nblk = -(-kv_len // bs)
        tables = [self._tables(it) for it in items]
        by_group = [
            torch.tensor([_padded(t[g], nblk) for t in tables], dtype=torch.long)
            for g in range(len(self.group_windows))
        ]
        cache = _PagedCache(
            (self.k_pool, self.v_pool),
            self._group_of,
            [table[w_rows, w_pos // bs].to(dev) for table in by_group],
            (w_pos % bs).to(dev),
            w_rows.to(dev),
            w_cols.to(dev),
            None if fresh else [table.to(dev) for table in by_group],
            kv_len,
        )
        if every_position:  # 0: the model's logits at every position
            return self._run(input_ids.to(dev), positions.to(dev), kv_len, cache, 0).float()
        keep = (lens_t - 1).view(rows, 1).to(dev)  # each row's last token
        logits = self._run(input_ids.to(dev), positions.to(dev), kv_len, cache, keep)[:, 0]
        return logits.float()

    def _run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_len: int, cache: Any, keep: Any
    ) -> torch.Tensor:
        """The model's logits ``[rows, kept, vocab]`` for tokens at ``positions`` over KV
        columns ``0 … kv_len-1`` held by ``cache``."""
        if self._alibi is not None:  # no sliding windows there: one mask
            (seen,) = self._seen(positions, kv_len).values()
            return self._alibi(input_ids, positions, seen, cache, keep)
        return self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=self._mask(positions, kv_len),
            **{self._cache_arg: cache},
            use_cache=True,
            logits_to_keep=keep,
        ).logits


def _in_item_order(logits: torch.Tensor, slot: list[int]) -> torch.Tensor:
    """Rows of a pass over the decode slots (row ``s`` is slot ``s``) in the items' order
    (item ``i`` sat in ``slot[i]``)."""
    if slot == sorted(slot):  # every item in the slot of its own index: rows in order
        return logits
    return logits[torch.tensor(slot, device=logits.device)]


def _padded(block_ids: Sequence[int], n: int) -> list[int]:
    """The first ``n`` entries of a block table, padded with block 0, holes (blocks
    released behind a sliding window) read as block 0: what is read there is masked."""
    head = [0 if b == HOLE else b for b in block_ids[:n]]
    return head + [0] * (n - len(head))
