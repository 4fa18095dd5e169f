"""The capacity plan against what a one-worker stack sustains, measured in the same run."""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import pytest

from services.bench.drivers import Sample, closed_loop
from services.bench.e2e_bench import service_cpu
from services.bench.prometheus import engine_counters
from services.ops import costs as costs_file
from services.ops.capacity import Costs, Target, plan
from tests.integration.harness import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SLOTS = 4  # the worker's max_running: the batch it steps at
TOKENS = 48
HEARTBEAT_S = 1.5


def _bodies(n: int) -> list[dict[str, Any]]:
    return [
        {"prompt": f"count the words of line {i}", "max_tokens": TOKENS, "ignore_eos": True}
        for i in range(n)
    ]


def _decode_rate(s: Sample) -> float:
    """Tokens/s a stream got while it ran: from its first token to its last."""
    return (s.tokens - 1) / (s.e2e - s.ttft)


def _whole_rate(s: Sample) -> float:
    """Tokens/s over the request's whole life, its wait for a slot included."""
    return s.tokens / s.e2e


async def test_the_plan_for_what_one_worker_sustains_is_one_worker_and_two_for_double(
    bare: Stack,
) -> None:
    """Measure, then plan from the measurement, then check the plan against the stack.

    1. One worker with ``SLOTS`` slots runs ``SLOTS`` closed-loop streams: the rate each
       stream got over its whole life (median; its first token's wait included), the
       engine's step time at that batch (its busy seconds over its steps, from its own
       counters), the request rate, and the worker loop's CPU per token (``/proc``) are this
       stack's target and costs. The other costs (edges, Redis, Kafka, batchers) come from
       the checked-in file: they decide no worker.
    2. The model's prediction of a stream's rate, one token per step (``1000 / step_ms``),
       is within 30% of what the streams got from their first token to their last. (Not an
       exact bound: the mean step counts each request's own prefill, which its stream's
       decode does not wait for.)
    3. The plan for that target (at the step the streams saw) needs 1 worker; for twice the
       streams at the same rate, 2.
       And the one-worker stack, given twice the streams, does not sustain them: each
       stream's rate over its life (its wait for a slot included) falls well below the
       measured rate, and the stack's tokens/s stays far from twice what it was.

    The doubled load is not run on two workers: on a 2-core machine two engines share the
    cores one used, so their rate would say nothing about the plan. All comparisons are
    ratios within this run."""
    bare.start("worker", TW_MAX_RUNNING=str(SLOTS))
    bare.start("batcher")
    bare.start("edge")
    await bare.wait_ready()
    model = bare.env["TW_MODEL_NAME"]
    await closed_loop(bare, _bodies(SLOTS), SLOTS, model)  # warm-up

    # The worker refreshes its engine counters on its heartbeat (about every second):
    # wait past one, so that the warm-up's steps are counted before, not in, the window.
    await asyncio.sleep(HEARTBEAT_S)
    busy0, steps0 = await engine_counters(bare)
    cpu0 = service_cpu(bare)
    samples, wall, one = await closed_loop(bare, _bodies(3 * SLOTS), SLOTS, model)
    cpu1 = service_cpu(bare)
    await asyncio.sleep(HEARTBEAT_S)
    busy1, steps1 = await engine_counters(bare)
    step_ms = (busy1 - busy0) / (steps1 - steps0) * 1000
    rate = statistics.median(_whole_rate(s) for s in samples)
    decode = statistics.median(_decode_rate(s) for s in samples)
    tokens = sum(s.tokens for s in samples)
    worker_us = (cpu1["worker"] - cpu0["worker"]) * 1e6 / tokens

    costs = Costs.from_values(
        costs_file.values(costs_file.read_costs()) | {"worker_cpu_us_per_token": worker_us}
    )
    assert 0.7 < decode / (1000 / step_ms) < 1.3, (decode, step_ms)
    # The target's step is the one the streams saw (their median decode rate): the
    # counters' mean also takes in prefill steps and any step the shared machine held up,
    # and a target at exactly what was sustained would be refused by that mean's bound
    # (a CI run under load: 136.2 tok/s sustained, 134.1 by the mean step).
    target = Target(
        streams=SLOTS,
        tokens_per_s=rate,
        request_rate=len(samples) / wall,
        step_ms=1000 / decode,
        max_running=SLOTS,
    )
    sustained = plan(target, costs)
    assert sustained.count("workers") == 1, sustained
    doubled = plan(Target(**{**target.__dict__, "streams": 2 * SLOTS}), costs)
    assert doubled.count("workers") == 2, doubled

    over, _, two = await closed_loop(bare, _bodies(4 * SLOTS), 2 * SLOTS, model)
    whole = statistics.median(_whole_rate(s) for s in over)
    print(  # shown with -s: the run's figures
        f"step {step_ms:.1f} ms at batch {SLOTS}: {1000 / step_ms:.1f} tok/s per stream "
        f"predicted, {decode:.1f} decoded, {rate:.1f} over a request's life; worker loop "
        f"{worker_us:.0f} us/token; "
        f"doubled: {whole:.1f} tok/s per stream over its life, {two.full:.0f} against "
        f"{one.full:.0f} tok/s"
    )
    assert whole < 0.75 * rate, (whole, rate, step_ms)
    assert two.full < 1.5 * one.full, (two.full, one.full)
