"""The model runner's fast paths against its plain one, on the embedded tiny model: decoding
rows that keep dense KV slots across steps, and prefill chunks batched into one padded pass,
give the logits of one row at a time gathered from the paged pool."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from services.worker.engine.engine import _forward_groups
from services.worker.engine.model_runner import ModelRunner, RunItem, _DecodeSlots
from services.worker.engine.request import SeqState
from services.worker.engine.scheduler import Work

pytestmark = pytest.mark.timeout(300)

BLOCK = 16
BLOCKS_PER_SEQ = 24  # room for 384 tokens


@pytest.fixture(scope="module")
def model(lm: tuple[Any, Any]) -> Any:
    return lm[0]


class Seq:
    """A sequence with its own blocks (disjoint from every other's) and its tokens so far."""

    def __init__(self, index: int, prompt: list[int]) -> None:
        self.key = (f"s{index}", index)
        self.blocks = list(range(index * BLOCKS_PER_SEQ, (index + 1) * BLOCKS_PER_SEQ))
        self.ids = list(prompt)
        self.computed = 0

    def item(self, n: int, keyed: bool) -> RunItem:
        chunk = self.ids[self.computed : self.computed + n]
        return RunItem(chunk, self.computed, self.blocks, self.key if keyed else None)


def assert_same(fast: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)
    assert fast.argmax(-1).tolist() == ref.argmax(-1).tolist()


def test_dense_decode_slots_match_paged_decode_as_rows_join_and_leave(model: Any) -> None:
    rng = random.Random(0)
    vocab = model.config.vocab_size
    lengths = [5, 40, 17, 200, 1, 64, 33, 90, 16, 3, 120, 48, *range(2, 14)]
    fast = ModelRunner(model, len(lengths) * BLOCKS_PER_SEQ, BLOCK)
    ref = ModelRunner(model, len(lengths) * BLOCKS_PER_SEQ, BLOCK)
    fast_seqs = [Seq(i, [rng.randrange(3, vocab) for _ in range(n)]) for i, n in enumerate(lengths)]
    ref_seqs = [Seq(i, s.ids) for i, s in enumerate(fast_seqs)]
    # Prefill all but the last token of each prompt in both runners (one row at a time).
    for f, r in zip(fast_seqs, ref_seqs, strict=True):
        n = len(f.ids) - 1
        if n:
            fast.forward([f.item(n, keyed=False)])
            ref.forward([r.item(n, keyed=False)])
            f.computed = r.computed = n
    # Which sequences decode at each step: joins, leaves, a comeback, growth past the first
    # views' slots and capacity, then a quiet tail on one short row.
    schedule = (
        [[0, 1, 2]] * 3
        + [[0, 2, 3, 4]] * 3  # 1 leaves, 3 and 4 join
        + [list(range(2, 12))] * 3  # more rows than the first buffer held
        + [[0, 1, 11]] * 3  # 0 and 1 come back after a pause; 11 moves to a low slot
        + [list(range(len(lengths)))] * 2
        + [[4]] * 3
    )
    for active in schedule:
        items = [fast_seqs[i].item(1, keyed=True) for i in active]
        got = fast.forward(items)
        want = torch.cat([ref.forward([ref_seqs[i].item(1, keyed=False)]) for i in active])
        assert_same(got, want)
        for i, token in zip(active, want.argmax(-1).tolist(), strict=True):
            for s in (fast_seqs[i], ref_seqs[i]):
                s.computed += 1
                s.ids.append(token)
    # The decode path also wrote every token into the pool: a pooled pass sees the same.
    probe = [fast_seqs[i].item(1, keyed=False) for i in (0, 3, 11)]
    assert_same(fast.forward(probe), ref.forward([ref_seqs[i].item(1, False) for i in (0, 3, 11)]))


def test_a_row_that_skipped_steps_reloads_from_the_pool(model: Any) -> None:
    rng = random.Random(1)
    vocab = model.config.vocab_size
    fast = ModelRunner(model, 4 * BLOCKS_PER_SEQ, BLOCK)
    ref = ModelRunner(model, 4 * BLOCKS_PER_SEQ, BLOCK)
    prompt = [rng.randrange(3, vocab) for _ in range(30)]
    f, r = Seq(0, prompt), Seq(0, prompt)
    for runner, s in ((fast, f), (ref, r)):
        runner.forward([s.item(20, keyed=False)])
        s.computed = 20
    assert_same(fast.forward([f.item(1, keyed=True)]), ref.forward([r.item(1, keyed=False)]))
    f.computed = r.computed = 21
    # Three tokens go through a prefill chunk, behind the dense slot's back.
    assert_same(fast.forward([f.item(3, keyed=True)]), ref.forward([r.item(3, keyed=False)]))
    f.computed = r.computed = 24
    assert_same(fast.forward([f.item(1, keyed=True)]), ref.forward([r.item(1, keyed=False)]))


def test_rows_too_big_for_a_dense_copy_fall_back_to_the_pool(model: Any) -> None:
    rng = random.Random(3)
    vocab = model.config.vocab_size
    # One long row and two short ones fill a 9-block pool; their dense copy (3 rows padded to
    # the long one) would be larger than the pool, so they decode from the pool instead.
    tables = [list(range(0, 7)), [7], [8]]
    fast, ref = ModelRunner(model, 9, BLOCK), ModelRunner(model, 9, BLOCK)
    ids = [[rng.randrange(3, vocab) for _ in range(n)] for n in (100, 5, 5)]
    for runner in (fast, ref):
        for row, table in zip(ids, tables, strict=True):
            runner.forward([RunItem(row[:-1], 0, table)])
    for active in ([0, 1, 2], [0, 1, 2], [1, 2], [1, 2], [0, 1, 2]):
        items = [RunItem(ids[i][-1:], len(ids[i]) - 1, tables[i], (f"s{i}", i)) for i in active]
        got = fast.forward(items)
        want = torch.cat(
            [ref.forward([RunItem(it.token_ids, it.start, it.block_ids)]) for it in items]
        )
        assert_same(got, want)
        assert (fast._slots.slots > 0) == (active == [1, 2])
        for i, token in zip(active, want.argmax(-1).tolist(), strict=True):
            ids[i].append(token)


def test_dense_slots_keep_their_rows_in_one_buffer_as_slots_and_capacity_grow() -> None:
    """More slots of the same capacity extend the views over the same memory with the held
    rows in place and the new slots zeroed; a longer capacity lays the held rows out again,
    moved to their new slots, still in that memory."""
    slots = _DecodeSlots([0, 0], 2, 3, 4, 400)
    slots._fit((4, 8), 4, 8, [])
    for buf in (*slots.k, *slots.v):
        buf.copy_(torch.arange(buf.numel(), dtype=buf.dtype).view(buf.shape) + 1)
    before = [b.clone() for b in (*slots.k, *slots.v)]
    memory = [b.data_ptr() for b in (*slots.k, *slots.v)]

    slots._fit((10, 8), 6, 8, [(r, r) for r in range(4)])
    assert (slots.slots, slots.capacity) == (10, 8)
    for b, old, at in zip((*slots.k, *slots.v), before, memory, strict=True):
        assert b.shape == (10, 2, 8, 3) and b.data_ptr() == at
        assert torch.equal(b[:4], old) and not b[4:].any()

    slots._fit((6, 16), 5, 12, [(0, 0), (3, 1), (1, 4)])
    assert (slots.slots, slots.capacity) == (6, 16)
    for b, old, at in zip((*slots.k, *slots.v), before, memory, strict=True):
        assert b.shape == (6, 2, 16, 3) and b.data_ptr() == at
        for new_slot, old_slot in ((0, 0), (1, 3), (4, 1)):
            assert torch.equal(b[new_slot, :, :8], old[old_slot])


def test_a_decoding_batch_keeps_its_dense_slots_within_a_block_of_its_longest_row() -> None:
    """128 prompts of 128 tokens join 8 a step, then decode to 256 tokens each, in a pool
    of 128 x 264 tokens: the capacity stays within a block of the longest row (attention
    reads the unused room between rows), so the buffer is laid out again once a block of
    steps, and rows that join at the same capacity never move anything."""
    limit, bs = 128 * 264, BLOCK
    slots = _DecodeSlots([0], 1, 1, bs, limit)
    sizes, held = [], (0, 0)
    joins = [min(128, 8 * (k + 1)) for k in range(16)] + [128] * 112
    for step, rows in enumerate(joins):
        need = 129 + step  # the longest row: prompt and output
        if rows > held[0] or need > held[1]:
            size = slots._size_for(rows, need)
            assert size is not None and size[0] * size[1] <= limit
            assert size[0] >= rows and need <= size[1] <= need + bs
            if size[1] != held[1]:
                sizes.append(size)
            held = size
    assert len(sizes) == -(-(256 - 128) // bs), sizes


def test_new_dense_slots_leave_room_by_row_width_length_and_device() -> None:
    """Decodes on a CPU get the next block boundary past the longest row, a 32nd more past
    32 blocks; rows of several tokens a step (speculation's verification), and decodes off
    the CPU, at least four blocks of room, a quarter of the longest row."""
    slots = _DecodeSlots([0], 1, 1, BLOCK, 1 << 20)
    assert slots._size_for(4, 100, 5) == (8, 176)  # four blocks past 100, on a block
    assert slots._size_for(4, 1000, 5) == (8, 1264)  # a quarter past 1000, on a block
    assert slots._size_for(4, 100, 1) == (8, 112)  # decodes: the next block boundary
    assert slots._size_for(4, 96, 1) == (8, 112)
    assert slots._size_for(4, 4000, 1) == (8, 4128)  # long rows: a 32nd more, on a block
    # Off the CPU, where room between rows was not measured to cost, decodes too.
    slots._device = torch.device("cuda")
    assert slots._size_for(4, 100, 1) == (8, 176)


def test_batched_prefill_matches_one_chunk_at_a_time(model: Any) -> None:
    rng = random.Random(2)
    vocab = model.config.vocab_size
    runner = ModelRunner(model, 8 * BLOCKS_PER_SEQ, BLOCK)
    seqs = [Seq(i, [rng.randrange(3, vocab) for _ in range(n)]) for i, n in enumerate([90] * 6)]
    # Fresh prompts (no gather: the new keys are all there is) of equal, then mixed lengths.
    first = runner.forward([s.item(40, keyed=False) for s in seqs[:3]])
    alone = torch.cat([runner.forward([s.item(40, keyed=False)]) for s in seqs[:3]])
    assert_same(first, alone)
    mixed = [seqs[3].item(7, False), seqs[4].item(33, False), seqs[5].item(2, False)]
    assert_same(runner.forward(mixed), torch.cat([runner.forward([it]) for it in mixed]))
    # Continuations of different lengths after different cached starts.
    for s in seqs[:3]:
        s.computed = 40
    seqs[1].computed = 10
    later = [seqs[0].item(50, False), seqs[1].item(45, False), seqs[2].item(12, False)]
    assert_same(runner.forward(later), torch.cat([runner.forward([it]) for it in later]))


def _work(prompt_len: int, computed: int, n: int) -> Work:
    seq = SeqState(f"r{prompt_len}-{computed}-{n}", [5] * prompt_len, 4)
    seq.num_computed = computed
    return Work(seq, n)


def test_forward_groups_batch_decodes_and_similar_prefill_chunks() -> None:
    decodes = [_work(10, 9, 1), _work(30, 29, 1)]
    similar = [_work(128, 0, 128), _work(120, 0, 120), _work(128, 0, 128)]
    short = _work(20, 0, 20)  # padding it to 128 would waste most of the pass
    late = _work(600, 512, 88)  # a chunk behind a long context: its own attention shape
    groups = _forward_groups([similar[0], *decodes, short, similar[1], late, similar[2]])
    assert groups[0] == decodes
    as_sets = [{w.seq.request_id for w in g} for g in groups[1:]]
    assert {w.seq.request_id for w in similar} in as_sets
    assert {short.seq.request_id} in as_sets and {late.seq.request_id} in as_sets
    assert sum(len(g) for g in groups) == 7
