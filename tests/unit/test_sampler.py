"""Per-request sampling: greedy, top-k/top-p/min-p filtering, and seeds independent of the
batch."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from services.worker.engine.sampler import (
    MAX_BLOCK,
    Picker,
    SeenTokens,
    _distributions,
    _Group,
    adjust,
    make_generator,
    row_max,
)
from services.worker.engine.wire import SamplingConfig

CPU = torch.device("cpu")
VOCAB = 50


def sample(
    logits: torch.Tensor,
    configs: list[SamplingConfig],
    generators: list[torch.Generator | None],
) -> list[int | None]:
    """One token per row of ``logits``, drawn row by row as the engine draws them."""
    picker = Picker(logits, configs)
    return [picker.pick(i, g) for i, g in enumerate(generators)]


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=gen) * 3.0


def draws(logits: torch.Tensor, cfg: SamplingConfig, n: int) -> Counter[int]:
    """``n`` samples of one row with one seeded generator (one row per draw)."""
    gen = make_generator(cfg.seed, CPU)
    rows = logits.expand(n, -1)
    return Counter(sample(rows, [cfg] * n, [gen] * n))


def test_greedy_is_argmax() -> None:
    logits = random_logits(8)
    out = sample(logits, [SamplingConfig()] * 8, [None] * 8)
    assert out == logits.argmax(dim=-1).tolist()
    assert all(isinstance(t, int) for t in out)


@pytest.mark.parametrize("cols", [MAX_BLOCK * 32, MAX_BLOCK * 3, MAX_BLOCK, 1000, 7])
def test_row_max_is_max_over_the_last_dim(cols: int) -> None:
    """Values and first columns as ``max(dim=-1)``: ties within a block and across blocks,
    NaN, +inf, a row of -inf only, a row of ties, and a view that is not contiguous."""
    gen = torch.Generator().manual_seed(cols)
    logits = torch.randn(12, cols, generator=gen)
    logits[0, [3, cols - 1]] = 50.0  # the first of two, across blocks
    logits[1, [5, 6]] = 50.0  # within one block
    logits[2, cols // 2] = float("nan")
    logits[3, [1, cols - 2]] = float("inf")
    logits[4] = float("-inf")
    logits[5] = 1.0
    logits[6, cols - 1] = 99.0  # the last column
    logits[7, 0] = 99.0
    logits[8, cols // 3] = float("nan")
    logits[8, 0] = float("inf")  # NaN wins over +inf, as max does
    for x in (logits, torch.cat([logits, logits], dim=1)[:, :cols]):
        top, col = row_max(x)
        want_top, want_col = x.max(dim=-1)
        assert torch.equal(col, want_col)
        assert torch.equal(top.isnan(), want_top.isnan())
        assert torch.equal(top.nan_to_num(0.0), want_top.nan_to_num(0.0))


def test_greedy_rows_ignore_top_k_top_p_min_p_and_seed() -> None:
    logits = random_logits(3)
    cfgs = [SamplingConfig(temperature=0.0, top_k=5, top_p=0.5, min_p=0.9, seed=1)] * 3
    assert sample(logits, cfgs, [None] * 3) == logits.argmax(dim=-1).tolist()


def test_half_precision_logits() -> None:
    logits = random_logits(4).to(torch.bfloat16)
    out = sample(logits, [SamplingConfig()] * 4, [None] * 4)
    assert out == logits.float().argmax(dim=-1).tolist()


@pytest.mark.parametrize("seed", range(5))
def test_top_k_one_equals_greedy(seed: int) -> None:
    logits = random_logits(6, seed)
    cfgs = [SamplingConfig(temperature=1.5, top_k=1, seed=seed + i) for i in range(6)]
    gens = [make_generator(c.seed, CPU) for c in cfgs]
    assert sample(logits, cfgs, gens) == logits.argmax(dim=-1).tolist()


def test_tiny_top_p_keeps_only_the_top_token() -> None:
    logits = random_logits(6, 3)
    cfgs = [SamplingConfig(temperature=2.0, top_p=1e-6, seed=i) for i in range(6)]
    gens = [make_generator(c.seed, CPU) for c in cfgs]
    for _ in range(20):
        assert sample(logits, cfgs, gens) == logits.argmax(dim=-1).tolist()


def test_top_k_never_picks_outside_the_k_best() -> None:
    logits = random_logits(1, 4)[0]
    best = set(logits.topk(3).indices.tolist())
    got = draws(logits, SamplingConfig(temperature=5.0, top_k=3, seed=11), 500)
    assert set(got) <= best
    assert len(got) == 3  # a hot temperature reaches all three


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    got = draws(logits, SamplingConfig(temperature=1.0, top_p=0.75, seed=5), 4000)
    assert set(got) == {0, 1}  # 0.5 < 0.75 <= 0.5 + 0.3
    assert got[0] / 4000 == pytest.approx(0.5 / 0.8, abs=0.03)


def test_min_p_keeps_the_tokens_at_least_that_share_of_the_top_one() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # 0.35 x 0.5 = 0.175: 0.3 stays, 0.15 and 0.05 go.
    got = draws(logits, SamplingConfig(temperature=1.0, min_p=0.35, seed=8), 4000)
    assert set(got) == {0, 1}
    assert got[0] / 4000 == pytest.approx(0.5 / 0.8, abs=0.03)
    # 0.25 x 0.5 = 0.125: 0.15 stays too.
    wider = draws(logits, SamplingConfig(temperature=1.0, min_p=0.25, seed=8), 4000)
    assert set(wider) == {0, 1, 2}
    assert wider[2] / 4000 == pytest.approx(0.15 / 0.95, abs=0.03)


def test_min_p_applies_after_temperature() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # At T=2 the shares go as sqrt(p): 0.15 is then 0.55 of the top one, 0.05 is 0.32.
    hot = draws(logits, SamplingConfig(temperature=2.0, min_p=0.5, seed=9), 3000)
    assert set(hot) == {0, 1, 2}
    cold = draws(logits, SamplingConfig(temperature=1.0, min_p=0.5, seed=9), 3000)
    assert set(cold) == {0, 1}


def test_min_p_one_keeps_only_the_top_token_and_zero_keeps_all() -> None:
    logits = random_logits(6, 5)
    cfgs = [SamplingConfig(temperature=5.0, min_p=1.0, seed=i) for i in range(6)]
    gens = [make_generator(c.seed, CPU) for c in cfgs]
    for _ in range(20):
        assert sample(logits, cfgs, gens) == logits.argmax(dim=-1).tolist()
    flat = torch.zeros(VOCAB)
    assert len(draws(flat, SamplingConfig(temperature=1.0, min_p=0.0, seed=4), 2000)) == VOCAB


def test_min_p_then_top_p_over_what_is_left() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    # min_p 0.4 leaves 0.4, 0.3, 0.2; top_p 0.75 over those renormalized (0.44, 0.33,
    # 0.22) needs the first two: 0.44 < 0.75 <= 0.78. (Over the whole distribution first,
    # top_p would keep three: 0.7 < 0.75.)
    got = draws(logits, SamplingConfig(temperature=1.0, min_p=0.4, top_p=0.75, seed=6), 4000)
    assert set(got) == {0, 1}
    assert got[0] / 4000 == pytest.approx(0.4 / 0.7, abs=0.03)


def test_temperature_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    got = draws(torch.log(probs), SamplingConfig(temperature=1.0, seed=1234), 4000)
    for token, p in enumerate(probs.tolist()):
        assert got[token] / 4000 == pytest.approx(p, abs=0.03)  # ~4 standard deviations


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    cold = draws(logits, SamplingConfig(temperature=0.05, seed=3), 1000)
    assert cold[0] / 1000 > 0.99
    hot = draws(logits, SamplingConfig(temperature=100.0, seed=3), 3000)
    for token in range(3):
        assert hot[token] / 3000 == pytest.approx(1 / 3, abs=0.035)
    # Expected share at T=2: proportional to sqrt(p).
    warm = draws(logits, SamplingConfig(temperature=2.0, seed=3), 4000)
    roots = [math.sqrt(p) for p in (0.5, 0.3, 0.2)]
    assert warm[2] / 4000 == pytest.approx(roots[2] / sum(roots), abs=0.03)


def test_make_generator() -> None:
    assert make_generator(None, CPU) is None
    a, b = make_generator(42, CPU), make_generator(42, CPU)
    assert a is not None and b is not None
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))


def test_the_same_seed_repeats_itself() -> None:
    logits = random_logits(1, 9).expand(64, -1)
    cfg = SamplingConfig(temperature=1.0, top_p=0.95, seed=77)
    first = sample(logits, [cfg] * 64, [make_generator(77, CPU)] * 64)
    again = sample(logits, [cfg] * 64, [make_generator(77, CPU)] * 64)
    assert first == again
    assert len(set(first)) > 1


@pytest.mark.parametrize(
    "target",
    [
        SamplingConfig(temperature=1.0, seed=2024),
        SamplingConfig(temperature=0.8, top_p=0.9, seed=2024),
        SamplingConfig(temperature=1.3, top_k=10, seed=2024),
        SamplingConfig(temperature=1.5, min_p=0.05, seed=2024),
    ],
)
def test_a_seeded_row_draws_the_same_alone_or_in_a_mixed_batch(target: SamplingConfig) -> None:
    steps = 25
    target_logits = random_logits(steps, 100)  # one row of logits per decode step

    gen = make_generator(target.seed, CPU)
    alone = [sample(target_logits[s : s + 1], [target], [gen])[0] for s in range(steps)]

    others = [
        SamplingConfig(),
        SamplingConfig(temperature=0.7),
        SamplingConfig(temperature=1.0, top_k=3, seed=1),
        SamplingConfig(temperature=2.0, top_p=0.5, seed=2),
        SamplingConfig(temperature=0.5, top_k=20, top_p=0.8),
        SamplingConfig(temperature=1.0, min_p=0.3, seed=3),
    ]
    neighbours = [others[i % len(others)] for i in range(15)]
    cfgs = [*neighbours[:7], target, *neighbours[7:]]
    gens = [make_generator(c.seed, CPU) if c.temperature > 0 else None for c in cfgs]
    noise = random_logits(steps * 16, 200).view(steps, 16, VOCAB)
    mixed = []
    for s in range(steps):
        batch = noise[s].clone()
        batch[7] = target_logits[s]
        mixed.append(sample(batch, cfgs, gens)[7])
    assert mixed == alone
    assert len(set(alone)) > 1  # the check is not trivially about a constant


def reference_probs(row: torch.Tensor, cfg: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's sampling distribution as its definition reads, the whole row sorted:
    temperature, min-p, top-k, then top-p over what the top-k left. And the tokens at the
    top-p's edge, whose mass before them is within float32 rounding of top-p (kept or
    dropped as the order of the additions falls)."""
    x = row.float() / cfg.temperature
    if cfg.min_p > 0:
        x = x.masked_fill(x < x.max() + math.log(cfg.min_p), float("-inf"))
    order = x.argsort(descending=True)
    probs = torch.softmax(x[order], dim=-1)
    if 0 < cfg.top_k < len(row):
        probs[cfg.top_k :] = 0.0
        probs /= probs.sum()
    before = probs.cumsum(dim=-1) - probs
    edge = (before - cfg.top_p).abs() < 1e-6
    if cfg.top_p < 1.0:
        probs[before >= cfg.top_p] = 0.0
        probs /= probs.sum()
    unsort = torch.empty_like(order).scatter_(0, order, torch.arange(len(row)))
    return probs[unsort], edge[unsort]


def dense(groups: list[_Group], rows: int, vocab: int) -> torch.Tensor:
    """The groups' distributions as ``[rows, vocab]`` probabilities."""
    out = torch.full((rows, vocab), float("nan"))
    for g in groups:
        probs = torch.diff(g.cdf, dim=-1, prepend=torch.zeros(len(g.rows), 1)) / g.cdf[:, -1:]
        at = torch.tensor(g.rows)
        if g.ids is None:
            out[at] = probs
        else:
            out[at] = torch.zeros(len(g.rows), vocab).scatter_(1, g.ids, probs)
    return out


def test_every_distribution_equals_its_definition_ranked_or_sorted() -> None:
    """Rows cut by top-k are ranked among their k most likely tokens, rows cut by top-p
    alone binned by probability (no sort): over 4,096 logits, from sharp rows (a few
    tokens kept) to flat ones (most of the vocabulary), each row's distribution is the one
    its definition gives, and the rows take every path."""
    vocab = 4096
    gen = torch.Generator().manual_seed(7)
    sharpness = torch.tensor([0.3, 1.0, 3.0, 6.0, 12.0]).repeat(16)[:, None]
    logits = torch.randn(80, vocab, generator=gen) * sharpness
    kinds = [
        SamplingConfig(temperature=1.0, top_p=0.9),
        SamplingConfig(temperature=0.7, top_p=0.5),
        SamplingConfig(temperature=1.3, top_p=0.99),
        SamplingConfig(temperature=1.0, top_k=5),
        SamplingConfig(temperature=1.0, top_k=100, top_p=0.8),
        SamplingConfig(temperature=1.0, top_k=3000),
        SamplingConfig(temperature=0.9, min_p=0.05, top_p=0.95),
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.8, top_p=0.999),
    ]
    configs = [kinds[i % len(kinds)] for i in range(80)]
    groups = _distributions(logits, list(range(80)), configs)
    got = dense(groups, 80, vocab)
    refs = [reference_probs(r, c) for r, c in zip(logits, configs, strict=True)]
    want = torch.stack([probs for probs, _ in refs])
    clear = ~torch.stack([edge for _, edge in refs])
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert not got[clear & (want == 0)].any()  # no dropped token can be drawn
    # Every kept one can, but for those too unlikely to move a float32 cumulative sum.
    assert got[clear & (want > 1e-6)].all()
    # Ranked among 16 (top-k 5) and 128 (top-k 100); the top-k of 3,000 sorted; the whole
    # rows and those cut by top-p alone over the vocabulary in order.
    assert {g.ids.shape[1] for g in groups if g.ids is not None} == {16, 128}
    assert sum(g.ids is None for g in groups) == 3


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0.9, top_p=0.9),  # binned
        SamplingConfig(temperature=0.9, top_k=5),  # ranked
        SamplingConfig(temperature=0.9),  # the whole vocabulary
        SamplingConfig(temperature=0.9, top_k=3000, top_p=0.5),  # sorted
        SamplingConfig(temperature=0.9, top_p=0.9, seed=4),  # drawn when picked
    ],
)
def test_rows_with_a_nan_or_inf_get_no_token_and_spare_the_others(cfg: SamplingConfig) -> None:
    logits = torch.randn(5, 4096, generator=torch.Generator().manual_seed(1)) * 3
    logits[0, 7] = float("nan")
    logits[1, 9] = float("inf")
    logits[2] = float("-inf")
    logits[3, 100] = 3e38  # finite, but over float32's limit once scaled by 1 / 0.9
    picker = Picker(logits, [cfg] * 5)
    gen = make_generator(cfg.seed, CPU)
    picks = [picker.pick(i, gen) for i in range(5)]
    assert picks[:3] == [None, None, None]
    assert picks[3] == 100  # an overflowing row samples its limit, the argmax
    assert isinstance(picks[4], int) and 0 <= picks[4] < 4096


def test_a_draw_never_lands_on_a_token_of_probability_zero() -> None:
    # Tokens 0 and 2 are dropped (probability 0), token 3 ends the row.
    group = _Group([0], torch.tensor([[0.0, 0.5, 0.5, 1.0]]), None)
    low, half, high = 0.0, 0.5, float(torch.tensor(1.0).nextafter(torch.tensor(0.0)))
    assert group.draw([0, 0, 0], torch.tensor([low, half, high])) == [1, 3, 3]
    assert group.draw([0], torch.tensor([0.4999])) == [1]
    ranked = _Group([0], torch.tensor([[0.7, 0.7, 1.0]]), torch.tensor([[9, 4, 2]]))
    assert ranked.draw([0, 0], torch.tensor([0.0, 0.9])) == [9, 2]


def test_a_seeded_row_draws_the_same_in_any_batch_over_a_large_vocabulary() -> None:
    """Over 4,096 logits rows are grouped by how many candidates they need: a seeded row's
    tokens still do not depend on its neighbours."""
    vocab, steps = 4096, 20
    gen = torch.Generator().manual_seed(3)
    target = SamplingConfig(temperature=0.9, top_p=0.9, seed=5)
    rows = torch.randn(steps, vocab, generator=gen) * 4.0
    seeded = make_generator(5, CPU)
    alone = [Picker(rows[s : s + 1], [target]).pick(0, seeded) for s in range(steps)]
    others = [
        SamplingConfig(temperature=1.0, top_p=0.5),
        SamplingConfig(temperature=1.0, top_k=40, seed=2),
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=2.0, top_p=0.99),
    ]
    configs = [others[i % 4] for i in range(8)] + [target]
    seeded = make_generator(5, CPU)
    mixed = []
    for s in range(steps):
        batch = torch.randn(9, vocab, generator=gen) * torch.rand(9, 1, generator=gen) * 8
        batch[8] = rows[s]
        picker = Picker(batch, configs)
        gens = [make_generator(c.seed, CPU) for c in configs[:8]]
        neighbours = [picker.pick(i, g) for i, g in enumerate(gens)]  # drawn first
        assert all(isinstance(t, int) for t in neighbours)
        mixed.append(picker.pick(8, seeded))
    assert mixed == alone
    assert len(set(alone)) > 1


def reference_adjust(
    row: torch.Tensor, cfg: SamplingConfig, prompt: list[int], output: list[int]
) -> torch.Tensor:
    """One row's penalties and biases, token by token, as their definitions read."""
    out = row.clone()
    vocab = len(row)
    for t in {t for t in prompt + output if 0 <= t < vocab}:
        out[t] = out[t] / cfg.repetition_penalty if out[t] > 0 else out[t] * cfg.repetition_penalty
    for t in {t for t in output if 0 <= t < vocab}:
        out[t] -= cfg.frequency_penalty * output.count(t) + cfg.presence_penalty
    for t, b in cfg.logit_bias:
        if t < len(row):
            out[t] += b
    return out


def seen_after(prompt: list[int], output: list[int]) -> SeenTokens:
    """A request's seen ids once it has generated ``output``, kept token by token."""
    seen = SeenTokens(prompt, VOCAB)
    for t in output:
        seen.add(t)
    return seen


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_drafts", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_adjust_matches_the_definitions_row_by_row(
    seed: int, with_drafts: bool, strided: bool
) -> None:
    rng = random.Random(seed)
    rows = 7
    logits = random_logits(rows, seed)
    configs = [
        SamplingConfig(),  # adjusts nothing: left as it is
        SamplingConfig(repetition_penalty=1.3),
        SamplingConfig(presence_penalty=0.7, frequency_penalty=-0.4),
        SamplingConfig(logit_bias=((3, 5.0), (3, -1.0), (VOCAB + 7, 9.0))),  # out of range
        SamplingConfig(
            repetition_penalty=0.8,
            presence_penalty=-1.0,
            frequency_penalty=1.5,
            logit_bias=((0, -100.0), (VOCAB - 1, 2.0)),
        ),
        SamplingConfig(temperature=1.0, frequency_penalty=0.5),
        SamplingConfig(repetition_penalty=2.0, presence_penalty=1.0, logit_bias=((5, 1.5),)),
    ]
    # Repeats in both lists; one output left empty, ids out of range ignored, a row that
    # outgrows its arrays (every id once), and a row with no ids at all (only its bias
    # applies).
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))] for _ in range(rows)]
    outputs = [[rng.randrange(VOCAB // 4) for _ in range(rng.randint(0, 40))] for _ in range(rows)]
    outputs[2] = []
    prompts[1] += [VOCAB, VOCAB + 3]
    prompts[5], outputs[5] = [1], rng.sample(range(VOCAB), VOCAB) * 2
    prompts[6] = outputs[6] = []
    # Speculation's rows: read as if a draft followed the output (new ids, repeats, an id
    # out of range), the request's own arrays left as they are.
    drafts = [
        [rng.choice([rng.randrange(VOCAB), VOCAB + 1]) for _ in range(rng.randint(0, 5))]
        if with_drafts
        else []
        for _ in range(rows)
    ]
    seen = [
        seen_after(p, o) if c.penalizes else None
        for p, o, c in zip(prompts, outputs, configs, strict=True)
    ]
    kept = [None if t is None else [a.tolist() for a in t.arrays([])] for t in seen]
    # Adjusted in place, also in a view whose rows are not contiguous (a pass's last
    # positions): the values between its rows are left as they are.
    whole = torch.zeros(rows, 2 if strided else 1, VOCAB)
    whole[:, 0] = logits
    got = whole[:, 0]
    adjust(got, configs, seen, drafts)
    assert not strided or torch.equal(whole[:, 1], torch.zeros(rows, VOCAB))
    for r in range(rows):
        output = outputs[r] + drafts[r]
        want = reference_adjust(logits[r], configs[r], prompts[r], output)
        torch.testing.assert_close(got[r], want)
    assert torch.equal(got[0], logits[0])
    assert not torch.equal(got[4], logits[4])
    assert [None if t is None else [a.tolist() for a in t.arrays([])] for t in seen] == kept


def test_seen_tokens_count_each_id_once_and_its_output_occurrences() -> None:
    seen = SeenTokens([7, 7, 3, -1, VOCAB], VOCAB)
    for t in [3, 9, 9, VOCAB + 2, 9]:
        seen.add(t)
    ids, counts = seen.arrays([])
    assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == {3: 1, 7: 0, 9: 3}
    ids, counts = seen.arrays([7, 11, 11])
    assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == {3: 1, 7: 1, 9: 3, 11: 2}
