"""Chained hashes of full blocks of token ids: the prefix cache's keys, and what workers
advertise and batchers match for prefix-affinity routing (deterministic across processes).

The two sides hash alike only when they cut prompts into the same blocks and look as deep:
both read the block size from the same setting (``FleetSettings.block_size``, default
``BLOCK_SIZE``) and the depth from ``AFFINITY_DEPTH``. Each worker's heartbeat carries
both, and a batcher refuses to route to a worker whose values differ from its own."""

from __future__ import annotations

from collections.abc import Sequence

BLOCK_SIZE = 16  # tokens per KV block: the default of TW_BLOCK_SIZE
AFFINITY_DEPTH = 4  # leading blocks a worker advertises and a batcher hashes for routing


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """Hash of a full block given its parent block's hash."""
    return hash((parent if parent is not None else -1, tuple(tokens)))


def block_hashes(
    token_ids: Sequence[int], block_size: int, max_blocks: int | None = None
) -> list[int]:
    """Hashes of the leading full blocks of ``token_ids`` (at most ``max_blocks``)."""
    out: list[int] = []
    parent: int | None = None
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    for i in range(n):
        parent = chain_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
