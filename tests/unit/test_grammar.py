"""The grammar cache and the batched token mask, on a small hand-written vocabulary (no
model): compiled once per canonical structure, least recently used evicted, bad specs
refused; the mask of the constrained rows equals each matcher's own, other rows untouched."""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr

from services.worker.engine.grammar import (
    Constraint,
    GrammarCache,
    GrammarError,
    apply_constraints,
    canonical_key,
    grammar_of,
)

VOCAB = ["<eos>", "{", "}", '"', "a", "b", ":", ", ", ": ", "1", "2", "x", "ab", '{"a": ', "[", "]"]
EOS = 0


@pytest.fixture
def cache() -> GrammarCache:
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return GrammarCache(info, capacity=2)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_one_compile_per_canonical_schema(cache: GrammarCache) -> None:
    first = cache.get("json_schema", json.dumps(SCHEMA))
    again = cache.get("json_schema", json.dumps(SCHEMA, indent=4))
    assert again is first
    assert (cache.hits, cache.misses) == (1, 1)
    assert canonical_key("json_schema", " { } ") == ("json_schema", "{}")
    # Key order orders the output: another order is another grammar.
    two = {"type": "object", "properties": {"a": {}, "b": {}}}
    swapped = {"type": "object", "properties": {"b": {}, "a": {}}}
    assert canonical_key("json_schema", json.dumps(two)) != canonical_key(
        "json_schema", json.dumps(swapped)
    )


def test_least_recently_used_is_evicted(cache: GrammarCache) -> None:
    a = cache.get("regex", "a+")
    cache.get("regex", "b+")
    assert cache.get("regex", "a+") is a  # a is now the most recent
    cache.get("regex", "(ab)+")  # evicts b+
    assert len(cache) == 2
    misses = cache.misses
    assert cache.get("regex", "a+") is a
    cache.get("regex", "b+")
    assert cache.misses == misses + 1


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("json_schema", '{"type": "frob"}'),
        ("json_schema", "{not json"),
        ("json_schema", "[1, 2]"),
        ("regex", "(unclosed"),
        ("ebnf", "root ::= missing_rule"),
        ("yaml", "a: 1"),
    ],
)
def test_bad_structures_are_refused(cache: GrammarCache, kind: str, spec: str) -> None:
    with pytest.raises(GrammarError) as info:
        cache.get(kind, spec)
    assert ".cc:" not in str(info.value)
    with pytest.raises(GrammarError):
        grammar_of(kind, spec)
    assert len(cache) == 0


def _allowed(logits_row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits_row).nonzero().flatten().tolist())


def test_batched_mask_equals_each_matchers_own_and_leaves_other_rows(
    cache: GrammarCache,
) -> None:
    vocab = len(VOCAB)
    torch.manual_seed(0)
    logits = torch.randn(5, vocab)
    before = logits.clone()
    obj = Constraint(cache.get("json_schema", json.dumps(SCHEMA)), [EOS])
    regex = Constraint(cache.get("regex", "(ab)+x"), [EOS])
    assert regex.accept(VOCAB.index("ab"))
    apply_constraints(logits, [(1, obj), (3, regex)])
    for row in (0, 2, 4):
        assert torch.equal(logits[row], before[row])
    for row, c in ((1, obj), (3, regex)):
        own = xgr.allocate_token_bitmask(1, vocab)
        c.matcher.fill_next_token_bitmask(own)
        expected = before[row : row + 1].clone()
        xgr.apply_token_bitmask_inplace(expected, own)
        assert torch.equal(logits[row], expected[0])
        finite = logits[row].isfinite()
        assert torch.equal(logits[row][finite], before[row][finite])
    assert _allowed(logits[1]) == {VOCAB.index("{"), VOCAB.index('{"a": ')}
    assert _allowed(logits[3]) == {VOCAB.index("a"), VOCAB.index("x"), VOCAB.index("ab")}


def test_no_constrained_rows_leaves_logits_alone() -> None:
    logits = torch.randn(3, 8)
    before = logits.clone()
    apply_constraints(logits, [])
    assert torch.equal(logits, before)


def test_constraint_allows_the_stop_token_only_once_complete(cache: GrammarCache) -> None:
    c = Constraint(cache.get("regex", "ab"), [EOS])
    logits = torch.zeros(1, len(VOCAB))
    apply_constraints(logits, [(0, c)])
    assert EOS not in _allowed(logits[0])
    assert c.accept(VOCAB.index("ab"))
    logits = torch.zeros(1, len(VOCAB))
    apply_constraints(logits, [(0, c)])
    assert _allowed(logits[0]) == {EOS}
    assert not c.terminated
    assert c.accept(EOS)
    assert c.terminated


def test_without_stop_tokens_a_complete_grammar_terminates_itself(cache: GrammarCache) -> None:
    c = Constraint(cache.get("regex", "ab"), [])
    assert not c.accept(VOCAB.index("x"))
    assert c.accept(VOCAB.index("ab"))
    assert c.terminated
