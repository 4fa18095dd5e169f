"""Run the chosen scenarios one after another against the running stack, each on a stack
that is whole again (every service up, the edge ready, a worker serving), and make a row
of each."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence

from services.chaos.load import Edge
from services.chaos.report import Row, row_of
from services.chaos.scenarios import SCENARIOS, Context, Result
from services.chaos.stack import ChaosError, Stack, exits_between

RECOVERY_S = 180.0  # how long the stack may take to be whole again after a scenario


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def run(
    stack: Stack, names: Sequence[str], streams: int, max_tokens: int, settle_s: float
) -> list[Row]:
    """A row per scenario; stops early (with a note in the last row) if the stack does not
    come back after one."""
    try:
        await stack.wait_ready(within_s=30)
    except ChaosError as exc:
        raise ChaosError(f"{exc}; start it with infra/stack.sh up") from None
    rows = []
    async with Edge(stack.edge_url, stack.api_key()) as edge:
        ctx = Context(stack, edge, streams, max_tokens, settle_s, say)
        for name in names:
            row, recovered = await _one(ctx, name)
            rows.append(row)
            say(f"{name}: {row.completed}/{row.requests} completed, {row.lost} lost")
            if not recovered:
                break
    return rows


async def _one(ctx: Context, name: str) -> tuple[Row, bool]:
    """One scenario's row, and whether the stack was whole again after it."""
    stack = ctx.stack
    say(f"{name}: {ctx.streams} streams")
    before = stack.snapshot()
    try:
        result = await SCENARIOS[name](ctx)
    except ChaosError as exc:
        result = Result([], notes=[f"not run to the end: {exc}"])
    why = await _recovery(ctx)
    if why:
        result.notes.append(f"the stack did not recover: {why}")
    exits = exits_between(before, stack.snapshot())
    if result.killed and exits[result.killed] > 0:
        exits[result.killed] -= 1  # the scenario's own SIGKILL
    notes = [f"{s} exited {n}×" for s, n in exits.items() if n] + result.notes
    row = row_of(name, result.outcomes, sum(exits.values()), notes)
    row.recovered = not why
    return row, row.recovered


async def _recovery(ctx: Context, within_s: float = RECOVERY_S) -> str:
    """Wait until the stack is whole again: every service up, the edge ready, a worker
    serving, and a new request answered. "" once it is, else why not."""
    deadline = time.monotonic() + within_s
    try:
        await ctx.stack.wait_ready(within_s=within_s, since=time.time())
    except ChaosError as exc:
        return str(exc)
    while why := await ctx.edge.answers():
        if time.monotonic() > deadline:
            return f"a new request still gets {why} after {within_s:.0f} s"
        await asyncio.sleep(1.0)
    return ""
