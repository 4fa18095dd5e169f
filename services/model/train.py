"""Model construction and a small, deterministic causal-LM training loop for CPU."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from services.model.presets import ModelPreset


def make_config(preset: ModelPreset, eot_id: int) -> LlamaConfig:
    """Return the ``LlamaConfig`` for ``preset``; ``eot_id`` is bos, eos and pad."""
    return LlamaConfig(
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        max_position_embeddings=preset.max_positions,
        rms_norm_eps=1e-5,
        # transformers 5 keeps rope_theta inside `rope_parameters`.
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        tie_word_embeddings=True,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        # transformers 5 renamed `torch_dtype` to `dtype`; float32 is what CPU serving wants.
        dtype="float32",
    )


def make_model(preset: ModelPreset, eot_id: int) -> LlamaForCausalLM:
    """Build a seeded, randomly initialised model for ``preset`` (float32, SDPA attention)."""
    config = make_config(preset, eot_id)
    config._attn_implementation = "sdpa"  # what from_pretrained also picks by default
    torch.manual_seed(preset.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id
    )
    model.eval()
    return model


def parameter_count(model: torch.nn.Module) -> int:
    """Count distinct parameters (tied embeddings once)."""
    return sum(p.numel() for p in model.parameters())  # .parameters() de-duplicates ties


def pack_documents(
    docs: Sequence[str], tokenizer: Tokenizer, seq_len: int, eot_id: int
) -> torch.Tensor:
    """Tokenize ``docs``, join them with ``<|endoftext|>`` and cut into ``seq_len`` rows.

    A separator precedes every document, so the model learns that a document starts after
    ``<|endoftext|>`` and ends with it. The ragged tail is dropped.
    """
    flat: list[int] = []
    for encoding in tokenizer.encode_batch(list(docs), add_special_tokens=False):
        flat.append(eot_id)
        flat.extend(encoding.ids)
    rows = len(flat) // seq_len
    if rows == 0:
        raise ValueError(f"corpus too small: {len(flat)} tokens for one {seq_len}-token row")
    return torch.tensor(flat[: rows * seq_len], dtype=torch.long).view(rows, seq_len)


@contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (the caller may be a server)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def available_cpus() -> int:
    """CPUs this process may run on (respects affinity masks, unlike ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train`: per-step losses and the wall time spent."""

    losses: list[float]
    seconds: float

    @property
    def final_loss(self) -> float:
        """Mean loss of the last 10 steps: less noisy than the very last batch."""
        tail = self.losses[-10:]
        return sum(tail) / len(tail)


def _loss(model: torch.nn.Module, batch: torch.Tensor, teacher: torch.nn.Module | None) -> Any:
    if teacher is None:
        return model(input_ids=batch, labels=batch).loss
    with torch.no_grad():
        target = F.log_softmax(teacher(input_ids=batch).logits.float(), dim=-1)
    ours = F.log_softmax(model(input_ids=batch).logits.float(), dim=-1)
    return F.kl_div(
        ours.flatten(0, 1), target.flatten(0, 1), log_target=True, reduction="batchmean"
    )


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(
    model: LlamaForCausalLM,
    data: torch.Tensor,
    preset: ModelPreset,
    log: Callable[[str], None],
    *,
    threads: int | None = None,
    teacher: torch.nn.Module | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``preset.train_steps`` steps on the packed rows ``data``:
    on the next token of each position, or with ``teacher`` on the teacher's whole
    next-token distribution there (the KL divergence from it: distillation, which teaches
    a small model to guess what the teacher would say rather than what the text says).

    A fixed step count (not a time limit) and a seeded batch order keep the result the same
    from run to run on a given machine and thread count.
    """
    generator = torch.Generator().manual_seed(preset.seed)
    torch.manual_seed(preset.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms: decaying them hurts
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=preset.learning_rate,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _lr_factor(step, preset.warmup_steps, preset.train_steps)
    )
    every = max(1, preset.train_steps // 10)
    losses: list[float] = []
    order = torch.randperm(data.size(0), generator=generator)
    cursor = 0
    started = time.perf_counter()
    model.train()
    with cpu_threads(threads or available_cpus()):
        for step in range(preset.train_steps):
            if cursor + preset.batch_size > order.numel():  # next epoch, new shuffle
                order = torch.randperm(data.size(0), generator=generator)
                cursor = 0
            batch = data[order[cursor : cursor + preset.batch_size]]
            cursor += preset.batch_size
            loss = _loss(model, batch, teacher)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            if (step + 1) % every == 0 or step == 0:
                elapsed = time.perf_counter() - started
                log(
                    f"  step {step + 1:4d}/{preset.train_steps}  loss {losses[-1]:.3f}  "
                    f"lr {scheduler.get_last_lr()[0]:.2e}  {elapsed:5.1f}s"
                )
    model.eval()
    return TrainResult(losses=losses, seconds=time.perf_counter() - started)
