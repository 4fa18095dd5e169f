"""Draft-model speculation: a smaller model with the target's tokenizer guesses the next
tokens of the requests that speculate, greedily, in one batched pass per draft position.

The draft keeps its own paged KV (a ``ModelRunner`` over a pool of its own) for every
request it drafts for. Each step it first catches up on what the request gained since its
last guess (the draft tokens the target kept, then the target's own token), then guesses.
Nothing needs undoing when the target rejects a guess: the KV of the rejected positions is
simply written over by the next catch-up, which starts at the first token that differs.
The target verifies every guess as it does an n-gram one (``Engine._pick``), so a draft
only decides how many tokens a step keeps, never which."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import torch

from services.worker.engine.model_runner import MAX_VERIFY_TOKENS, ModelRunner, RunItem


class DraftUnsupported(ValueError):
    """A model that cannot draft for the target (another vocabulary, sliding windows)."""


@dataclass(slots=True)
class _Drafting:
    """One request's state in the draft: the tokens whose KV its blocks hold."""

    key: int  # its rows' name in the runner (a fresh one per admission)
    ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DraftWant:
    """A request to draft for this step: all its tokens so far and how many to guess."""

    request_id: str
    tokens: Sequence[int]
    room: int


class DraftModel:
    """Greedy guesses from ``model`` over a pool of ``kv_tokens`` tokens of its KV."""

    def __init__(self, model: Any, *, vocab_size: int, block_size: int, kv_tokens: int) -> None:
        draft_vocab = int(model.get_input_embeddings().num_embeddings)
        if draft_vocab != vocab_size:
            raise DraftUnsupported(
                f"the draft model's vocabulary has {draft_vocab} tokens, the target's "
                f"{vocab_size}: a draft model must share the target's tokenizer"
            )
        self.runner = ModelRunner(model, max(1, -(-kv_tokens // block_size)), block_size)
        if len(self.runner.group_windows) > 1 or self.runner.group_windows[0] is not None:
            raise DraftUnsupported("a draft model with sliding-window layers is not supported")
        self.block_size = block_size
        self.context = self.runner.layout.context
        self._free = list(range(self.runner.num_blocks - 1, -1, -1))
        self._seqs: dict[str, _Drafting] = {}
        self._keys = count()

    def propose(self, wants: Sequence[DraftWant]) -> dict[str, list[int]]:
        """Up to ``room`` greedy tokens for each want that fits the draft's pool and
        context; a forward pass that raises drops every request's draft state (they
        catch up from their start next time) and propagates."""
        rows = [w for w in wants if self._fits(w, {x.request_id for x in wants})]
        if not rows:
            return {}
        try:
            return self._guess(rows)
        except Exception:
            self.reset()
            raise

    def retain(self, request_ids: Iterable[str]) -> None:
        """Free the state of every request not in ``request_ids`` (finished, aborted)."""
        keep = set(request_ids)
        for rid in [r for r in self._seqs if r not in keep]:
            self._drop(rid)

    def release(self, request_id: str) -> None:
        """Free a finished request's state now (its blocks would otherwise wait for the
        next step's :meth:`retain`, which an idle engine never takes)."""
        if request_id in self._seqs:
            self._drop(request_id)

    def reset(self) -> None:
        for rid in list(self._seqs):
            self._drop(rid)
        self.runner.forget_rows()

    @property
    def used_blocks(self) -> int:
        return self.runner.num_blocks - len(self._free)

    # --- internals ---------------------------------------------------------------------------
    def _fits(self, want: DraftWant, wanted: set[str]) -> bool:
        """Give ``want`` blocks for its tokens and guesses, taking them from requests that
        do not draft this step when the pool is short; False when it cannot have them."""
        size = len(want.tokens) + want.room - 1  # the last guess's KV is never written
        if size > self.context:
            return False
        st = self._seqs.get(want.request_id)
        if st is None:
            st = self._seqs[want.request_id] = _Drafting(next(self._keys))
        need = -(-size // self.block_size) - len(st.blocks)
        idle = (r for r in list(self._seqs) if r not in wanted)
        while need > len(self._free):
            victim = next(idle, None)
            if victim is None:
                self._drop(want.request_id)
                return False
            self._drop(victim)
        for _ in range(need):
            st.blocks.append(self._free.pop())
        return True

    def _drop(self, request_id: str) -> None:
        st = self._seqs.pop(request_id)
        self._free.extend(reversed(st.blocks))

    def _guess(self, wants: list[DraftWant]) -> dict[str, list[int]]:
        states = [self._seqs[w.request_id] for w in wants]
        items = []
        for w, st in zip(wants, states, strict=True):
            start = min(_common_prefix(st.ids, w.tokens), len(w.tokens) - 1)
            items.append(RunItem(w.tokens[start:], start, st.blocks, st.key))
        # A row with more to catch up on than a verification pass takes (the request is
        # new here) runs it first, all but its last token. Then the first guessing pass
        # brings each row's tokens gained since its last guess (several where the target
        # kept every guess): over the decode slots, as the target's verification, the
        # last position's logits giving the first guess. Later passes are one-token decodes.
        behind = [i for i, it in enumerate(items) if len(it.token_ids) > MAX_VERIFY_TOKENS]
        if behind:
            self.runner.forward(
                [
                    RunItem(it.token_ids[:-1], it.start, it.block_ids, it.row_key)
                    for it in (items[i] for i in behind)
                ]
            )
            for i in behind:
                it = items[i]
                items[i] = RunItem(
                    it.token_ids[-1:], it.start + len(it.token_ids) - 1, it.block_ids, it.row_key
                )
        out: dict[str, list[int]] = {w.request_id: [] for w in wants}
        live = list(range(len(wants)))
        while live:
            batch = [items[i] for i in live]
            if any(len(it.token_ids) > 1 for it in batch):
                every = self.runner.forward(batch, every_position=True)
                last = torch.tensor([len(it.token_ids) - 1 for it in batch], device=every.device)
                logits = every[torch.arange(len(batch), device=every.device), last]
            else:
                logits = self.runner.forward(batch)
            picks = logits.argmax(dim=-1).tolist()
            nxt = []
            for i, tok in zip(live, picks, strict=True):
                w, guesses = wants[i], out[wants[i].request_id]
                guesses.append(tok)
                if len(guesses) < w.room:
                    it = items[i]
                    items[i] = RunItem(
                        [tok], it.start + len(it.token_ids), it.block_ids, it.row_key
                    )
                    nxt.append(i)
            live = nxt
        for w, st in zip(wants, states, strict=True):
            st.ids = [*w.tokens, *out[w.request_id][:-1]]
        return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of ``a`` and ``b``. A request's tokens only grow, and
    the draft state holds its tokens of the last step plus that step's guesses: the scan
    starts near the end, where they can first differ."""
    n = min(len(a), len(b))
    i = n
    # Whole-tail equality in C first; the guesses of one step are few.
    while i > 0 and a[:i] != b[:i]:
        i = max(0, i - 16)
    while i < n and a[i] == b[i]:
        i += 1
    return i
