"""Facts about a served model read from its ``config.json`` alone (no transformers), so
that every service agrees on them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Rope variants whose frequencies depend on the longest position in the forward pass, so
# a row's result would depend on its batch neighbours past the original context: served
# up to that context only, where they equal the unscaled rope.
BATCH_DEPENDENT_ROPE = ("dynamic", "longrope")


def served_context(config: Mapping[str, Any]) -> int | None:
    """The longest context served exactly, from a config as a dict (``config.json``): the
    model's own, or the original one for rope variants that change with the batch; None
    when the config names none."""
    declared = config.get("max_position_embeddings") or config.get("n_positions")
    context = int(declared) if declared else None
    for rope in _rope_parameters(config):
        if rope.get("rope_type", rope.get("type")) in BATCH_DEPENDENT_ROPE:
            original = rope.get("original_max_position_embeddings") or config.get(
                "original_max_position_embeddings"
            )
            if original:
                context = min(context or int(original), int(original))
    return context


def _rope_parameters(config: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every rope parameter set a config declares (one, or one per layer type)."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if not isinstance(rope, Mapping):
            continue
        if all(isinstance(v, Mapping) for v in rope.values()) and rope:
            yield from rope.values()
        else:
            yield rope
