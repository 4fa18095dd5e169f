"""EngineProcess: the engine runs in a child process; the worker's event loop submits work,
reads every step's outputs and queries the KV summary over a pipe."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from services.worker.engine.engine import Engine
from services.worker.engine.request import Status
from services.worker.engine.wire import EngineConfig, EngineRequest, StepOutput, TokenLogprobs
from services.worker.runtime import EngineFailed, EngineProcess, EngineSpec
from tests.conftest import torch_imported_by
from tests.unit.conftest import DEVICE, DTYPE

ROOT = Path(__file__).resolve().parents[2]
CONFIG = EngineConfig(kv_budget_tokens=2048)


@pytest.fixture
async def engine(model_dir: str) -> AsyncIterator[EngineProcess]:
    spec = EngineSpec(model_dir, DEVICE, DTYPE, torch_threads=1, config=CONFIG)
    proc = EngineProcess(spec)
    await asyncio.to_thread(proc.start, 120)
    await proc.attach()
    yield proc
    proc.stop()
    assert proc._proc.exitcode == 0  # stopped on request, not killed


async def finals(proc: EngineProcess, n: int) -> dict[str, list[StepOutput]]:
    outs: dict[str, list[StepOutput]] = {}
    done = 0
    while done < n:
        step = await asyncio.wait_for(proc.outputs.get(), 60)
        assert proc.error is None
        for o in step:
            outs.setdefault(o.request_id, []).append(o)
            done += o.finish is not None
    return outs


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead too
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_outputs_match_the_engine_in_process(
    engine: EngineProcess, lm: tuple[Any, Any]
) -> None:
    reqs = [
        EngineRequest(f"r{i}", [5, 6, 7, 8 + i], max_tokens=6, ignore_eos=True) for i in range(3)
    ]
    for r in reqs:
        engine.submit(r)
    got = await finals(engine, 3)
    local = Engine(*lm, CONFIG)
    for r in reqs:
        local.add_request(r)
    want: dict[str, list[int]] = {}
    for o in local.run_until_idle():
        want.setdefault(o.request_id, []).extend(o.token_ids)
    assert {rid: [t for o in steps for t in o.token_ids] for rid, steps in got.items()} == want
    assert all(steps[-1].finish is not None for steps in got.values())
    # Each step's outputs come with the engine's stats at that point.
    assert engine.stats.finished == 3 and engine.stats.steps >= 6
    assert engine.stats.running == 0 and engine.stats.kv_used_blocks == 0


def thread_niceness(pid: int | None) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int((t / "stat").read_text().rsplit(")", 1)[1].split()[16]) for t in tasks.iterdir()]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
async def test_every_engine_thread_runs_at_the_lowered_priority(model_dir: str) -> None:
    """Threads started after the process lowered its priority (PyTorch's OpenMP team, on
    the first step with two threads) inherit it, as do those started before."""
    spec = EngineSpec(model_dir, DEVICE, DTYPE, torch_threads=2, nice=3, config=CONFIG)
    proc = EngineProcess(spec)
    await asyncio.to_thread(proc.start, 120)
    try:
        await proc.attach()
        proc.submit(EngineRequest("r", [5, 6, 7, 8], max_tokens=4))
        await finals(proc, 1)
        nice = thread_niceness(proc.pid)
        assert len(nice) > 1
        assert set(nice) == {os.nice(0) + 3}
    finally:
        proc.stop()


def test_the_loaded_engine_is_kept_out_of_gc_scans(engine: EngineProcess) -> None:
    # The model, tokenizer and libraries (hundreds of thousands of objects) are frozen once
    # loaded: a full collection would otherwise scan them all, pausing every stream.
    assert engine.stats.gc_frozen_objects > 50_000


async def test_kv_summary_is_answered_between_steps(engine: EngineProcess) -> None:
    prompt = list(range(10, 74))  # four full blocks: cached prefix hashes to summarise
    for i in range(4):
        engine.submit(EngineRequest(f"c{i}", prompt, max_tokens=24, ignore_eos=True))
    summaries = []
    for _ in range(20):  # query while steps mutate the cache
        summaries.append(await asyncio.wait_for(engine.kv_summary(64), 30))
    await finals(engine, 4)
    assert any(summaries), "the shared prefix never showed up in the cache summary"
    assert await asyncio.wait_for(engine.kv_summary(64), 30)  # still cached when idle


async def test_an_aborted_request_ends_without_running_to_its_limit(
    engine: EngineProcess,
) -> None:
    engine.submit(EngineRequest("long", [5, 6, 7], max_tokens=500, ignore_eos=True))
    first: list[StepOutput] = []
    while not first:  # a step's tokens come out with the next step (its text overlaps it)
        first = await asyncio.wait_for(engine.outputs.get(), 60)
    assert [o.request_id for o in first] == ["long"]
    engine.abort("long")
    outs = await finals(engine, 1)
    assert sum(len(o.token_ids) for o in first + outs["long"]) < 500


async def test_a_failing_step_is_reported_and_ends_the_process(model_dir: str) -> None:
    spec = EngineSpec(model_dir, DEVICE, DTYPE, torch_threads=1, config=CONFIG)
    proc = EngineProcess(spec)
    await asyncio.to_thread(proc.start, 120)
    await proc.attach()
    proc.submit(EngineRequest("x", ["not a token id"], max_tokens=2))  # type: ignore[list-item]
    assert await asyncio.wait_for(proc.outputs.get(), 60) == []
    assert isinstance(proc.error, EngineFailed)
    assert "TypeError" in str(proc.error)
    await asyncio.to_thread(proc._proc.join, 60)  # returns at the exit (slow under load)
    assert proc._proc.exitcode is not None
    proc.stop()


def test_a_model_that_cannot_load_fails_start(tmp_path: Path) -> None:
    proc = EngineProcess(EngineSpec(str(tmp_path / "missing"), torch_threads=1))
    with pytest.raises(EngineFailed, match="failed to start"):
        proc.start(120)


def test_a_step_output_crosses_the_pipe_whole() -> None:
    """Every field survives the pickle the pipe carries, none left at its default."""
    out = StepOutput(
        "r1",
        [5, 6],
        " ab",
        Status.FINISHED_ERROR,
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=1,
        error="boom",
        error_code="engine_error",
        logprobs=[TokenLogprobs(-0.5, ((5, -0.5), (7, -1.5))), TokenLogprobs(-0.1)],
    )
    defaults = StepOutput("", [], "")
    assert all(getattr(out, f.name) != getattr(defaults, f.name) for f in fields(StepOutput))
    assert pickle.loads(pickle.dumps(out, pickle.HIGHEST_PROTOCOL)) == out


def test_the_worker_leaves_torch_to_its_engine_process() -> None:
    """The worker's own process imports its service, the engine's wire types and the
    process runner without torch or transformers: it starts its engine process first, which
    imports them and loads the model meanwhile."""
    code = "import services.cli, services.worker.service, services.worker.runtime"
    assert torch_imported_by(code) == []


def test_the_engine_process_dies_with_its_worker(model_dir: str) -> None:
    script = (
        "import sys, time\n"
        "from services.worker.runtime import EngineProcess, EngineSpec\n"
        "if __name__ == '__main__':\n"
        "    p = EngineProcess(EngineSpec(sys.argv[1], torch_threads=1))\n"
        "    p.start(120)\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script, model_dir],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its resource tracker complains about the kill
        text=True,
    )
    try:
        assert worker.stdout is not None
        child = int(worker.stdout.readline())
        assert alive(child)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        deadline = time.monotonic() + 15
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the engine process outlived its worker"
    finally:
        worker.kill()


class _Collect:
    def __init__(self) -> None:
        self.got: list[Any] = []

    def _received(self, msg: Any) -> None:
        self.got.append(msg)


def test_the_loops_reader_splits_connection_frames_however_they_arrive() -> None:
    from multiprocessing.connection import Connection

    from services.worker.runtime import _Pipe

    wire = bytearray()

    class Capture(Connection):  # multiprocessing's own framing, as the engine process sends
        def _send(self, buf: bytes, write: Any = None) -> None:
            wire.extend(buf)

    msgs: list[Any] = [("step", [], None), ("summary", 1, list(range(50_000))), ("x", b"")]
    msgs += [("step", [i] * i, None) for i in range(40)]
    r, w = os.pipe()
    os.close(r)
    sender = Capture(w)
    for m in msgs:
        sender.send(m)
    sender.close()
    for cut in (1, 3, 4097, len(wire)):  # arrival in pieces of this size
        owner = _Collect()
        proto = _Pipe(owner)  # type: ignore[arg-type]
        for i in range(0, len(wire), cut):
            piece = wire[i : i + cut]
            while piece:  # no more than the buffer offered, as a socket would
                buf = proto.get_buffer(-1)
                n = min(len(buf), len(piece))
                buf[:n] = piece[:n]
                proto.buffer_updated(n)
                piece = piece[n:]
        assert owner.got == msgs
