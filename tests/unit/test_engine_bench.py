"""The engine benchmark's extractive prompts, how much of a passage an answer copies, and
the split of a decode step's time."""

from __future__ import annotations

import random
from typing import Any

from services.bench.engine_bench import (
    _extractive_text,
    _prompts,
    copied_share,
    decode_step_split,
    quoted_share,
)
from services.worker.engine.wire import EngineConfig

PASSAGE = "Handlers and loggers are initialized with NOTSET so that they will log all messages"


def test_the_prompt_starts_the_copy_at_a_word_boundary() -> None:
    prompt = _extractive_text(PASSAGE)
    assert prompt.startswith("Repeat the following text exactly.\nText: " + PASSAGE + "\n")
    assert prompt.endswith("\nRepeated: Handlers and loggers are initialized with NOTSET")


def test_the_copied_share_counts_up_to_the_first_departure() -> None:
    rest = " so that they will log all messages"
    assert copied_share(rest, rest) == 1.0
    assert copied_share(" so that they will", rest) == 1.0  # all of a shorter answer
    assert copied_share(" so that it", rest) == len(" so that ") / len(" so that it")
    assert copied_share(" so that they will log all messages, and more", rest) == 1.0
    assert copied_share("\nthe list is the string", rest) == 0.0
    assert copied_share("", rest) == 0.0


def test_the_quoted_share_counts_words_that_go_on_a_run_of_the_passage() -> None:
    assert quoted_share(PASSAGE, PASSAGE) == 1.0
    # Skips and starts again still quote; a run of the answer's own does not.
    skipped = "Handlers and loggers so that they will log all messages"
    assert quoted_share(skipped, PASSAGE) == 6 / 8  # "loggers so that", "and loggers so" not
    again = "they will log all Handlers and loggers are"
    assert quoted_share(again, PASSAGE) == 4 / 6
    assert quoted_share("the list is the string of the list is the string", PASSAGE) == 0.0
    assert quoted_share("they will", PASSAGE) == 0.0  # fewer words than a run
    assert quoted_share("", PASSAGE) == 0.0


def test_a_decode_step_splits_into_the_runners_pass_and_the_models_idle_time(
    lm: tuple[Any, Any],
) -> None:
    model, tok = lm
    prompts = _prompts(8, 24, model.config.vocab_size, random.Random(0))
    for overlap in (True, False):
        config = EngineConfig(kv_budget_tokens=2048, overlap=overlap)
        split = decode_step_split(model, tok, prompts, config, steps=6)
        assert (split["rows"], split["steps"]) == (8, 6)
        assert 0 < split["pass_ms"] < split["step_ms"]
        assert 0 < split["idle_ms"] < split["step_ms"]
