"""The response caches' pure parts: which requests may be cached, what their exact key
covers, the guard a semantic hit must pass, and a stored entry's replay."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from shared.cache.guard import disagreement
from shared.cache.keys import (
    context_digest,
    exact_digest,
    model_identity,
    reproducible,
    sampling_class,
)
from shared.cache.store import entry_of, replay_events, storable
from shared.messages import (
    CacheMode,
    CacheStore,
    ChatMessage,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)


def req(text: str = "hi", **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        messages=[ChatMessage(role="user", content=text)],
        sampling=SamplingParams(**{"temperature": 0, **sampling}),
    ).with_seed()


def test_key_covers_what_decides_the_output_and_nothing_else() -> None:
    base = req()
    same = req().model_copy(
        update={"tenant": "other", "priority": "bulk", "stream": False, "cache": "no-store"}
    )
    assert exact_digest(base, "m") == exact_digest(same, "m")  # ids, seeds (greedy), delivery
    assert exact_digest(base, "m") != exact_digest(base, "m2")  # the model
    assert exact_digest(base, "m") != exact_digest(req("hi!"), "m")  # the prompt
    assert exact_digest(base, "m") != exact_digest(req(max_tokens=17), "m")  # a sampling field
    assert exact_digest(base, "m") != exact_digest(base, "m", {"retrieval": "v2"})
    # logprobs pick no token, but the stored events carry them or not
    assert exact_digest(base, "m") != exact_digest(req(logprobs=2), "m")
    sampled = [req(temperature=0.7, seed=s) for s in (1, 1, 2)]
    assert exact_digest(sampled[0], "m") == exact_digest(sampled[1], "m")
    assert exact_digest(sampled[0], "m") != exact_digest(sampled[2], "m")  # the seed


def test_only_reproducible_requests() -> None:
    assert reproducible(req(), client_seeded=False)
    assert reproducible(req(temperature=1.0, top_k=1), client_seeded=False)
    assert not reproducible(req(temperature=0.7), client_seeded=False)
    assert reproducible(req(temperature=0.7), client_seeded=True)
    assert CacheMode("no-cache").stores and not CacheMode("no-cache").looks_up
    assert CacheMode("no-store").looks_up and not CacheMode("no-store").stores


def test_semantic_scope_context_and_class() -> None:
    one = req("a")
    two = GenerateRequest(
        messages=[ChatMessage(role="system", content="be brief"), *(one.messages or [])],
        sampling=one.sampling,
    )
    assert context_digest(one) == context_digest(req("b"))  # only the last turn differs
    assert context_digest(one) != context_digest(two)
    assert sampling_class(one) == sampling_class(req("b"))
    assert sampling_class(one) != sampling_class(req("a", max_tokens=3))


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("How do I sort a list?", "How do I not sort a list?", "negation"),
        ("Is it safe?", "Isn't it safe?", "negation"),
        ("What is 15% of 200?", "What is 25% of 200?", "numbers"),
        ("Capital of France?", "What is the capital of Germany?", "entities"),
        ("Convert Celsius to Fahrenheit", "convert Fahrenheit to Celsius", "direction"),
        ("Sort a dict by key", "Sort a dict by value", "antonyms"),
        ("Boil an egg for a soft yolk", "Boil an egg for a runny yolk", "substitution"),
        (
            "How do I stop a running container?",
            "How do I stop all running containers?",
            "quantifiers",
        ),
        ("What is the capital of France?", "What is the largest city of France?", "degree"),
        ("Sort numbers in JavaScript", "Sort numbers in descending order in JavaScript", "degree"),
        ("How can I get a string's length in Java?", "Find the length of an array in Java", "kind"),
        ("When was the Eiffel Tower built?", "Where was the Eiffel Tower built?", "question"),
        (
            "What language is spoken in Brazil?",
            "How many languages are spoken in Brazil?",
            "question",
        ),
        ("How do I center a div?", "How do I keep a div from being centered?", "negation"),
        ("How do I set a cookie in Flask?", "How do I unset a cookie in Flask?", "antonyms"),
        ("How do I make a row hidden in Excel?", "How do I unhide a row in Excel?", "antonyms"),
        ("How do I build a set from a list?", "How do I build a list out of a set?", "direction"),
        (
            "When was the printing press invented?",
            "Which inventor made the printing press?",
            "question",
        ),
        ("How many legs does a spider have?", "How many eyes does a spider have?", "question"),
        ("How much water should I drink daily?", "How much water should I drink per hour?", "kind"),
        ("How long does it take to walk 5 km?", "How long does it take to run 5 km?", "kind"),
        ("List files over 2 GB in Linux", "List files smaller than 2 GB in Linux", "comparison"),
        ("Find rows where price exceeds 10", "Find rows where price is 10", "comparison"),
        (
            "Copy a file from the local disk to the remote host",
            "Copy a file from the remote host onto the local disk",
            "direction",
        ),
        ("Sort the words of a file", "Sort the words of a file, ignoring case", "negation"),
        ("Count the rows of a table", "Count the rows of a table in each group", "quantifiers"),
    ],
)
def test_guard_refuses_one_slot_edits(a: str, b: str, why: str) -> None:
    assert disagreement(a, b) == why


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I reverse a list in Python?", "What is the way to reverse a Python list?"),
        ("What is the capital of France?", "Which city is the capital of France?"),
        ("Who painted the Mona Lisa?", "Which artist painted the Mona Lisa?"),
        ("How do I list all running processes?", "How can I see every running process?"),
        (
            "What is the tallest mountain in the world?",
            "Which is the highest mountain on the planet?",
        ),
        ("How do I undo the last commit in git?", "How can I revert my most recent git commit?"),
        ("How many calories are in a banana?", "What is the calorie count of a banana?"),
        ("How many ounces are in a pound?", "A pound equals how many ounces?"),
        (
            "How do I convert a string to an integer in Python?",
            "How can I get an integer from a string in Python?",
        ),
        ("How much protein should I eat daily?", "How much protein should I eat per day?"),
        ("When did the Berlin Wall fall?", "In what year did the Berlin Wall fall?"),
        ("How do I iterate over a list in Python?", "How can I loop through a Python list?"),
        ("Find files larger than 2 GB", "How do I find files over 2 GB?"),
    ],
)
def test_guard_lets_paraphrases_through(a: str, b: str) -> None:
    assert disagreement(a, b) is None


def events(rid: str, n: int, finish: FinishReason | None = FinishReason.STOP) -> list[bytes]:
    out = [TokenEvent(request_id=rid, seq=i, text=f"t{i}", token_ids=[i]) for i in range(n)]
    out[-1].finish_reason = finish
    out[-1].usage = Usage(prompt_tokens=3, completion_tokens=n) if finish else None
    return [orjson.dumps(ev.model_dump(mode="json", exclude_none=True)) for ev in out]


def test_entry_replays_under_a_new_id() -> None:
    entry = entry_of(events("req-a", 3))
    assert entry is not None and b"req-a" not in entry
    replayed = replay_events(entry, "req-b")
    assert [(e.request_id, e.seq, e.text) for e in replayed] == [
        ("req-b", 0, "t0"),
        ("req-b", 1, "t1"),
        ("req-b", 2, "t2"),
    ]
    assert replayed[-1].usage == Usage(prompt_tokens=3, completion_tokens=3)
    assert entry_of(events("req-a", 3, finish=None)) is None  # not finished
    assert entry_of(events("req-a", 3)[1:]) is None  # not from seq 0


def test_only_stop_or_length_is_stored() -> None:
    store = CacheStore(digest="ab" * 10, ttl_s=60)
    asked = req().model_copy(update={"cache_store": store})
    final = TokenEvent(request_id="r", seq=0, finish_reason=FinishReason.LENGTH)
    assert storable(asked, final)
    assert not storable(req(), final)
    cancelled = final.model_copy(update={"finish_reason": FinishReason.CANCELLED})
    assert not storable(asked, cancelled)


def test_model_identity_follows_the_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    first = model_identity(tmp_path, "m")
    assert first == model_identity(tmp_path, "m")
    (tmp_path / "model.safetensors").write_bytes(b"retrained")
    assert model_identity(tmp_path, "m") != first
    assert model_identity("", "m") != model_identity("", "n")


def test_grounded_answers_stored_only_for_the_keyed_index_version() -> None:
    from shared.messages import Grounding, Retrieval

    store = CacheStore(digest="ab" * 10, ttl_s=60, retrieval_version="v2")
    final = TokenEvent(request_id="r", seq=0, finish_reason=FinishReason.STOP)
    asked = req().model_copy(update={"cache_store": store, "retrieval": Retrieval(index="kb")})
    grounded = {"grounding": Grounding(index="kb", version="v2")}
    assert storable(asked.model_copy(update=grounded), final)
    newer = {"grounding": Grounding(index="kb", version="v3")}
    assert not storable(asked.model_copy(update=newer), final)
    assert not storable(asked, final)  # no grounding recorded
