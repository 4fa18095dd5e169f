"""The streams of a response with several choices (``n`` > 1, or a list of prompts), read
as one: each choice is a request of its own with its own stream, and ``ChoiceStreams``
hands on their events in arrival order, each tagged with its choice's ``index``.

It reads like an ``EventStream`` (``next``, ``finished``, ``final_event``, ``unfinished``,
``close``), so the relays serve it unchanged. It finishes when every choice has, or when
one fails or is cancelled: the response then ends that way, and the choices still running
are ``unfinished()`` for the relay to cancel. The final event carries the usage of the whole response: each
prompt's tokens once (its choices share its prefill), every choice's completion tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.edge.relay import Event, EventStream
from services.edge.shapes import ends_badly

PUMP_WAIT_S = 1.0


class ChoiceStreams:
    def __init__(self, request_id: str, streams: list[EventStream], prompts: list[int]) -> None:
        """``streams[i]`` is choice ``i``'s; ``prompts[i]`` the prompt it answers."""
        self.request_id = request_id
        self.streams = streams
        self.prompts = prompts
        self.finished = False
        self.final_event: Event | None = None
        self._finals: dict[int, Event] = {}
        self._queue: asyncio.Queue[list[Event]] = asyncio.Queue()
        self._pumps: list[asyncio.Task[None]] = []
        self._closed = False

    def _start(self) -> None:
        if not self._pumps:
            self._pumps = [
                asyncio.create_task(self._pump(i, s), name=f"choice-{i}")
                for i, s in enumerate(self.streams)
            ]

    async def _pump(self, index: int, stream: EventStream) -> None:
        # A stream can be finished with events still to take (a cache hit's are all in
        # its log when it opens): it is read until it returns none. A closed response's
        # pump ends at its next read even when that read lost the close's cancel (a Redis
        # call can): a closed stream is never fed again, and it would read on for ever.
        while not self._closed:
            events = await stream.next(PUMP_WAIT_S)
            if events:
                self._queue.put_nowait([{**ev, "index": index} for ev in events])
            elif stream.finished:
                return

    async def next(self, wait_s: float) -> list[Event]:
        """The next events of any choice (each with its ``index``), or ``[]`` when none
        came within ``wait_s`` seconds or the response has finished."""
        if self.finished:
            return []
        self._start()
        try:
            batch = await asyncio.wait_for(self._queue.get(), wait_s)
        except TimeoutError:
            return []
        out: list[Event] = []
        while True:
            for ev in batch:
                if self._take(ev, out):
                    return out
            if self._queue.empty():
                return out
            batch = self._queue.get_nowait()

    def _take(self, ev: Event, out: list[Event]) -> bool:
        """Hand ``ev`` on; True when the response has finished with it."""
        out.append(ev)
        if ev.get("finish_reason") is None:
            return False
        self._finals[ev["index"]] = ev
        if ends_badly(ev):
            self.finished, self.final_event = True, ev
        elif len(self._finals) == len(self.streams):
            self.finished, self.final_event = True, self._summary(ev)
        return self.finished

    def _summary(self, last: Event) -> Event:
        """The last choice's final event with the whole response's usage."""
        usages = {i: ev.get("usage") or {} for i, ev in self._finals.items()}
        first_of: dict[int, int] = {}
        for i, prompt in enumerate(self.prompts):
            first_of.setdefault(prompt, i)
        usage: dict[str, Any] = {
            "prompt_tokens": sum(usages[i].get("prompt_tokens", 0) for i in first_of.values()),
            "cached_tokens": sum(usages[i].get("cached_tokens", 0) for i in first_of.values()),
            "completion_tokens": sum(u.get("completion_tokens", 0) for u in usages.values()),
        }
        return {**last, "usage": usage}

    def unfinished(self) -> list[str]:
        """The request ids of the choices not yet finished."""
        return [s.request_id for i, s in enumerate(self.streams) if i not in self._finals]

    def close(self) -> None:
        self._closed = True
        for task in self._pumps:
            task.cancel()
        for stream in self.streams:
            stream.close()
