"""What the runner must know of a model's attention to serve it exactly, read from its
config (no torch): each layer's attention window, the attention implementation to load it
with, the context it can be served at, and what is refused.

The runner builds its own masks and hands its own KV to the model, so everything the
model's own mask code would have done (sliding windows, per-layer window types) is done
here, and anything it cannot reproduce exactly is refused at load, naming the model type
and the feature: wrong tokens are never served.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shared.model_config import served_context

FULL = "full_attention"
SLIDING = "sliding_attention"

# The architectures the engine is checked against (tests/unit/test_model_matrix.py): greedy
# tokens identical to ``generate``, logits equal to one plain forward pass.
SUPPORTED: dict[str, str] = {
    "llama": "Llama 2/3 (rope scaling: linear, llama3, yarn; dynamic up to its original context)",
    "mistral": "Mistral (sliding window or none)",
    "mixtral": "Mixtral (mixture of experts, sliding window or none)",
    "qwen2": "Qwen 2 / 2.5 (sliding layers or none)",
    "qwen2_moe": "Qwen 2 MoE",
    "qwen3": "Qwen 3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2 (interleaved sliding layers, attention and final-logit softcapping)",
    "gemma3_text": "Gemma 3 text (interleaved sliding layers, per-type rope)",
    "phi3": "Phi-3 (longrope up to its original context)",
    "gpt2": "GPT-2 (learned positions)",
    "gpt_neox": "GPT-NeoX / Pythia",
    "opt": "OPT (learned positions)",
    "falcon": "Falcon (rotary or alibi)",
    "bloom": "BLOOM (alibi)",
    "olmoe": "OLMoE",
}


class UnsupportedModel(ValueError):
    """The model cannot be served exactly; raised at load."""

    def __init__(self, model_type: str, feature: str) -> None:
        super().__init__(
            f"model type {model_type!r}: {feature}; refusing to serve it rather than serve "
            f"wrong tokens (supported: {', '.join(sorted(SUPPORTED))})"
        )
        self.model_type, self.feature = model_type, feature


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """``windows[i]``: how many positions (itself included) layer ``i`` attends to, None
    for all of them. ``by_type``: the layers differ, so the model takes one mask per
    layer type (``layer_types[i]`` names layer ``i``'s)."""

    model_type: str
    layer_types: tuple[str, ...]
    windows: tuple[int | None, ...]
    context: int

    @property
    def by_type(self) -> bool:
        return len(set(self.windows)) > 1

    @property
    def max_window(self) -> int | None:
        """The longest window of any layer; None when a layer attends to everything."""
        return None if None in self.windows else max(w for w in self.windows if w is not None)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The layers in KV groups of equal size, each group's layers of one window: all
        layers in one group when they share a window; else, per window, its layers in runs
        of the greatest common divisor of the windows' layer counts (Gemma 2, one sliding
        layer per full one: two groups of half the layers). Each group keeps its own block
        tables in one shared pool, so a sliding group holds a window of blocks."""
        by_window: dict[int | None, list[int]] = {}
        for layer, w in enumerate(self.windows):
            by_window.setdefault(w, []).append(layer)
        size = math.gcd(*(len(ls) for ls in by_window.values()))
        return tuple(
            tuple(ls[i : i + size]) for ls in by_window.values() for i in range(0, len(ls), size)
        )

    def group_window(self, group: tuple[int, ...]) -> int | None:
        return self.windows[group[0]]


def attention_implementation(config: Any, supports_sdpa: bool) -> str:
    """The attention implementation to load a model with: SDPA where the model supports it
    and nothing it computes is lost there (SDPA has no logit softcapping), eager else."""
    if getattr(config, "attn_logit_softcapping", None) is not None or not supports_sdpa:
        return "eager"
    return "sdpa"


def attention_layout(config: Any) -> AttentionLayout:
    """The layout of a loaded model's config (a transformers ``PretrainedConfig``);
    raises ``UnsupportedModel`` for anything the runner cannot serve exactly."""
    model_type = str(getattr(config, "model_type", "?"))
    if model_type not in SUPPORTED:
        raise UnsupportedModel(model_type, "an architecture outside the tested matrix")
    refuse = _refusal(config)
    if refuse:
        raise UnsupportedModel(model_type, refuse)
    layers = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    declared = getattr(config, "layer_types", None)
    if declared is not None:
        types = tuple(str(t) for t in declared)[:layers]
    else:  # no per-layer types: the window, when set, applies to every layer
        types = (SLIDING if window else FULL,) * layers
    unknown = sorted({t for t in types} - {FULL, SLIDING})
    if unknown:
        raise UnsupportedModel(model_type, f"layer types {unknown}")
    if SLIDING in types and not window:
        raise UnsupportedModel(model_type, "sliding layers without a window size")
    windows = tuple(int(window) if t == SLIDING and window else None for t in types)
    return AttentionLayout(model_type, types, windows, served_context(config.to_dict()) or 1 << 30)


def _refusal(config: Any) -> str | None:
    """A feature of the config the runner cannot reproduce, or None."""
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (None, "sdpa", "eager"):
        return f"attention implementation {impl!r} (the runner passes its own masks: sdpa or eager)"
    if impl == "sdpa" and getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logit softcapping under SDPA (load it with eager attention)"
    return None
