"""The engine in a process of its own; the worker's event loop (Kafka intake, Redis
publishing, heartbeats) talks to it over a pipe.

Why a process: the engine's step is Python between PyTorch ops, and every op re-takes the
GIL, so an event-loop thread in the same process, however light, would make the engine wait
for the GIL on every op it runs.

The engine process runs at a lower CPU priority than the worker (``EngineSpec.nice``; the
worker passes ``TW_ENGINE_NICE``, 5 by default). While the engine keeps every core busy
decoding, the processes that relay its tokens then get a core as soon as they wake, instead
of waiting for an engine thread to be descheduled; the engine still gets every cycle the
rest leave idle. (The measurements behind both choices: docs/benchmarks.md.)

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
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from services.worker.engine.wire import EngineConfig, EngineRequest, EngineStats, StepOutput

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.5
# Steps of outputs the worker may hold unpublished (Redis away) before the engine pauses:
# a bounded buffer, and nothing generated is ever dropped.
MAX_BUFFERED_STEPS = 2048


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine process needs to build the engine."""

    model_dir: str
    device: str = "auto"
    dtype: str = "auto"
    quantize: str = "none"
    torch_threads: int = 0  # 0: torch's default
    nice: int = 0  # added to the niceness of the process and of every thread it starts
    config: EngineConfig = field(default_factory=EngineConfig)
    draft_model_dir: str = ""  # draft speculation's guessing model
    log_level: str = "INFO"


class EngineFailed(RuntimeError):
    """The engine process could not start, a step raised, or the process died."""


class EngineProcess:
    """The worker's handle on its engine process.

    ``start()`` blocks until the model is loaded; ``attach()`` then moves the worker's end
    of the pipe onto the running event loop. The loop writes requests and reads outputs
    itself, as it does its sockets: no thread sits between the engine and the loop, so a
    step's outputs wait for no thread switch or GIL hand-off. ``submit``, ``abort`` and
    ``stop`` are safe from any thread; ``kv_summary`` is awaited on the loop, which also
    receives every step's outputs on ``outputs``. ``stats`` is the snapshot sent with the
    latest step. When the engine fails, ``error`` is set and an empty list is put on
    ``outputs`` so that the reader wakes up. Flow control: when ``outputs`` holds
    ``max_buffered`` steps the engine pauses after its step, and it resumes once the reader
    has taken half of them (``taken``).

    The frames are ``multiprocessing.Connection``'s (a length, then a pickle), so the engine
    process keeps a plain blocking ``Connection``.
    """

    def __init__(self, spec: EngineSpec, max_buffered: int = MAX_BUFFERED_STEPS) -> None:
        self.outputs: asyncio.Queue[list[StepOutput]] = asyncio.Queue()
        self.max_buffered = max_buffered
        self.paused = False
        self.stats = EngineStats(block_size=spec.config.block_size)
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        ctx = mp.get_context("spawn")  # no inherited threads or CUDA state
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=_engine_main, args=(child, spec), name="tw-engine", daemon=True
        )
        self._child_conn: Connection | None = child
        self._transport: asyncio.Transport | None = None
        self._loop_thread: int | None = None
        self._queries: dict[int, asyncio.Future[list[int]]] = {}
        self._ids = itertools.count()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def start(self, timeout: float = 600.0) -> None:
        """Start the process and wait until its engine is built; ``EngineFailed`` if not."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process: it builds its engine while the caller goes on."""
        self._proc.start()
        assert self._child_conn is not None
        self._child_conn.close()  # so that the child's death reads as EOF here
        self._child_conn = None

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Wait until the launched process has built its engine; ``EngineFailed`` if not."""
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

    async def attach(self) -> None:
        """Serve the pipe on the running loop: outputs and query answers arrive there."""
        loop = asyncio.get_running_loop()
        self._loop, self._loop_thread = loop, threading.get_ident()
        # A socket of its own over the same pipe end (a socketpair), for the loop's transport.
        sock = socket.socket(fileno=os.dup(self._conn.fileno()))
        self._transport, _ = await loop.create_unix_connection(lambda: _Pipe(self), sock=sock)

    def submit(self, req: EngineRequest) -> None:
        self._post(("submit", req))

    def abort(self, request_id: str) -> None:
        self._post(("abort", request_id))

    def taken(self) -> None:
        """The reader took outputs: resume a paused engine once half the buffer is free."""
        if self.paused and self.outputs.qsize() <= self.max_buffered // 2:
            self.paused = False
            self._post(("resume",))
            log.info("engine resumed: its outputs are being published again")

    async def kv_summary(self, limit: int) -> list[int]:
        """The KV cache's routing summary, computed in the engine process between steps."""
        qid = next(self._ids)
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._queries[qid] = fut
        self._post(("summary", qid, limit))
        try:
            return await fut
        finally:
            self._queries.pop(qid, None)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the process to exit after the step in progress; kill it if it does not."""
        if self._stopping:
            return
        self._stopping = True
        self._post(("stop",))
        if self._proc.pid is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                log.warning("engine process did not stop in %.0f s: killing it", timeout)
                self._proc.kill()
                self._proc.join(5)
        if self._transport is not None:
            self._on_loop(self._transport.close)
        self._conn.close()

    # --- the worker's end of the pipe (no engine state here) ---------------------------
    def _post(self, msg: tuple[Any, ...]) -> None:
        """Send ``msg`` through the loop's transport (buffered, never blocking the loop);
        before ``attach`` or once the loop is gone, straight down the pipe."""
        if self._transport is not None and not self._transport.is_closing():
            payload = ForkingPickler.dumps(msg)
            if self._on_loop(self._transport.write, _frame_header(len(payload)) + payload):
                return
        if self._conn.closed:
            return
        with contextlib.suppress(OSError, ValueError):  # the process is gone
            os.set_blocking(self._conn.fileno(), True)  # the loop's socket shares the pipe
            self._conn.send(msg)

    def _on_loop(self, fn: Any, *args: Any) -> bool:
        """Run ``fn`` on the attached loop (now if this is its thread); False if the loop
        is gone."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return True
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    def _received(self, msg: tuple[Any, ...]) -> None:
        kind, *rest = msg
        if kind == "step":
            outs, self.stats = rest
            self.outputs.put_nowait(outs)
            if not self.paused and self.outputs.qsize() >= self.max_buffered:
                self.paused = True
                self._post(("pause",))
                log.warning(
                    "engine paused: %d steps of outputs wait to be published", self.max_buffered
                )
        elif kind == "summary":
            qid, hashes = rest
            fut = self._queries.get(qid)
            if fut is not None and not fut.done():
                fut.set_result(hashes)
        elif kind == "failed":
            self._fail(EngineFailed(rest[0]))

    def _closed(self) -> None:
        if not self._stopping and self.error is None:
            self._fail(EngineFailed(f"the engine process exited ({self._proc.exitcode})"))

    def _fail(self, exc: BaseException) -> None:
        log.error("%s", exc)
        self.error = exc
        self.outputs.put_nowait([])


def _frame_header(n: int) -> bytes:
    """``multiprocessing.Connection``'s length prefix for an ``n``-byte payload."""
    return struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)


class _Pipe(asyncio.BufferedProtocol):
    """Reads the engine's frames on the loop: into one growing buffer, each complete frame
    unpickled and handed to the ``EngineProcess`` as it completes."""

    def __init__(self, owner: EngineProcess) -> None:
        self._owner = owner
        self._buf = bytearray(1 << 16)
        self._end = 0  # bytes of self._buf in use

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buf) - self._end < 1 << 14:  # double it (a new one: views may remain)
            grown = bytearray(2 * len(self._buf))
            grown[: self._end] = self._buf[: self._end]
            self._buf = grown
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        view, start = memoryview(self._buf), 0
        try:
            while self._end - start >= 4:
                (n,) = struct.unpack_from("!i", view, start)
                head = 4
                if n == -1:
                    if self._end - start < 12:
                        break
                    (n,) = struct.unpack_from("!Q", view, start + 4)
                    head = 12
                if self._end - start < head + n:
                    break
                msg = pickle.loads(view[start + head : start + head + n])
                start += head + n
                self._owner._received(msg)
        finally:
            view.release()
        if start:  # keep only the incomplete frame's bytes
            self._buf[: self._end - start] = self._buf[start : self._end]
            self._end -= start

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._closed()


# --- the engine process ---------------------------------------------------------------
def _engine_main(conn: Connection, spec: EngineSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    _lower_priority(spec.nice)
    from shared.logs import setup_logging

    setup_logging("worker-engine", spec.log_level)
    try:
        engine = _build(spec)
    except Exception:
        conn.send(("failed", traceback.format_exc(limit=8)))
        return
    from services.worker.loader import freeze_loaded_objects

    engine.stats.gc_frozen_objects = freeze_loaded_objects()
    log.info("engine loaded; %d objects kept out of GC scans", engine.stats.gc_frozen_objects)
    conn.send(("ready", engine.stats))
    with contextlib.suppress(EOFError, OSError):  # the worker is gone: exit quietly
        _serve(conn, engine)


def _build(spec: EngineSpec) -> Any:
    import torch

    from services.worker.engine.engine import Engine
    from services.worker.loader import load_model

    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    model, tokenizer = load_model(spec.model_dir, spec.device, spec.dtype, spec.quantize)
    draft = None
    if spec.draft_model_dir:
        draft, draft_tokenizer = load_model(spec.draft_model_dir, spec.device, spec.dtype)
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"the draft model {spec.draft_model_dir} has another tokenizer than "
                f"{spec.model_dir}: a draft model must share the served model's tokenizer"
            )
    return Engine(model, tokenizer, spec.config, draft_model=draft)


def _serve(conn: Connection, engine: Any) -> None:
    paused = False  # the worker cannot publish outputs now: hold the engine still
    while True:
        busy = engine.has_work and not paused
        if conn.poll(0 if busy else IDLE_POLL_S):
            while True:  # everything that arrived during the step
                kind, *rest = conn.recv()
                if kind == "submit":
                    engine.add_request(rest[0])
                elif kind == "abort":
                    engine.abort(rest[0])
                elif kind == "summary":
                    conn.send(("summary", rest[0], engine.kv.summary_hashes(rest[1])))
                elif kind in ("pause", "resume"):
                    paused = kind == "pause"
                elif kind == "stop":
                    return
                if not conn.poll(0):
                    break
        if engine.has_work and not paused:
            try:
                outs = engine.step()
            except Exception:
                log.exception("engine step failed")
                conn.send(("failed", "engine step failed: " + traceback.format_exc(limit=8)))
                return
            conn.send(("step", outs, engine.stats))


def _lower_priority(increment: int) -> None:
    """Raise this process's niceness by ``increment``, for every thread it has so far
    (Linux keeps niceness per thread; those started later, PyTorch's OpenMP team among
    them, inherit it from the thread that starts them)."""
    if increment <= 0:
        return
    value = os.nice(increment)
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), value)


def _exit_with_parent() -> None:
    """Linux: get SIGKILL when the worker dies, even mid-step (EOF on the pipe covers the
    rest, between steps)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError) as exc:  # no such libc: EOF on the pipe still ends it
            log.warning("cannot ask to be killed with the worker: %s", exc)
