"""Incremental detokenization and stop strings (no torch).

Text deltas never split a multi-byte character: a delta whose decoding ends in U+FFFD waits
for the next token. Text that could still turn into a stop string is held back, so a stop
string spanning tokens is cut exactly and never half-sent. The text ends right before the
first stop string, or right after it where the request keeps it (vLLM's
``include_stop_str_in_output``); text decoded past it is dropped either way.

Each token's text comes from decoding a short window of ids twice (with and without the
new ones, as vLLM and TGI do), through transformers' ``decode``: about 7 µs a token on the
tiny preset, most of it Python around the tokenizers library's Rust. Where the tokenizer
allows it, ``incremental_decoders`` gives each stream the same algorithm in Rust
(``tokenizers.decoders.DecodeStream``, about 0.7 µs), checked at load against ``decode``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

# One token's new text, or None while its bytes do not yet end a character.
Step = Callable[[int], "str | None"]


class Decoder(Protocol):
    """What the text stream needs of a tokenizer: ``decode``."""

    def decode(self, token_ids: Sequence[int], **kwargs: bool) -> str: ...


class TextStream:
    """Turns a growing list of token ids into text deltas for one request."""

    def __init__(
        self,
        decoder: Decoder,
        stop: Sequence[str] = (),
        *,
        include_stop: bool = False,
        step: Step | None = None,
    ) -> None:
        """``step``: an incremental decoder of this stream's own (``incremental_decoders``)
        that gives what ``push`` would decode, one token at a time."""
        self._decoder = decoder
        self._step = step
        self._stop = [s for s in stop if s]
        self._include_stop = include_stop
        self._ids: list[int] = []
        self._prefix_offset = 0  # ids before this are settled into _text
        self._read_offset = 0
        self._text = ""  # decoded text so far (settled part)
        self._sent = 0  # characters of _text already emitted
        self.stopped = False

    @property
    def text(self) -> str:
        """The text emitted so far."""
        return self._text[: self._sent]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=True)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text that is safe to send now. Sets ``stopped`` when a
        stop string appeared (the returned text ends right before it, or right after it
        with ``include_stop``)."""
        self._ids.extend(token_ids)
        if self._step is not None:
            try:
                for tid in token_ids:
                    if piece := self._step(tid):
                        self._text += piece
                return self._release(final=False)
            except Exception as exc:  # whatever its decoder refuses: windows from here on
                log.warning("the incremental decoder failed, decoding windows: %r", exc)
                self._step = None
                self._text = self._decode(self._ids)
                self._prefix_offset = self._read_offset = len(self._ids)
                return self._release(final=False)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release(final=False)

    def flush(self) -> str:
        """At the end: everything not sent yet (a trailing partial character included)."""
        if not self.stopped:
            self._text = self._decode(self._ids)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        if self.stopped:
            return ""
        cut = self._stop_cut() if self._stop else -1
        if cut >= 0:
            self._text = self._text[:cut]
            self.stopped = True
            end = cut
        elif final or not self._stop:
            end = len(self._text)
        else:
            end = len(self._text) - self._held_back()
        delta = self._text[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return delta

    def _stop_cut(self) -> int:
        """Where the text ends for the earliest stop string in it (-1: none). Text already
        sent holds no whole stop string, so the search starts a stop string's length back."""
        start = max(0, self._sent - max((len(s) for s in self._stop), default=0))
        found = [(i, s) for s in self._stop if (i := self._text.find(s, start)) >= 0]
        if not found:
            return -1
        # The earliest; of two starting there, the one listed first (vLLM checks in order).
        at, stop = min(found, key=lambda f: f[0])
        return at + len(stop) if self._include_stop else at

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._text)), best, -1):
                if self._text.endswith(s[:k]):
                    best = k
                    break
        return best


def incremental_decoders(tokenizer: Any, probe_tokens: int = 2048) -> Callable[[], Step] | None:
    """A maker of per-stream incremental decoders in the tokenizers library's Rust code, when
    ``tokenizer`` is a fast tokenizer whose streams they reproduce: the same text, token by
    token, as the windowed ``decode`` on a probe of every id (up to ``probe_tokens``, in a
    fixed shuffled order: multi-byte characters split across ids, special ids skipped). None
    otherwise (a slow tokenizer, a decode that cleans up spaces or is overridden to do more)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    if backend is None:
        return None

    def make() -> Step:
        stream = DecodeStream(skip_special_tokens=True)
        return lambda tid: stream.step(backend, tid)

    ids = list(range(min(len(tokenizer), probe_tokens)))
    random.Random(0).shuffle(ids)
    try:
        slow, fast = TextStream(tokenizer), TextStream(tokenizer, step=make())
        same = all(slow.push([t]) == fast.push([t]) for t in ids)
    except Exception as exc:  # whatever the tokenizer raises on the probe: windows instead
        log.info("no incremental decoder for this tokenizer: %r", exc)
        return None
    return make if same and fast._step is not None else None
