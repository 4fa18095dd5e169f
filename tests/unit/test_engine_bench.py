"""The engine benchmark's extractive prompts and how much of a passage an answer copies."""

from __future__ import annotations

from services.bench.engine_bench import _extractive_text, copied_share

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
