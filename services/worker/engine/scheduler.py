"""Iteration-level scheduler (pure: no torch, no I/O).

Every step: running sequences first get their next token (decode) or prefill chunk, then
waiting ones are admitted — interactive before bulk, then by arrival — while the step's
token budget, the running-sequence cap and the KV blocks allow. A waiting prompt whose
uncached blocks are mostly being prefilled by a running sequence waits for them to reach
the prefix cache (``n`` > 1 prefills its prompt once). A step that prefills an
interactive prompt leaves running bulk sequences out, so bulk delays a chat's first token
by no more than the step already in progress. A running sequence that cannot grow preempts
the lowest-priority, most recently arrived one (its KV is freed and recomputed later,
mostly from the prefix cache) instead of failing.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from services.worker.engine.kv_cache import KVCache
from services.worker.engine.request import SeqState, Status


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's limits: running sequences, tokens per step, prefill chunk."""

    max_running: int = 64
    max_step_tokens: int = 1024  # tokens processed by one step (decodes + prefill chunks)
    prefill_chunk: int = 256  # a long prompt is prefilled this many tokens per step


# Running and waiting sequences are kept in this order: interactive before bulk, then by
# arrival (``SeqState.sort_key``).
_SORT_KEY = attrgetter("priority", "arrival")


@dataclass(slots=True)  # not frozen: a step builds one per running sequence
class Work:
    """Process ``num_tokens`` tokens of ``seq`` starting at ``seq.num_computed``; the last
    ``draft`` of them are the sequence's draft tokens (speculation), to be verified."""

    seq: SeqState
    num_tokens: int
    draft: int = 0

    @property
    def samples(self) -> bool:
        """Whether this work reaches the end of the known tokens, so a token is sampled."""
        return self.seq.num_computed + self.num_tokens - self.draft == self.seq.num_tokens


@dataclass(slots=True)
class StepPlan:
    """One step's work and the sequences preempted to make room for it."""

    work: list[Work] = field(default_factory=list)
    preempted: list[SeqState] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.work


class Scheduler:
    """Decides, each step, which sequences run and how many tokens each processes."""

    def __init__(self, kv: KVCache, config: SchedulerConfig) -> None:
        self.kv = kv
        self.config = config
        self.waiting: list[SeqState] = []  # kept sorted by (priority, arrival)
        self.running: list[SeqState] = []
        self._arrivals = 0

    # --- membership ------------------------------------------------------------------------
    def add(self, seq: SeqState) -> None:
        seq.arrival = self._arrivals
        self._arrivals += 1
        seq.status = Status.WAITING
        self._enqueue(seq)

    def _enqueue(self, seq: SeqState) -> None:
        bisect.insort(self.waiting, seq, key=_SORT_KEY)

    def finish(self, seq: SeqState, status: Status) -> None:
        """Mark ``seq`` finished and release its KV (shared prefix blocks stay cached)."""
        seq.finish(status)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step --------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_step_tokens
        self.running.sort(key=_SORT_KEY)
        # Decodes first, one token each, so running streams never stall behind prefills;
        # prefill chunks share what is left of the step's token budget.
        # While a higher-priority prompt is being prefilled, lower-priority sequences sit
        # the step out: the first token of a chat request waits only for its own prefill
        # (and other chats' decodes), not for a full batch of bulk work.
        decoding: list[SeqState] = []
        prefilling: list[SeqState] = []
        for s in self.running:
            (prefilling if s.in_prefill else decoding).append(s)
        cut = self._urgent_priority(prefilling)
        if cut is not None:
            decoding = [s for s in decoding if s.priority <= cut]
            prefilling = [s for s in prefilling if s.priority <= cut]
        chunk = self.config.prefill_chunk
        for seq in decoding + prefilling:
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this step
            n = min(seq.num_uncomputed, budget, chunk)
            # A draft rides along with a decode while the budget has room for it.
            if seq.draft:
                del seq.draft[min(len(seq.draft), budget - n) if not seq.in_prefill else 0 :]
            if seq.draft and not self.kv.can_allocate(
                seq.request_id, seq.all_ids, seq.num_computed + n + len(seq.draft)
            ):
                seq.draft = []  # a guess never preempts anyone
            n += len(seq.draft)
            preempted = len(plan.preempted)
            if self._reserve(seq, n, plan):
                plan.work.append(Work(seq, n, len(seq.draft)))
                budget -= n
            if len(plan.preempted) > preempted:
                # A preempted sequence's planned tokens go back to the budget (summed only
                # then: once per sequence, it made a step quadratic in the batch).
                budget = self.config.max_step_tokens - sum(w.num_tokens for w in plan.work)
        self._admit(plan, budget, cut)
        return plan

    def _urgent_priority(self, prefilling: list[SeqState]) -> int | None:
        """The priority of the most urgent prompt this step would prefill (the running
        ``prefilling`` ones or the first waiting one), when a running sequence has a lower
        one; otherwise None (everything runs)."""
        if not self.running:
            return None
        lowest = self.running[-1].priority  # sorted by priority
        urgent = min((s.priority for s in prefilling), default=lowest)
        if self.waiting and self.waiting[0].priority < urgent and self._admissible(self.waiting[0]):
            urgent = self.waiting[0].priority
        return urgent if urgent < lowest else None

    def _admissible(self, seq: SeqState) -> bool:
        """Whether ``_admit`` could start ``seq`` now (running-sequence cap and KV)."""
        if len(self.running) >= self.config.max_running:
            return False
        ids, cached, n = self._first_chunk(seq, self.config.max_step_tokens)
        return self.kv.can_allocate(seq.request_id, ids, cached + n)

    def _first_chunk(self, seq: SeqState, budget: int) -> tuple[list[int], int, int]:
        """A waiting sequence's tokens, how many of them the prefix cache holds, and how
        many its first step would compute."""
        ids = seq.all_ids
        cached = len(self.kv.cached_prefix_blocks(ids)) * self.kv.block_size
        return ids, cached, min(len(ids) - cached, budget, self.config.prefill_chunk)

    def _reserve(self, seq: SeqState, n: int, plan: StepPlan) -> bool:
        """Make room for ``n`` more tokens of ``seq``, preempting the lowest-priority, most
        recent running sequences (possibly ``seq`` itself) while memory is short."""
        while not self.kv.can_allocate(seq.request_id, seq.all_ids, seq.num_computed + n):
            victim = max(self.running, key=_SORT_KEY)
            plan.work = [w for w in plan.work if w.seq is not victim]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        self.kv.allocate(seq.request_id, seq.all_ids, seq.num_computed + n)
        return True

    def _admit(self, plan: StepPlan, budget: int, cut: int | None) -> None:
        # A step that prefills or admits a request admits nothing of lower priority after
        # it (nor below ``cut``, the priority the running sequences were cut at): an
        # interactive request's first token waits for the whole step, so bulk prefill
        # joins in the next one.
        prefills = [w.seq.priority for w in plan.work if w.num_tokens - w.draft > 1]
        urgent = min(prefills + ([] if cut is None else [cut]), default=None)
        at = 0
        while at < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_running:
            seq = self.waiting[at]
            if plan.preempted and seq.sort_key >= plan.preempted[-1].sort_key:
                break  # memory is short this step: don't admit what we just evicted
            if urgent is not None and seq.priority > urgent:
                break
            ids, cached, n = self._first_chunk(seq, budget)
            if self._prefilled_by_another(seq, ids, cached):
                at += 1
                continue
            if not self.kv.can_allocate(seq.request_id, ids, cached + n):
                break  # head-of-line waits: admission never overcommits KV
            hit = self.kv.allocate(seq.request_id, ids, cached + n)
            self.waiting.pop(at)
            seq.num_computed = hit
            if seq.num_preemptions == 0:
                seq.num_cached_prompt = hit
            seq.status = Status.RUNNING
            self.running.append(seq)
            plan.work.append(Work(seq, n))
            budget -= n
            urgent = seq.priority if urgent is None else min(urgent, seq.priority)

    def _prefilled_by_another(self, seq: SeqState, ids: list[int], cached: int) -> bool:
        """Whether a running sequence of the same or a more urgent priority is prefilling
        most of what ``seq`` still has to compute (the choices of one ``n`` > 1 request,
        prompts sent together with one long system prompt): ``seq`` then waits for those
        blocks to reach the prefix cache instead of computing them a second time."""
        if not self.kv.enable_prefix_cache:
            return False
        bs = self.kv.block_size
        todo = len(ids) - cached
        for other in self.running:
            if other.priority > seq.priority or not other.in_prefill:
                continue
            if other.num_computed >= cached + bs:
                continue  # past these blocks: they would be cached if it shared them
            theirs = other.prompt_ids
            shared = cached
            while (
                shared + bs <= min(len(ids), len(theirs))
                and ids[shared : shared + bs] == theirs[shared : shared + bs]
            ):
                shared += bs
            if (
                shared > cached
                and 2 * (shared - cached) >= todo
                and ids[:cached] == theirs[:cached]
            ):
                return True
        return False

    def _preempt(self, seq: SeqState, plan: StepPlan) -> None:
        self.running.remove(seq)
        self.kv.free(seq.request_id)
        seq.preempt()
        self._enqueue(seq)
        plan.preempted.append(seq)

    def complete(self, plan: StepPlan, accepted: Mapping[str, int] | None = None) -> None:
        """Account for a finished step: the planned tokens now have KV in the cache. Of a
        draft, only the ``accepted[request_id]`` leading tokens the model agreed with count
        (they become the sequence's next outputs): the KV past them is rolled back, its
        blocks freed and never registered in the prefix cache."""
        for w in plan.work:
            seq = w.seq
            if seq.status is not Status.RUNNING:
                continue
            ids = seq.all_ids
            if w.draft:
                kept = min(w.draft, (accepted or {}).get(seq.request_id, 0))
                ids = ids + seq.draft[:kept]  # a new list: ``all_ids`` is the sequence's own
                seq.num_computed += w.num_tokens - w.draft + kept
                self.kv.truncate(seq.request_id, seq.num_computed)
            else:
                seq.num_computed += w.num_tokens
            seq.draft = []
            self.kv.commit(seq.request_id, ids, seq.num_computed)
