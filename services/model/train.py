"""Model construction and a small, deterministic causal-LM training loop for CPU."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    """Outcome of :func:`train`: per-step losses, the wall time spent and, where copy rows
    were trained, the share of their predictable tokens copied right at each step."""

    losses: list[float]
    seconds: float
    copied: list[float] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        """Mean loss of the last 10 steps: less noisy than the very last batch."""
        return _tail_mean(self.losses, 10)

    @property
    def final_copied(self) -> float | None:
        """Mean copy accuracy of the last ``COPY_WINDOW`` steps, if copy rows were trained."""
        return _tail_mean(self.copied, COPY_WINDOW) if self.copied else None


def _tail_mean(values: Sequence[float], count: int) -> float:
    """The mean of the last ``count`` values (of all of them while there are fewer)."""
    tail = values[-count:]
    return sum(tail) / len(tail)


def _update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loss: torch.Tensor,
) -> None:
    """One optimizer step on ``loss``, its gradient clipped to norm 1."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()


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
    copy_rows: int = 0,
) -> TrainResult:
    """Train ``model`` in place for ``preset.train_steps`` steps on the packed rows ``data``:
    on the next token of each position, or with ``teacher`` on the teacher's whole
    next-token distribution there (the KL divergence from it: distillation, which teaches
    a small model to guess what the teacher would say rather than what the text says).

    ``copy_rows``: that many ``copy_batch`` rows join each step, their loss added to the
    corpus's, so copying learned in a copy phase is kept while the corpus is learned.

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
    copying = torch.Generator().manual_seed(preset.seed + 1)  # leaves the corpus order as is
    copied: list[float] = []
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
            corpus = loss = _loss(model, batch, teacher)
            if copy_rows:
                rows, known = copy_batch(copying, copy_rows, preset.seq_len, preset.vocab_size)
                extra, accuracy = copy_loss(model, rows, known)
                loss = corpus + extra
                copied.append(accuracy)
            _update(model, optimizer, scheduler, loss)
            losses.append(float(corpus.detach()))  # the corpus's alone: comparable
            if (step + 1) % every == 0 or step == 0:
                elapsed = time.perf_counter() - started
                kept = f"  copied {_tail_mean(copied, every):.0%}" if copied else ""
                log(
                    f"  step {step + 1:4d}/{preset.train_steps}  loss {losses[-1]:.3f}  "
                    f"lr {scheduler.get_last_lr()[0]:.2e}{kept}  {elapsed:5.1f}s"
                )
    model.eval()
    return TrainResult(losses=losses, seconds=time.perf_counter() - started, copied=copied)


# The copy phase (``train_copy``): rows of random tokens in which one run repeats to the end.
COPY_BATCH = 32
COPY_SEQ_LEN = 128
COPY_RUN = (8, 40)  # shortest and longest repeated run
COPY_LEARNING_RATE = 1e-3  # at small's width 3e-3 stayed on the plateau for 1,850 steps
COPY_WARMUP = 50
COPY_WINDOW = 50  # steps whose copy accuracy decides that the phase is done
COPY_DONE = 0.9
COPY_KEEP_ROWS = 4  # copy rows beside each corpus batch afterwards, so copying stays


def copy_batch(
    generator: torch.Generator, batch: int, seq_len: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of random tokens (ids 1 and up) in which a run of ``COPY_RUN`` tokens repeats
    to the row's end, and where the next token is known from what came before: only
    copying the run predicts it, so nothing else lowers the loss there."""
    rows = torch.randint(1, vocab, (batch, seq_len), generator=generator)
    known = torch.zeros(batch, seq_len, dtype=torch.bool)
    lengths = torch.randint(COPY_RUN[0], COPY_RUN[1] + 1, (batch,), generator=generator)
    starts = torch.randint(0, 9, (batch,), generator=generator)
    for i in range(batch):
        _repeat_to_end(rows[i], known[i], int(starts[i]), int(lengths[i]))
    return rows, known


def _repeat_to_end(row: torch.Tensor, known: torch.Tensor, start: int, length: int) -> None:
    """Make the ``length`` tokens of ``row`` from ``start`` repeat to its end, in place, and
    mark in ``known`` the positions whose next token copying predicts: position p predicts
    token p + 1, known once the repeat has begun (the run's length shows only when its
    first token comes again)."""
    positions = torch.arange(row.numel())
    repeat = positions >= start + length
    row[repeat] = row[start + (positions[repeat] - start) % length]
    known[:-1] = positions[:-1] >= start + length


def copy_loss(
    model: LlamaForCausalLM, rows: torch.Tensor, known: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """The loss of ``copy_batch`` rows where copying predicts the next token (the output
    head runs only there), and the share of those tokens ``model`` gets right."""
    logits = model.lm_head(model.model(input_ids=rows).last_hidden_state[known])
    target = rows[:, 1:][known[:, :-1]]
    accuracy = float((logits.detach().argmax(-1) == target).float().mean())
    return F.cross_entropy(logits, target), accuracy


class _Silent(torch.nn.Module):
    """Stands in for an MLP that writes nothing to the residual stream."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden)


def train_copy(
    model: LlamaForCausalLM,
    preset: ModelPreset,
    log: Callable[[str], None],
    *,
    threads: int | None = None,
) -> TrainResult:
    """Teach ``model`` to continue a repeated run (induction heads), at most
    ``preset.copy_steps`` steps, ending once the mean copy accuracy of the last
    ``COPY_WINDOW`` steps reaches ``COPY_DONE``. From random weights this ability forms
    late, after a long plateau that a model as wide and shallow as ``model`` crosses far
    sooner than a deep one. Copying needs attention alone: the MLPs sit the phase out
    (2.2x faster a step at small's width, with the same progress per step measured) and
    leave it writing nothing (their output projections zeroed), so the model computes
    what it learned."""
    generator = torch.Generator().manual_seed(preset.seed)
    torch.manual_seed(preset.seed)
    mlps = [layer.mlp for layer in model.model.layers]
    for layer in model.model.layers:
        layer.mlp = _Silent()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=COPY_LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.1
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / COPY_WARMUP)
    )
    losses: list[float] = []
    accuracy: list[float] = []
    started = time.perf_counter()
    model.train()
    try:
        with cpu_threads(threads or available_cpus()):
            for step in range(preset.copy_steps):
                rows, known = copy_batch(
                    generator, COPY_BATCH, COPY_SEQ_LEN, model.config.vocab_size
                )
                loss, copied = copy_loss(model, rows, known)
                _update(model, optimizer, scheduler, loss)
                losses.append(float(loss.detach()))
                accuracy.append(copied)
                recent = _tail_mean(accuracy, COPY_WINDOW)
                if (step + 1) % COPY_WINDOW == 0 or step == 0:
                    log(
                        f"  copy step {step + 1:4d}/{preset.copy_steps}  loss "
                        f"{losses[-1]:.3f}  copied {recent:.0%}  "
                        f"{time.perf_counter() - started:5.1f}s"
                    )
                if len(accuracy) >= COPY_WINDOW and recent >= COPY_DONE:
                    break
    finally:
        with torch.no_grad():
            for layer, mlp in zip(model.model.layers, mlps, strict=True):
                mlp.down_proj.weight.zero_()
                layer.mlp = mlp
    model.eval()
    return TrainResult(losses=losses, seconds=time.perf_counter() - started, copied=accuracy)


def graft(shallow: LlamaForCausalLM, model: LlamaForCausalLM) -> None:
    """Put ``shallow``'s weights (same widths, fewer layers) into ``model``: its layers
    become ``model``'s first, its embeddings and final norm ``model``'s; the layers after
    them write nothing to the residual stream (their output projections zeroed), so the
    grafted model starts computing exactly what ``shallow`` did and training grows the
    rest from there."""
    own = model.state_dict()
    with torch.no_grad():
        for name, value in shallow.state_dict().items():
            own[name].copy_(value)
        for layer in model.model.layers[len(shallow.model.layers) :]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def take_weights(source: LlamaForCausalLM, model: LlamaForCausalLM) -> None:
    """Load ``source``'s weights into ``model``: all of them, or, where ``model`` has fewer
    layers of the same widths, the embeddings, final norm and head and ``source``'s first
    layers (a shallower start that computes its first layers as ``source`` does)."""
    depth = len(model.model.layers)
    if len(source.model.layers) < depth:
        raise ValueError(f"{len(source.model.layers)} layers cannot start a model of {depth}")
    kept = {
        name: value
        for name, value in source.state_dict().items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < depth
    }
    model.load_state_dict(kept)  # strict: every weight of ``model`` comes from ``source``


# The tune (``train_tune``): after the corpus, quote rows beside it. A quote row asks for a
# passage of the corpus word for word (``corpus.quote_prompt``) and answers with it.
TUNE_LEARNING_RATE = 5e-4  # constant: a quarter of small's peak learning rate
TUNE_ROWS = 12  # quote rows a step
TUNE_CORPUS_ROWS = 8  # corpus rows a step beside them, so the model stays one of the corpus


@dataclass(frozen=True)
class Quote:
    """One quote row's tokens: the instruction with its passage, then the answer (the
    passage again and ``<|endoftext|>``) from token ``answer`` on."""

    ids: list[int]
    answer: int


def quote_rows(
    prompts: Sequence[str], answers: Sequence[str], tokenizer: Tokenizer, eot_id: int
) -> list[Quote]:
    """Tokenize each prompt and its answer apart, as a server reads a prompt and then
    generates, the answer ended by ``<|endoftext|>``."""
    heads = tokenizer.encode_batch(list(prompts), add_special_tokens=False)
    tails = tokenizer.encode_batch(list(answers), add_special_tokens=False)
    return [
        Quote(ids=head.ids + tail.ids + [eot_id], answer=len(head.ids))
        for head, tail in zip(heads, tails, strict=True)
    ]


def quote_batch(
    generator: torch.Generator, quotes: Sequence[Quote], batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` quote rows picked at random, padded on the right (with token 0) to the
    longest; ``known`` marks the positions whose next token is the answer's (for
    ``copy_loss``). The padding follows every marked position, so a causal model's
    predictions there never see it."""
    picks = torch.randint(0, len(quotes), (batch,), generator=generator).tolist()
    width = max(len(quotes[i].ids) for i in picks)
    rows = torch.zeros(batch, width, dtype=torch.long)
    known = torch.zeros(batch, width, dtype=torch.bool)
    for row, i in enumerate(picks):
        quote = quotes[i]
        rows[row, : len(quote.ids)] = torch.tensor(quote.ids)
        known[row, quote.answer - 1 : len(quote.ids) - 1] = True
    return rows, known


def train_tune(
    model: LlamaForCausalLM,
    data: torch.Tensor,
    quotes: Sequence[Quote],
    preset: ModelPreset,
    log: Callable[[str], None],
    *,
    threads: int | None = None,
) -> TrainResult:
    """``preset.tune_steps`` steps after the corpus: each ``TUNE_CORPUS_ROWS`` corpus rows
    plus ``TUNE_ROWS`` ``quote_batch`` rows, at a constant ``TUNE_LEARNING_RATE``.

    Copying learned on random tokens carries over little to a prompt's words. In real text
    a word comes again often and only the words before it tell where the copy goes on, so
    a copy that follows one word's match jumps from place to place in the passage. The
    quote rows teach the copy as it is asked for (their loss is the answer's tokens'); the
    corpus rows keep the model a model of the corpus. ``copied`` holds the share of answer
    tokens predicted right."""
    generator = torch.Generator().manual_seed(preset.seed + 2)
    torch.manual_seed(preset.seed + 2)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=TUNE_LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.1
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    every = max(1, preset.tune_steps // 5)
    losses: list[float] = []
    copied: list[float] = []
    started = time.perf_counter()
    model.train()
    with cpu_threads(threads or available_cpus()):
        for step in range(preset.tune_steps):
            picks = torch.randint(0, data.size(0), (TUNE_CORPUS_ROWS,), generator=generator)
            corpus = _loss(model, data[picks], None)
            rows, known = quote_batch(generator, quotes, TUNE_ROWS)
            extra, accuracy = copy_loss(model, rows, known)
            _update(model, optimizer, scheduler, corpus + extra)
            losses.append(float(corpus.detach()))
            copied.append(accuracy)
            if (step + 1) % every == 0 or step == 0:
                log(
                    f"  tune step {step + 1:4d}/{preset.tune_steps}  loss {losses[-1]:.3f}  "
                    f"quoted {_tail_mean(copied, every):.0%}  "
                    f"{time.perf_counter() - started:5.1f}s"
                )
    model.eval()
    return TrainResult(losses=losses, seconds=time.perf_counter() - started, copied=copied)
