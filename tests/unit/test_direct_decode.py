"""Decode steps on the weights directly (``services.worker.engine.direct``): taken for the
plain Llama-family rows of the compatibility matrix, bit-identical to the model's own
forward through the same runner over many steps of a changing batch (decodes, and
speculation's verification rows with drafts kept in part and rolled back), and refused for
anything else, including a model whose own forward differs from it in the last bit."""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from services.worker.engine.direct import direct_decoder
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
            items if every else [replace(it, token_ids=it.token_ids[:1]) for it in items],
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
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (2, 9, 30, 17, 64)]
    direct = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK)
    plain = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK)
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
