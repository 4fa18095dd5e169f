"""Per-request sampling. Each seeded request draws from its own generator, so its tokens do
not depend on which other requests share the batch.

Safe for every value the wire schema admits: a temperature below ``GREEDY_BELOW`` samples
greedily (vLLM's convention; dividing by it would overflow float32 into NaN), and a row whose
logits are not finite gets no token (``None``) instead of poisoning the batch: the engine
ends that request alone."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

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
    -inf). A row's draw takes one number from its generator, so a caller that draws rows
    in order and stops early (speculation's verification, at the first rejected draft)
    leaves each generator where drawing those tokens one step at a time would. Rows without
    a seed are drawn together when the picker is built (one uniform number each from
    torch's global generator), so ``pick`` only looks them up.

    A row samples by inverting its cumulative distribution at a uniform number: one
    cumulative sum over what the row keeps and one binary search, where torch's
    ``multinomial`` took one call, one read back, and about 0.1 ms a row on a CPU (4,096
    logits). Rows whose top-k or top-p keeps part of the vocabulary rank only as many of
    their most likely tokens as hold it (``_distributions``) instead of sorting it all."""

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
        self._drawn: dict[int, int] = {}  # rows without a seed → their token, drawn already
        self._rows: dict[int, tuple[_Group, int]] = {}  # rows that sample → group, row there
        rows = [i for i, c in enumerate(configs) if not c.greedy]
        if not rows:
            return
        for group in _distributions(logits, rows, [configs[i] for i in rows]):
            total = group.cdf[:, -1]
            # A finite row can still overflow once scaled (logits near float32's limit): the
            # limit of such a distribution is its argmax.
            usable = (total.isfinite() & (total > 0)).tolist()
            kept = [j for j, ok in enumerate(usable) if ok]
            free = [j for j in kept if configs[group.rows[j]].seed is None]
            drawn = group.draw(free, torch.rand(len(free), device=logits.device)) if free else []
            self._drawn.update((group.rows[j], tok) for j, tok in zip(free, drawn, strict=True))
            self._rows.update((group.rows[j], (group, j)) for j in kept)

    def pick(self, i: int, generator: torch.Generator | None) -> int | None:
        """Row ``i``'s token: its argmax when greedy, else a draw from its distribution."""
        if i in self.bad:
            return None
        if generator is None and i in self._drawn:
            return self._drawn[i]
        at = self._rows.get(i)
        if at is None:
            return self.argmax[i]
        group, j = at
        u = torch.rand(1, generator=generator, device=group.cdf.device)
        return group.draw([j], u)[0]


@dataclass(slots=True)
class _Group:
    """Rows of the logits sampled alike: ``cdf``, each row's cumulative probabilities (not
    normalized) over ``ids``, its candidates in order (``None``: the whole vocabulary)."""

    rows: list[int]
    cdf: torch.Tensor
    ids: torch.Tensor | None

    def draw(self, at: list[int], u: torch.Tensor) -> list[int]:
        """The tokens of rows ``at`` (of this group) for uniform numbers ``u`` in [0, 1):
        each the first whose cumulative probability exceeds ``u`` times its row's total,
        so never one of probability 0."""
        index = torch.tensor(at, device=self.cdf.device)
        cdf = self.cdf.index_select(0, index)
        total = cdf[:, -1:]
        # Below the total even where ``u`` times it rounds up to it.
        x = torch.minimum(u.unsqueeze(1) * total, total.nextafter(torch.zeros_like(total)))
        picked = torch.searchsorted(cdf, x, right=True)
        if self.ids is not None:
            picked = self.ids.index_select(0, index).gather(1, picked)
        return picked[:, 0].tolist()


# The fewest candidates a row is ranked among; widths are rounded up to powers of 2 from
# here (one top-k for each). A row needing more than half the vocabulary is sorted: a top-k
# of 2,048 of 4,096 logits takes 0.6 of a sort on a CPU, of 64 a tenth.
MIN_CANDIDATES = 16
# Octaves of probability below a row's most likely token told apart by ``_nucleus_widths``.
OCTAVES = 32
# Mass beyond top-p the octaves must reach: their sums and a sorted row's cumulative sum
# add in other orders, so a row with less is sorted rather than ranked among too few.
MASS_MARGIN = 1e-4


def _distributions(
    logits: torch.Tensor, rows: list[int], configs: list[SamplingConfig]
) -> list[_Group]:
    """The distributions ``rows`` of ``logits`` sample from: temperature, min-p first, then
    top-k and top-p over what is left (vLLM's order). Grouped by how they are held: rows
    that keep the whole vocabulary; rows that keep some of their ``w`` most likely tokens,
    ranked by a top-k (a group for each width ``w``: a top-k's ``k``, or enough to hold
    the top-p's nucleus); rows sorted whole. A row's group depends on its own logits and
    settings alone, so it draws the same in any batch."""
    dev = logits.device
    temps = torch.tensor([c.temperature for c in configs], device=dev).unsqueeze(1)
    scaled = logits.index_select(0, torch.tensor(rows, device=dev)) / temps
    # Non-finite rows are reported by ``Picker``; here they only must not raise.
    scaled = _min_p(scaled.nan_to_num(nan=float("-inf")), [c.min_p for c in configs])
    vocab = scaled.shape[-1]
    top_k = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    top_p = [c.top_p for c in configs]
    everything = range(len(rows))
    groups = []
    whole = [j for j in everything if top_k[j] == vocab and top_p[j] >= 1.0]
    if whole:
        kept = scaled[whole]
        # Relative to the row's maximum: the largest term is 1.
        cdf = (kept - kept.amax(dim=-1, keepdim=True)).exp_().cumsum_(dim=-1)
        groups.append(_Group([rows[j] for j in whole], cdf, None))
    # Each cut row's candidates: its top-k, else as many as hold its nucleus (0: unknown).
    width = {j: top_k[j] for j in everything if top_k[j] < vocab}
    by_p = [j for j in everything if top_k[j] == vocab and top_p[j] < 1.0]
    norm: dict[int, torch.Tensor] = {}
    if by_p:
        found, lse = _nucleus_widths(scaled[by_p], [top_p[j] for j in by_p])
        width.update(zip(by_p, found, strict=True))
        norm.update(zip(by_p, lse, strict=True))
    buckets: dict[int, list[int]] = {}
    sort = []
    for j, w in width.items():
        size = max(MIN_CANDIDATES, 1 << max(0, w - 1).bit_length())
        if w and 2 * size <= vocab:
            buckets.setdefault(size, []).append(j)
        else:
            sort.append(j)
    for size, tried in sorted(buckets.items()):
        group, unclosed = _ranked(scaled, tried, size, top_k, top_p, norm)
        if group.rows:
            groups.append(replace(group, rows=[rows[j] for j in group.rows]))
        sort += unclosed
    if sort:
        probs = _sorted_probs(scaled[sort], [top_k[j] for j in sort], [top_p[j] for j in sort])
        groups.append(_Group([rows[j] for j in sort], probs.cumsum(dim=-1), None))
    return groups


def _ranked(
    scaled: torch.Tensor,
    tried: list[int],
    width: int,
    top_k: list[int],
    top_p: list[float],
    norm: dict[int, torch.Tensor],
) -> tuple[_Group, list[int]]:
    """Rows ``tried`` of ``scaled`` over their ``width`` most likely tokens (row numbers of
    ``scaled`` in the group), and those of them whose nucleus turned out not to close
    within the candidates (left to be sorted). ``norm``: the log-normalizer of each row
    cut by top-p alone; a top-k's rows are normalized over their top k."""
    dev = scaled.device
    vals, ids = scaled[tried].topk(width, dim=-1)
    k = torch.tensor([top_k[j] for j in tried], device=dev).unsqueeze(1)
    vals = vals.masked_fill(torch.arange(width, device=dev).unsqueeze(0) >= k, -math.inf)
    lse = vals.logsumexp(dim=-1, keepdim=True)
    by_p = [i for i, j in enumerate(tried) if j in norm]
    if by_p:
        lse[by_p] = torch.stack([norm[tried[i]] for i in by_p])
    probs = (vals - lse).exp_()
    reached = probs.cumsum(dim=-1)
    mass = _mass([top_p[j] for j in tried], dev)
    probs.masked_fill_(reached - probs >= mass, 0.0)
    # Closed within the candidates where a top-k cuts there, or where they reach the
    # top-p's mass: every token after them has at least their mass before it.
    open_ = set()
    if by_p:
        reach = (reached[by_p, -1:] >= mass[by_p])[:, 0].tolist()
        open_ = {i for i, r in zip(by_p, reach, strict=True) if not r}
    done = [i for i in range(len(tried)) if i not in open_]
    group = _Group([tried[i] for i in done], probs[done].cumsum_(dim=-1), ids[done])
    return group, [tried[i] for i in sorted(open_)]


def _nucleus_widths(scaled: torch.Tensor, top_p: list[float]) -> tuple[list[int], torch.Tensor]:
    """For rows cut by top-p alone: how many of each row's most likely tokens surely hold
    what its top-p keeps (0: not found), and each row's log-normalizer (``[rows, 1]``).
    A row's tokens fall into octaves below its most likely one (the first octave holds
    those at least half as likely); the octaves down to the first whose mass, with the
    mass above it, reaches top-p hold every token kept: a token after them has all
    their mass before it. One pass over the row's probabilities instead of a sort."""
    n = scaled.shape[0]
    dev = scaled.device
    lse = scaled.logsumexp(dim=-1, keepdim=True)
    top = scaled.amax(dim=-1, keepdim=True)
    below = (top - scaled).mul_(1 / math.log(2)).nan_to_num_(nan=OCTAVES - 1)
    octave = below.clamp_(0, OCTAVES - 1).long()
    probs = (scaled - lse).exp_()
    mass = torch.zeros(n, OCTAVES, device=dev).scatter_add_(1, octave, probs).cumsum_(dim=1)
    count = torch.zeros(n, OCTAVES, device=dev).scatter_add_(1, octave, torch.ones_like(probs))
    reach = mass >= _mass(top_p, dev) + MASS_MARGIN
    first = reach.float().argmax(dim=1, keepdim=True)  # the first octave reaching it
    width = count.cumsum_(dim=1).gather(1, first)[:, 0].where(reach.any(dim=1), 0.0)
    return width.long().tolist(), lse


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


def _sorted_probs(scaled: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Each row's distribution after its top-k, then its top-p over what the top-k left
    (vLLM's order), with the whole row sorted."""
    vocab = scaled.shape[-1]
    dev = scaled.device
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    k = torch.tensor(top_k, device=dev).unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(ranks >= k, float("-inf")), dim=-1)
    # Keep the smallest set whose mass reaches top_p (the first token always stays).
    probs = probs.masked_fill(probs.cumsum(dim=-1) - probs >= _mass(top_p, dev), 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, probs)


def _mass(top_p: list[float], device: torch.device) -> torch.Tensor:
    """``[rows, 1]`` the mass each row's top-p keeps; infinite where it keeps everything
    (a cumulative sum that rounds up to 1 drops no token)."""
    return torch.tensor([p if p < 1.0 else math.inf for p in top_p], device=device).unsqueeze(1)


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
