"""Ended requests settled, in the order a crash can never undo: each one's Kafka completion
and dead letter are acknowledged, then its claim is released with its done marker, then
its batch's offset may be committed. Off the publishing path: token events never wait on
Kafka acks."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from services.worker.context import WorkerContext
from services.worker.events import RequestState
from shared.cache.store import storable, store_answer
from shared.codec import encode
from shared.dead_letters import dead_letter
from shared.kafka_io import TooFarBack, holds_keyed_record, ridden_out
from shared.messages import DeadLetter, TokenEvent
from shared.retry import REDIS_DOWN

log = logging.getLogger("services.worker.service")


class Settler:
    """Takes ended requests from ``ctx.finals`` and settles them."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    async def run(self) -> None:
        finals = self.ctx.finals
        while True:
            ended = await finals.get()
            got = 1
            while not finals.empty():  # catch up in one round trip
                ended += finals.get_nowait()
                got += 1
            try:
                await self.settle(ended)
            finally:
                for _ in range(got):
                    finals.task_done()

    async def settle(self, ended: list[RequestState]) -> None:
        ctx = self.ctx
        owed = [st for st in ended if _owes_completion(st)]
        landed = await self._landed([st for st in owed if st.resettled])
        await self._send_completions([st for st in owed if st.request_id not in landed])
        await self._store_answers([st for st in ended if storable(st.request, st.final)])
        # A request settled from a lost worker's log may have had its dead letter sent
        # already: it is sent again (twice, never lost).
        for st in ended:
            if st.final is not None and st.final.error is not None:
                ctx.metrics.failures.labels(st.final.error.code).inc()
                await ctx.send_dead_letter(self._letter_of(st, st.final))
        rids = [st.request_id for st in ended]
        ttl = ctx.settings.done_ttl_s
        await ctx.redis_dep.call(
            lambda: ctx.claims.release(rids, "done", done_ttl_s=ttl), REDIS_DOWN
        )
        for st in ended:
            ctx.table.drop(st)
            ctx.offsets.done(st.request_id)
        await self.commit()

    async def _send_completions(self, ended: list[RequestState]) -> None:
        """Each request's ``Completion`` to its reply topic, waiting out a Kafka outage;
        one that cannot be delivered at all is dead-lettered. A send that failed may have
        landed all the same (the broker wrote it and went away before its answer came):
        before it is sent again, the reply topic is searched for it."""
        ctx = self.ctx
        pending = ended
        while pending:
            asked_at = time.monotonic()
            results = await asyncio.gather(
                *(self._send_completion(st) for st in pending), return_exceptions=True
            )
            retry: list[RequestState] = []
            failure: KafkaError | None = None
            for st, res in zip(pending, results, strict=True):
                if isinstance(res, KafkaError) and ridden_out(res):
                    retry.append(st)
                    failure = res
                elif isinstance(res, KafkaError):
                    await self._undeliverable(st, res)
                elif isinstance(res, BaseException):
                    raise res
            if failure is None:
                ctx.kafka_dep.answered(asked_at)
                return
            await asyncio.sleep(ctx.kafka_failed(failure))
            landed = await self._landed(retry)
            pending = [st for st in retry if st.request_id not in landed]

    async def _landed(self, sent_before: list[RequestState]) -> set[str]:
        """Which of these requests, whose completion may have been sent before (by a worker
        that died settling them, or by a send here that failed without saying whether it
        landed), have it on the reply topic already."""
        found = await asyncio.gather(*(self._on_reply_topic(st) for st in sent_before))
        return {st.request_id for st, on in zip(sent_before, found, strict=True) if on}

    async def _on_reply_topic(self, st: RequestState) -> bool:
        """Whether a request's completion is on its reply topic, waiting out a Kafka
        outage. Where the topic cannot be searched (too many records since the request was
        made, reading refused) the answer is no: a completion sent twice, never lost."""
        ctx, topic = self.ctx, st.request.reply.kafka_topic
        assert topic is not None
        while True:
            try:
                return await holds_keyed_record(
                    ctx.settings,
                    topic,
                    await ctx.producer.partitions_for(topic),
                    st.request_id.encode(),
                    st.request.created_at,
                    client_id=f"{ctx.settings.worker_id}-settle",
                )
            except TooFarBack as exc:
                why = str(exc)
            except KafkaError as exc:
                if ridden_out(exc):
                    await asyncio.sleep(ctx.kafka_failed(exc))
                    continue
                why = repr(exc)
            ctx.metrics.handled_errors.labels("completion_search").inc()
            log.warning(
                "%s not searched for the completion (%s): sent again",
                topic,
                why,
                extra={"request_id": st.request_id},
            )
            return False

    async def _store_answers(self, ended: list[RequestState]) -> None:
        """Copy finished answers into the response cache, as their edges asked. A cache
        that cannot be written is a miss later, never a reason to hold a request back."""
        ctx = self.ctx
        for st in ended:
            try:
                stored = await store_answer(ctx.redis, ctx.names, st.request)
            except REDIS_DOWN as exc:
                stored = False
                log.warning("answer not cached: %r", exc, extra={"request_id": st.request_id})
            if not stored:
                ctx.metrics.handled_errors.labels("cache_store").inc()

    async def _send_completion(self, st: RequestState) -> None:
        topic, final = st.request.reply.kafka_topic, st.final
        assert topic is not None and final is not None
        record = encode(st.completion(final, self.ctx.settings.worker_id))
        await (await self.ctx.producer.send(topic, record, key=st.request_id.encode()))

    async def _undeliverable(self, st: RequestState, exc: KafkaError) -> None:
        self.ctx.metrics.handled_errors.labels("completion").inc()
        log.warning("completion undeliverable: %r", exc, extra={"request_id": st.request_id})
        assert st.final is not None
        letter = self._letter_of(st, st.final, "completion_undeliverable", repr(exc))
        await self.ctx.send_dead_letter(letter)

    def _letter_of(
        self, st: RequestState, final: TokenEvent, reason: str | None = None, detail: str = ""
    ) -> DeadLetter:
        err = final.error
        return dead_letter(
            reason=reason or (err.code if err else "error"),
            detail=detail or (err.message if err else ""),
            topic=self.ctx.names.batches,
            partition=st.partition,
            offset=st.offset,
            key=st.request_id,
            value=encode(st.request),
            request_id=st.request_id,
        )

    async def commit(self) -> None:
        """Commit the batches whose requests are all settled; a failed commit (a rebalance
        in flight, Kafka away) is offered again with the next one."""
        ctx = self.ctx
        offsets = ctx.offsets.committable()
        if not offsets:
            return
        try:
            await ctx.consumer.commit(
                {TopicPartition(ctx.names.batches, p): o for p, o in offsets.items()}
            )
        except KafkaError as exc:
            ctx.offsets.not_committed(offsets)
            ctx.metrics.handled_errors.labels("commit").inc()
            log.warning("commit of %s failed, retried later: %r", offsets, exc)


REPLY_TOPIC_NOT_FOUND = "reply_topic_not_found"


def _owes_completion(st: RequestState) -> bool:
    """Whether a completion goes to the request's reply topic (none when that topic is
    what failed it)."""
    err = st.final.error if st.final is not None else None
    return bool(st.request.reply.kafka_topic) and not (err and err.code == REPLY_TOPIC_NOT_FOUND)
