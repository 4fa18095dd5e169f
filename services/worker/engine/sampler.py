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

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


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
    vocab = scaled.shape[-1]
    top_k = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    top_p = [c.top_p for c in configs]
    # Non-finite rows are reported by ``sample``; here they only must not raise.
    scaled = scaled.nan_to_num(nan=float("-inf"))
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
