"""Structured JSON logs for every service: one object per line, with the service name and,
where one is known, the request id (``extra={"request_id": ...}`` or ``request_context``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import faulthandler
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import FrameType

import orjson

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Tag every log record made inside the block with ``request_id``."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, service, logger, message, request id."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "t": round(record.created, 6),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or _request_id.get()
        if rid:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


# Client libraries that log every failed try while a dependency is away (aiokafka: one
# ERROR per reconnect, fetch and heartbeat, thousands per outage). The service's own
# dependency record logs an outage once each way; these are kept, once per window.
CHATTY_LOGGERS = ("aiokafka",)
REPEAT_WINDOW_S = 30.0


class RepeatFilter(logging.Filter):
    """Lets through the first record of each kind (logger, level, message template) from
    ``loggers`` in a window of ``window_s`` seconds; the first one after the window says
    how many were held back."""

    def __init__(
        self,
        loggers: tuple[str, ...] = CHATTY_LOGGERS,
        window_s: float = REPEAT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.prefixes = tuple(p + "." for p in loggers)
        self.loggers = loggers
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # → (shown at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name not in self.loggers and not name.startswith(self.prefixes):
            return True
        key = (name, record.levelno, str(record.msg))
        now = self.clock()
        shown = self._seen.get(key)
        if shown is not None and now - shown[0] < self.window_s:
            self._seen[key] = (shown[0], shown[1] + 1)
            return False
        if shown is not None and shown[1]:
            record.msg = (
                f"{record.msg} (and {shown[1]} more like it in the last {now - shown[0]:.0f} s)"
            )
        if len(self._seen) > 1024:  # bounded: templates are few, but never grow forever
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, dump_stacks)


def route_transformers_logs() -> None:
    """transformers' warnings through the process's handlers (the service's JSON lines),
    and none of its progress bars: its own handler wrote "[transformers] ..." lines and a
    "Loading weights" bar into the services' logs. Called where a model is loaded."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()


def _await_chain(task: asyncio.Task[object]) -> list[FrameType]:
    """The frames a task waits in, outermost first: its coroutine and each one it awaits
    (``Task.print_stack`` shows the outermost only)."""
    frames = []
    step: object = task.get_coro()
    while step is not None:
        frame = next(
            (f for a in ("cr_frame", "gi_frame", "ag_frame") if (f := getattr(step, a, None))),
            None,
        )
        if frame is not None:
            frames.append(frame)
        step = next(
            (s for a in ("cr_await", "gi_yieldfrom", "ag_await") if (s := getattr(step, a, None))),
            None,
        )
    return frames


def dump_stacks(signum: int = signal.SIGUSR1, frame: object = None) -> None:
    """Write every thread's stack and, when an event loop runs, every task's await chain
    to stderr (``kill -USR1 <pid>`` on any service): what a process that will not stop or
    has stopped answering is waiting on. The process goes on as before."""
    err = sys.stderr
    err.write(f"--- stacks (signal {signum}) ---\n")
    faulthandler.dump_traceback(file=err, all_threads=True)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        tasks = asyncio.all_tasks(loop)
        err.write(f"--- {len(tasks)} asyncio tasks ---\n")
        for task in tasks:
            err.write(f"{task!r}\n")
            chain = traceback.StackSummary.extract((f, f.f_lineno) for f in _await_chain(task))
            err.write("".join(chain.format()))
    err.write("--- end of stacks ---\n")
    err.flush()
