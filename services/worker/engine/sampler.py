"""Per-request sampling. Each seeded request draws from its own generator, so its tokens do
not depend on which other requests share the batch.

Safe for every value the wire schema admits: a temperature below ``GREEDY_BELOW`` samples
greedily (vLLM's convention; dividing by it would overflow float32 into NaN), and a row whose
logits are not finite gets no token (``None``) instead of poisoning the batch: the engine
ends that request alone."""

from __future__ import annotations

import itertools
import math

import torch

from services.worker.engine.wire import SamplingConfig


def adjust(
    logits: torch.Tensor,
    configs: list[SamplingConfig],
    prompts: list[list[int]],
    outputs: list[list[int]],
) -> None:
    """Apply each row's penalties and biases to ``logits`` in place, batched over the rows
    that have any. Both touch only a few ids of a row (those it has seen, those biased),
    so they are computed there alone: the logits gathered at those ids, elementwise
    arithmetic, one indexed write back; nothing is done over the vocabulary. Repetition as
    Hugging Face applies it (over prompt and output; positive logits divided, negative
    multiplied), then the OpenAI penalties over the output, then the biases."""
    rows = [i for i, c in enumerate(configs) if c.adjusts]
    if not rows:
        return
    picked = [configs[i] for i in rows]
    dev, vocab = logits.device, logits.shape[-1]
    # A penalty at the edge of its range (a repetition penalty of 5e-324) can overflow a
    # logit: keep every value finite, so the row is still sampled, never failed.
    big = torch.finfo(logits.dtype).max
    at = torch.tensor(rows, device=dev).unsqueeze(1)
    seen, has_ids = _seen_ids([prompts[i] + outputs[i] for i in rows], vocab, dev)
    vals = logits[at, seen].float()
    n = _occurrences(_padded([outputs[i] for i in rows], vocab, dev), seen)
    knobs = [(c.repetition_penalty, c.frequency_penalty, c.presence_penalty) for c in picked]
    rep, freq, pres = torch.tensor(knobs, dtype=vals.dtype, device=dev).unsqueeze(2).unbind(1)
    new = torch.where(vals > 0, vals / rep, vals * rep) - freq * n - pres * (n > 0)
    new = torch.where(has_ids, new.clamp(-big, big), vals)
    # An id seen twice is written twice with the same value (from the same logit and
    # count), so the order of the writes does not matter.
    logits[at, seen] = new.to(logits.dtype)
    # Ids outside the vocabulary (the wire admits any) bias nothing. An id listed twice
    # gets both biases.
    biases = [(i, t, b) for i, c in zip(rows, picked, strict=True) for t, b in c.logit_bias]
    biases = [x for x in biases if x[1] < vocab]
    if biases:
        bias_rows, ids, values = zip(*biases, strict=True)
        where = tuple(torch.tensor([bias_rows, ids], device=dev))
        added = torch.tensor(values, dtype=logits.dtype, device=dev)
        logits.index_put_(where, added, accumulate=True)
        logits[where] = logits[where].clamp(-big, big)


def _seen_ids(
    token_lists: list[list[int]], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, longest]`` ids each row has seen, and ``[rows, 1]`` whether it has any.
    Padding (and ids outside the vocabulary) repeat a real id of the row, the largest,
    so every entry can be gathered and written; a row with none repeats id 0, which the
    caller leaves as it is."""
    ids = _padded(token_lists, vocab, device).sort(dim=1, descending=True).values
    top = ids[:, :1]
    has_ids = top >= 0
    return torch.where(ids < 0, top, ids).clamp(min=0), has_ids


def _occurrences(out_ids: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """How often each of ``seen`` (``[rows, n]``) occurs in its row of ``out_ids``
    (padding -1 never does): two binary searches in the sorted rows."""
    if out_ids.shape[1] == 0:
        return torch.zeros(seen.shape, device=seen.device)
    ordered = out_ids.sort(dim=1).values
    last = torch.searchsorted(ordered, seen, right=True)
    return (last - torch.searchsorted(ordered, seen)).float()


def _padded(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[rows, longest]`` token ids, each list padded with -1 (ids outside ``[0, vocab)``
    too): one conversion of all the lists together, then one indexed write."""
    lengths = torch.tensor([len(t) for t in token_lists])
    longest = int(lengths.max()) if len(token_lists) else 0
    ids = torch.full((len(token_lists), longest), -1, dtype=torch.long)
    flat = torch.tensor(list(itertools.chain.from_iterable(token_lists)), dtype=torch.long)
    if flat.numel():
        flat[(flat < 0) | (flat >= vocab)] = -1
        row = torch.repeat_interleave(torch.arange(len(token_lists)), lengths)
        starts = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
        ids[row, torch.arange(flat.numel()) - starts] = flat
    return ids.to(device)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator for one request; sampling without a seed uses torch's global one."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


class Picker:
    """Each row's distribution of ``logits`` (shape [rows, vocab]), ready to draw from one
    row at a time (``None`` for a row whose logits hold a NaN or +inf, or nothing but
    -inf). A row's draw takes one multinomial draw from its generator, so a caller that
    draws rows in order and stops early (speculation's verification, at the first
    rejected draft) leaves each generator where drawing those tokens one step at a time
    would."""

    def __init__(self, logits: torch.Tensor, configs: list[SamplingConfig]) -> None:
        logits = logits.float()
        # The row maxima (``row_max``) give both each row's argmax and whether the row is
        # usable: the maximum is NaN where the row holds a NaN, +inf where it holds +inf,
        # and -inf where it holds nothing else; ties go to the first index, as with
        # ``argmax``. Read back and tested on the host, where testing on the device took
        # three more kernels a step.
        top, argmax = row_max(logits)
        self.bad = {i for i, t in enumerate(top.tolist()) if not math.isfinite(t)}
        self.argmax: list[int] = argmax.tolist()
        self.row_of: dict[int, int] = {}  # row → its row of ``probs`` (rows that sample)
        rows = [i for i, c in enumerate(configs) if not c.greedy]
        self.probs = logits[:0]
        self.usable: list[bool] = []
        if rows:
            idx = torch.tensor(rows, device=logits.device)
            sub = logits.index_select(0, idx)
            temps = torch.tensor([configs[i].temperature for i in rows], device=logits.device)
            self.probs = _filtered_probs(sub / temps.unsqueeze(1), [configs[i] for i in rows])
            # A finite row can still overflow once scaled (logits near float32's limit): the
            # limit of such a distribution is its argmax.
            self.usable = (
                self.probs.isfinite().all(dim=-1) & (self.probs.sum(dim=-1) > 0)
            ).tolist()
            self.row_of = {i: j for j, i in enumerate(rows)}

    def pick(self, i: int, generator: torch.Generator | None) -> int | None:
        """Row ``i``'s token: its argmax when greedy, else a draw from its distribution."""
        out: int | None = self.argmax[i]
        j = self.row_of.get(i)
        if j is not None and self.usable[j]:
            out = int(torch.multinomial(self.probs[j], 1, generator=generator)[0])
        return None if i in self.bad else out


# Width of the column blocks ``row_max`` reduces first on a CPU.
MAX_BLOCK = 128


def row_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's maximum and the first column holding it, as ``logits.max(dim=-1)``
    (NaN counts as the maximum, as there). On a CPU torch's reductions that return indices
    run an order of magnitude slower than those that return values only (128 rows of 4,096
    logits, one thread: ``max(dim=-1)`` 290 us, ``amax`` 26 us), so where the columns split
    into blocks of ``MAX_BLOCK`` this takes each block's ``amax``, the first block holding
    the row's maximum, and the first column of that block holding it: the same values and
    columns (ties to the first) in about a quarter of the time."""
    rows, cols = logits.shape
    if logits.device.type != "cpu" or cols % MAX_BLOCK or cols == MAX_BLOCK:
        return logits.max(dim=-1)
    blocks = logits.reshape(rows, cols // MAX_BLOCK, MAX_BLOCK)
    top, block = blocks.amax(dim=-1).max(dim=-1)
    inner = blocks[torch.arange(rows), block].argmax(dim=-1)
    return top, block * MAX_BLOCK + inner


def _filtered_probs(scaled: torch.Tensor, configs: list[SamplingConfig]) -> torch.Tensor:
    """The distribution each row samples from: min-p first, then top-k and top-p over
    what is left (vLLM's order)."""
    vocab = scaled.shape[-1]
    top_k = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    top_p = [c.top_p for c in configs]
    # Non-finite rows are reported by ``Picker``; here they only must not raise.
    scaled = _min_p(scaled.nan_to_num(nan=float("-inf")), [c.min_p for c in configs])
    if max(top_k) == vocab and min(top_p) >= 1.0:
        return torch.softmax(scaled, dim=-1)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device).unsqueeze(0)
    k = torch.tensor(top_k, device=scaled.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest set whose mass reaches top_p (the first token always stays).
    before = probs.cumsum(dim=-1) - probs
    p = torch.tensor(top_p, device=scaled.device).unsqueeze(1)
    probs = probs.masked_fill(before >= p, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, probs)


def _min_p(scaled: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Mask the tokens less likely than ``min_p`` times the row's top token: in logits,
    those below the row's maximum plus ``log(min_p)`` (the same test as on probabilities,
    without their underflow). A row with ``min_p`` 0 keeps everything (its bound is -inf);
    the top token always stays."""
    if max(min_p) <= 0.0:
        return scaled
    floor = torch.tensor(min_p, device=scaled.device).log().unsqueeze(1)
    bound = scaled.max(dim=-1, keepdim=True).values + floor
    return scaled.masked_fill(scaled < bound, float("-inf"))
