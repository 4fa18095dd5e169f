"""Decode steps on the weights directly (``services.worker.engine.direct``): taken for the
plain Llama-family rows of the compatibility matrix, bit-identical to the model's own
forward through the same runner over many steps of a changing batch (decodes, and
speculation's verification rows with drafts kept in part and rolled back), and refused for
anything else, including a model whose own forward differs from it in the last bit.
Products padded to more rows give the unpadded pass's tokens, and the padding is chosen
from measured times."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from services.worker.engine.direct import PAD_ROWS, choose_padding, direct_decoder
from services.worker.engine.model_runner import ModelRunner, RunItem
from services.worker.loader import load_model
from tests.tiny_models import VOCAB, build_tiny

pytestmark = pytest.mark.timeout(300)

# On an H200 (fp32) the load probe found the model's own forward rounding otherwise than
# the direct pass, so the runner keeps the forward there: the tests of the embedded model
# taking the direct path are about the CPU.
cpu_only = pytest.mark.skipif(
    os.environ.get("TW_TEST_DEVICE", "cpu") != "cpu",
    reason="the direct path is refused off the CPU (not bit-identical there)",
)

BLOCK = 8
PER_SEQ = 40  # blocks per sequence: room for 320 tokens

# Matrix rows the direct path serves, and rows it must leave to the model's forward.
DIRECT_ROWS = ["llama", "llama-rope-llama3", "llama-rope-yarn", "mistral", "qwen2"]
MODEL_ROWS = ["llama-rope-dynamic", "qwen3", "gemma", "gpt2", "falcon"]


def batch_prompts(vocab: int) -> list[list[int]]:
    """Five prompts of 2 to 64 random tokens: the changing batch the runner tests decode."""
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (2, 9, 30, 17, 64)]


def decode_logits(
    runner: ModelRunner, prompts: list[list[int]], steps: int, vocab: int = 0
) -> list[torch.Tensor]:
    """Each step's decode logits, rows joining and leaving (greedy: the argmax is fed back)."""
    rng = random.Random(1)
    seqs = [list(p) for p in prompts]
    for i, s in enumerate(seqs):  # all but the last prompt token
        runner.forward([RunItem(s[:-1], 0, range(i * PER_SEQ, (i + 1) * PER_SEQ))])
    out = []
    for _ in range(steps):
        rows = sorted(rng.sample(range(len(seqs)), rng.randint(1, len(seqs))))
        items = [
            RunItem([seqs[i][-1]], len(seqs[i]) - 1, range(i * PER_SEQ, (i + 1) * PER_SEQ), i)
            for i in rows
        ]
        logits = runner.forward(items)
        out.append(logits)
        for i, tok in zip(rows, logits.argmax(-1).tolist(), strict=True):
            seqs[i].append(tok)
    return out


def verify_logits(
    runner: ModelRunner, prompts: list[list[int]], steps: int, vocab: int
) -> list[torch.Tensor]:
    """Speculation's verification passes: each step some rows bring their next token and a
    draft of 0 to 5 made-up tokens; a random number of the draft is kept (the rest rolled
    back), then the argmax after it; plain decode steps come in between."""
    rng = random.Random(2)
    seqs = [list(p) for p in prompts]
    for i, s in enumerate(seqs):
        runner.forward([RunItem(s[:-1], 0, range(i * PER_SEQ, (i + 1) * PER_SEQ))])
    out = []
    for step in range(steps):
        rows = sorted(rng.sample(range(len(seqs)), rng.randint(1, len(seqs))))
        drafts = {i: [rng.randrange(3, vocab) for _ in range(rng.randint(0, 5))] for i in rows}
        items = [
            RunItem(
                [seqs[i][-1], *drafts[i]],
                len(seqs[i]) - 1,
                range(i * PER_SEQ, (i + 1) * PER_SEQ),
                i,
            )
            for i in rows
        ]
        every = step % 4 != 3  # every fourth step: a plain decode of the same rows
        logits = runner.forward(
            items if every else [it._replace(token_ids=it.token_ids[:1]) for it in items],
            every_position=every,
        )
        if every:  # the positions the rows brought (shorter rows are padded)
            out.append(torch.cat([logits[r, : len(it.token_ids)] for r, it in enumerate(items)]))
        else:
            out.append(logits)
        for r, i in enumerate(rows):
            kept = rng.randint(0, len(drafts[i])) if every else 0
            row = logits[r, kept] if every else logits[r]
            seqs[i] += [*drafts[i][:kept], int(row.argmax())]
    return out


def assert_bit_identical(model: Any, vocab: int) -> None:
    prompts = batch_prompts(vocab)
    # Unpadded products: a padded one rounds as a product of its padded rows does.
    direct = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK, pad_products=False)
    plain = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK, pad_products=False)
    # Decoding runs directly everywhere. Verifying rows of several tokens runs directly where
    # the load probe finds it bit-identical on this CPU, else through the model's own
    # forward: either way over the same dense slots, in the same rows, and its logits must
    # be the model's, bit for bit. (Logits of a row depend on its place in the batch on
    # some CPUs, so the two runners must place rows alike.)
    assert direct._direct is not None
    plain._direct = None
    for run in (decode_logits, verify_logits):
        for runner in (direct, plain):  # a row key names one sequence's tokens
            runner.forget_rows()
        ours = run(direct, prompts, 40, vocab)
        theirs = run(plain, prompts, 40, vocab)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), run.__name__


@cpu_only
def test_the_embedded_model_decodes_directly_bit_for_bit(lm: tuple[Any, Any]) -> None:
    model = lm[0]
    assert_bit_identical(model, model.config.vocab_size)


@pytest.mark.parametrize("name", DIRECT_ROWS)
def test_plain_llama_family_rows_decode_directly_bit_for_bit(
    name: str, tmp_path: Path, model_dir: str
) -> None:
    model, _ = load_model(str(build_tiny(name, tmp_path / name, model_dir)), "cpu", "float32")
    assert_bit_identical(model, VOCAB)


@pytest.mark.parametrize("name", MODEL_ROWS)
def test_other_models_keep_their_own_forward(name: str, tmp_path: Path, model_dir: str) -> None:
    model, _ = load_model(str(build_tiny(name, tmp_path / name, model_dir)), "cpu", "float32")
    assert ModelRunner(model, 8, BLOCK)._direct is None


@cpu_only
def test_a_forward_that_differs_in_the_last_bit_is_not_replaced(lm: tuple[Any, Any]) -> None:
    model = lm[0]
    runner = ModelRunner(model, 8, BLOCK)
    assert direct_decoder(model, runner._run) is not None

    def nudged(*args: Any) -> torch.Tensor:
        logits = runner._run(*args)
        return torch.nextafter(logits, torch.full_like(logits, float("inf")))

    assert direct_decoder(model, nudged) is None


@cpu_only
def test_padded_products_give_the_unpadded_passs_tokens(lm: tuple[Any, Any]) -> None:
    model = lm[0]
    vocab = model.config.vocab_size
    prompts = batch_prompts(vocab)
    padded = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK)
    unpadded = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK, pad_products=False)
    assert padded._direct is not None and unpadded._direct is not None
    assert unpadded._direct.pad == {}
    # Every product of fewer rows than the most timed runs padded, whatever this CPU's
    # times chose: a decode of 1 to 5 rows, a verification of up to 5 positions.
    padded._direct.pad = {m: PAD_ROWS for m in range(1, PAD_ROWS)}
    for run in (decode_logits, verify_logits):
        for runner in (padded, unpadded):
            runner.forget_rows()
        ours = run(padded, prompts, 40, vocab)
        theirs = run(unpadded, prompts, 40, vocab)
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a.argmax(-1), b.argmax(-1)), run.__name__
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_a_product_is_padded_only_to_a_clearly_faster_row_count() -> None:
    # Seconds per row count, as MKL on an AMD EPYC gave them for the small preset's layers.
    times = {1: 0.0101, 2: 0.0159, 3: 0.0170, 4: 0.0142, 5: 0.0119, 6: 0.0117}
    assert choose_padding(times) == {2: 6, 3: 6, 4: 6}
    # One row's matrix-vector product is the fastest: never padded. Within 15%: left alone.
    assert choose_padding({1: 1.0, 2: 1.1, 3: 1.0}) == {}
    assert choose_padding({1: 1.0, 2: 1.2, 3: 1.0}) == {2: 3}
    # Ties go to the fewest rows; a count with nothing larger keeps its own.
    assert choose_padding({2: 2.0, 3: 1.0, 4: 1.0}) == {2: 3}
    assert choose_padding({4: 1.0}) == {}


@cpu_only
def test_the_padding_is_measured_once_per_model(lm: tuple[Any, Any]) -> None:
    model = lm[0]
    first = ModelRunner(model, 8, BLOCK)
    assert first._direct is not None
    assert set(first._direct.pad) <= set(range(1, PAD_ROWS))
    assert all(m < n <= PAD_ROWS for m, n in first._direct.pad.items())
    again = ModelRunner(model, 8, BLOCK)
    assert again._direct is not None and again._direct.pad is first._direct.pad
