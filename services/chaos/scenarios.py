"""The fault scenarios. Each runs streaming clients through the edge, breaks one thing
and returns an outcome per request it sent, and the service it killed on purpose (that
exit is the scenario's, not the stack's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import redis.asyncio as aioredis

from services import chaos
from services.chaos.accounting import (
    Expect,
    Outcome,
    check_stream,
    cut_stream_outcome,
    unfollowed_outcome,
)
from services.chaos.bus import DeadLetters, KafkaReplies, log_judged, replay_log
from services.chaos.load import PROMPTS, Edge, Load, StreamRun
from services.chaos.stack import Stack
from services.edge.config import EdgeSettings
from shared.messages import (
    FinishReason,
    GenerateRequest,
    ReplyTarget,
    SamplingParams,
    TokenEvent,
)

WARMUP_S = 2.0  # load before the fault, so that it meets running streams
DRAIN_S = 180.0  # how long the requests in flight may take to end after the load stops
RESTART_S = 90.0  # how long a killed service may take to come back
LONG_TOKENS = 1500  # edge-kill: a stream that would run long after its edge is gone


@dataclass
class Context:
    """What every scenario works with."""

    stack: Stack
    edge: Edge
    streams: int
    max_tokens: int
    settle_s: float  # how long the load runs on after the fault
    say: Callable[[str], None]


@dataclass
class Result:
    """What one scenario produced: each request's outcome, the service it killed, notes for the table."""

    outcomes: list[Outcome]
    killed: str | None = None  # the service the scenario SIGKILLed
    notes: list[str] = field(default_factory=list)


Scenario = Callable[[Context], Awaitable[Result]]


async def under_load(ctx: Context, fault: Callable[[], Awaitable[None]]) -> list[Outcome]:
    """Run ``fault`` while the streams run (from ``WARMUP_S`` after they start to
    ``settle_s`` before they stop); an outcome per streamed request."""
    load = Load(ctx.edge, ctx.streams, ctx.max_tokens)
    load.start()
    try:
        await asyncio.sleep(WARMUP_S)
        await fault()
        await asyncio.sleep(ctx.settle_s)
    except BaseException:
        await load.finish(0)
        raise
    return await load.finish(DRAIN_S)


async def redis_restart(ctx: Context) -> Result:
    async def fault() -> None:
        ctx.say("stopping Redis for 3 s")
        await ctx.stack.script("redis", "stop")
        try:
            await asyncio.sleep(3)
        finally:  # interrupted or not, the stack gets its Redis back
            await ctx.stack.script("redis", "start")

    return Result(await under_load(ctx, fault))


def kafka_stop(seconds: float) -> Scenario:
    async def scenario(ctx: Context) -> Result:
        async def fault() -> None:
            ctx.say(f"stopping the Kafka broker for {seconds:.0f} s")
            await ctx.stack.script("kafka", "stop")
            try:
                await asyncio.sleep(seconds)
            finally:
                await ctx.stack.script("kafka", "start")

        return Result(await under_load(ctx, fault))

    return scenario


async def worker_kill(ctx: Context) -> Result:
    """Kafka-reply requests of growing lengths are sent; once the shortest is answered
    (the others mid-way), the worker is SIGKILLed and its supervisor restarts it."""
    rids: list[str] = []
    async with KafkaReplies(ctx.stack.settings) as replies:

        async def fault() -> None:
            for i in range(2 * ctx.streams):
                sampling = SamplingParams(
                    max_tokens=ctx.max_tokens + 8 * i, temperature=0, ignore_eos=True
                )
                req = GenerateRequest(prompt=PROMPTS[i % len(PROMPTS)], sampling=sampling)
                rids.append(await replies.submit(req))
            await replies.wait(rids[:1], within_s=60, linger_s=0)
            pid = ctx.stack.kill("worker")
            ctx.say(f"worker (pid {pid}) SIGKILLed; {len(replies.seen)} of {len(rids)} answered")
            await ctx.stack.wait_restarted("worker", pid, RESTART_S)

        outcomes = await under_load(ctx, fault)
        await replies.wait(rids, within_s=DRAIN_S)
        outcomes += [replies.outcome(r) for r in rids]
    return Result(outcomes, killed="worker")


async def edge_kill(ctx: Context) -> Result:
    """Long non-resumable streams lose their edge (SIGKILL, so it cancels nothing): each
    must end cancelled once nobody has followed it for the edge's grace, unless it
    finished on its own before then. Then streams run through the new edge."""
    grace = EdgeSettings.from_env(ctx.stack.env).unfollowed_grace_s
    runs, outcomes, killed_at = await _kill_edge_under(ctx, grace)
    client = aioredis.Redis.from_url(ctx.stack.settings.redis_url)

    async def ended(rid: str) -> tuple[list[TokenEvent], float]:
        log = await replay_log(client, ctx.stack.names, rid, grace + 30)
        return log, time.monotonic() - killed_at

    try:
        logs = await asyncio.gather(*(ended(r.request_id) for r in runs))
    finally:
        await client.aclose()
    for r, (log, ended_s) in zip(runs, logs, strict=True):
        finish = log[-1].finish_reason if log else None
        judged = unfollowed_outcome(
            [e.seq for e in log], finish.value if finish else None, ended_s, grace
        )
        seen = check_stream(r.events, r.started_at, r.ended_at)
        outcomes.append(cut_stream_outcome(seen, replace(judged, request_id=r.request_id)))
    cancelled = sum(1 for log, _ in logs if log and log[-1].finish_reason == FinishReason.CANCELLED)
    notes = [
        f"cut streams ended within {max((s for _, s in logs), default=0.0):.1f} s of the "
        f"kill (grace {grace:g} s); {cancelled} of {len(runs)} cancelled by their worker"
        + (
            ""
            if cancelled
            else ": all finished first (a shorter TW_UNFOLLOWED_GRACE_S on the "
            "stack's edge puts the cancel to the test)"
        )
    ]
    outcomes += await under_load(ctx, _nothing)
    return Result(outcomes, killed="edge", notes=notes)


async def _kill_edge_under(
    ctx: Context, grace: float
) -> tuple[list[StreamRun], list[Outcome], float]:
    """Start long streams, SIGKILL the edge once each is under way and wait for it to be
    restarted: the streams it cut, the outcomes of those that never got under way (lost),
    and when it was killed."""
    runs = [StreamRun() for _ in range(ctx.streams)]
    bodies = [ctx.edge.body(PROMPTS[i % len(PROMPTS)], LONG_TOKENS) for i in range(ctx.streams)]
    tasks = [asyncio.create_task(ctx.edge.stream(b, r)) for b, r in zip(bodies, runs, strict=True)]
    deadline = time.monotonic() + 60
    while any(len(r.events) < 3 for r in runs):  # every stream under way
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    pid = ctx.stack.kill("edge")
    killed_at = time.monotonic()
    ctx.say(f"edge (pid {pid}) SIGKILLed under {len(runs)} streams; grace {grace:g} s")
    for run, task in zip(runs, tasks, strict=True):
        if not run.events:  # still being refused: it must not reach the next edge
            task.cancel()
    for end in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(end, BaseException) and not isinstance(end, asyncio.CancelledError):
            raise end
    await ctx.stack.wait_restarted("edge", pid, RESTART_S)
    cut = [r for r in runs if r.events]
    missed = [
        Outcome(False, why=f"not streaming when the edge was killed ({r.refusal or 'no event'})")
        for r in runs
        if not r.events
    ]
    return cut, missed, killed_at


async def _nothing() -> None:
    return None


async def poison(ctx: Context) -> Result:
    """Under the streams: temperature 1e-45 over HTTP and raw on Kafka (each must be
    answered), a request that fails in the worker (a reply topic that does not exist: an
    error event and a dead letter), then a normal request."""
    settings = ctx.stack.settings
    found: list[Outcome] = []
    async with KafkaReplies(settings) as replies, DeadLetters(settings) as letters:

        async def fault() -> None:
            tiny = await ctx.edge.stream(ctx.edge.body(PROMPTS[0], 12, temperature=1e-45))
            found.append(tiny.outcome(Expect.ANSWERED))
            raw = GenerateRequest(
                prompt=PROMPTS[3], sampling=SamplingParams(temperature=1e-45, max_tokens=12)
            )
            missing = ReplyTarget(kafka_topic=f"{settings.names.prefix}.chaos-no-such-topic")
            failing = GenerateRequest(prompt=PROMPTS[5], reply=missing)
            raw_id = await replies.submit(raw)
            failing_id = await replies.submit(failing)
            normal = await ctx.edge.stream(ctx.edge.body(PROMPTS[1], ctx.max_tokens))
            found.append(normal.outcome(Expect.OK))
            await replies.wait([raw_id], within_s=60)
            found.append(replies.outcome(raw_id, Expect.ANSWERED))
            found.append(await _failed_in_worker(ctx, letters, failing_id))

        outcomes = await under_load(ctx, fault)
    return Result(outcomes + found)


async def _failed_in_worker(ctx: Context, letters: DeadLetters, rid: str) -> Outcome:
    """Completed when the request's replay log ends with an error event and it was
    dead-lettered."""
    client = aioredis.Redis.from_url(ctx.stack.settings.redis_url)
    try:
        events = await replay_log(client, ctx.stack.names, rid, 60)
        judged = log_judged(rid, events, Expect.ERROR)
    finally:
        await client.aclose()
    reason = await letters.wait(rid, within_s=30)
    if judged.completed and reason is None:
        return Outcome(False, why="an error event but no dead letter", request_id=rid)
    return judged


SCENARIOS: dict[str, Scenario] = {
    "redis-restart": redis_restart,
    "kafka-stop-10s": kafka_stop(10),
    "kafka-stop-40s": kafka_stop(40),
    "worker-kill": worker_kill,
    "edge-kill": edge_kill,
    "poison": poison,
}
if list(SCENARIOS) != list(chaos.SCENARIOS):  # the command line's list is this one
    raise RuntimeError("services.chaos.SCENARIOS and scenarios.SCENARIOS disagree")
