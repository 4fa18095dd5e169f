"""Facts about a served model read from its ``config.json`` alone (no transformers), so
that every service agrees on them."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
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


@functools.lru_cache(maxsize=8)
def folder_context(model_dir: str) -> int | None:
    """``served_context`` of a model folder's ``config.json`` (None without one)."""
    path = Path(model_dir) / "config.json"
    if not model_dir or not path.exists():
        return None
    return served_context(json.loads(path.read_text()))


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


# Sampling defaults a generation_config.json may state that the engine does not implement
# (at their neutral value they change nothing): the worker says so at start.
UNAPPLIED_DEFAULTS = ("typical_p", "no_repeat_ngram_size")


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request that leaves a sampling field out gets: the value the model's
    ``generation_config.json`` states (temperature, top_p, top_k, min_p,
    repetition_penalty), else the OpenAI default (as vLLM does; ``do_sample`` is not read:
    a client that wants greedy asks for temperature 0)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    unapplied: tuple[str, ...] = ()  # defaults the file states that no request gets

    @classmethod
    def of_folder(cls, model_dir: str | Path) -> SamplingDefaults:
        path = Path(model_dir) / "generation_config.json"
        if not path.exists():
            return cls()
        stated = json.loads(path.read_text())
        base = cls()
        return cls(
            temperature=float(stated.get("temperature", base.temperature)),
            top_p=float(stated.get("top_p", base.top_p)),
            top_k=int(stated.get("top_k", base.top_k)),
            repetition_penalty=float(stated.get("repetition_penalty", base.repetition_penalty)),
            min_p=float(stated.get("min_p", base.min_p)),
            unapplied=tuple(k for k in UNAPPLIED_DEFAULTS if stated.get(k) not in (None, 1.0, 0.0)),
        )

    def resolve(
        self, temperature: float | None, top_p: float | None, top_k: int | None
    ) -> tuple[float, float, int]:
        return (
            self.temperature if temperature is None else temperature,
            self.top_p if top_p is None else top_p,
            self.top_k if top_k is None else top_k,
        )

    def repetition(self, asked: float | None) -> float:
        return self.repetition_penalty if asked is None else asked

    def min_prob(self, asked: float | None) -> float:
        """The request's ``min_p``, else the model's."""
        return self.min_p if asked is None else asked
