"""The decode engine: one ``step()`` drains the inbox, schedules, runs the model, samples and
turns tokens into text deltas. Thread-safe inbox; everything else runs on the caller's
thread (the worker steps it in a process of its own, ``services.worker.runtime``)."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from services.worker.engine.draft import DraftModel, DraftWant
from services.worker.engine.grammar import (
    Constraint,
    GrammarCache,
    GrammarError,
    apply_constraints,
)
from services.worker.engine.kv_cache import kv_cache_for
from services.worker.engine.model_runner import ModelRunner, RunItem
from services.worker.engine.request import SeqState, Status
from services.worker.engine.sampler import Picker, SeenTokens, adjust, make_generator
from services.worker.engine.scheduler import Scheduler, SchedulerConfig, StepPlan, Work
from services.worker.engine.speculation import propose
from services.worker.engine.text import TextStream, incremental_decoders
from services.worker.engine.wire import (
    EngineConfig,
    EngineRequest,
    EngineStats,
    StepOutput,
    TokenLogprobs,
)

log = logging.getLogger(__name__)


# What a log-probability of minus infinity is reported as (JSON has no infinity), as vLLM.
LOGPROB_FLOOR = -9999.0


@dataclass(slots=True)
class _Live:
    req: EngineRequest
    seq: SeqState
    text: TextStream
    generator: torch.Generator | None
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    constraint: Constraint | None = None
    seen: SeenTokens | None = None  # what its penalties read, when it has some


@dataclass(slots=True)
class _Flight:
    """A step's forward passes, launched and not yet settled: each group of work's pass
    (None where it failed), and what they filled in (``Engine._forward``)."""

    plan: StepPlan
    passes: list[torch.Tensor | None]
    logits: dict[str, tuple[torch.Tensor, int]]
    failed: dict[str, str]


@dataclass(slots=True)
class _Held:
    """A step's tokens of one request, taken (appended to its sequence, a finish they make
    decided) and their text not yet made: that comes at the end of the step, on a GPU
    while the next pass runs."""

    live: _Live
    tokens: list[int]
    logprobs: list[TokenLogprobs] | None
    finish: Status | None = None
    stop_id: bool = False  # the last token is a stop id (its text is dropped)
    error: str | None = None


class Engine:
    """Continuous batching over a Hugging Face causal LM with prefix KV reuse."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: EngineConfig = EngineConfig(),
        grammars: GrammarCache | None = None,
        draft_model: Any = None,
    ) -> None:
        """``draft_model``: the guessing model of ``method="draft"`` speculation."""
        self.config = config
        self.tokenizer = tokenizer
        self.runner = ModelRunner(
            model,
            max(1, config.kv_budget_tokens // config.block_size),
            config.block_size,
            budget_bytes=config.kv_budget_bytes,
            cuda_graphs=config.cuda_graphs,
            pad_products=config.pad_products,
        )
        num_blocks = self.runner.num_blocks
        # One KV manager per layer group (sliding layers hold only their window).
        self.kv = kv_cache_for(
            self.runner.group_windows, num_blocks, config.block_size, config.enable_prefix_cache
        )
        self.scheduler = Scheduler(
            self.kv,
            SchedulerConfig(config.max_running, config.max_step_tokens, config.prefill_chunk),
        )
        self.max_context = self.runner.layout.context
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self._text_steps = incremental_decoders(tokenizer)
        self.drafter: DraftModel | None = None
        spec = config.speculation
        if spec.enabled and spec.method == "draft":
            if draft_model is None:
                raise ValueError("draft speculation needs a draft model")
            self.drafter = DraftModel(
                draft_model,
                vocab_size=self.vocab_size,
                block_size=config.block_size,
                # Room for every request that may speculate at once, at the longest context.
                kv_tokens=(spec.max_running + 1) * (self.max_context + spec.k),
            )
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}
        self._flight: _Flight | None = None
        self._held: list[_Held] = []
        # A pass is launched without waiting for the device on a GPU, so the step's text is
        # made while it runs and it is settled by the next step. A CPU runs it at launch.
        self._overlap = config.overlap and self.runner.device.type != "cpu"
        # Built with the first constrained request, unless shared (engines of one model).
        self._grammars = grammars
        self.stats = EngineStats(
            kv_blocks=num_blocks,
            block_size=config.block_size,
            kv_groups=len(getattr(self.kv, "groups", ())) or 1,
            kv_bytes_per_token=self.runner.bytes_per_token,
        )

    # --- thread-safe inbox -----------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        self._inbox.put(("add", req))

    def abort(self, request_id: str) -> None:
        """Cancel a request at the next step; its blocks are freed (shared prefix stays)."""
        self._inbox.put(("abort", request_id))

    @property
    def has_work(self) -> bool:
        return bool(self._live) or self._flight is not None or not self._inbox.empty()

    # --- one step -----------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Settle the pass in flight (sample, take its tokens), drain the inbox, launch the
        next scheduled pass, and return every request's output. Overlapped (on a GPU), the
        pass launched is settled by the next step, and the text returned is that of the
        tokens of the pass before it, made while it runs."""
        t0 = time.perf_counter()
        outputs = self._settle() if self._flight is not None else []
        outputs += self._drain_inbox()
        self._propose()
        plan = self.scheduler.schedule()
        self.stats.preemptions += len(plan.preempted)
        if not plan.empty:
            self._launch(plan)
            if not self._overlap:
                outputs += self._settle()
        outputs += self._emit_held()
        self._update_stats(time.perf_counter() - t0)
        return outputs

    def _drain_inbox(self) -> list[StepOutput]:
        outputs = []
        while not self._inbox.empty():
            kind, arg = self._inbox.get()
            if kind == "add":
                out = self._admit(arg)
            else:
                out = self._abort(arg)
            if out is not None:
                outputs.append(out)
        return outputs

    def _admit(self, req: EngineRequest) -> StepOutput | None:
        if req.request_id in self._live:
            return None  # a duplicate delivery of a request already in flight
        total = len(req.prompt_ids) + req.max_tokens
        problem = None
        if not req.prompt_ids:
            problem = "empty prompt"
        elif total > self.max_context:
            problem = f"prompt + max_tokens = {total} exceeds the model context {self.max_context}"
        elif self.kv.max_blocks(total, self.config.prefill_chunk) > self.kv.num_blocks:
            problem = f"prompt + max_tokens = {total} exceeds the KV budget"
        elif not 0 <= min(req.prompt_ids) <= max(req.prompt_ids) < self.vocab_size:
            # On CUDA an out-of-range id would not raise but poison the device for every
            # later step (a device-side assert); here it is one request's error.
            problem = f"prompt token ids must lie in [0, {self.vocab_size})"
        elif any(t >= self.vocab_size for t, _ in req.sampling.logit_bias) or any(
            t >= self.vocab_size for t in req.stop_token_ids
        ):
            # Never sampled: a bias or a stop id the model has not would be ignored.
            problem = f"logit_bias and stop_token_ids must lie in [0, {self.vocab_size})"
        stop_ids = frozenset(req.stop_token_ids) | (frozenset() if req.ignore_eos else self.eos_ids)
        constraint = None
        if problem is None and req.structure is not None:
            try:
                constraint = Constraint(self.grammars.get(*req.structure), stop_ids)
            except GrammarError as exc:
                problem = f"the output structure does not compile: {exc}"
        if problem:
            return StepOutput(req.request_id, [], "", Status.FINISHED_ERROR, error=problem)
        seq = SeqState(req.request_id, list(req.prompt_ids), req.max_tokens, req.priority)
        gen = None if req.sampling.greedy else make_generator(req.sampling.seed, self.runner.device)
        self._live[req.request_id] = _Live(
            req,
            seq,
            TextStream(
                self.tokenizer,
                req.stop,
                include_stop=req.include_stop,
                step=self._text_steps() if self._text_steps else None,
            ),
            gen,
            stop_ids,
            constraint,
            SeenTokens(seq.prompt_ids, self.vocab_size) if req.sampling.penalizes else None,
        )
        self.scheduler.add(seq)
        return None

    @property
    def grammars(self) -> GrammarCache:
        """Compiled grammars of constrained requests, over the model's vocabulary."""
        if self._grammars is None:
            self._grammars = GrammarCache.for_tokenizer(self.tokenizer, self.vocab_size)
        return self._grammars

    def _abort(self, request_id: str) -> StepOutput | None:
        live = self._live.pop(request_id, None)
        if live is None:
            return None
        if not live.seq.status.finished:  # else its taken tokens finished it: not yet emitted
            self.scheduler.finish(live.seq, Status.FINISHED_ABORTED)
        return self._final_output(live, [], "", Status.FINISHED_ABORTED)

    def _propose(self) -> None:
        """Give each decoding request that may speculate this step's draft: the n-gram
        guess from its own tokens or the draft model's, none while the batch is fuller than
        the setting's cap."""
        spec = self.config.speculation
        if not spec.enabled:
            return
        k = spec.per_request(len(self.scheduler.running))
        wants: list[DraftWant] = []
        for seq in self.scheduler.running:
            seq.draft = []
            live = self._live.get(seq.request_id)
            if not k or seq.in_prefill or live is None or not _speculates(live):
                continue
            # The verifying step adds a token of its own after the accepted ones.
            room = min(k, seq.max_tokens - len(seq.output_ids) - 1)
            if room <= 0:
                continue
            if self.drafter is None:
                seq.draft = propose(seq.all_ids, room, spec.max_n, spec.min_n)
            else:
                wants.append(DraftWant(seq.request_id, seq.all_ids, room))
        if self.drafter is not None:
            self.drafter.retain(self._live)
            if wants:
                self._draft(wants)

    def _draft(self, wants: list[DraftWant]) -> None:
        """The draft model's guesses; a failing draft pass costs this step its guesses,
        never a request."""
        assert self.drafter is not None
        try:
            guesses = self.drafter.propose(wants)
        except Exception as exc:  # whatever the draft model's code raises, as in _forward
            log.warning("the draft model's pass failed, this step goes without drafts: %s", exc)
            return
        for seq in self.scheduler.running:
            seq.draft = guesses.get(seq.request_id, seq.draft)

    def _launch(self, plan: StepPlan) -> None:
        """Run the step's passes: on a GPU, launch them (nothing waits for the device)."""
        logits: dict[str, tuple[torch.Tensor, int]] = {}
        failed: dict[str, str] = {}
        passes = [self._forward(group, logits, failed) for group in _forward_groups(plan.work)]
        self._flight = _Flight(plan, passes, logits, failed)

    def _settle(self) -> list[StepOutput]:
        """Wait for the pass in flight, sample its rows and take their tokens. Rows of a
        request that ended while it ran (a stop string in its text) are dropped."""
        flight, self._flight = self._flight, None
        assert flight is not None
        plan, logits, failed = flight.plan, flight.logits, flight.failed
        outputs = [
            self._fail(self._live[rid], why) for rid, why in failed.items() if rid in self._live
        ]
        work = [
            w for w in plan.work if w.seq.request_id in logits and w.seq.status is Status.RUNNING
        ]
        # One pass of plain decodes, each sampled: its logits are the step's rows, in order.
        plain = (
            len(flight.passes) == 1
            and len(work) == len(plan.work)
            and all(w.num_tokens == 1 for w in plan.work)
        )
        if not work:
            self.scheduler.complete(plan)  # the ended ones are finished: it skips them
            return outputs
        lives = [self._live[w.seq.request_id] for w in work]
        tokens, reported = self._pick(work, lives, logits, flight.passes[0] if plain else None)
        accepted = {
            w.seq.request_id: len(toks) - 1 for w, toks in zip(work, tokens, strict=True) if w.draft
        }
        # Before the tokens are taken (which may finish a request and free its KV), so the
        # step's full blocks reach the prefix cache.
        self.scheduler.complete(plan, accepted)
        for w, lv, toks, lps in zip(work, lives, tokens, reported, strict=True):
            self._count_draft(w, toks)
            self._take(lv, toks, lps)
        return outputs

    @torch.inference_mode()  # ``whole`` is the pass's own tensor: processors edit it in place
    def _pick(
        self,
        work: list[Work],
        lives: list[_Live],
        logits: dict[str, tuple[torch.Tensor, int]],
        whole: torch.Tensor | None = None,
    ) -> tuple[list[list[int | None]], list[list[TokenLogprobs] | None]]:
        """Each work's tokens and, when asked for, their log-probabilities. A work with a
        draft has a row of logits per draft token and one after them: row ``j`` is sampled
        as a decode after the draft's first ``j`` tokens would be, in order, until a token
        differs from the draft's. Kept are the draft tokens that matched, and the token
        that differed (or the one after the whole draft).

        Drawing the target's own token and comparing is the rejection rule for a draft that
        is one token ``t`` for sure: ``t`` is kept with probability ``p(t)`` and otherwise
        the token comes from ``p`` without ``t``, renormalized. Each row takes from the
        request's generator just what a decode takes, so a request's tokens are the same
        with and without speculation, for greedy and seeded sampling alike.

        ``whole``: the logits of every work as one tensor, a row each in order (a step of
        plain decodes), taken as they are instead of copied together."""
        if whole is not None:  # a row per work, none with a draft: nothing to gather
            stacked, row_lives, first = whole, lives, list(range(len(lives)))
            row_drafts: list[list[int]] = [[]] * len(lives)  # read only
        else:
            rows: list[torch.Tensor] = []
            row_lives, row_drafts, first = [], [], []  # the draft tokens before each row
            for w, lv in zip(work, lives, strict=True):
                out, i = logits[w.seq.request_id]
                first.append(len(row_lives))
                rows.append(_rows_of(out, i, w))
                row_lives += [lv] * (w.draft + 1)
                row_drafts += [w.seq.draft[:j] for j in range(w.draft + 1)]
            stacked = torch.cat(rows)
        wanted = [i for i, lv in enumerate(row_lives) if lv.req.logprobs is not None]
        # From the model's own distribution, before holds and sampling filters.
        logprobs = torch.log_softmax(stacked[wanted].float(), dim=-1) if wanted else None
        picker = self._sample(stacked, row_lives, row_drafts)
        tokens: list[list[int | None]] = []
        row_tokens: list[int | None] = [None] * len(row_lives)
        for w, lv, at in zip(work, lives, first, strict=True):
            toks: list[int | None] = []
            for j in range(w.draft + 1):
                tok = row_tokens[at + j] = picker.pick(at + j, lv.generator)
                toks.append(tok)
                if tok is None or (j < w.draft and tok != w.seq.draft[j]):
                    break
            tokens.append(toks)
        reported = self._logprobs(logprobs, wanted, row_lives, row_tokens)
        lps = [
            [reported[at + j] for j in range(len(toks))] if lv.req.logprobs is not None else None
            for lv, toks, at in zip(lives, tokens, first, strict=True)
        ]
        return tokens, lps

    def _count_draft(self, w: Work, tokens: list[int | None]) -> None:
        self.stats.decoded_tokens += len(tokens) - (tokens[-1] is None)  # None ends a run
        if w.draft:
            self.stats.spec_verifications += 1
            self.stats.spec_draft_tokens += w.draft
            self.stats.spec_accepted_tokens += len(tokens) - 1

    def _logprobs(
        self,
        logprobs: torch.Tensor | None,
        wanted: list[int],
        lives: list[_Live],
        tokens: list[int | None],
    ) -> dict[int, TokenLogprobs]:
        """Each wanted row's sampled token log-probability and top alternatives: one gather
        and one top-k over the wanted rows."""
        if logprobs is None:
            return {}
        picks = torch.tensor([tokens[i] or 0 for i in wanted], device=logprobs.device)
        chosen = logprobs.gather(1, picks.unsqueeze(1))[:, 0].tolist()
        k = max(lives[i].req.logprobs or 0 for i in wanted)
        top_v, top_i = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0])
        top_vals, top_ids = top_v.tolist(), top_i.tolist()
        out = {}
        for j, i in enumerate(wanted):
            n = lives[i].req.logprobs or 0
            top = tuple(
                (int(t), max(v, LOGPROB_FLOOR))
                for t, v in zip(top_ids[j][:n], top_vals[j][:n], strict=True)
            )
            out[i] = TokenLogprobs(max(chosen[j], LOGPROB_FLOOR), top)
        return out

    def _forward(
        self,
        group: list[Work],
        logits: dict[str, tuple[torch.Tensor, int]],
        failed: dict[str, str],
    ) -> torch.Tensor | None:
        """One forward pass over ``group``; if it raises, its halves are retried until the
        request it fails on is alone, and only that one fails. A group with drafts gets
        the logits of every position. ``logits`` gets, for each work that samples, the
        pass's output and the work's row in it (``_rows_of``). Returns the pass's logits
        (None when it was split)."""
        items = [
            RunItem(
                w.seq.tokens(w.seq.num_computed, w.num_tokens),
                w.seq.num_computed,
                self.kv.table(w.seq.request_id).block_ids,
                # Unique per admission, so a reused request id never meets stale KV.
                (w.seq.request_id, w.seq.arrival),
            )
            for w in group
        ]
        try:
            every = any(w.draft for w in group)
            if every:
                out = self.runner.forward(items, every_position=True)
            else:
                out = self.runner.forward(items)
        except Exception as exc:  # whatever the model's code raises: isolate it, never crash
            # A pass that failed part-way may have left rows' dense KV half written: those
            # rows are reloaded from the pool (its blocks are rewritten by the retry).
            self.runner.forget_rows()
            if len(group) == 1:
                rid = group[0].seq.request_id
                log.warning("forward pass failed: %s", exc, extra={"request_id": rid})
                failed[rid] = f"the forward pass failed: {exc}"
                return None
            half = len(group) // 2
            self._forward(group[:half], logits, failed)
            self._forward(group[half:], logits, failed)
            return None
        for i, w in enumerate(group):
            samples = w.samples
            if samples:
                logits[w.seq.request_id] = (out, i)
            if not (samples and w.num_tokens - w.draft == 1 and w.seq.output_ids):
                self.stats.prefilled_tokens += w.num_tokens
        return out

    def _sample(self, logits: torch.Tensor, lives: list[_Live], drafts: list[list[int]]) -> Picker:
        """Each row's distribution after the request's processors, row ``i`` as if
        ``drafts[i]`` had been generated already (speculation's rows)."""
        configs = [lv.req.sampling for lv in lives]
        if any(c.adjusts for c in configs):
            adjust(logits, configs, [lv.seen for lv in lives], drafts)
        self._hold_stops(logits, lives, drafts)
        apply_constraints(
            logits, [(i, lv.constraint) for i, lv in enumerate(lives) if lv.constraint]
        )
        return Picker(logits, configs)

    def _hold_stops(
        self, logits: torch.Tensor, lives: list[_Live], drafts: list[list[int]]
    ) -> None:
        """Rows short of their ``min_tokens`` cannot pick a stop id (EOS, stop token ids):
        one indexed write over the few (row, id) pairs, as Hugging Face's min-new-tokens
        processor does."""
        rows: list[int] = []
        cols: list[int] = []
        for i, (lv, draft) in enumerate(zip(lives, drafts, strict=True)):
            # A grammar decides when its output may end: holding EOS past its completion
            # would leave the row nothing to pick.
            if not lv.req.min_tokens or lv.constraint is not None:
                continue
            if len(lv.seq.output_ids) + len(draft) < lv.req.min_tokens:
                ids = [t for t in lv.stop_ids if t < self.vocab_size]
                rows += [i] * len(ids)
                cols += ids
        if rows:
            dev = logits.device
            index = (torch.tensor(rows, device=dev), torch.tensor(cols, device=dev))
            logits.index_put_(index, torch.tensor(float("-inf"), device=dev))

    def _take(
        self, live: _Live, tokens: list[int | None], logprobs: list[TokenLogprobs] | None
    ) -> None:
        """Take a step's tokens of one request in order: append them to its sequence and
        decide what they finish on their own (a stop id, the length, the grammar's end, a
        token the grammar refuses, non-finite logits), dropping the tokens after it. A
        finished request leaves the scheduler now, before the next step is scheduled; its
        text, and what the text finishes (a stop string), come with ``_emit``."""
        seq = live.seq
        held = _Held(live, [], logprobs)
        for tok in tokens:
            if tok is None:
                held.error = "the model produced non-finite logits"
            elif live.constraint is not None and not live.constraint.accept(tok):
                held.error = f"token {tok} breaks the output's grammar"
            if held.error is not None:
                break
            assert tok is not None
            seq.append_output(tok)
            if live.seen is not None:
                live.seen.add(tok)
            held.tokens.append(tok)
            if tok in live.stop_ids:
                held.finish, held.stop_id = Status.FINISHED_STOPPED, True
            elif live.constraint is not None and live.constraint.terminated:
                held.finish = Status.FINISHED_STOPPED  # complete, with no stop token to end it
            elif len(seq.output_ids) >= seq.max_tokens:
                held.finish = Status.FINISHED_LENGTH
            if held.finish is not None:
                break
        if held.error is not None:
            self.scheduler.finish(seq, Status.FINISHED_ERROR)
        elif held.finish is not None:
            self.scheduler.finish(seq, held.finish)
        self._held.append(held)

    def _emit_held(self) -> list[StepOutput]:
        held, self._held = self._held, []
        return [out for h in held if (out := self._emit(h)) is not None]

    def _emit(self, held: _Held) -> StepOutput | None:
        """The text of a request's taken tokens, as one output; a stop string in it finishes
        the request there (the tokens after it are dropped). None for a request aborted
        since its tokens were taken."""
        live, seq = held.live, held.live.seq
        if self._live.get(seq.request_id) is not live:
            return None
        finish, error, tokens = held.finish, held.error, held.tokens
        text, n = "", 0
        try:
            for i, tok in enumerate(tokens):
                # A stop id's own text is dropped unless the request keeps what stopped it.
                if not (held.stop_id and i == len(tokens) - 1) or live.req.include_stop:
                    text += live.text.push([tok])
                n += 1
                if live.text.stopped:
                    finish, error = Status.FINISHED_STOPPED, None
                    break
            if finish is None and error is None:
                return StepOutput(seq.request_id, tokens, text, logprobs=held.logprobs)
            if error is None:
                text += live.text.flush()
        except Exception as exc:  # a tokenizer's failure on one output is that request's
            log.warning("detokenizing failed: %s", exc, extra={"request_id": seq.request_id})
            error = f"detokenizing the output failed: {exc}"
        if n < len(tokens):  # taken, but after the stop string (or the failing token)
            seq.drop_outputs(len(tokens) - n)
        logprobs = None if held.logprobs is None else held.logprobs[:n]
        if error is not None:
            return self._fail(live, error, tokens[:n], text, logprobs)
        assert finish is not None
        self._live.pop(seq.request_id, None)
        if not seq.status.finished:  # a stop string: the tokens alone did not end it
            self.scheduler.finish(seq, finish)
        out = self._final_output(live, tokens[:n], text, finish)
        out.logprobs = logprobs
        return out

    def _fail(
        self,
        live: _Live,
        why: str,
        tokens: list[int] | None = None,
        text: str = "",
        logprobs: list[TokenLogprobs] | None = None,
    ) -> StepOutput:
        """End one request after a failure of its own (after ``tokens``, ``text`` and their
        ``logprobs`` where some came first); the step goes on for the others."""
        self.stats.request_errors += 1
        self._live.pop(live.seq.request_id, None)
        if not live.seq.status.finished:  # else its taken tokens finished it already
            self.scheduler.finish(live.seq, Status.FINISHED_ERROR)
        out = self._final_output(live, tokens or [], text, Status.FINISHED_ERROR)
        out.logprobs, out.error, out.error_code = logprobs, why, "engine_error"
        return out

    def _final_output(
        self, live: _Live, tokens: list[int], text: str, finish: Status
    ) -> StepOutput:
        self.stats.finished += 1
        seq = live.seq
        if self.drafter is not None:
            self.drafter.release(seq.request_id)
        return StepOutput(
            seq.request_id,
            tokens,
            text,
            finish,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_tokens=seq.num_cached_prompt,
        )

    def _update_stats(self, seconds: float) -> None:
        s, kv = self.stats, self.kv.stats
        s.steps += 1
        s.step_seconds += seconds
        s.running = len(self.scheduler.running)
        s.waiting = len(self.scheduler.waiting)
        s.kv_used_blocks = kv.used_blocks
        s.kv_peak_used_blocks = kv.peak_used_blocks
        s.kv_cached_blocks = kv.cached_blocks
        s.prefix_hit_tokens = kv.prefix_hit_tokens

    def run_until_idle(self) -> list[StepOutput]:
        """Step until every request has finished (for tests, benchmarks and batch jobs)."""
        outputs = []
        while self.has_work:
            outputs += self.step()
        return outputs


# A padded forward wastes the padding's compute but saves a pass over every weight; batching
# prefill chunks paid off on CPU (2 threads, 30M model: 8 x 128 tokens in 0.6x the time of
# 8 separate passes, 8 x 32 in 0.4x) as long as the padding stays small.
_MAX_PADDING = 1.25


def _forward_groups(work: list[Work]) -> list[list[Work]]:
    """Split a step's work into forward passes: all decodes in one batched pass (with the
    logits of every position when some carry a draft: plain decodes ride along as rows of
    one token rather than pay a pass over the weights of their own), prefill chunks batched
    together while padding to the longest costs little."""
    decode = [w for w in work if w.num_tokens == 1 or w.draft]
    prefill = sorted(
        (w for w in work if w.num_tokens > 1 and not w.draft), key=lambda w: -w.num_tokens
    )
    groups = [decode] if decode else []
    batch: list[Work] = []
    for w in prefill:
        if batch and not _pads_little([*batch, w]):
            groups.append(batch)
            batch = []
        batch.append(w)
    if batch:
        groups.append(batch)
    return groups


def _rows_of(out: torch.Tensor, i: int, w: Work) -> torch.Tensor:
    """Work ``w``'s rows of logits in its pass's output, where it is row ``i``: with every
    position's logits, a row per draft token and the one after them (the last token's
    alone without a draft); else its one row."""
    if out.dim() == 3:
        return out[i, w.num_tokens - w.draft - 1 : w.num_tokens]
    return out[i : i + 1]


def _speculates(live: _Live) -> bool:
    """Whether a request may carry drafts. Not under an output structure: its grammar's
    state would have to advance through each draft token and back."""
    return live.constraint is None


def _pads_little(batch: list[Work]) -> bool:
    """Whether padding every chunk to the longest, and every context to the longest, stays
    within ``_MAX_PADDING`` of the real token count and attention area."""
    q = max(w.num_tokens for w in batch)
    kv = max(w.seq.num_computed + w.num_tokens for w in batch)
    tokens = sum(w.num_tokens for w in batch)
    area = sum(w.num_tokens * (w.seq.num_computed + w.num_tokens) for w in batch)
    return len(batch) * q <= _MAX_PADDING * tokens and len(batch) * q * kv <= _MAX_PADDING * area
