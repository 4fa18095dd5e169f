"""Structured logs: a client library's per-retry errors during an outage are kept once per
window, with a count of what was held back; the service's own lines are never held. A
service asked with SIGUSR1 writes what every thread and task waits on, and goes on."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from shared.logs import RepeatFilter
from tests.conftest import ROOT


def record(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_flood_of_client_library_errors_is_one_line_per_window() -> None:
    now = [0.0]
    f = RepeatFilter(("aiokafka",), window_s=30, clock=lambda: now[0])
    template = "Unable connect to node with id %s: %s"
    shown = []
    for i in range(1000):  # an outage: one error per reconnect, every 30 ms
        now[0] = i * 0.03
        r = record("aiokafka", template, 1, "Connection refused")
        if f.filter(r):
            shown.append(r.getMessage())
    assert len(shown) == 1  # 30 s of the same error
    now[0] = 31.0
    r = record("aiokafka", template, 1, "Connection refused")
    assert f.filter(r)
    assert r.getMessage().endswith("(and 999 more like it in the last 31 s)")
    # Another kind of message, or another logger of the library, has its own window.
    assert f.filter(record("aiokafka.consumer.fetcher", "Failed fetch messages from %s", 1))
    assert f.filter(record("aiokafka", template, 1, "x", level=logging.WARNING))


def test_the_services_own_lines_are_never_held() -> None:
    f = RepeatFilter(("aiokafka",), window_s=30, clock=lambda: 0.0)
    for name in ("services.worker.service", "aiokafkaesque", "shared.retry"):
        assert all(f.filter(record(name, "kafka is unreachable (%r)", "x")) for _ in range(5))


STUCK = textwrap.dedent(
    """
    import asyncio
    from shared.logs import setup_logging

    async def waits_on_a_lock_nobody_releases(lock):
        async with lock:
            pass

    async def loops_over_a_step(lock):
        while True:
            await waits_on_a_lock_nobody_releases(lock)

    async def main():
        setup_logging("probe")
        lock = asyncio.Lock()
        await lock.acquire()
        task = asyncio.create_task(loops_over_a_step(lock))
        await asyncio.sleep(0.05)  # the task waits on the lock now
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_sigusr1_writes_every_tasks_await_chain_and_the_process_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "stuck.py"  # a file, so the stacks show its source lines
    script.write_text(STUCK)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)
        dump = []
        for line in proc.stderr:
            dump.append(line)
            if line.startswith("--- end of stacks"):
                break
        text = "".join(dump)
        assert "Current thread" in text or "Thread 0x" in text, text  # the threads' stacks
        assert "await waits_on_a_lock_nobody_releases(lock)" in text, text  # the stuck task
        assert "async with lock" in text, text  # ... down to the line it waits on
        assert proc.poll() is None  # still running
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_process_logs_json_lines_only_to_its_exit(model_dir: str) -> None:
    # transformers wrote its own "Loading weights" progress bar and "[transformers] ..."
    # warnings into the worker's JSON log, and what the engine process froze out of GC
    # scans outlived the interpreter's last collection: a cycle's finaliser never ran, and
    # triton's nanobind bindings (torch's CUDA build imports triton) ended every worker's
    # log with ~40 lines of "nanobind: leaked".
    script = textwrap.dedent(
        """
        import logging, os, sys
        from shared.logs import setup_logging
        from services.worker.loader import freeze_loaded_objects, load_model
        class Cycle:
            def __del__(self):
                os.write(1, b"finalised")
        c = Cycle(); c.me = c
        setup_logging("worker")
        load_model(sys.argv[1])
        logging.getLogger("transformers").warning("a library warning")
        freeze_loaded_objects()
        del c
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, model_dir],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "finalised"
    lines = done.stderr.splitlines()
    assert all(line.startswith('{"t":') for line in lines), done.stderr
    assert any('"msg":"a library warning"' in line for line in lines), done.stderr
