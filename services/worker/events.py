"""One request as a worker holds it (``RequestState``): its phase, where it came from, and
its stream — engine outputs turned into wire events with contiguous ``seq``, the final
event with usage, and the completion record for Kafka reply targets."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.worker.engine.request import Status
from services.worker.engine.wire import StepOutput
from services.worker.requests import Phase
from shared.messages import (
    Completion,
    ErrorInfo,
    FinishReason,
    GenerateRequest,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
)

FINISH = {
    Status.FINISHED_STOPPED: FinishReason.STOP,
    Status.FINISHED_LENGTH: FinishReason.LENGTH,
    Status.FINISHED_ABORTED: FinishReason.CANCELLED,
    Status.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass
class RequestState:
    """One request held by this worker, in one ``Phase`` (changed only by the worker's
    ``RequestTable``), with its stream as the worker writes it."""

    request: GenerateRequest
    partition: int  # where its batch came from (for commits and its dead letter)
    offset: int
    phase: Phase = Phase.RUNNING
    skip_upto: int = -1  # events up to this seq were published before (a redelivery)
    next_seq: int = 0
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    text_chars: int = 0  # characters of completion text in the events so far
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    # Outputs that arrived while CLAIMING (started before its claim answered).
    held: list[StepOutput] = field(default_factory=list)
    final: TokenEvent | None = None  # the final event, once built (published or not)
    unheard_since: float | None = None  # monotonic time since no client got its events
    cancelling: bool = False  # an abort is on its way to the engine
    # Restored from the replay log of a worker that died settling it: its completion may
    # be on the reply topic already.
    resettled: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def heard(self, listened: bool, now: float) -> None:
        """Note whether a client received the event just published."""
        if listened:
            self.unheard_since = None
        elif self.unheard_since is None:
            self.unheard_since = now

    def abandoned(self, now: float) -> bool:
        """No client has followed the stream for longer than the request's grace period
        (its edge died, and with it the cancel a disconnect would have sent)."""
        grace = self.request.reply.unfollowed_grace_s
        since = self.unheard_since
        return grace is not None and since is not None and now - since > grace

    def event(self, out: StepOutput) -> TokenEvent | None:
        """The event for one step's output, or None while there is no text to send yet
        (e.g. half of a multi-byte character); its token ids ride on the next event."""
        self.pending_ids += out.token_ids
        self.token_ids += out.token_ids
        self.text.append(out.text)
        if out.logprobs:
            self.pending_logprobs += [
                TokenLogprob(
                    token_id=t,
                    logprob=lp.logprob,
                    top=[TopLogprob(token_id=i, logprob=v) for i, v in lp.top],
                )
                for t, lp in zip(out.token_ids, out.logprobs, strict=True)
            ]
        if not out.text and out.finish is None:
            return None
        ev = TokenEvent(
            request_id=out.request_id, seq=self.next_seq, text=out.text, token_ids=self.pending_ids
        )
        if self.request.sampling.logprobs is not None:
            ev.logprobs, ev.text_offset = self.pending_logprobs, self.text_chars
            self.pending_logprobs = []
        self.text_chars += len(out.text)
        if out.finish is not None:
            ev.finish_reason = FINISH[out.finish]
            if out.error:
                ev.error = ErrorInfo(code=out.error_code, message=out.error)
            else:
                ev.usage = Usage(
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens,
                    cached_tokens=out.cached_tokens,
                )
            self.final = ev
        self.pending_ids = []
        self.next_seq += 1
        return ev if ev.seq > self.skip_upto else None

    def restore(self, events: list[TokenEvent]) -> None:
        """Take the stream from its replay log (which ends with its final event): the
        request ended on a worker that died while settling it."""
        self.text = [ev.text for ev in events]
        self.token_ids = [t for ev in events for t in ev.token_ids]
        self.final = events[-1]
        self.skip_upto = self.final.seq
        self.next_seq = self.final.seq + 1
        self.resettled = True

    def completion(self, final: TokenEvent, worker_id: str) -> Completion:
        return Completion(
            request_id=self.request.request_id,
            tenant=self.request.tenant,
            text="".join(self.text),
            token_ids=self.token_ids,
            finish_reason=final.finish_reason or FinishReason.ERROR,
            usage=final.usage,
            error=final.error,
            created_at=self.request.created_at,
            worker_id=worker_id,
        )
