"""EngineLoop: the engine steps on one thread, an event loop submits work and reads outputs
from another, and reads engine state only through ``call`` (on the engine's thread)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from services.worker.engine.engine import Engine, EngineConfig, EngineRequest, StepOutput
from services.worker.runtime import EngineLoop


@pytest.fixture
async def running(lm: tuple[Any, Any]) -> Any:
    runner = EngineLoop(Engine(*lm, EngineConfig(kv_budget_tokens=2048)))
    runner.attach(asyncio.get_running_loop())
    thread = threading.Thread(target=runner.run, name="engine-under-test")
    thread.start()
    yield runner, thread
    runner.stop()
    thread.join(10)
    assert not thread.is_alive()


async def finals(runner: EngineLoop, n: int) -> dict[str, list[StepOutput]]:
    outs: dict[str, list[StepOutput]] = {}
    done = 0
    while done < n:
        for o in await asyncio.wait_for(runner.outputs.get(), 60):
            outs.setdefault(o.request_id, []).append(o)
            done += o.finish is not None
    return outs


async def test_outputs_reach_the_event_loop(running: Any) -> None:
    runner, _ = running
    for i in range(3):
        runner.submit(EngineRequest(f"r{i}", [5, 6, 7, 8 + i], max_tokens=6, ignore_eos=True))
    outs = await finals(runner, 3)
    assert sorted(outs) == ["r0", "r1", "r2"]
    for steps in outs.values():
        assert sum(len(o.token_ids) for o in steps) == 6
        assert steps[-1].finish is not None


async def test_call_runs_on_the_engine_thread_between_steps(running: Any) -> None:
    runner, thread = running
    prompt = list(range(10, 74))  # four full blocks: cached prefix hashes to summarise
    for i in range(4):
        runner.submit(EngineRequest(f"c{i}", prompt, max_tokens=24, ignore_eos=True))
    seen = []
    summaries = []
    for _ in range(30):  # read the cache while steps mutate it
        where = await asyncio.wrap_future(runner.call(threading.current_thread))
        seen.append(where)
        summaries.append(
            await asyncio.wrap_future(runner.call(lambda: runner.engine.kv.summary_hashes(64)))
        )
    await finals(runner, 4)
    assert set(seen) == {thread}
    assert any(summaries), "the shared prefix never showed up in the cache summary"


async def test_call_passes_exceptions_back(running: Any) -> None:
    runner, _ = running

    def boom() -> None:
        raise ValueError("nope")

    with pytest.raises(ValueError, match="nope"):
        await asyncio.wrap_future(runner.call(boom))


async def test_a_failing_step_wakes_the_reader_and_ends_run(lm: tuple[Any, Any]) -> None:
    engine = Engine(*lm, EngineConfig(kv_budget_tokens=2048))

    def broken() -> list[StepOutput]:
        raise RuntimeError("device lost")

    engine.step = broken  # type: ignore[method-assign]
    runner = EngineLoop(engine)
    runner.attach(asyncio.get_running_loop())
    thread = threading.Thread(target=runner.run)
    thread.start()
    runner.submit(EngineRequest("x", [1, 2, 3], max_tokens=2))
    assert await asyncio.wait_for(runner.outputs.get(), 30) == []
    assert isinstance(runner.error, RuntimeError)
    thread.join(10)
    assert not thread.is_alive()
