"""Steps the engine on the process's main thread, while the worker's event loop (Kafka
intake, Redis publishing) runs on a helper thread.

Why this way round: PyTorch's CPU kernels run on an OpenMP team that belongs to the thread
that calls them. The model is loaded (and its first ops run) on the main thread; stepping
it from a second thread makes a second team, and the two contend for the cores. Measured on
2 cores with the ``small`` preset at 32 streams: decode steps took 39 ms from a helper
thread against 31 ms on the loading thread, and the engine made 0.8x the tokens/s.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from services.worker.engine.engine import Engine, EngineRequest, StepOutput

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineLoop:
    """Steps the engine while it has work and hands each step's outputs to an event loop.

    ``run()`` blocks the calling thread (the one that loaded the model); ``submit``,
    ``abort``, ``call``, ``attach`` and ``stop`` are safe from any thread. The engine's
    state (scheduler, KV cache) is touched only by ``run``'s thread: other threads read it
    through ``call``.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.outputs: asyncio.Queue[list[StepOutput]] = asyncio.Queue()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._runner: threading.Thread | None = None
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver outputs to ``loop`` (the loop that reads ``outputs``)."""
        self._loop = loop

    def submit(self, req: EngineRequest) -> None:
        self.engine.add_request(req)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine's thread between two steps; its result comes back in
        the future (``asyncio.wrap_future`` awaits it)."""
        fut: Future[T] = Future()
        self._calls.put((fn, fut))
        self._wake.set()
        return fut

    def _run_calls(self) -> None:
        while not self._calls.empty():
            fn, fut = self._calls.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except Exception as exc:
                    fut.set_exception(exc)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask ``run()`` to return and wait (bounded) until the step in progress ends."""
        self._stop.set()
        self._wake.set()
        if not self._stopped.is_set() and threading.current_thread() is not self._runner:
            self._stopped.wait(timeout)

    def run(self) -> None:
        self._runner = threading.current_thread()
        try:
            while not self._stop.is_set():
                self._run_calls()
                if not self.engine.has_work or self._loop is None:
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                try:
                    outs = self.engine.step()
                except Exception as exc:  # surfaced to the service, which stops the worker
                    log.exception("engine step failed")
                    self.error = exc
                    self._deliver([])
                    return
                if outs:
                    self._deliver(outs)
        finally:
            self._stopped.set()

    def _deliver(self, outs: list[StepOutput]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self.outputs.put_nowait, outs)
        except RuntimeError:  # the loop closed meanwhile: the service is gone
            pass
