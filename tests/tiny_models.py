"""Random-weight tiny models of every architecture the engine serves, built offline from
their transformers config classes (2-3 layers, hidden 64) with the embedded default
model's tokenizer, and saved as a model folder that loads through the real
``from_pretrained`` path. Windows of 16 tokens, so short prompts already pass them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.falcon import modeling_falcon

WINDOW = 16
VOCAB = 4096  # the default model's tokenizer
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class Arch:
    """One row of the matrix: a model type with config overrides, the KV layout its layers
    must produce (heads, head size, layers) and the windows its layers must get."""

    model_type: str
    kv: tuple[int, int, int]
    windows: tuple[int | None, ...]
    config: dict[str, Any] = field(default_factory=dict)
    context: int = 512  # the context the engine serves it at
    note: str = ""


FULL2 = (None, None)
# Falcon's new decoder caches its KV groups as they are in the transformers releases whose
# attention repeats them at attention time (``repeat_kv``); earlier ones cache every head.
_FALCON_CACHES_GROUPS = hasattr(modeling_falcon, "repeat_kv")
ARCHS: dict[str, Arch] = {
    "llama": Arch("llama", (2, 16, 2), FULL2, {"num_key_value_heads": 2}),
    "llama-rope-llama3": Arch(
        "llama",
        (2, 16, 2),
        FULL2,
        {
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama-rope-linear": Arch(
        "llama",
        (4, 16, 2),
        FULL2,
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    ),
    "llama-rope-yarn": Arch(
        "llama",
        (4, 16, 2),
        FULL2,
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
            }
        },
    ),
    "llama-rope-dynamic": Arch(
        "llama",
        (4, 16, 2),
        FULL2,
        {
            "rope_parameters": {
                "rope_type": "dynamic",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 128,
            }
        },
        context=128,
        note="served up to its original context",
    ),
    "mistral": Arch(
        "mistral", (2, 16, 2), FULL2, {"num_key_value_heads": 2, "sliding_window": None}
    ),
    "mistral-window": Arch(
        "mistral",
        (2, 16, 2),
        (WINDOW, WINDOW),
        {"num_key_value_heads": 2, "sliding_window": WINDOW},
    ),
    "mixtral-window": Arch(
        "mixtral",
        (2, 16, 2),
        (WINDOW, WINDOW),
        {
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
        },
    ),
    "qwen2": Arch("qwen2", (2, 16, 2), FULL2, {"num_key_value_heads": 2}),
    "qwen2-sliding-layers": Arch(
        "qwen2",
        (2, 16, 3),
        (None, WINDOW, WINDOW),
        {
            "num_key_value_heads": 2,
            "num_hidden_layers": 3,
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 1,
        },
    ),
    "qwen2_moe": Arch(
        "qwen2_moe",
        (2, 16, 2),
        FULL2,
        {
            "num_key_value_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
        },
    ),
    "qwen3": Arch("qwen3", (2, 16, 2), FULL2, {"num_key_value_heads": 2, "head_dim": 16}),
    "gemma": Arch("gemma", (1, 16, 2), FULL2, {"num_key_value_heads": 1, "head_dim": 16}),
    "gemma2": Arch(
        "gemma2",
        (2, 16, 2),
        (WINDOW, None),
        {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": WINDOW},
        note="eager attention (logit softcapping)",
    ),
    "gemma3_text": Arch(
        "gemma3_text",
        (2, 16, 3),
        (WINDOW, None, WINDOW),
        {
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_hidden_layers": 3,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
    "phi3": Arch("phi3", (2, 16, 2), FULL2, {"num_key_value_heads": 2}),
    "phi3-longrope": Arch(
        "phi3",
        (2, 16, 2),
        FULL2,
        {
            "num_key_value_heads": 2,
            "original_max_position_embeddings": 128,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "long_factor": [1.0 + i / 4 for i in range(8)],
                "short_factor": [1.0] * 8,
                "original_max_position_embeddings": 128,
            },
        },
        context=128,
        note="served up to its original context",
    ),
    "gpt2": Arch(
        "gpt2", (4, 16, 2), FULL2, {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512}
    ),
    "gpt_neox": Arch("gpt_neox", (4, 16, 2), FULL2),
    "opt": Arch("opt", (4, 16, 2), FULL2, {"ffn_dim": 128, "word_embed_proj_dim": 64}),
    "falcon": Arch(
        "falcon",
        (1, 16, 2),
        FULL2,
        {"new_decoder_architecture": False, "multi_query": True, "alibi": False},
        note="multi-query: one KV head",
    ),
    "falcon-new-decoder": Arch(
        "falcon",
        (2 if _FALCON_CACHES_GROUPS else 4, 16, 2),
        FULL2,
        {"new_decoder_architecture": True, "num_kv_heads": 2, "alibi": False},
        note="two KV groups" if _FALCON_CACHES_GROUPS else "KV groups expanded to every head",
    ),
    "falcon-alibi": Arch(
        "falcon",
        (1, 16, 2),
        FULL2,
        {"new_decoder_architecture": False, "multi_query": True, "alibi": True},
        note="alibi biases built by the runner",
    ),
    "bloom": Arch(
        "bloom",
        (4, 16, 2),
        FULL2,
        {"n_layer": 2, "n_head": 4},
        context=1 << 30,
        note="alibi, eager attention; no position limit (the KV budget bounds a request)",
    ),
    "olmoe": Arch("olmoe", (4, 16, 2), FULL2, {"num_experts": 4, "num_experts_per_tok": 2}),
}

# Configs the engine must refuse at load, with the feature its message names.
REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    "mpt": ("mpt", {"n_layers": 2, "n_heads": 4, "d_model": 64}, "outside the tested matrix"),
    "qwen2-unknown-layer-type": (
        "qwen2",
        {"num_hidden_layers": 2, "layer_types": ["full_attention", "chunked_attention"]},
        "layer types",
    ),
}


def tiny_config(model_type: str, overrides: dict[str, Any]) -> Any:
    kw = {**COMMON, **overrides}
    if model_type in ("gpt2", "bloom"):
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            kw.pop(key, None)
        kw.pop("max_position_embeddings", None)
    return AutoConfig.for_model(model_type, **kw)


def build_tiny(name: str, folder: Path, tokenizer_dir: str, *, seed: int = 0) -> Path:
    """The model folder of matrix row ``name`` (built once per folder)."""
    if (folder / "config.json").exists():
        return folder
    arch = ARCHS[name]
    config = tiny_config(arch.model_type, arch.config)
    return save_tiny(config, folder, tokenizer_dir, seed=seed)


def save_tiny(config: Any, folder: Path, tokenizer_dir: str, *, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Random init gives near-uniform logits; wider weights make greedy picks clear-cut.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = 0
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder
