"""Who moves a batch along: every edge runs the same two background tasks.

- **The advancer** walks the active batches. For each it takes a short lease in Redis
  (renewed while held; one holder at a time), and then validates the input file, submits
  lines to the requests topic at bulk priority (at most ``MAX_IN_FLIGHT`` outstanding,
  as ``tokenwire bulk submit`` does, so one batch never fills the batchers' queues; each
  with its ``cache`` field, so the batcher answers a repeated greedy or seeded line from
  the exact cache, with a completion like a worker's),
  broadcasts cancels, and writes the output and error files when every line has a
  result. An edge that dies drops its lease; another edge takes the batch over within
  ``LEASE_MS`` and resubmits from the recorded cursor (a line sent twice has the same
  request id: the workers run it once, and its result is counted once).
- **The collector** is one edge at a time, the holder of a second lease: it reads the
  completions topic (no consumer group: a dead member would hold its partitions until a
  rebalance times out), records each batch line's result (set-once, counted in the
  same script), and only then stores the next offsets in Redis, guarded by its lease.
  An edge that dies after recording and before storing leaves those completions to be
  read again by the next holder; re-recording is a no-op, so nothing is lost and
  nothing counted twice. With no edge up, completions wait in Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from services.bulk.runner import MAX_IN_FLIGHT
from services.edge.batch_lines import Checked, cancelled_line, check_file, result_line, window
from services.edge.batch_store import (
    EXPIRED,
    BatchRecord,
    BatchStore,
    line_request_id,
    parse_request_id,
)
from services.edge.cancel import send_cancels
from services.edge.state import EdgeState
from shared.codec import DecodeError, decode, encode
from shared.kafka_io import make_consumer
from shared.messages import CacheMode, CancelRequest, Completion, GenerateRequest
from shared.retry import REDIS_DOWN
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

TICK_S = 0.25
LEASE_MS = 5_000
RESEND_S = 1.0  # how often a cancelling batch's cancels are broadcast again
CANCEL_GRACE_S = 120.0  # a cancelled line whose worker never answers is written off then
TRANSIENT = (*REDIS_DOWN, KafkaError)


class BatchRunner:
    """This edge's share of advancing batches and recording their results."""

    def __init__(self, st: EdgeState) -> None:
        self.st = st
        self.store = BatchStore(st.redis, st.names)
        self.me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._tasks: list[asyncio.Task[None]] = []
        self._resent: dict[str, float] = {}
        self._held: set[str] = set()  # batches leased by this edge

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._forever(self.tick, "advance")),
            asyncio.create_task(self._forever(self.collect, "collect")),
        ]

    async def stop(self) -> None:
        """Stop both tasks and hand this edge's leases over (a restart of a healthy edge
        then pauses no batch; a crash leaves them to expire)."""
        await cancel_and_wait(*self._tasks)
        try:
            await self.store.release(self.me, sorted(self._held))
        except REDIS_DOWN as exc:
            log.warning("batch leases not released, Redis away: %r", exc)

    async def _forever(self, step: Callable[[], Awaitable[None]], what: str) -> None:
        away = False  # a dependency outage: the edge's health check warns of it once
        while True:
            try:
                await step()
                if away:
                    log.info("batch %s resumed", what)
                    away = False
            except TRANSIENT as exc:
                log.log(logging.DEBUG if away else logging.INFO, "batch %s paused: %r", what, exc)
                away = True
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch %s failed; retrying", what)
                await asyncio.sleep(1.0)
            if what == "advance":
                await asyncio.sleep(TICK_S)

    # --- advancing ----------------------------------------------------------------------
    async def tick(self) -> None:
        """One pass over the active batches this edge can lease."""
        for batch_id in await self.store.active():
            if await self.store.lease(batch_id, self.me, LEASE_MS):
                self._held.add(batch_id)
                await self.advance(batch_id)
            else:
                self._held.discard(batch_id)

    async def advance(self, batch_id: str) -> None:
        rec = await self.store.get(batch_id)
        if rec is None:
            await self.store.retire(batch_id)
            return
        if rec.status == "validating":
            await self._validate(rec)
        elif rec.status in ("in_progress", "cancelling"):
            stopping = rec.cancel_requested or time.time() >= rec.expires_at
            if stopping:
                await self._stop(rec)
            else:
                await self._submit(rec)
            rec = await self.store.get(batch_id) or rec
            if rec.counted >= rec.total:
                await self._finalize(rec)
        elif rec.status == "finalizing":
            await self._finalize(rec)
        else:
            await self.store.retire(batch_id)

    async def _validate(self, rec: BatchRecord) -> None:
        if rec.cancel_requested:
            await self.store.move(rec.id, "cancelled", from_=("validating",))
            await self.store.retire(rec.id)
            return
        content = await self.store.content(rec.input_file_id)
        if content is None:
            checked = Checked(
                errors=[{"code": "file_not_found", "message": "the input file is gone"}]
            )
        else:
            checked = await asyncio.to_thread(self._check, rec, content)
        if content is None or checked.errors:
            await self.store.update(rec.id, errors=checked.errors)
            await self.store.move(rec.id, "failed", from_=("validating",))
            await self.store.retire(rec.id)
            return
        await self.store.accept(rec.id, content, [j.custom_id for j in checked.jobs])
        await self.store.update(rec.id, total=len(checked.jobs))
        await self.store.move(rec.id, "in_progress", from_=("validating",))

    def _check(self, rec: BatchRecord, content: bytes) -> Checked:
        return check_file(
            content,
            batch_id=rec.id,
            endpoint=rec.endpoint,
            model=rec.model,
            tenant=rec.tenant,
            reply_topic=self.st.names.completions,
        )

    async def _submit(self, rec: BatchRecord) -> None:
        """Send lines from the cursor on, keeping at most ``MAX_IN_FLIGHT`` unanswered."""
        room = min(MAX_IN_FLIGHT - (rec.submitted - rec.counted), rec.total - rec.submitted)
        if room <= 0:
            return
        content = await self.store.input(rec.id)
        if content is None:
            return
        jobs = window(
            content,
            start=rec.submitted,
            count=room,
            batch_id=rec.id,
            tenant=rec.tenant,
            reply_topic=self.st.names.completions,
        )
        futures = []
        for job in jobs:
            req = self._cached(job.request.with_seed(), job.cache)
            futures.append(
                await self.st.producer.send(
                    self.st.names.requests, encode(req), key=req.request_id.encode()
                )
            )
        await asyncio.gather(*futures)
        await self.store.update(rec.id, submitted=rec.submitted + room)

    def _cached(self, req: GenerateRequest, mode: CacheMode) -> GenerateRequest:
        """A line asking the batcher for the exact cache (it looks greedy and client-seeded
        lines up, answers a hit on the completions topic as a worker would, and has a
        miss's answer stored). A line's result is recorded from its completion either
        way, once: a hit's comes under the line's own request id."""
        if not self.st.settings.cache:
            return req
        return req.model_copy(update={"cache": mode})

    async def _stop(self, rec: BatchRecord) -> None:
        """A cancelled or expired batch: lines never sent are written off at once; the
        sent ones still running are cancelled on every worker (again each ``RESEND_S``,
        as the HTTP cancel does), until their completions come back."""
        if not rec.cancel_requested:
            await self.store.update(rec.id, cancel_requested=EXPIRED)
            rec.cancel_requested = EXPIRED
        expired = rec.cancel_requested == EXPIRED
        if rec.status == "in_progress":
            await self.store.move(rec.id, "cancelling", from_=("in_progress",))
        ids = await self.store.custom_ids(rec.id, list(range(rec.submitted, rec.total)))
        for index, cid in zip(range(rec.submitted, rec.total), ids, strict=True):
            line = cancelled_line(cid or "", line_request_id(rec.id, index), expired=expired)
            await self.store.record(rec.id, index, line, ok=False)
        if rec.submitted < rec.total:
            await self.store.update(rec.id, submitted=rec.total)
        missing = await self.store.missing(rec.id, rec.submitted)
        now = time.time()
        if missing and now - (rec.cancelling_at or now) > CANCEL_GRACE_S:
            await self._write_off(rec, missing)
        elif missing and now - self._resent.get(rec.id, 0.0) >= RESEND_S:
            self._resent[rec.id] = now
            cancels = []
            for index in missing:
                rid = line_request_id(rec.id, index)
                cancels.append((rid, encode(CancelRequest(request_id=rid, tenant=rec.tenant))))
            await send_cancels(self.st, cancels)

    async def _write_off(self, rec: BatchRecord, missing: list[int]) -> None:
        ids = await self.store.custom_ids(rec.id, missing)
        for index, cid in zip(missing, ids, strict=True):
            line = cancelled_line(cid or "", line_request_id(rec.id, index))
            await self.store.record(rec.id, index, line, ok=False)

    async def _finalize(self, rec: BatchRecord) -> None:
        """Write the output and error files and end the batch. File ids follow from the
        batch id, so a finalize that an edge death interrupted is simply repeated."""
        if rec.status != "finalizing":
            await self.store.move(rec.id, "finalizing", from_=("in_progress", "cancelling"))
        rec = await self.store.get(rec.id) or rec
        out, err = await self.store.results(rec.id)
        suffix = rec.id.removeprefix("batch_")
        ids: dict[str, str] = {}
        if out:
            info = await self.store.put_file(
                rec.tenant, f"{rec.id}_output.jsonl", "batch_output", out, f"file-out-{suffix}"
            )
            ids["output_file_id"] = info.id
        if err:
            info = await self.store.put_file(
                rec.tenant, f"{rec.id}_error.jsonl", "batch_output", err, f"file-err-{suffix}"
            )
            ids["error_file_id"] = info.id
        if ids:
            await self.store.update(rec.id, **ids)
        if not rec.cancel_requested:
            end = "completed"
        elif rec.cancel_requested == EXPIRED:
            end = "expired"
        else:
            end = "cancelled"
        await self.store.move(rec.id, end, from_=("finalizing",))
        await self.store.retire(rec.id)
        self._resent.pop(rec.id, None)
        self._held.discard(rec.id)

    # --- collecting ---------------------------------------------------------------------
    async def collect(self) -> None:
        """While this edge holds the collector lease, record batch results from the
        completions topic, from the offsets the last holder stored on."""
        if not await self.store.lease_collector(self.me, LEASE_MS):
            await asyncio.sleep(TICK_S)
            return
        consumer = make_consumer(
            self.st.settings, group_id=None, client_id=f"edge-batches-{self.me}"
        )
        try:
            await consumer.start()
            topic = self.st.names.completions
            parts = [TopicPartition(topic, p) for p in await self.st.producer.partitions_for(topic)]
            if not parts:
                await asyncio.sleep(1.0)  # the topic is not there yet
                return
            consumer.assign(parts)
            stored = await self.store.offsets()
            for tp in parts:
                if tp.partition in stored:
                    consumer.seek(tp, stored[tp.partition])
                else:
                    await consumer.seek_to_beginning(tp)
            while await self.store.lease_collector(self.me, LEASE_MS):
                batch = await consumer.getmany(timeout_ms=500, max_records=500)
                done = [c for msgs in batch.values() for c in _completions(msgs)]
                if done:
                    await self.record(done)
                if batch:
                    nxt = {tp.partition: msgs[-1].offset + 1 for tp, msgs in batch.items()}
                    await self.store.save_offsets(self.me, nxt)
        finally:
            await consumer.stop()

    async def record(self, done: list[Completion]) -> None:
        """Record the results of batch lines among ``done`` (others are skipped)."""
        by_batch: dict[str, list[tuple[int, Completion]]] = defaultdict(list)
        for c in done:
            where = parse_request_id(c.request_id)
            if where is not None:
                by_batch[where[0]].append((where[1], c))
        for batch_id, items in by_batch.items():
            rec = await self.store.get(batch_id)
            if rec is None:
                continue
            ids = await self.store.custom_ids(batch_id, [i for i, _ in items])
            for (index, c), cid in zip(items, ids, strict=True):
                if cid is None:
                    continue
                line, ok = result_line(
                    cid, rec.endpoint, rec.model, c, expired=rec.cancel_requested == EXPIRED
                )
                await self.store.record(batch_id, index, line, ok=ok)


def _completions(msgs: list[ConsumerRecord[bytes, bytes]]) -> list[Completion]:
    out = []
    for m in msgs:
        try:
            out.append(decode(Completion, m.value or b""))
        except DecodeError:
            continue
    return out
