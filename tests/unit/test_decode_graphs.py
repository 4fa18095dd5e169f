"""Decode steps replayed from CUDA graphs (``services.worker.engine.graphs``): the bucket
and capture policy on plain data, and the padded pass a graph records against the
runner's own decode over a changing batch. On a CPU the padded pass runs eagerly on the
same fixed buffers; with ``TW_TEST_DEVICE=cuda`` it is captured and replayed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from services.worker.engine.graphs import CAPTURE_AFTER, DecodeGraphs, bucket_rows
from services.worker.engine.model_runner import ModelRunner, RunItem
from tests.unit.test_direct_decode import BLOCK, PER_SEQ, batch_prompts, decode_logits

pytestmark = pytest.mark.timeout(300)


def test_rows_pad_to_powers_of_two_then_multiples_of_16() -> None:
    got = [bucket_rows(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 250, 512)]
    assert got == [1, 2, 4, 8, 8, 16, 16, 32, 256, 512]
    assert bucket_rows(513) is None
    assert bucket_rows(40, largest=40) == 40  # never past the largest


def test_a_shape_gets_its_graph_after_it_repeats_and_inputs_go_through_fixed_buffers() -> None:
    seen: list[tuple[int, int]] = []

    def run_pass(inputs: torch.Tensor, cap: int) -> torch.Tensor:
        seen.append((inputs.data_ptr(), cap))
        return inputs.sum(0, keepdim=True).float()

    graphs = DecodeGraphs(run_pass, 3, torch.device("cpu"), replay=False)
    host = torch.arange(12).view(3, 4)
    outs = [graphs.run(host, 64) for _ in range(CAPTURE_AFTER + 1)]
    assert outs[: CAPTURE_AFTER - 1] == [None] * (CAPTURE_AFTER - 1)
    for out in outs[CAPTURE_AFTER - 1 :]:
        assert out is not None and out.tolist() == [[12.0, 15.0, 18.0, 21.0]]
    assert graphs.run(host, 128) is None  # another capacity: another shape, counted afresh
    assert {ptr for ptr, _ in seen} == {graphs.inputs.data_ptr()}
    assert graphs.replays == 2


def test_a_failed_capture_leaves_every_later_decode_to_the_eager_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graphs = DecodeGraphs(lambda inputs, cap: inputs.float(), 2, torch.device("cpu"), replay=False)
    graphs.replay = True  # as on a GPU, with a capture that fails

    def fail(*_: Any) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", fail)
    host = torch.ones((2, 4), dtype=torch.long)
    assert [graphs.run(host, 16) for _ in range(CAPTURE_AFTER + 2)] == [None] * (CAPTURE_AFTER + 2)
    assert graphs.broken and graphs.replays == 0


def _graphed(runner: ModelRunner) -> ModelRunner:
    if runner._graphs is None:  # a CPU: the padded pass, run eagerly
        runner._graphs = runner.decode_graphs(replay=False)
    return runner


@pytest.mark.parametrize("path", ["direct", "model forward"])
def test_graphed_decodes_give_the_runners_own_tokens_over_a_changing_batch(
    lm: tuple[Any, Any], path: str
) -> None:
    model = lm[0]
    vocab = model.config.vocab_size
    prompts = batch_prompts(vocab)
    graphed = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK)
    plain = ModelRunner(model, len(prompts) * PER_SEQ, BLOCK, cuda_graphs=False)
    assert plain._graphs is None
    if path == "direct" and graphed._direct is None:
        pytest.skip("the direct decoder is not bit-identical to the forward on this device")
    if path == "model forward":
        graphed._direct = plain._direct = None
    graphed = _graphed(graphed)
    ours = decode_logits(graphed, prompts, 60, vocab)
    theirs = decode_logits(plain, prompts, 60, vocab)
    assert graphed.graph_replays > 10
    exact = model.dtype == torch.float32
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 if exact else 0.125)
    # Padding rows wrote only to the spare block: every block the KV manager hands out
    # holds what the plain runner's does.
    n = plain.num_blocks
    for mine, its in zip(graphed.k_pool + graphed.v_pool, plain.k_pool + plain.v_pool, strict=True):
        torch.testing.assert_close(mine[:n], its[:n], rtol=0, atol=1e-4 if exact else 0.125)


def test_a_steady_batch_decodes_from_one_graph(lm: tuple[Any, Any]) -> None:
    model = lm[0]
    runner = _graphed(ModelRunner(model, 4 * PER_SEQ, BLOCK))
    seqs = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    for i, s in enumerate(seqs):
        runner.forward([RunItem(s[:-1], 0, range(i * PER_SEQ, (i + 1) * PER_SEQ))])
    caps = set()
    for _ in range(20):
        items = [
            RunItem([s[-1]], len(s) - 1, range(i * PER_SEQ, (i + 1) * PER_SEQ), i)
            for i, s in enumerate(seqs)
        ]
        for s, tok in zip(seqs, runner.forward(items).argmax(-1).tolist(), strict=True):
            s.append(tok)
        caps.add(runner._slots.capacity)
    # One shape per capacity the slots grew through (a block at a time on a CPU).
    assert runner._graphs is not None
    assert runner.graph_replays == 20 - (CAPTURE_AFTER - 1) * len(caps) > 0
    if runner._graphs.replay:
        assert runner._graphs.captures == len(caps)
