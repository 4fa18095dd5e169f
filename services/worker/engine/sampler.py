"""Per-request sampling. Each seeded request draws from its own generator, so its tokens do
not depend on which other requests share the batch.

Safe for every value the wire schema admits: a temperature below ``GREEDY_BELOW`` samples
greedily (vLLM's convention; dividing by it would overflow float32 into NaN), and a row whose
logits are not finite gets no token (``None``) instead of poisoning the batch: the engine
ends that request alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How one request picks its tokens (resolved: no field left to a default)."""

    temperature: float = 0.0  # below GREEDY_BELOW: greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI: minus this for each token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this times its count in the output
    repetition_penalty: float = 1.0  # Hugging Face: tokens of the prompt and output
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI: added to these tokens' logits
    min_p: float = 0.0  # vLLM: keep tokens at least this times as likely as the top one

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def adjusts(self) -> bool:
        """Whether penalties or biases change this request's logits."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )


def adjust(
    logits: torch.Tensor,
    configs: list[SamplingConfig],
    prompts: list[list[int]],
    outputs: list[list[int]],
) -> None:
    """Apply each row's penalties and biases to ``logits`` in place, batched over the rows
    that have any: token counts by one scatter-add, then elementwise arithmetic (no loop
    over the vocabulary). Repetition as Hugging Face applies it (over prompt and output;
    positive logits divided, negative multiplied), then the OpenAI penalties over the
    output, then the biases."""
    rows = [i for i, c in enumerate(configs) if c.adjusts]
    if not rows:
        return
    dev, vocab = logits.device, logits.shape[-1]
    sub = logits[rows].float()
    out_counts = _counts([outputs[i] for i in rows], vocab, dev)
    seen = out_counts + _counts([prompts[i] for i in rows], vocab, dev) > 0
    rep = torch.tensor([configs[i].repetition_penalty for i in rows], device=dev).unsqueeze(1)
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    freq = torch.tensor([configs[i].frequency_penalty for i in rows], device=dev).unsqueeze(1)
    pres = torch.tensor([configs[i].presence_penalty for i in rows], device=dev).unsqueeze(1)
    sub = sub - freq * out_counts - pres * (out_counts > 0)
    # Ids outside the vocabulary (the wire admits any) bias nothing.
    biases = [(j, t, b) for j, i in enumerate(rows) for t, b in configs[i].logit_bias if t < vocab]
    if biases:
        bias_rows, ids, values = (list(x) for x in zip(*biases, strict=True))
        sub.index_put_(
            (torch.tensor(bias_rows, device=dev), torch.tensor(ids, device=dev)),
            torch.tensor(values, device=dev),
            accumulate=True,
        )
    # A penalty at the edge of its range (a repetition penalty of 5e-324) can overflow a
    # logit: keep every value finite, so the row is still sampled, never failed.
    big = torch.finfo(logits.dtype).max
    logits[rows] = sub.clamp(-big, big).to(logits.dtype)


def _counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[rows, vocab]`` occurrences of each token id in each list (ids out of range
    ignored)."""
    counts = torch.zeros((len(token_lists), vocab + 1), device=device)
    longest = max((len(t) for t in token_lists), default=0)
    if longest:
        ids = torch.full((len(token_lists), longest), vocab, dtype=torch.long)
        for r, toks in enumerate(token_lists):
            ids[r, : len(toks)] = torch.tensor(toks, dtype=torch.long).clamp_(0, vocab)
        counts.scatter_add_(1, ids.to(device), torch.ones(ids.shape, device=device))
    return counts[:, :vocab]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator for one request; sampling without a seed uses torch's global one."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample(
    logits: torch.Tensor,
    configs: list[SamplingConfig],
    generators: list[torch.Generator | None],
) -> list[int | None]:
    """Pick one token per row of ``logits`` (shape [rows, vocab]); ``None`` for a row whose
    logits hold a NaN or +inf, or nothing but -inf."""
    logits = logits.float()
    bad = logits.isnan().any(dim=-1) | logits.isposinf().any(dim=-1)
    bad |= logits.isneginf().all(dim=-1)
    out: list[int | None] = list(logits.argmax(dim=-1).tolist())
    rows = [i for i, c in enumerate(configs) if not c.greedy]
    if rows:
        idx = torch.tensor(rows, device=logits.device)
        sub = logits.index_select(0, idx)
        temps = torch.tensor([configs[i].temperature for i in rows], device=logits.device)
        probs = _filtered_probs(sub / temps.unsqueeze(1), [configs[i] for i in rows])
        # A finite row can still overflow once scaled (logits near float32's limit): the
        # limit of such a distribution is its argmax, already in ``out``.
        usable = (probs.isfinite().all(dim=-1) & (probs.sum(dim=-1) > 0)).tolist()
        for j, i in enumerate(rows):
            if usable[j]:
                out[i] = int(torch.multinomial(probs[j], 1, generator=generators[i])[0])
    for i in bad.nonzero().flatten().tolist():
        out[i] = None
    return out


def _filtered_probs(scaled: torch.Tensor, configs: list[SamplingConfig]) -> torch.Tensor:
    """The distribution each row samples from: min-p first, then top-k and top-p over
    what is left (vLLM's order)."""
    vocab = scaled.shape[-1]
    top_k = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    top_p = [c.top_p for c in configs]
    # Non-finite rows are reported by ``sample``; here they only must not raise.
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
