"""The engine in a process of its own; the worker's event loop (Kafka intake, Redis
publishing, heartbeats) talks to it over a pipe.

Why a process: the engine's step is Python between PyTorch ops, and every op re-takes the
GIL. An event-loop thread in the same process, however light, makes the engine wait for the
GIL on every op it runs. Measured on 2 cores with the ``small`` preset at 32 streams, the
engine alone made 583 tokens/s; beside a thread holding the GIL 5% of the time, 509 (0.87x);
beside a process doing the same work, 546 (0.94x).

The engine process steps on its main thread (the one that loads the model, so PyTorch's
OpenMP team is the only one) and has no other threads: between steps it drains the pipe
(new requests, aborts, KV-summary queries), then sends the step's outputs with a snapshot
of the engine's stats. It ignores SIGINT and SIGTERM (the worker decides when it stops) and
exits when the worker's end of the pipe closes, including when the worker is killed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import itertools
import logging
import multiprocessing as mp
import queue
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from services.worker.engine.engine import EngineConfig, EngineRequest, EngineStats, StepOutput

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine process needs to build the engine."""

    model_dir: str
    device: str = "auto"
    dtype: str = "auto"
    torch_threads: int = 0  # 0: torch's default
    config: EngineConfig = field(default_factory=EngineConfig)
    log_level: str = "INFO"


class EngineFailed(RuntimeError):
    """The engine process could not start, a step raised, or the process died."""


class EngineProcess:
    """The worker's handle on its engine process.

    ``start()`` blocks until the model is loaded. Then ``submit``, ``abort`` and ``stop``
    are safe from any thread; ``kv_summary`` is awaited on the attached event loop, which
    also receives every step's outputs on ``outputs``. ``stats`` is the snapshot sent with
    the latest step. When the engine fails, ``error`` is set and an empty list is put on
    ``outputs`` so that the reader wakes up.
    """

    def __init__(self, spec: EngineSpec) -> None:
        self.outputs: asyncio.Queue[list[StepOutput]] = asyncio.Queue()
        self.stats = EngineStats(block_size=spec.config.block_size)
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        ctx = mp.get_context("spawn")  # no inherited threads or CUDA state
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=_engine_main, args=(child, spec), name="tw-engine", daemon=True
        )
        self._child_conn: Connection | None = child
        self._send: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._queries: dict[int, asyncio.Future[list[int]]] = {}
        self._ids = itertools.count()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def start(self, timeout: float = 600.0) -> None:
        """Start the process and wait until its engine is built; ``EngineFailed`` if not."""
        self._proc.start()
        assert self._child_conn is not None
        self._child_conn.close()  # so that the child's death reads as EOF here
        self._child_conn = None
        if not self._conn.poll(timeout):
            self._proc.kill()
            raise EngineFailed(f"the engine did not start within {timeout:.0f} s")
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            kind, payload = "failed", f"the engine process exited ({self._proc.exitcode})"
        if kind != "ready":
            self._proc.join(5)
            raise EngineFailed(f"the engine failed to start: {payload}")
        self.stats = payload
        # Before multiprocessing's own exit hook, which would wait for the process forever.
        atexit.register(self.stop)
        threading.Thread(target=self._write, name="engine-send", daemon=True).start()
        threading.Thread(target=self._read, name="engine-recv", daemon=True).start()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver outputs and query answers to ``loop``."""
        self._loop = loop

    def submit(self, req: EngineRequest) -> None:
        self._send.put(("submit", req))

    def abort(self, request_id: str) -> None:
        self._send.put(("abort", request_id))

    async def kv_summary(self, limit: int) -> list[int]:
        """The KV cache's routing summary, computed in the engine process between steps."""
        qid = next(self._ids)
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._queries[qid] = fut
        self._send.put(("summary", qid, limit))
        try:
            return await fut
        finally:
            self._queries.pop(qid, None)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the process to exit after the step in progress; kill it if it does not."""
        if self._stopping:
            return
        self._stopping = True
        self._send.put(("stop",))
        self._send.put(None)
        if self._proc.pid is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                log.warning("engine process did not stop in %.0f s: killing it", timeout)
                self._proc.kill()
                self._proc.join(5)
        self._conn.close()

    # --- pipe threads (no engine state here: only the worker's side) ------------------
    def _write(self) -> None:
        while (msg := self._send.get()) is not None:
            try:
                self._conn.send(msg)
            except (OSError, ValueError):  # the process is gone; the reader reports it
                return

    def _read(self) -> None:
        while True:
            try:
                kind, *rest = self._conn.recv()
            except (EOFError, OSError):
                if not self._stopping:
                    code = self._proc.exitcode
                    self._fail(EngineFailed(f"the engine process exited ({code})"))
                return
            if kind == "step":
                outs, self.stats = rest
                self._deliver(self.outputs.put_nowait, outs)
            elif kind == "summary":
                qid, hashes = rest
                self._deliver(self._answer, qid, hashes)
            elif kind == "failed":
                self._fail(EngineFailed(rest[0]))
                return

    def _answer(self, qid: int, hashes: list[int]) -> None:
        fut = self._queries.get(qid)
        if fut is not None and not fut.done():
            fut.set_result(hashes)

    def _fail(self, exc: BaseException) -> None:
        log.error("%s", exc)
        self.error = exc
        self._deliver(self.outputs.put_nowait, [])

    def _deliver(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)


# --- the engine process ---------------------------------------------------------------
def _engine_main(conn: Connection, spec: EngineSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    from shared.logs import setup_logging

    setup_logging("worker-engine", spec.log_level)
    try:
        engine = _build(spec)
    except Exception:
        conn.send(("failed", traceback.format_exc(limit=8)))
        return
    conn.send(("ready", engine.stats))
    with contextlib.suppress(EOFError, OSError):  # the worker is gone: exit quietly
        _serve(conn, engine)


def _build(spec: EngineSpec) -> Any:
    import torch

    from services.worker.engine.engine import Engine
    from services.worker.loader import load_model

    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    model, tokenizer = load_model(spec.model_dir, spec.device, spec.dtype)
    return Engine(model, tokenizer, spec.config)


def _serve(conn: Connection, engine: Any) -> None:
    while True:
        if conn.poll(0 if engine.has_work else IDLE_POLL_S):
            while True:  # everything that arrived during the step
                kind, *rest = conn.recv()
                if kind == "submit":
                    engine.add_request(rest[0])
                elif kind == "abort":
                    engine.abort(rest[0])
                elif kind == "summary":
                    conn.send(("summary", rest[0], engine.kv.summary_hashes(rest[1])))
                elif kind == "stop":
                    return
                if not conn.poll(0):
                    break
        if engine.has_work:
            try:
                outs = engine.step()
            except Exception:
                log.exception("engine step failed")
                conn.send(("failed", "engine step failed: " + traceback.format_exc(limit=8)))
                return
            conn.send(("step", outs, engine.stats))


def _exit_with_parent() -> None:
    """Linux: get SIGKILL when the worker dies, even mid-step (EOF on the pipe covers the
    rest, between steps)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
