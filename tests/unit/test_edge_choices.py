"""``ChoiceStreams`` on scripted streams: the choices of one response read as one."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from services.edge.choices import ChoiceStreams
from services.edge.relay import EventStream


class Scripted:
    """An ``EventStream`` stand-in handing out its events one per call. ``ready``: all of
    them were in the replay log when it opened (a cache hit), so it is finished at once."""

    def __init__(self, rid: str, events: list[dict[str, Any]], *, ready: bool = False) -> None:
        self.request_id = rid
        self.events = events
        self.finished = ready
        self.final_event = events[-1] if ready else None

    async def next(self, wait_s: float) -> list[dict[str, Any]]:
        if not self.events:
            if not self.finished:
                await asyncio.sleep(wait_s)
            return []
        await asyncio.sleep(0.001)
        ev = self.events.pop(0)
        if ev.get("finish_reason"):
            self.finished, self.final_event = True, ev
        return [ev]

    def unfinished(self) -> list[str]:
        return [] if self.finished else [self.request_id]

    def close(self) -> None:
        pass


def _events(n: int, finish: str = "length", **final: Any) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = [{"seq": i, "text": f"t{i}"} for i in range(n - 1)]
    usage = {"prompt_tokens": 10, "completion_tokens": n, "cached_tokens": 8}
    return [*evs, {"seq": n - 1, "text": "end", "finish_reason": finish, "usage": usage, **final}]


async def _read_all(cs: ChoiceStreams) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    for _ in range(200):
        events = await cs.next(0.5)
        if not events and cs.finished:
            return got
        got += events
    raise AssertionError("the response never finished")


def _merged(streams: list[Scripted], prompts: list[int]) -> ChoiceStreams:
    return ChoiceStreams("r", cast(list[EventStream], streams), prompts)


async def test_every_choice_is_read_in_order_with_its_index_and_the_usage_is_summed() -> None:
    # Two prompts, two choices each; choice 3 was a cache hit (finished when opened).
    streams = [
        Scripted("r-0", _events(3)),
        Scripted("r-1", _events(2, "stop")),
        Scripted("r-2", _events(4)),
        Scripted("r-3", _events(3), ready=True),
    ]
    cs = _merged(streams, [0, 0, 1, 1])
    got = await _read_all(cs)
    for i, n in enumerate((3, 2, 4, 3)):
        assert [ev["seq"] for ev in got if ev["index"] == i] == list(range(n))
    final = cs.final_event
    assert final is not None and cs.unfinished() == []
    # Each prompt's tokens once (from its first choice); every choice's completion tokens.
    assert final["usage"] == {"prompt_tokens": 20, "cached_tokens": 16, "completion_tokens": 12}


async def test_one_failing_choice_ends_the_response_and_leaves_the_others_to_cancel() -> None:
    streams = [
        Scripted("r-0", _events(50)),
        Scripted("r-1", _events(2, "error", error={"code": "internal", "message": "x"})),
    ]
    cs = _merged(streams, [0, 0])
    await _read_all(cs)
    assert cs.final_event is not None and cs.final_event["error"]["code"] == "internal"
    assert cs.unfinished() == ["r-0"]
    cs.close()


class LosesACancel(Scripted):
    """A stream whose read loses the first cancel, as a replay-log read in Redis can
    (``shared/tasks.py``), and then waits on, never finishing."""

    def __init__(self, rid: str) -> None:
        super().__init__(rid, [])
        self.lost = 0

    async def next(self, wait_s: float) -> list[dict[str, Any]]:
        try:
            await asyncio.sleep(wait_s)
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost += 1
        return []


async def test_a_closed_response_stops_its_choices_though_a_read_loses_the_cancel() -> None:
    stream = LosesACancel("r-0")
    cs = _merged([stream], [0])
    assert await cs.next(0.05) == []  # the pump is reading
    cs.close()
    pump = cs._pumps[0]
    done, _ = await asyncio.wait({pump}, timeout=3)
    assert stream.lost == 1  # the one cancel was lost, yet the pump ended
    assert done == {pump}
