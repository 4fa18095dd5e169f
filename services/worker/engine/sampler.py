"""Per-request sampling. Each seeded request draws from its own generator, so its tokens do
not depend on which other requests share the batch.

Safe for every value the wire schema admits: a temperature below ``GREEDY_BELOW`` samples
greedily (vLLM's convention; dividing by it would overflow float32 into NaN), and a row whose
logits are not finite gets no token (``None``) instead of poisoning the batch: the engine
ends that request alone."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from services.worker.engine.wire import SamplingConfig


class SeenTokens:
    """The ids one request has seen, its prompt's and its output's, each once, and how
    often each occurs in its output: what its penalties read. Kept as its tokens come (a
    step adds one, or a few when a draft is accepted), so a step copies these arrays into
    the batch's instead of rebuilding them from the token lists, which cost every row its
    whole length every step (38 ms a step at 128 rows of 1,536 tokens, on one CPU thread).
    Ids outside ``[0, vocab)`` are left out: they name no logit."""

    __slots__ = ("_at", "counts", "ids", "n", "vocab")

    def __init__(self, prompt: list[int], vocab: int) -> None:
        ids = np.unique(np.asarray(prompt, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < vocab)]
        self.vocab = vocab
        self.n = len(ids)
        self.ids = np.empty(max(16, 2 * self.n), dtype=np.int64)
        self.ids[: self.n] = ids
        self.counts = np.zeros(len(self.ids), dtype=np.float32)
        self._at: dict[int, int] = {t: i for i, t in enumerate(ids.tolist())}

    def add(self, token: int) -> None:
        """One more output token."""
        if not 0 <= token < self.vocab:
            return
        i = self._at.get(token)
        if i is None:
            if self.n == len(self.ids):  # full: twice the room
                self.ids = np.concatenate([self.ids, np.zeros(self.n, np.int64)])
                self.counts = np.concatenate([self.counts, np.zeros(self.n, np.float32)])
            i = self._at[token] = self.n
            self.ids[i] = token
            self.n += 1
        self.counts[i] += 1

    def arrays(self, draft: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The ids and their output counts, as if ``draft`` followed the output: views of
        this request's arrays without a draft, copies with one (left as they are)."""
        ids, counts = self.ids[: self.n], self.counts[: self.n]
        if not draft:
            return ids, counts
        counts = counts.copy()
        new: dict[int, int] = {}  # ids the draft brings first → their count in it
        for t in draft:
            if not 0 <= t < self.vocab:
                continue
            i = self._at.get(t)
            if i is None:
                new[t] = new.get(t, 0) + 1
            else:
                counts[i] += 1
        if not new:
            return ids, counts
        new_ids = np.fromiter(new, np.int64, len(new))
        new_counts = np.fromiter(new.values(), np.float32, len(new))
        return np.concatenate([ids, new_ids]), np.concatenate([counts, new_counts])


def adjust(
    logits: torch.Tensor,
    configs: list[SamplingConfig],
    seen: list[SeenTokens | None],
    drafts: list[list[int]],
) -> None:
    """Apply each row's penalties and biases to ``logits`` in place, batched over the rows
    that have them (each row with penalties has its request's ``seen``, read as if the
    row's draft followed). Both touch only a few ids of a row (those it has seen, those
    biased), so they are computed there alone: the logits gathered at those ids,
    elementwise arithmetic, one write back; nothing is done over the vocabulary.
    Repetition as Hugging Face applies it (over prompt and output; positive logits
    divided, negative multiplied), then the OpenAI penalties over the output, then the
    biases."""
    rows = [i for i, c in enumerate(configs) if c.penalizes]
    vocab = logits.shape[-1]
    biased = [
        (i, b)
        for i, c in enumerate(configs)
        if c.logit_bias and (b := _biases(c.logit_bias, vocab, logits.device))[0].numel()
    ]
    if not rows and not biased:
        return
    dev = logits.device
    # A penalty at the edge of its range (a repetition penalty of 5e-324) can overflow a
    # logit: keep every value finite, so the row is still sampled, never failed.
    big = torch.finfo(logits.dtype).max
    work = logits if logits.is_contiguous() else logits.contiguous()
    if rows:
        arrays = []
        for i in rows:
            tokens = seen[i]
            assert tokens is not None, "a row with penalties has its request's seen ids"
            arrays.append(tokens.arrays(drafts[i]))
        ids, n, has_ids = _batched(arrays, dev)
        # The (row, id) entries as offsets in the flattened logits: one gather and one
        # write back, where indexing by rows and ids took ten times as long on a CPU.
        flat = work.view(-1)
        at = (torch.tensor(rows, device=dev).unsqueeze(1) * vocab + ids).view(-1)
        vals = flat.index_select(0, at).view(ids.shape).float()
        knobs = [
            (
                configs[i].repetition_penalty,
                configs[i].frequency_penalty,
                configs[i].presence_penalty,
            )
            for i in rows
        ]
        rep, freq, pres = torch.tensor(knobs, dtype=vals.dtype, device=dev).unsqueeze(2).unbind(1)
        new = torch.where(vals > 0, vals / rep, vals * rep) - freq * n - pres * (n > 0)
        new = torch.where(has_ids, new.clamp(-big, big), vals)
        # Padding repeats a row's first id with its count: written twice with the same
        # value (from the same logit and count), so the order of the writes does not matter.
        flat.index_copy_(0, at, new.view(-1).to(logits.dtype))
    # An id listed twice gets both biases.
    if biased:
        counts = torch.tensor([b[0].numel() for _, b in biased], device=dev)
        where = (
            torch.repeat_interleave(torch.tensor([i for i, _ in biased], device=dev), counts),
            torch.cat([b[0] for _, b in biased]),
        )
        added = torch.cat([b[1] for _, b in biased]).to(logits.dtype)
        work.index_put_(where, added, accumulate=True)
        work[where] = work[where].clamp(-big, big)
    if work is not logits:
        logits.copy_(work)


def _batched(
    arrays: list[tuple[np.ndarray, np.ndarray]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[rows, longest]`` seen ids and their output counts, one row per ``(ids, counts)``
    pair, and ``[rows, 1]`` whether the row has any: one copy to the device each. Past a
    row's own, its first id and count repeat; a row with none holds id 0."""
    longest = max(len(ids) for ids, _ in arrays)
    ids_m = np.zeros((len(arrays), longest), dtype=np.int64)
    counts_m = np.zeros((len(arrays), longest), dtype=np.float32)
    has = np.zeros((len(arrays), 1), dtype=np.bool_)
    for r, (ids, counts) in enumerate(arrays):
        k = len(ids)
        if k:
            ids_m[r, :k], ids_m[r, k:] = ids, ids[0]
            counts_m[r, :k], counts_m[r, k:] = counts, counts[0]
            has[r] = True
    ids_t, counts_t, has_t = (torch.from_numpy(m).to(device) for m in (ids_m, counts_m, has))
    return ids_t, counts_t, has_t


@functools.lru_cache(maxsize=4096)
def _biases(
    logit_bias: tuple[tuple[int, float], ...], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's logit biases as ids and values on the device, built once for all its
    steps (a step of 128 requests with 50 biases each spent 3 ms making them from lists).
    Ids outside the vocabulary (the wire admits any) bias nothing."""
    kept = [(t, b) for t, b in logit_bias if t < vocab]
    ids = torch.tensor([t for t, _ in kept], dtype=torch.long, device=device)
    return ids, torch.tensor([b for _, b in kept], dtype=torch.float64, device=device)


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
        clean = not self.bad
        for group in _distributions(logits, rows, [configs[i] for i in rows], clean):
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
        cdf = _rows(self.cdf, at)
        total = cdf[:, -1:]
        # Below the total even where ``u`` times it rounds up to it.
        x = torch.minimum(u.unsqueeze(1) * total, total.nextafter(torch.zeros_like(total)))
        picked = torch.searchsorted(cdf, x, right=True)
        if self.ids is not None:
            picked = _rows(self.ids, at).gather(1, picked)
        return picked[:, 0].tolist()


def _rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Rows ``rows`` of ``t``; ``t`` itself (no copy) when they are all of its rows in order."""
    if len(rows) == t.shape[0] and rows == list(range(len(rows))):
        return t
    return t.index_select(0, torch.tensor(rows, device=t.device))


# The fewest candidates a top-k row is ranked among; widths are rounded up to powers of 2
# from here (one top-k call for each). A top-k of more than half the vocabulary is sorted:
# a top-k of 2,048 of 4,096 logits takes 0.6 of a sort on a CPU, of 64 a tenth.
MIN_CANDIDATES = 16
# ``_nucleus`` bins a token by its probability relative to the row's top: 64 bins an
# octave, over 32 octaves (the last bin holding everything less likely). Finer bins leave
# fewer tokens in the one bin ranked: tiny at 256 streams, top-p 0.95, that top-k took
# 10 ms a step with 8 bins an octave (up to hundreds of tokens a row), 2.5 ms with 64.
BINS_PER_OCTAVE = 64
BINS = 2048


def _distributions(
    logits: torch.Tensor, rows: list[int], configs: list[SamplingConfig], clean: bool = False
) -> list[_Group]:
    """The distributions ``rows`` of ``logits`` sample from: temperature, min-p first, then
    top-k and top-p over what is left (vLLM's order), none with a sort of the vocabulary
    but those of a top-k over more than half of it (and a top-p whose mass, rounded,
    never reaches it). Grouped by how they are held: rows that
    keep the whole vocabulary or cut it by top-p alone (``_nucleus``), over the vocabulary
    in order; rows cut by a top-k, over their ``w`` most likely tokens ranked (a group for
    each width ``w``); rows sorted whole. A row's group and distribution depend on its own
    logits and settings alone, so it draws the same in any batch. ``clean``: no row holds
    a NaN."""
    dev = logits.device
    temps = torch.tensor([c.temperature for c in configs], device=dev).unsqueeze(1)
    scaled = _rows(logits, rows) / temps
    if not clean:  # Rows with a NaN are reported by ``Picker``; here they must not raise.
        scaled = scaled.nan_to_num_(nan=-math.inf)
    scaled = _min_p(scaled, [c.min_p for c in configs])
    vocab = scaled.shape[-1]
    top_k = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    top_p = [c.top_p for c in configs]
    everything = range(len(rows))
    groups = []
    sort = []
    whole = [j for j in everything if top_k[j] == vocab and top_p[j] >= 1.0]
    if whole:
        kept = _rows(scaled, whole)
        # Relative to the row's maximum: the largest term is 1.
        cdf = (kept - kept.amax(dim=-1, keepdim=True)).exp_().cumsum_(dim=-1)
        groups.append(_Group([rows[j] for j in whole], cdf, None))
    by_p = [j for j in everything if top_k[j] == vocab and top_p[j] < 1.0]
    if by_p:
        cdf, unreached = _nucleus(_rows(scaled, by_p), [top_p[j] for j in by_p])
        done = [i for i in range(len(by_p)) if i not in unreached]
        if done:
            groups.append(_Group([rows[by_p[i]] for i in done], cdf[done], None))
        sort += [by_p[i] for i in sorted(unreached)]
    buckets: dict[int, list[int]] = {}
    for j in (j for j in everything if top_k[j] < vocab):
        size = max(MIN_CANDIDATES, 1 << (top_k[j] - 1).bit_length())
        if 2 * size <= vocab:
            buckets.setdefault(size, []).append(j)
        else:
            sort.append(j)
    for size, cut in sorted(buckets.items()):
        ks, ps = [top_k[j] for j in cut], [top_p[j] for j in cut]
        groups.append(_ranked(_rows(scaled, cut), [rows[j] for j in cut], size, ks, ps))
    if sort:
        probs = _sorted_probs(
            _rows(scaled, sort), [top_k[j] for j in sort], [top_p[j] for j in sort]
        )
        groups.append(_Group([rows[j] for j in sort], probs.cumsum(dim=-1), None))
    return groups


def _ranked(
    scaled: torch.Tensor, rows: list[int], width: int, top_k: list[int], top_p: list[float]
) -> _Group:
    """Rows cut by a top-k of at most ``width`` (``scaled``, the group's ``rows``, each
    row's ``top_k`` and ``top_p``) over their ``width`` most likely tokens: the top k of
    them kept, then the top-p over those."""
    dev = scaled.device
    vals, ids = scaled.topk(width, dim=-1)
    k = torch.tensor(top_k, device=dev).unsqueeze(1)
    vals = vals.masked_fill(torch.arange(width, device=dev).unsqueeze(0) >= k, -math.inf)
    probs = torch.softmax(vals, dim=-1)
    kept = probs.cumsum(dim=-1) - probs < _mass(top_p, dev)
    return _Group(rows, probs.mul_(kept).cumsum_(dim=-1), ids)


def _nucleus(scaled: torch.Tensor, top_p: list[float]) -> tuple[torch.Tensor, set[int]]:
    """Rows cut by top-p alone: each row's cumulative probabilities (not normalized) over
    the vocabulary in order, 0 for the tokens its top-p drops; and the rows whose mass
    never reached their top-p (rounding, a top-p near 1), left to be sorted.

    The nucleus without a sort: tokens are binned by probability (``BINS``, most likely
    first). Call the edge the first bin at which the running mass of the bins reaches
    top-p: the bins before it are kept whole, those after it dropped whole, and only its
    tokens are ranked (a top-k over them), the most likely kept while the mass before
    each stays short of top-p."""
    n, dev = scaled.shape[0], scaled.device
    below = scaled - scaled.amax(dim=-1, keepdim=True)  # log-probability against the top
    # Bins of a 64th of an octave below the row's top (probability 0 in the last), as
    # integers: the decisions below all read these, so no token is counted in one bin
    # and judged in another. torch's CPU kernels are slow on boolean tensors (a sum, a
    # where): masks are made floats at once.
    octaves = below * (-BINS_PER_OCTAVE / math.log(2))
    bins = octaves.nan_to_num_(nan=0.0).clamp_(0, BINS - 1).long()
    e = below.exp_()
    goal = e.sum(dim=-1, keepdim=True) * _mass(top_p, dev)
    mass = torch.zeros(n, BINS, device=dev).scatter_add_(1, bins, e)
    count = torch.zeros(n, BINS, device=dev).scatter_add_(1, bins, torch.ones_like(e))
    reached = mass.cumsum(dim=1) >= goal
    edge = reached.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first bin reaching it
    before = (mass * (torch.arange(BINS, device=dev) < edge)).sum(dim=1, keepdim=True)
    # Rows that never reach top-p (sorted instead) need no ranking.
    width = max(1, int((count.gather(1, edge) * reached[:, -1:]).max()))
    # The edge bin's tokens first (their probabilities), the others below 0.
    vals, ids = (bins != edge).to(e.dtype).mul_(-2.0).add_(e).topk(width, dim=-1)
    # In the edge bin, kept while the mass before a token is short of top-p.
    edge_kept = (before + vals.cumsum(dim=-1) - vals < goal) & (vals >= 0)
    kept = (bins < edge).to(e.dtype)
    kept.scatter_(1, ids, kept.gather(1, ids) + edge_kept.to(e.dtype))
    unreached = {i for i, r in enumerate(reached[:, -1].tolist()) if not r}
    return e.mul_(kept).cumsum_(dim=-1), unreached


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
