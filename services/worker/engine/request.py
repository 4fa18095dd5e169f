"""One request's state inside the engine (pure: no torch, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Status(Enum):
    """Where a sequence is in its life; the ``FINISHED_*`` ones are final."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass(slots=True)
class SeqState:
    """Token-level state of a request; the scheduler and cache manager see only this.

    ``num_computed`` counts tokens whose KV is in the cache. A step processes the next
    ``n`` uncomputed tokens; when it reaches the end of the known tokens a new token is
    sampled. Decoding is the case ``n == 1``. A decoding sequence may carry ``draft``: tokens
    guessed to follow (speculation), computed in the same step and kept as far as the model
    agrees with them."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    priority: int = 0  # 0 interactive, 1 bulk: lower is served first
    arrival: int = 0
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0
    num_cached_prompt: int = 0  # prompt tokens served by the prefix cache on first admission
    num_preemptions: int = 0
    draft: list[int] = field(default_factory=list)
    # The prompt and the outputs, kept as one list as outputs are appended (read-only to
    # callers): the scheduler and the cache read it a few times a step for every sequence.
    all_ids: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.all_ids = self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.all_ids)

    def tokens(self, start: int, n: int) -> list[int]:
        """The ``n`` tokens from position ``start`` of the prompt, the outputs and then the
        draft."""
        got = self.all_ids[start : start + n]
        if len(got) < n:
            behind = max(0, start - len(self.all_ids))
            got += self.draft[behind : behind + n - len(got)]
        return got

    @property
    def num_uncomputed(self) -> int:
        return len(self.all_ids) - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_uncomputed > 1

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.arrival)

    def append_output(self, token_id: int) -> None:
        self.output_ids.append(token_id)
        self.all_ids.append(token_id)

    def drop_outputs(self, n: int) -> None:
        """Forget the last ``n`` outputs (of a finished sequence: taken past its stop)."""
        del self.output_ids[len(self.output_ids) - n :]
        del self.all_ids[len(self.all_ids) - n :]

    def finish(self, status: Status) -> None:
        if not status.finished:
            raise ValueError(f"{status} is not a finished status")
        self.status = status

    def preempt(self) -> None:
        """Drop the KV; the tokens so far are recomputed when the request is admitted again."""
        self.status = Status.PREEMPTED
        self.num_computed = 0
        self.draft = []
        self.num_preemptions += 1
