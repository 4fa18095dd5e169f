"""Runs the engine on its own thread, so Kafka and Redis I/O never wait on a forward pass."""

from __future__ import annotations

import asyncio
import logging
import threading

from services.worker.engine.engine import Engine, EngineRequest, StepOutput

log = logging.getLogger(__name__)


class EngineThread:
    """Steps the engine while it has work; hands each step's outputs to the event loop."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self._loop = loop
        self.outputs: asyncio.Queue[list[StepOutput]] = asyncio.Queue()
        self._wake = threading.Event()
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, req: EngineRequest) -> None:
        self.engine.add_request(req)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop:
            if not self.engine.has_work:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                outs = self.engine.step()
            except Exception as exc:  # surfaced to the service, which stops the worker
                log.exception("engine step failed")
                self.error = exc
                self._loop.call_soon_threadsafe(self.outputs.put_nowait, [])
                return
            if outs:
                self._loop.call_soon_threadsafe(self.outputs.put_nowait, outs)
