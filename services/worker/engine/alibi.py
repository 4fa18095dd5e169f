"""Alibi models (Falcon with ``alibi=True``, BLOOM) through the runner's masks and caches.

Their forward builds the alibi biases from a 2D padding mask and folds them into the
attention mask; the runner's masks are 4D (each row of a mixed batch at its own
positions), which those forwards cannot take. For them the runner runs the decoder itself,
with the model's own modules and its own ``build_alibi_tensor``: biases over the key
columns ``0 … kv_len-1`` (the runner's KV columns are positions, as in a plain forward
pass), combined with the runner's mask exactly as the model's forward combines them with
its own. The matrix test holds these to a plain forward pass, so a transformers release
that changes either forward fails there, not in production.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from transformers.modeling_utils import slice_logits_to_keep

# (input_ids, position_ids, seen [rows, 1, q, kv_len] bool, cache, logits_to_keep) → logits
AlibiForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any, Any], torch.Tensor]


def alibi_forward(model: Any) -> AlibiForward | None:
    """The runner's forward for an alibi model, None for any other."""
    config = model.config
    if config.model_type == "falcon" and getattr(config, "alibi", False):
        return partial(_falcon, model)
    if config.model_type == "bloom":
        return partial(_bloom, model)
    return None


def _biases(body: Any, rows: int, kv_len: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """The model's own alibi tensor ``[rows * heads, 1, kv_len]`` for unpadded rows."""
    build = getattr(body, "build_alibi_tensor", None)
    if build is None:  # Falcon: a module-level function
        build = sys.modules[type(body).__module__].build_alibi_tensor
    ones = torch.ones((rows, kv_len), dtype=torch.long, device=device)
    return build(ones, body.num_heads, dtype)


def _additive(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    blocked = torch.finfo(dtype).min
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(~seen, blocked)


def _head(model: Any, hidden: torch.Tensor, logits_to_keep: Any) -> torch.Tensor:
    return model.lm_head(slice_logits_to_keep(hidden, logits_to_keep))


def _falcon(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    seen: torch.Tensor,
    cache: Any,
    logits_to_keep: Any,
) -> torch.Tensor:
    body = model.transformer
    hidden = body.word_embeddings(input_ids)
    rows, kv_len = input_ids.shape[0], seen.shape[-1]
    alibi = _biases(body, rows, kv_len, hidden.dtype, hidden.device)
    # FalconModel.forward: the scaled biases are the mask, blocked where the mask blocks.
    scale = math.sqrt(model.config.hidden_size // body.num_heads)
    mask = (alibi.reshape(rows, -1, 1, kv_len) / scale).masked_fill(
        ~seen, torch.finfo(hidden.dtype).min
    )
    for block in body.h:
        hidden = block(
            hidden,
            alibi=alibi,
            attention_mask=mask,
            position_ids=position_ids,
            layer_past=cache,
            use_cache=True,
            position_embeddings=None,
        )[0]
    return _head(model, body.ln_f(hidden), logits_to_keep)


def _bloom(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    seen: torch.Tensor,
    cache: Any,
    logits_to_keep: Any,
) -> torch.Tensor:
    body = model.transformer
    hidden = body.word_embeddings_layernorm(body.word_embeddings(input_ids))
    rows, kv_len = input_ids.shape[0], seen.shape[-1]
    alibi = _biases(body, rows, kv_len, hidden.dtype, hidden.device)
    mask = _additive(seen, hidden.dtype)  # BLOOM adds the mask to the biased scores
    for block in body.h:
        hidden = block(hidden, alibi=alibi, attention_mask=mask, layer_past=cache, use_cache=True)[
            0
        ]
    return _head(model, body.ln_f(hidden), logits_to_keep)
