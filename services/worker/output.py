"""The engine's outputs out: each step's events for every stream in one Redis write, and
the end of every request (finished by the engine, or ended here with an error of its own)
handed on to be settled."""

from __future__ import annotations

import logging
import time

from services.worker.context import WorkerContext
from services.worker.engine.wire import StepOutput
from services.worker.events import RequestState
from services.worker.requests import Phase
from services.worker.runtime import EngineFailed
from shared.messages import TokenEvent, error_event

log = logging.getLogger("services.worker.service")

Pairs = list[tuple[RequestState, TokenEvent]]


class Output:
    """Publishes events in order and moves ended requests to ``SETTLING``."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    async def run(self) -> None:
        """Publish every step's outputs as they come; raise if the engine failed."""
        runner = self.ctx.runner
        outputs = runner.outputs
        while True:
            outs = await outputs.get()
            if runner.error is not None:
                raise EngineFailed("engine step failed") from runner.error
            batch = [outs]
            while not outputs.empty():  # catch up in one round trip
                batch.append(outputs.get_nowait())
            runner.taken()
            await self.emit(*self.events([o for step in batch for o in step]))

    def events(self, outs: list[StepOutput]) -> tuple[Pairs, list[RequestState]]:
        """The events to publish for ``outs``, and the requests they end (including those
        whose final event went out before a redelivery)."""
        table = self.ctx.table
        pairs: Pairs = []
        ended = []
        for out in outs:
            if self.ctx.stale(out):
                continue  # a run handed back or withdrawn; this request may run again
            st = table.get(out.request_id)
            if st is None or not st.phase.in_engine:
                continue  # handed back, withdrawn or lost meanwhile
            if st.phase is Phase.CLAIMING:
                st.held.append(out)  # its claim has not answered yet
                continue
            ev = st.event(out)
            if out.finish is not None:
                table.move(st, Phase.SETTLING)
                self.ctx.left_engine(st)
                ended.append(st)
            if ev is not None:
                pairs.append((st, ev))
        return pairs, ended

    async def emit(self, pairs: Pairs, ended: list[RequestState]) -> None:
        """Publish events (waiting out a Redis outage); ended requests go on to be settled,
        and a stream no client follows any more is cancelled."""
        ctx = self.ctx
        await ctx.publisher.publish(pairs)
        now = time.monotonic()
        for st, ev in pairs:
            ctx.metrics.published(st.request, ev)
            if ev.final:
                log.info("finished: %s", ev.finish_reason, extra={"request_id": ev.request_id})
            elif st.abandoned(now) and not st.cancelling and st.phase is Phase.RUNNING:
                st.cancelling = True
                log.info(
                    "no client follows the stream: cancelling", extra={"request_id": ev.request_id}
                )
                ctx.metrics.unfollowed.inc()
                ctx.runner.abort(ev.request_id)
        if ended:
            ctx.finals.put_nowait(ended)

    async def release_held(self, st: RequestState) -> None:
        """A ``CLAIMING`` request is this worker's: publish what it held back."""
        held, st.held = st.held, []
        self.ctx.table.move(st, Phase.RUNNING)
        if held:
            await self.emit(*self.events(held))

    def resettle(self, st: RequestState, events: list[TokenEvent]) -> None:
        """Settle a request whose worker died after publishing its final event, from its
        replay log's ``events``; its completion is sent only if the reply topic does not
        hold it yet."""
        st.restore(events)
        self.ctx.table.move(st, Phase.SETTLING)
        log.info("settling the ended request of a lost worker", extra={"request_id": st.request_id})
        self.ctx.finals.put_nowait([st])

    async def fail(self, st: RequestState, code: str, message: str, seq: int) -> None:
        """End a request with an error of its own: an error event at ``seq``, its next one
        (never a seq a redelivered stream already has), then its dead letter."""
        log.warning("failed (%s): %s", code, message, extra={"request_id": st.request_id})
        await self.end(st, error_event(st.request_id, seq, code, message))

    async def end(self, st: RequestState, ev: TokenEvent) -> None:
        """End a request that is not in the engine with ``ev`` as its final event."""
        self.ctx.table.move(st, Phase.SETTLING)
        st.final = ev
        await self.emit([(st, ev)], [st])
