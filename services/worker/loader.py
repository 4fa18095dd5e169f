"""Loads a local Hugging Face model folder onto the chosen device (no hub access)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


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
    """Model and tokenizer from a local folder, with SDPA attention, in eval mode."""
    dev = pick_device(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=pick_dtype(dtype, dev),
        attn_implementation="sdpa",
        local_files_only=True,
    )
    model.to(dev)  # type: ignore[arg-type]
    return model.eval(), tokenizer
