"""``tokenwire bulk submit IN.jsonl OUT.jsonl``: stream an OpenAI batch file through Kafka.

Lines are read lazily and at most ``max_in_flight`` requests are outstanding, so memory
stays bounded on a file of any size. Results are appended to OUT as they finish, in any
order, keyed by ``custom_id``; rerunning skips every ``custom_id`` already in OUT. A line
that fails validation becomes an error line in OUT, never a crash, and a Kafka outage is
waited out (``Producer.submit`` sends again until the broker takes the request).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from services.bulk.batch_file import BadLine, Job, done_ids, error_line, parse_line, result_line
from shared.producer import Producer
from shared.settings import CommonSettings

# Requests outstanding at once: enough to keep the workers' bulk slots full, few enough
# that the batchers' queues (and the edges' admission, which sheds above a queue limit)
# never fill with one job's lines.
MAX_IN_FLIGHT = 256


@dataclass
class BulkStats:
    """Progress of one bulk run: lines read, skipped (already done), submitted, written, failed."""

    total: int = 0
    skipped: int = 0
    submitted: int = 0
    written: int = 0
    errors: int = 0


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield lineno, line


async def submit_file(
    settings: CommonSettings,
    src: Path,
    out: Path,
    *,
    tenant: str = "bulk",
    max_in_flight: int = MAX_IN_FLIGHT,
    progress: bool = True,
) -> BulkStats:
    stats = BulkStats(total=sum(1 for _ in _lines(src)))
    done = done_ids(out)
    pending: dict[str, Job] = {}
    slots = asyncio.Semaphore(max_in_flight)
    bar = tqdm(total=stats.total, unit="req", disable=not progress, smoothing=0.05)
    with out.open("ab") as sink:
        async with Producer(settings, client_id="tw-bulk") as producer:
            reader = asyncio.create_task(_collect(producer, pending, slots, sink, stats, bar))
            try:
                for lineno, line in _lines(src):
                    item = parse_line(line, lineno, tenant, producer.replies)
                    cid = item.custom_id
                    if cid in done:
                        stats.skipped += 1
                        bar.update(1)
                        continue
                    done.add(cid)  # a custom_id repeated in the input is served once
                    if isinstance(item, BadLine):
                        _write(
                            sink, error_line(cid, item.code, item.message), stats, bar, error=True
                        )
                        continue
                    await slots.acquire()
                    pending[item.request.request_id] = item
                    await producer.submit(item.request)
                    stats.submitted += 1
                while pending:
                    if reader.done():
                        reader.result()  # surfaces the reader's failure
                    await asyncio.sleep(0.05)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                bar.close()
    return stats


async def _collect(
    producer: Producer,
    pending: dict[str, Job],
    slots: asyncio.Semaphore,
    sink: BinaryIO,
    stats: BulkStats,
    bar: tqdm,
) -> None:
    async for c in producer.completions():
        job = pending.pop(c.request_id, None)
        if job is None:
            continue  # someone else's request, or a duplicate
        _write(sink, result_line(job, c), stats, bar, error=c.error is not None)
        slots.release()


def _write(sink: BinaryIO, line: bytes, stats: BulkStats, bar: tqdm, *, error: bool) -> None:
    sink.write(line + b"\n")
    sink.flush()
    stats.written += 1
    stats.errors += int(error)
    bar.update(1)
