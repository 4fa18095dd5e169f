"""Grammar-constrained decoding with xgrammar (as vLLM and SGLang use it).

A request's ``Structure`` (JSON object, JSON schema, regex or EBNF) compiles once per
distinct spec against the model's vocabulary and is kept in an LRU; each constrained
request gets its own matcher, advanced with every token it accepts. In a decode step the
matchers of all constrained rows fill one token bitmask together and one call applies it
to the logits; rows without a grammar are not touched.

JSON is generated compactly (``", "`` and ``": "`` between items, no free whitespace):
a small model given free whitespace can emit it forever, and a fixed layout lets the edge
read a tool call's name before its arguments are complete.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import xgrammar as xgr

STRUCTURE_KINDS = ("json_object", "json_schema", "regex", "ebnf")


class GrammarError(ValueError):
    """A structure xgrammar cannot compile (the request's fault)."""


def grammar_of(kind: str, spec: str) -> xgr.Grammar:
    """The tokenizer-independent grammar of a structure; ``GrammarError`` if it has none.
    Cheap (milliseconds): the edge calls it to refuse a bad schema with a 400."""
    try:
        if kind == "json_object":
            return xgr.Grammar.from_json_schema(
                {"type": "object"}, any_whitespace=False, strict_mode=False
            )
        if kind == "json_schema":
            schema = json.loads(spec)
            if not isinstance(schema, dict):
                raise GrammarError("a JSON schema must be an object")
            return xgr.Grammar.from_json_schema(schema, any_whitespace=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec)
        if kind == "ebnf":
            return xgr.Grammar.from_ebnf(spec)
    except (RuntimeError, ValueError, RecursionError) as exc:
        if isinstance(exc, GrammarError):
            raise
        raise GrammarError(_reason(exc)) from None
    raise GrammarError(f"unknown structure kind {kind!r}")


def _reason(exc: BaseException) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    _, sep, rest = text.partition("] ")
    text = rest if sep and text.startswith("[") else text
    if ".cc:" in text:
        text = text.split(": ", 1)[-1]
    return text[:500]


def canonical_key(kind: str, spec: str) -> tuple[str, str]:
    """The cache key of a structure: JSON specs re-serialized compactly, so layout and
    whitespace do not split the cache (key order is kept: it orders the output)."""
    if kind == "json_schema":
        try:
            spec = json.dumps(json.loads(spec), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            pass  # compiling it reports the problem
    if kind == "json_object":
        spec = ""
    return kind, spec


@dataclass
class GrammarCache:
    """Compiled grammars by canonical structure, least recently used evicted first."""

    tokenizer_info: xgr.TokenizerInfo
    capacity: int = 256
    hits: int = 0
    misses: int = 0
    _compiled: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = field(
        default_factory=OrderedDict
    )
    _compiler: Any = None

    def __post_init__(self) -> None:
        # xgrammar's own cache is keyed by the raw spec: this one replaces it.
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=1, cache_enabled=False
        )

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int, capacity: int = 256) -> GrammarCache:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        return cls(info, capacity)

    def __len__(self) -> int:
        return len(self._compiled)

    def get(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        """The compiled grammar of a structure (compiled on first use); ``GrammarError``
        if it does not compile."""
        key = canonical_key(kind, spec)
        found = self._compiled.get(key)
        if found is not None:
            self.hits += 1
            self._compiled.move_to_end(key)
            return found
        self.misses += 1
        grammar = grammar_of(kind, spec)
        try:
            compiled = self._compiler.compile_grammar(grammar)
        except RuntimeError as exc:
            raise GrammarError(_reason(exc)) from None
        self._compiled[key] = compiled
        while len(self._compiled) > self.capacity:
            self._compiled.popitem(last=False)
        return compiled


class Constraint:
    """One request's position in its grammar. It stops on ``stop_ids`` once the grammar
    is complete; with none (``ignore_eos``), it terminates on completion by itself."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: Collection[int]) -> None:
        stops = sorted(stop_ids)
        self.matcher = xgr.GrammarMatcher(
            compiled,
            override_stop_tokens=stops or None,
            terminate_without_stop_token=not stops,
        )

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False if the grammar does not allow it."""
        return bool(self.matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        """Whether the grammar is complete and nothing more may follow."""
        return bool(self.matcher.is_terminated())


_BATCH = xgr.BatchGrammarMatcher(max_threads=1)


def apply_constraints(logits: torch.Tensor, rows: Sequence[tuple[int, Constraint]]) -> None:
    """Mask, in place, every token the grammar of each listed row forbids: the matchers
    fill one bitmask (rows without a grammar stay all-allowed) and one call applies it
    to the listed rows of ``logits``."""
    if not rows:
        return
    batch, vocab = logits.shape
    bitmask = xgr.allocate_token_bitmask(batch, vocab)
    indices = [i for i, _ in rows]
    _BATCH.batch_fill_next_token_bitmask([c.matcher for _, c in rows], bitmask, indices)
    xgr.apply_token_bitmask_inplace(
        logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab, indices=indices
    )
