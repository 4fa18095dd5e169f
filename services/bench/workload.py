"""The end-to-end benchmark's workload: shared system prompts, prompt and output lengths,
interactive/bulk priorities, drawn deterministically for a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

WORDS = (
    "return the value of each key in the mapping when it is not none and raise an error if the "
    "argument is a list of strings or a path to a file that does not exist yet while the module "
    "keeps a cache of results for later calls"
).split()


@dataclass
class Workload:
    """The shape of an end-to-end run's requests: shared system prompts, prompt and output lengths, bulk share."""

    shared_prefix_share: float = 0.5  # share of requests that start with a shared system prompt
    system_prompts: int = 4
    system_words: int = 120
    prompt_words: tuple[int, int] = (8, 64)
    output_tokens: tuple[int, int] = (32, 256)  # chat-like: answers longer than questions
    bulk_share: float = 0.1
    seed: int = 0


class Mix:
    """Draws requests from the workload (deterministic for a seed)."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.rng = random.Random(w.seed)
        self.systems = [
            " ".join(self.rng.choices(WORDS, k=w.system_words)) for _ in range(w.system_prompts)
        ]

    def body(self) -> dict[str, Any]:
        words = " ".join(self.rng.choices(WORDS, k=self.rng.randint(*self.w.prompt_words)))
        if self.rng.random() < self.w.shared_prefix_share:
            words = self.rng.choice(self.systems) + "\n" + words
        return {
            "prompt": words,
            "max_tokens": self.rng.randint(*self.w.output_tokens),
            "temperature": 0,
            "ignore_eos": True,
            "priority": "bulk" if self.rng.random() < self.w.bulk_share else "interactive",
        }
