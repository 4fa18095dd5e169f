"""Batches in: each request of a batch is claimed (``Claims``) and, if it is this worker's
to run, tokenized and handed to the engine; otherwise it is left to the worker holding its
claim, skipped (finished before), or ended at once (cancelled, failing, a poison)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from services.worker.claims import POISON_ATTEMPTS, Claim
from services.worker.context import WorkerContext
from services.worker.engine.wire import EngineRequest, SamplingConfig
from services.worker.events import RequestState
from services.worker.output import Output
from services.worker.requests import Phase
from services.worker.settle import REPLY_TOPIC_NOT_FOUND
from shared import token_stream
from shared.codec import DecodeError, decode
from shared.consumer_flow import Backpressure
from shared.dead_letters import dead_letter_of_record
from shared.messages import Batch, FinishReason, GenerateRequest, TokenEvent
from shared.prompts import prompt_token_ids
from shared.retry import REDIS_DOWN

log = logging.getLogger("services.worker.service")

INLINE_TOKENIZE_CHARS = 8192
# A batch created this long after its partition was assigned here cannot have been running
# on a worker that crashed: its requests may start before their claims answer.
FRESH_BATCH_MARGIN_S = 1.0
TOPICS_REFRESH_S = 5.0


class Intake:
    """Consumes the batches topic and starts what is this worker's to run."""

    def __init__(self, ctx: WorkerContext, output: Output) -> None:
        self.ctx = ctx
        self.output = output
        self.backpressure = Backpressure(ctx.consumer)
        self._topics: set[str] = set()  # reply topics known to exist
        self._topics_at = 0.0

    async def run(self) -> None:
        consumer = self.ctx.consumer
        while True:
            self._apply_backpressure()
            records = await consumer.getmany(timeout_ms=100, max_records=64)
            for tp, msgs in records.items():
                for msg in msgs:
                    await self.take_batch(tp, msg)

    def _apply_backpressure(self) -> None:
        """Stop fetching while the engine's queue is long; Kafka keeps the rest durable."""
        full = self.ctx.runner.stats.waiting >= self.ctx.settings.max_waiting
        self.backpressure.apply(full=full, room=not full)

    async def take_batch(self, tp: TopicPartition, msg: ConsumerRecord[Any, Any]) -> None:
        ctx = self.ctx
        try:
            batch = decode(Batch, msg.value)
        except DecodeError as exc:
            # Batches come from our own batchers; a bad one is dead-lettered and skipped.
            log.error("undecodable batch at %s:%s: %s", tp, msg.offset, exc)
            ctx.offsets.add(tp.partition, msg.offset, [])
            await ctx.send_dead_letter(dead_letter_of_record(msg, exc.reason, exc.detail, None))
            return
        reqs = batch.requests
        ctx.offsets.add(tp.partition, msg.offset, [r.request_id for r in reqs])
        # The engine starts at once and the claim's round trip overlaps the prefill: until
        # the claim answers, a stream's outputs are held, and a request that turns out not
        # to be this worker's to start is aborted with nothing of it published. Only for a
        # fresh batch: a redelivered one may hold a poison, which must not reach the
        # engine before its claim has counted the crashes it was in.
        early: list[RequestState] = []
        assigned = ctx.assigned_at.get(tp.partition, math.inf)
        if batch.created_at > assigned + FRESH_BATCH_MARGIN_S:
            early = [st for r in reqs if (st := self._start_early(tp, msg.offset, r))]
        try:
            rids = [r.request_id for r in reqs]
            claims = await ctx.redis_dep.call(lambda: ctx.claims.take(rids), REDIS_DOWN)
            for req, claim in zip(reqs, claims, strict=True):
                await self.resolve(tp.partition, msg.offset, req, claim)
        finally:
            for st in early:  # unresolved: intake stopped
                if st.phase is Phase.CLAIMING:
                    self._withdraw(st)

    async def resolve(
        self, partition: int, offset: int, req: GenerateRequest, claim: Claim
    ) -> None:
        """Act on a request's claim."""
        ctx = self.ctx
        st = ctx.table.get(req.request_id)
        if st is not None and st.phase is Phase.CLAIMING:
            if claim.ours and not (claim.done or claim.cancelled or claim.poison or claim.finished):
                st.skip_upto = claim.last_seq
                self._started(req)
                await self.output.release_held(st)
                return
            self._withdraw(st)
            st = None
        if claim.done:
            if st is not None and st.phase is Phase.DEFERRED:
                ctx.table.drop(st)
            ctx.offsets.done(req.request_id)  # finished before: never generated twice
        elif st is not None and st.phase is not Phase.DEFERRED:
            return  # a duplicate delivery of a request being started, running or settling
        elif not claim.ours:
            if st is None:  # another live worker has it: wait for it to end or lapse
                ctx.table.add(RequestState(req, partition, offset, phase=Phase.DEFERRED))
        else:
            if st is None:
                st = RequestState(req, partition, offset, phase=Phase.CLAIMED)
                ctx.table.add(st)
            else:
                ctx.table.move(st, Phase.CLAIMED)
            await self._start_claimed(st, claim)

    async def _start_claimed(self, st: RequestState, claim: Claim) -> None:
        """A request this worker holds now: end it at once, or start it."""
        nxt = claim.last_seq + 1  # an ending event never reuses a seq its log has
        if claim.finished and (events := await self._ended_stream(st)):
            self.output.resettle(st, events)  # ended before: settled from its log, never rerun
        elif claim.poison:
            why = f"the request was running during {POISON_ATTEMPTS} worker crashes"
            await self.output.fail(st, "poison", why, nxt)
        elif claim.cancelled:
            ev = TokenEvent(request_id=st.request_id, seq=nxt, finish_reason=FinishReason.CANCELLED)
            await self.output.end(st, ev)
        else:
            await self._start(st, claim.last_seq)

    async def _ended_stream(self, st: RequestState) -> list[TokenEvent]:
        """A request's replay log if it still ends with its final event, else nothing."""
        ctx = self.ctx
        events = await ctx.redis_dep.call(
            lambda: token_stream.read_log(ctx.redis, ctx.names, st.request_id), REDIS_DOWN
        )
        return events if events and events[-1].final else []

    def _start_early(
        self, tp: TopicPartition, offset: int, req: GenerateRequest
    ) -> RequestState | None:
        """Submit a request before its claim answers, its outputs held; None where the
        claimed path must decide (held here already, a passed deadline, a reply topic not
        yet known, a long or failing prompt)."""
        if req.request_id in self.ctx.table:
            return None
        if req.deadline is not None and req.deadline < time.time():
            return None
        topic = req.reply.kafka_topic
        if req.prompt_chars > INLINE_TOKENIZE_CHARS or (topic and topic not in self._topics):
            return None
        try:
            ids = prompt_token_ids(self.ctx.tokenizer, req)
        except Exception:  # a template or tokenizer error: reported on the claimed path
            return None
        st = RequestState(req, tp.partition, offset, phase=Phase.CLAIMING)
        self.ctx.table.add(st)
        self._submit(st, ids)
        return st

    def _withdraw(self, st: RequestState) -> None:
        """A request that started early is not this worker's to run: abort it unpublished."""
        if self.ctx.table.drop(st):
            self.ctx.retire(st)

    def _started(self, req: GenerateRequest) -> None:
        self.ctx.metrics.started(req)
        log.debug(
            "started %.1f ms after creation",
            (time.time() - req.created_at) * 1000,
            extra={"request_id": req.request_id},
        )

    async def _start(self, st: RequestState, skip_upto: int) -> None:
        """Start a request this worker holds (its events up to ``skip_upto`` are in its
        replay log already), or end it with an error that is its own."""
        req = st.request
        nxt = skip_upto + 1
        if req.deadline is not None and req.deadline < time.time():
            why = "the deadline passed before generation started"
            await self.output.fail(st, "deadline_exceeded", why, nxt)
            return
        topic = req.reply.kafka_topic
        if topic and not await self._topic_exists(topic):
            why = f"the reply topic '{topic}' does not exist"
            await self.output.fail(st, REPLY_TOPIC_NOT_FOUND, why, nxt)
            return
        try:
            # Short prompts are tokenized inline (well under a millisecond): a thread hop
            # would wait for the GIL behind the engine's step. Long ones go to a thread so
            # the event loop never stalls on them.
            if req.prompt_chars <= INLINE_TOKENIZE_CHARS:
                ids = prompt_token_ids(self.ctx.tokenizer, req)
            else:
                ids = await asyncio.to_thread(prompt_token_ids, self.ctx.tokenizer, req)
        except Exception as exc:  # a template or tokenizer error is the request's problem
            await self.output.fail(st, "invalid_request", f"cannot tokenize the prompt: {exc}", nxt)
            return
        st.skip_upto = skip_upto
        self.ctx.table.move(st, Phase.RUNNING)
        self._started(req)
        self._submit(st, ids)

    def _submit(self, st: RequestState, ids: list[int]) -> None:
        """Hand a request to the engine."""
        req = st.request
        sp = req.sampling
        self.ctx.idle.clear()
        self.ctx.runner.submit(
            EngineRequest(
                request_id=req.request_id,
                prompt_ids=ids,
                max_tokens=sp.max_tokens,
                sampling=SamplingConfig(
                    *self.ctx.sampling_defaults.resolve(sp.temperature, sp.top_p, sp.top_k),
                    sp.seed,
                    presence_penalty=sp.presence_penalty,
                    frequency_penalty=sp.frequency_penalty,
                    repetition_penalty=self.ctx.sampling_defaults.repetition(sp.repetition_penalty),
                    logit_bias=tuple(sp.logit_bias.items()),
                    min_p=self.ctx.sampling_defaults.min_prob(sp.min_p),
                ),
                stop=sp.stop,
                include_stop=sp.include_stop_str_in_output,
                stop_token_ids=sp.stop_token_ids,
                ignore_eos=sp.ignore_eos,
                min_tokens=sp.min_tokens,
                logprobs=sp.logprobs,
                structure=(sp.structure.kind, sp.structure.spec) if sp.structure else None,
                priority=req.priority.rank,
            )
        )

    async def _topic_exists(self, topic: str) -> bool:
        """Whether a reply topic exists (cluster metadata, refreshed at most every few
        seconds for names not seen yet). While Kafka is away the answer is yes: the
        completion then waits for Kafka like any other."""
        if topic in self._topics or time.monotonic() - self._topics_at < TOPICS_REFRESH_S:
            return topic in self._topics
        try:
            client = self.ctx.producer.client
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), 5.0)
        except (KafkaError, TimeoutError) as exc:
            log.warning("cannot read the topic list: %r", exc)
            return True
        self._topics = set(cluster.topics())
        self._topics_at = time.monotonic()
        return topic in self._topics

    async def retry_deferred(self) -> None:
        """Requests claimed by another worker: done when it finishes them, ours if its
        claim lapsed (it died)."""
        waiting = self.ctx.table.in_phase(Phase.DEFERRED)
        if not waiting:
            return
        claims = await self.ctx.claims.take([st.request_id for st in waiting])
        for st, claim in zip(waiting, claims, strict=True):
            if self.ctx.table.get(st.request_id) is st:  # not handed back meanwhile
                await self.resolve(st.partition, st.offset, st.request, claim)
