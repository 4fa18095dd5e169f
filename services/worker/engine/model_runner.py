"""The only torch code of the engine: paged KV storage and the forward pass.

KV lives in a pool of fixed-size blocks per layer, ``[num_blocks, block_size, kv_heads,
head_dim]``; a sequence's block table (from the cache manager) says which blocks hold its
tokens, so prefix blocks are shared physically and the KV budget is the pool's size. For a
forward pass, a small cache object writes the new keys/values into their blocks and gathers
each sequence's blocks into a padded batch for SDPA, with an explicit 4D mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class RunItem:
    """Tokens ``token_ids`` at positions ``start, start+1, …`` of a sequence with blocks
    ``block_ids``; KV for positions before ``start`` is already in those blocks."""

    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]


class _PagedCache:
    """Duck-typed transformers cache: ``update`` stores new KV into the pool and returns
    every row's full keys/values, padded to a common length."""

    def __init__(
        self,
        pools: tuple[list[torch.Tensor], list[torch.Tensor]],
        write_blocks: torch.Tensor,
        write_offsets: torch.Tensor,
        write_rows: torch.Tensor,
        write_cols: torch.Tensor,
        gather: torch.Tensor,
        kv_len: int,
    ) -> None:
        self.k_pool, self.v_pool = pools
        self.write_blocks, self.write_offsets = write_blocks, write_offsets
        self.write_rows, self.write_cols = write_rows, write_cols
        self.gather = gather  # [rows, blocks_per_row]
        self.kv_len = kv_len

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for pool, new in (
            (self.k_pool[layer_idx], key_states),
            (self.v_pool[layer_idx], value_states),
        ):
            # new: [rows, heads, q, dim] → the valid (row, q) tokens into their slots.
            pool[self.write_blocks, self.write_offsets] = new[self.write_rows, :, self.write_cols]
            rows, nblk = self.gather.shape
            full = pool[self.gather].view(rows, nblk * pool.shape[1], pool.shape[2], pool.shape[3])
            out.append(full[:, : self.kv_len].transpose(1, 2))
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len


class ModelRunner:
    """Runs a Hugging Face causal LM over paged KV blocks."""

    def __init__(self, model: Any, num_blocks: int, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        cfg = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        shape = (num_blocks, block_size, kv_heads, head_dim)
        # Zeros, not empty: padded slots are masked out, but NaN garbage would leak through
        # the value product (0 * NaN).
        self.k_pool = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.v_pool = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.bytes_per_token = (
            2 * cfg.num_hidden_layers * kv_heads * head_dim * param.element_size()
        )
        self._decoder = model.get_decoder()
        self._lm_head = model.get_output_embeddings()

    @torch.inference_mode()
    def forward(self, items: Sequence[RunItem]) -> torch.Tensor:
        """Logits of the last token of each item, shape ``[len(items), vocab]``."""
        dev, bs = self.device, self.block_size
        q = max(len(it.token_ids) for it in items)
        rows = len(items)
        input_ids = torch.zeros((rows, q), dtype=torch.long)
        positions = torch.zeros((rows, q), dtype=torch.long)
        kv_len = max(it.start + len(it.token_ids) for it in items)
        nblk = -(-kv_len // bs)
        gather = torch.zeros((rows, nblk), dtype=torch.long)
        w_blocks, w_offs, w_rows, w_cols = [], [], [], []
        for r, it in enumerate(items):
            n = len(it.token_ids)
            input_ids[r, :n] = torch.tensor(it.token_ids)
            positions[r, :n] = torch.arange(it.start, it.start + n)
            positions[r, n:] = it.start + n - 1
            gather[r, : len(it.block_ids)] = torch.tensor(it.block_ids[:nblk])
            for j in range(n):
                p = it.start + j
                w_blocks.append(it.block_ids[p // bs])
                w_offs.append(p % bs)
                w_rows.append(r)
                w_cols.append(j)
        # mask[r, 0, j, c]: query j of row r sees column c iff c <= its position.
        cols = torch.arange(kv_len)
        mask = cols.view(1, 1, 1, -1) <= positions.view(rows, 1, q, 1)
        cache = _PagedCache(
            (self.k_pool, self.v_pool),
            torch.tensor(w_blocks, device=dev),
            torch.tensor(w_offs, device=dev),
            torch.tensor(w_rows, device=dev),
            torch.tensor(w_cols, device=dev),
            gather.to(dev),
            kv_len,
        )
        hidden = self._decoder(
            input_ids=input_ids.to(dev),
            position_ids=positions.to(dev),
            attention_mask=mask.to(dev),
            cache=cache,
            use_cache=True,
        ).last_hidden_state
        last = torch.tensor([len(it.token_ids) - 1 for it in items], device=dev)
        h = hidden[torch.arange(rows, device=dev), last]
        return self._lm_head(h).float()
