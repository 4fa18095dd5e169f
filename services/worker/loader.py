"""Loads a local Hugging Face model folder onto the chosen device (no hub access)."""

from __future__ import annotations

import atexit
import gc
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from services.worker.engine.layout import attention_implementation, attention_layout
from shared.logs import route_transformers_logs


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 on CUDA, unless configured."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_model(
    model_dir: str, device: str = "auto", dtype: str = "auto", quantize: str = "none"
) -> tuple[Any, Any]:
    """Model and tokenizer from a local folder, in eval mode, with SDPA attention where the
    model supports it exactly and eager attention else. A model the engine cannot serve
    exactly is refused here (``UnsupportedModel``), before its weights are read.
    ``quantize="int8"``: its linear layers in int8 (``quantize_int8``)."""
    route_transformers_logs()
    dev = pick_device(device)
    if quantize not in ("none", "int8"):
        raise ValueError(f"unknown quantization {quantize!r}: none or int8")
    if quantize == "int8" and dev.type != "cpu":
        raise ValueError("int8 weights (TW_QUANTIZE=int8) run on the CPU only")
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
    model.eval()
    if quantize == "int8":
        quantize_int8(model)
    return model, tokenizer


def quantize_int8(model: Any) -> None:
    """Every ``nn.Linear`` of ``model`` (the output head among them) replaced in place by
    torch's dynamically quantized one: int8 weights (a scale per tensor), each step's
    activations quantized on the fly, the matrix products in int8 (fbgemm on x86). torch marks ``torch.ao.quantization`` deprecated in
    favour of torchao, whose int8 weight-only CPU path ran 8x slower than this here; the
    warning is silenced, and a torch without it refuses ``TW_QUANTIZE=int8`` at start."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.ao")
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*quantize_per_tensor.*deprecated")
        torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )


def freeze_loaded_objects() -> int:
    """Take what the process has loaded so far out of the garbage collector's scans, and
    return how many objects that was. A model's modules, its tokenizer and the libraries'
    own objects live as long as the process (about 415,000 objects with the tiny model), and
    a full collection scans every one: a pause of 0.2 s on this project's CPU machine, every
    stream of the engine stalled for it, to free nothing. Call once, after loading. They are
    thawed at exit, so that the interpreter's last collection still finalises them (frozen,
    triton's bindings report each of theirs as leaked, at the end of every log)."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    return gc.get_freeze_count()
