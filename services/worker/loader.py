"""Loads a local Hugging Face model folder onto the chosen device (no hub access)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from services.worker.engine.layout import attention_implementation, attention_layout


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 on CUDA, unless configured."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_model(model_dir: str, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any]:
    """Model and tokenizer from a local folder, in eval mode, with SDPA attention where the
    model supports it exactly and eager attention else. A model the engine cannot serve
    exactly is refused here (``UnsupportedModel``), before its weights are read."""
    dev = pick_device(device)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    attention_layout(config)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    supports_sdpa = bool(getattr(model_class, "_supports_sdpa", False))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=pick_dtype(dtype, dev),
        attn_implementation=attention_implementation(config, supports_sdpa),
        local_files_only=True,
    )
    model.to(dev)  # type: ignore[arg-type]
    return model.eval(), tokenizer
