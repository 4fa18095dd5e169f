"""The scheduler on plain lists: a fake model appends one token per sampling step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from services.worker.engine.kv_cache import KVCacheManager
from services.worker.engine.request import SeqState, Status
from services.worker.engine.scheduler import Scheduler, SchedulerConfig, StepPlan, Work

INTERACTIVE, BULK = 0, 1


@dataclass(frozen=True)
class Planned:
    """A Work as it was at planning time (a Work's seq keeps changing afterwards)."""

    request_id: str
    start: int
    num_tokens: int
    samples: bool


@dataclass
class Sim:
    """A scheduler, its KV manager and a fake model; checks invariants on every step."""

    num_blocks: int = 256
    block_size: int = 4
    max_running: int = 64
    max_step_tokens: int = 1024
    prefill_chunk: int = 256
    prefix_cache: bool = True
    seqs: dict[str, SeqState] = field(default_factory=dict)
    finished: list[SeqState] = field(default_factory=list)
    history: list[list[Planned]] = field(default_factory=list)
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.kv = KVCacheManager(self.num_blocks, self.block_size, self.prefix_cache)
        self.sched = Scheduler(
            self.kv, SchedulerConfig(self.max_running, self.max_step_tokens, self.prefill_chunk)
        )

    def add(
        self, rid: str, prompt: list[int], max_tokens: int, priority: int = INTERACTIVE
    ) -> SeqState:
        seq = SeqState(rid, list(prompt), max_tokens, priority)
        self.seqs[rid] = seq
        self.sched.add(seq)
        return seq

    def expected_output(self, seq: SeqState) -> list[int]:
        base = 1_000_000 + 1000 * list(self.seqs).index(seq.request_id)
        return [base + i for i in range(seq.max_tokens)]

    def step(self) -> StepPlan:
        plan = self.sched.schedule()
        planned = [
            Planned(w.seq.request_id, w.seq.num_computed, w.num_tokens, w.samples)
            for w in plan.work
        ]
        self.check(plan)
        self.history.append(planned)
        self.preemptions += len(plan.preempted)
        sampling = [w.seq for w in plan.work if w.samples]
        self.sched.complete(plan)
        for seq in sampling:
            seq.append_output(self.expected_output(seq)[len(seq.output_ids)])
            if len(seq.output_ids) >= seq.max_tokens:
                self.sched.finish(seq, Status.FINISHED_LENGTH)
                self.finished.append(seq)
        return plan

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError(f"no progress: {len(self.finished)}/{len(self.seqs)} finished")

    def check(self, plan: StepPlan) -> None:
        sched, kv = self.sched, self.kv
        ids = [w.seq.request_id for w in plan.work]
        assert len(ids) == len(set(ids)), "a sequence was planned twice"
        assert sum(w.num_tokens for w in plan.work) <= self.max_step_tokens
        assert len(sched.running) <= self.max_running
        assert kv.stats.used_blocks <= self.num_blocks
        assert kv.stats.peak_used_blocks <= self.num_blocks
        for w in plan.work:
            assert w.num_tokens >= 1
            assert w.num_tokens <= self.prefill_chunk
            assert w.seq.status is Status.RUNNING and w.seq in sched.running
            # The step's allocation covers every token it processes.
            capacity = len(kv.table(w.seq.request_id).block_ids) * self.block_size
            assert capacity >= w.seq.num_computed + w.num_tokens
            assert w.seq.num_computed + w.num_tokens <= w.seq.num_tokens
        for seq in plan.preempted:
            assert seq.status is Status.PREEMPTED
            assert seq.num_computed == 0
            assert seq in sched.waiting and seq not in sched.running
            assert not kv.holds(seq.request_id)
            assert seq.request_id not in ids
        keys = [s.sort_key for s in sched.waiting]
        assert keys == sorted(keys)


def prompt(tag: int, n: int) -> list[int]:
    """A prompt of ``n`` ids unique to ``tag`` (no accidental prefix sharing)."""
    return [tag * 10_000 + i for i in range(n)]


def planned_ids(plan: StepPlan) -> list[str]:
    return [w.seq.request_id for w in plan.work]


# --- request state -------------------------------------------------------------------------
def test_seq_state_basics() -> None:
    seq = SeqState("r", [1, 2, 3], max_tokens=4)
    assert seq.num_tokens == 3 and seq.num_uncomputed == 3 and seq.in_prefill
    seq.num_computed = 2
    assert not seq.in_prefill
    seq.append_output(9)
    assert seq.all_ids == [1, 2, 3, 9]
    seq.preempt()
    assert (seq.status, seq.num_computed, seq.num_preemptions) == (Status.PREEMPTED, 0, 1)
    with pytest.raises(ValueError):
        seq.finish(Status.RUNNING)
    seq.finish(Status.FINISHED_STOPPED)
    assert seq.status.finished
    assert not Status.PREEMPTED.finished
    assert all(s.finished == s.name.startswith("FINISHED") for s in Status)


def test_work_samples_only_at_the_end_of_known_tokens() -> None:
    seq = SeqState("r", list(range(10)), max_tokens=1)
    assert not Work(seq, 4).samples
    assert Work(seq, 10).samples
    seq.num_computed = 6
    assert Work(seq, 4).samples


def test_nothing_to_do_is_an_empty_plan() -> None:
    sim = Sim()
    assert not sim.sched.has_work
    assert sim.sched.schedule().empty


# --- ordering ------------------------------------------------------------------------------
def test_interactive_before_bulk_then_arrival() -> None:
    sim = Sim(max_running=3)
    sim.add("b0", prompt(0, 4), 2, BULK)
    sim.add("i1", prompt(1, 4), 2, INTERACTIVE)
    sim.add("b2", prompt(2, 4), 2, BULK)
    sim.add("i3", prompt(3, 4), 2, INTERACTIVE)
    assert [s.request_id for s in sim.sched.waiting] == ["i1", "i3", "b0", "b2"]
    # Bulk prefill does not lengthen the step that gives interactive requests their first
    # token; it joins in the next step.
    assert planned_ids(sim.step()) == ["i1", "i3"]
    assert planned_ids(sim.step()) == ["i1", "i3", "b0"]
    assert [s.request_id for s in sim.sched.waiting] == ["b2"]


def test_running_bulk_sits_out_while_an_interactive_prompt_prefills() -> None:
    sim = Sim(max_step_tokens=64, prefill_chunk=16)
    sim.add("b0", prompt(0, 40), 2, BULK)
    assert planned_ids(sim.step()) == ["b0"]  # first chunk of three
    sim.add("i1", prompt(1, 4), 2, INTERACTIVE)
    sim.add("b2", prompt(2, 4), 2, BULK)
    # The chat's first token waits for its own prefill only: b0's next chunk and b2's
    # admission wait a step.
    assert planned_ids(sim.step()) == ["i1"]
    assert planned_ids(sim.step()) == ["i1", "b0", "b2"]  # decodes first, then prefill


def test_a_late_interactive_request_overtakes_waiting_bulk() -> None:
    sim = Sim(max_running=1)
    sim.add("b0", prompt(0, 4), 1, BULK)
    sim.add("b1", prompt(1, 4), 1, BULK)
    assert planned_ids(sim.step()) == ["b0"]  # b0 finishes (one token)
    sim.add("i2", prompt(2, 4), 1, INTERACTIVE)
    assert planned_ids(sim.step()) == ["i2"]
    assert planned_ids(sim.step()) == ["b1"]


# --- budgets -------------------------------------------------------------------------------
def test_step_token_budget_is_respected() -> None:
    sim = Sim(max_step_tokens=25, prefill_chunk=16)
    for i in range(6):
        sim.add(f"r{i}", prompt(i, 10), 5)
    first = sim.step()
    assert [(w.seq.request_id, w.num_tokens) for w in first.work] == [
        ("r0", 10),
        ("r1", 10),
        ("r2", 5),
    ]
    sim.run()
    assert all(sum(p.num_tokens for p in step) <= 25 for step in sim.history)
    assert len(sim.finished) == 6


def test_max_running_caps_admission() -> None:
    sim = Sim(max_running=3)
    for i in range(10):
        sim.add(f"r{i}", prompt(i, 4), 3)
    assert planned_ids(sim.step()) == ["r0", "r1", "r2"]
    assert len(sim.sched.running) == 3
    sim.run()  # the cap is checked on every step
    assert len(sim.finished) == 10
    assert max(len(step) for step in sim.history) == 3


def test_finished_sequences_leave_and_their_slot_is_reused_next_step() -> None:
    sim = Sim(max_running=2)
    a = sim.add("a", prompt(0, 4), 1)
    sim.add("b", prompt(1, 4), 5)
    sim.add("c", prompt(2, 4), 5)
    assert planned_ids(sim.step()) == ["a", "b"]
    assert a.status is Status.FINISHED_LENGTH and a.output_ids == sim.expected_output(a)
    assert a not in sim.sched.running and not sim.kv.holds("a")
    assert planned_ids(sim.step()) == ["b", "c"]


def test_finishing_a_waiting_sequence_removes_it() -> None:
    sim = Sim()
    seq = sim.add("r", prompt(0, 4), 3)
    sim.sched.finish(seq, Status.FINISHED_ABORTED)
    assert not sim.sched.has_work
    assert seq.status is Status.FINISHED_ABORTED


# --- chunked prefill -------------------------------------------------------------------------
def test_chunked_prefill_does_not_stall_running_decodes() -> None:
    sim = Sim(max_step_tokens=64, prefill_chunk=32)
    shorts = [sim.add(f"s{i}", prompt(i, 4), 30) for i in range(3)]
    sim.step()  # the short prompts are prefilled and sampled
    long = sim.add("long", prompt(9, 200), 2)
    steps = 0
    while not long.output_ids:
        before = [len(s.output_ids) for s in shorts]
        plan = sim.step()
        steps += 1
        by_id = {w.seq.request_id: w.num_tokens for w in plan.work}
        assert all(by_id[s.request_id] == 1 for s in shorts), by_id
        assert by_id["long"] <= 32
        assert [len(s.output_ids) for s in shorts] == [b + 1 for b in before]
    assert steps == -(-200 // 32)  # 7 chunks, the last one samples
    chunks = [p.num_tokens for step in sim.history for p in step if p.request_id == "long"]
    assert chunks == [32] * 6 + [8]
    starts = [p.start for step in sim.history for p in step if p.request_id == "long"]
    assert starts == [32 * k for k in range(7)]


def test_bulk_decodes_pause_while_interactive_prompts_prefill_then_resume() -> None:
    # Two long interactive prompts arrive while bulk requests decode: their chunks run
    # alone, then the bulk decodes resume every step and everything finishes intact.
    sim = Sim(max_step_tokens=64, prefill_chunk=32)
    bulk = [sim.add(f"b{i}", prompt(i, 4), 30, BULK) for i in range(3)]
    sim.step()
    long = [sim.add(f"L{i}", prompt(8 + i, 200), 2, INTERACTIVE) for i in (1, 2)]
    while any(s.in_prefill for s in long):
        before = [len(s.output_ids) for s in bulk]
        assert planned_ids(sim.step()) == ["L1", "L2"]
        assert [len(s.output_ids) for s in bulk] == before
    assert all(len(s.output_ids) == 1 for s in long)  # first tokens came from the prefill
    for _ in range(5):
        before = [len(s.output_ids) for s in bulk]
        sim.step()
        assert [len(s.output_ids) for s in bulk] == [b + 1 for b in before], sim.history[-1]
    sim.run()
    for seq in bulk + long:
        assert seq.output_ids == sim.expected_output(seq)


def test_a_prompt_larger_than_the_budget_is_chunked_by_the_budget() -> None:
    sim = Sim(max_step_tokens=10, prefill_chunk=256)
    seq = sim.add("r", prompt(0, 35), 1)
    sim.run()
    assert [p.num_tokens for step in sim.history for p in step] == [10, 10, 10, 5]
    assert seq.output_ids == sim.expected_output(seq)


# --- KV admission and preemption -------------------------------------------------------------
def test_admission_never_overcommits_kv() -> None:
    sim = Sim(num_blocks=10, block_size=4)
    for i in range(5):
        sim.add(f"r{i}", prompt(i, 12), 2)
    plan = sim.step()
    # Three prompts of three blocks fit in ten; the fourth waits instead of overcommitting.
    assert planned_ids(plan) == ["r0", "r1", "r2"]
    assert plan.preempted == []
    assert sim.kv.stats.used_blocks == 9
    sim.run()
    assert len(sim.finished) == 5
    assert sim.kv.stats.peak_used_blocks <= 10
    assert sim.kv.stats.used_blocks == 0


def test_preemption_takes_the_lowest_priority_most_recent_sequence() -> None:
    sim = Sim(num_blocks=4, block_size=4, prefix_cache=False)
    b = sim.add("B", prompt(1, 3), 6, BULK)
    d = sim.add("D", prompt(3, 3), 6, BULK)
    assert planned_ids(sim.step()) == ["B", "D"]
    a = sim.add("A", prompt(0, 3), 6, INTERACTIVE)
    c = sim.add("C", prompt(2, 3), 6, INTERACTIVE)
    assert planned_ids(sim.step()) == ["A", "C"]  # the bulk decodes sit out the prefill
    assert sim.kv.num_free_blocks == 0
    assert planned_ids(sim.step()) == ["A", "C", "B", "D"]
    # A and C need a second block: D (bulk, newest) goes first, then B; the interactive
    # requests are never evicted.
    plan = sim.step()
    assert plan.preempted == [d, b]
    assert planned_ids(plan) == ["A", "C"]
    assert (b.num_preemptions, d.num_preemptions) == (1, 1)
    assert [s.request_id for s in sim.sched.waiting] == ["B", "D"]
    sim.run()
    for seq in (a, b, c, d):
        assert seq.status is Status.FINISHED_LENGTH
        assert seq.output_ids == sim.expected_output(seq)
    assert a.num_preemptions == c.num_preemptions == 0


def test_a_sequence_with_nobody_younger_preempts_itself() -> None:
    sim = Sim(num_blocks=3, block_size=4, prefix_cache=False)
    a = sim.add("A", prompt(0, 2), 4)
    b = sim.add("B", prompt(1, 8), 4)
    assert planned_ids(sim.step()) == ["A", "B"]
    plan = sim.step()
    assert plan.preempted == [b]
    assert planned_ids(plan) == ["A"]  # B is not re-admitted in the step that evicted it
    sim.run()
    assert a.output_ids == sim.expected_output(a)
    assert b.output_ids == sim.expected_output(b)


def test_preempted_sequences_are_recomputed_and_all_finish() -> None:
    rng = random.Random(1234)
    sim = Sim(num_blocks=16, block_size=4, max_running=8, max_step_tokens=32, prefill_chunk=12)
    shared = prompt(99, 8)
    pending = []
    for i in range(50):
        head = shared if i % 3 == 0 else []
        ids = head + prompt(i, rng.randint(1, 24))
        max_tokens = rng.randint(1, 64 - len(ids))  # each fits the cache alone
        pending.append((f"r{i}", ids, max_tokens, rng.choice((INTERACTIVE, BULK))))
    first_hits: dict[str, int] = {}
    recomputed: set[str] = set()
    for _ in range(10_000):
        for req in pending[:5]:  # requests keep arriving while others run
            sim.add(*req)
        del pending[:5]
        if not sim.sched.has_work:
            break
        plan = sim.step()
        for p in sim.history[-1]:
            seq = sim.seqs[p.request_id]
            first_hits.setdefault(p.request_id, seq.num_cached_prompt)
            if seq.num_preemptions and seq.output_ids:
                recomputed.add(p.request_id)
        assert all(s.num_computed == 0 for s in plan.preempted)
    assert len(sim.finished) == 50
    assert sim.preemptions > 0 and recomputed, "the budget should force preemption"
    for seq in sim.seqs.values():
        assert seq.status is Status.FINISHED_LENGTH
        assert seq.output_ids == sim.expected_output(seq)
        assert seq.num_cached_prompt == first_hits[seq.request_id]
    assert sim.kv.stats.peak_used_blocks <= 16
    assert sim.kv.stats.used_blocks == 0


# --- prefix reuse ------------------------------------------------------------------------------
def test_a_shared_prefix_is_not_recomputed() -> None:
    sim = Sim(block_size=16)
    prefix = prompt(0, 64)
    sim.add("first", [*prefix, 1, 2, 3], 2)
    sim.run()
    second = sim.add("second", [*prefix, 7, 8], 2)
    sim.step()
    assert second.num_cached_prompt == 64
    assert sim.history[-1] == [Planned("second", 64, 2, True)]  # starts at num_computed=64
    # A prompt that is exactly the prefix recomputes its last block (its last token's
    # logits are needed).
    third = sim.add("third", prefix, 2)
    sim.step()
    assert third.num_cached_prompt == 48
    assert Planned("third", 48, 16, True) in sim.history[-1]
    sim.run()
    assert second.output_ids == sim.expected_output(second)


def test_running_sequences_share_prefix_blocks() -> None:
    sim = Sim(block_size=16)
    prefix = prompt(0, 64)
    first = sim.add("first", [*prefix, 1], 10)
    sim.step()  # first's prompt is now cached while it keeps decoding
    second = sim.add("second", [*prefix, 2], 10)
    sim.step()
    assert second.num_cached_prompt == 64
    shared = sim.kv.table("first").block_ids[:4]
    assert sim.kv.table("second").block_ids[:4] == shared
    sim.run()
    assert first.output_ids == sim.expected_output(first)
    assert second.output_ids == sim.expected_output(second)


def test_without_prefix_cache_everything_is_computed() -> None:
    sim = Sim(block_size=16, prefix_cache=False)
    prefix = prompt(0, 64)
    sim.add("first", [*prefix, 1], 2)
    sim.run()
    second = sim.add("second", [*prefix, 2], 2)
    sim.step()
    assert second.num_cached_prompt == 0
    assert sim.history[-1] == [Planned("second", 0, 65, True)]


def test_prompts_sent_together_prefill_their_shared_blocks_once() -> None:
    """The choices of an n > 1 request arrive together: one prefills, the others wait for
    its blocks to reach the prefix cache, then compute only their last block."""
    sim = Sim(block_size=16, prefill_chunk=32)
    same = [*prompt(0, 64), 5]
    choices = [sim.add(f"c{i}", same, 3) for i in range(4)]
    other = sim.add("other", prompt(1, 20), 3)  # nothing shared: admitted at once
    first = sim.step()
    assert planned_ids(first) == ["c0", "other"]
    sim.run()
    assert [c.num_cached_prompt for c in choices] == [0, 64, 64, 64]
    computed = sum(p.num_tokens for step in sim.history for p in step if p.request_id != "other")
    assert computed == 65 + 3 * 1 + 4 * 2  # one prefill, three last tokens, the decodes
    for seq in [*choices, other]:
        assert seq.output_ids == sim.expected_output(seq)


def test_a_prompt_sharing_little_with_a_prefill_does_not_wait_for_it() -> None:
    sim = Sim(block_size=16)
    system = prompt(0, 16)
    sim.add("a", system + prompt(1, 64), 2)
    b = sim.add("b", system + prompt(2, 64), 2)
    sim.step()
    assert b.status is Status.RUNNING and b.num_cached_prompt == 0


def test_waiting_for_a_bulk_prefill_never_delays_an_interactive_prompt() -> None:
    sim = Sim(block_size=16, prefill_chunk=16)
    same = [*prompt(0, 64), 5]
    sim.add("bulk", same, 2, BULK)
    sim.step()
    chat = sim.add("chat", same, 2, INTERACTIVE)
    sim.step()
    assert chat.status is Status.RUNNING  # not held back behind a less urgent prefill
    sim.run()
    assert chat.output_ids == sim.expected_output(chat)


def test_without_prefix_cache_nothing_waits_for_another_prefill() -> None:
    sim = Sim(block_size=16, prefix_cache=False)
    same = [*prompt(0, 64), 5]
    sim.add("a", same, 2)
    b = sim.add("b", same, 2)
    sim.step()
    assert b.status is Status.RUNNING
