"""Stopping tasks that lose cancels (``shared.tasks.cancel_and_wait``), on plain asyncio."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared import tasks
from shared.tasks import cancel_and_wait


class Stubborn:
    """A task body that goes on after each cancel while it has cancels left to lose, as
    a library call that swallows one does; ends at the next."""

    def __init__(self, lost: float) -> None:
        self.lost = lost

    async def run(self) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if self.lost <= 0:
                    raise
                self.lost -= 1


async def test_a_task_that_loses_cancels_is_cancelled_again_until_it_ends() -> None:
    task = asyncio.create_task(Stubborn(3).run())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task, None) == set()
    assert task.cancelled()


async def test_a_task_that_never_ends_is_left_behind_after_the_bound_and_named(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "RECANCEL_S", 0.01)
    body = Stubborn(float("inf"))
    task = asyncio.create_task(body.run(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="shared.tasks"):
        assert await cancel_and_wait(task, within_s=0.1) == {task}
    assert "stubborn" in caplog.text
    body.lost = 0  # it ends at the next cancel
    assert await cancel_and_wait(task) == set()


async def test_ended_tasks_errors_are_taken_not_raised() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.create_task(fails())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    assert await cancel_and_wait(failed, done) == set()
    assert isinstance(failed.exception(), ValueError)
