"""A step's text made while the next pass runs (``EngineConfig.overlap``, on a GPU): the
same outputs as steps that settle their own pass, the text made after the next pass is
launched, and the requests that end meanwhile (a stop string, an abort) leaving nothing
behind. A CPU runs its pass at launch, so there overlapping changes only the order of
work: the same order as on a GPU, tested here on whichever device the tests run."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from services.worker.engine.engine import Engine
from services.worker.engine.request import Status
from services.worker.engine.wire import (
    EngineConfig,
    EngineRequest,
    SamplingConfig,
    SpecConfig,
    StepOutput,
)

pytestmark = pytest.mark.timeout(600)


def overlapped(engine: Engine, on: bool = True) -> Engine:
    """``engine`` settling each pass in the next step (as on a GPU), whatever its device."""
    engine._overlap = on
    return engine


def _outputs(engine: Engine, requests: list[EngineRequest]) -> dict[str, list[StepOutput]]:
    for r in requests:
        engine.add_request(r)
    by_request: dict[str, list[StepOutput]] = {}
    for o in engine.run_until_idle():
        by_request.setdefault(o.request_id, []).append(o)
    return by_request


def _summary(outs: list[StepOutput]) -> tuple[Any, ...]:
    final = outs[-1]
    assert final.finish is not None and all(o.finish is None for o in outs[:-1])
    tokens = [t for o in outs for t in o.token_ids]
    assert final.completion_tokens == len(tokens)  # none counted past a stop
    logprobs = [lp for o in outs for lp in o.logprobs or []]
    return (
        tokens,
        "".join(o.text for o in outs),
        final.finish,
        final.error,
        [(round(lp.logprob, 4), [t for t, _ in lp.top]) for lp in logprobs],
    )


def _requests(tok: Any, vocab: int, ids: list[int], text: str) -> list[EngineRequest]:
    """Requests ending every way, at different steps: ``ids`` and ``text`` are the greedy
    continuation of ``BASE``."""
    rng = random.Random(5)
    base = tok(BASE)["input_ids"]
    # Stop strings found at different steps; some of them a token's middle.
    stops = [text[n : n + 3] for n in (4, 7, len(text) // 3, len(text) // 2) if text[n : n + 3]]
    # A prompt that the model goes on copying: drafts accepted, a stop string inside them.
    quoting = base + ids + base + ids[:3]
    reqs = [
        EngineRequest("length", base, max_tokens=30, ignore_eos=True),
        EngineRequest("eos", base, max_tokens=30),
        EngineRequest("stop-id", base, max_tokens=30, stop_token_ids=[ids[6]], ignore_eos=True),
        EngineRequest("logprobs", base, max_tokens=12, logprobs=3, ignore_eos=True, stop=stops[2:]),
        EngineRequest(
            "seeded",
            base,
            max_tokens=20,
            sampling=SamplingConfig(temperature=0.9, top_p=0.9, seed=11),
            ignore_eos=True,
        ),
        EngineRequest("quoting", quoting, max_tokens=30, ignore_eos=True),
    ]
    reqs += [
        EngineRequest(f"stop-{i}", base, max_tokens=30, stop=[s], ignore_eos=True)
        for i, s in enumerate(stops)
    ]
    reqs += [
        EngineRequest(f"quoting-{i}", quoting, max_tokens=30, stop=[s], ignore_eos=True)
        for i, s in enumerate(stops)
    ]
    # Later arrivals join while others decode, some sharing the prompt's cached blocks.
    reqs += [
        EngineRequest(f"late-{i}", [*base, rng.randrange(3, vocab)], max_tokens=8 + i)
        for i in range(6)
    ]
    return reqs


BASE = "The river runs"


# n-gram drafts for every request, however many run.
NGRAM = SpecConfig(k=4, max_running=64, step_tokens=256)


@pytest.mark.parametrize("speculation", [SpecConfig(), NGRAM], ids=["plain", "ngram"])
def test_overlapped_steps_give_the_outputs_of_steps_that_settle_their_own_pass(
    lm: tuple[Any, Any], speculation: SpecConfig
) -> None:
    model, tok = lm
    probe = Engine(model, tok, EngineConfig(overlap=False))
    probe.add_request(EngineRequest("p", tok(BASE)["input_ids"], max_tokens=30))
    ids = [t for o in probe.run_until_idle() for t in o.token_ids]
    text = tok.decode(ids, skip_special_tokens=True)
    requests = _requests(tok, model.config.vocab_size, ids, text)
    results = {}
    for overlap in (False, True):
        config = EngineConfig(
            kv_budget_tokens=2048, prefill_chunk=32, speculation=speculation, overlap=overlap
        )
        engine = overlapped(Engine(model, tok, config), overlap)
        outs = _outputs(engine, requests)
        results[overlap] = {rid: _summary(o) for rid, o in outs.items()}
        assert engine.stats.kv_used_blocks == 0  # every request's blocks freed
        assert engine.stats.request_errors == 0
        if speculation.enabled:
            assert engine.stats.spec_accepted_tokens > 0
    assert results[True] == results[False]
    finishes = {rid: s[2] for rid, s in results[True].items()}
    assert finishes["stop-0"] is Status.FINISHED_STOPPED
    assert finishes["length"] is Status.FINISHED_LENGTH


def _order_of_work(engine: Engine, request: EngineRequest) -> tuple[list[str], list[int]]:
    """What the engine did, in order, serving ``request`` alone (launching a pass,
    settling one, making text), and how many tokens each of its outputs carried."""
    events: list[str] = []
    launch, settle, emit = engine._launch, engine._settle, engine._emit_held

    def logged_launch(*args: Any) -> None:
        events.append("launch")
        launch(*args)

    def logged_settle() -> list[StepOutput]:
        events.append("settle")
        return settle()

    def logged_emit() -> list[StepOutput]:
        outs = emit()
        if outs:
            events.append("text")
        return outs

    engine._launch = logged_launch  # type: ignore[method-assign,assignment]
    engine._settle = logged_settle  # type: ignore[method-assign]
    engine._emit_held = logged_emit  # type: ignore[method-assign]
    engine.add_request(request)
    return events, [len(o.token_ids) for o in engine.run_until_idle()]


def test_a_steps_text_is_made_after_the_next_pass_is_launched(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    request = EngineRequest("r", tok("The river runs")["input_ids"], max_tokens=6, ignore_eos=True)
    for overlap in (True, False):
        engine = overlapped(Engine(model, tok, EngineConfig()), overlap)
        events, sizes = _order_of_work(engine, request)
        assert sizes == [1] * 6
        assert events.count("launch") == events.count("settle") == 6
        before = [events[i - 1] for i, e in enumerate(events) if e == "text"]
        if overlap:  # each token's text while the next pass runs, but the last one's
            assert before == ["launch"] * 5 + ["settle"]
        else:
            assert before == ["settle"] * 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's launch is asynchronous")
def test_on_a_gpu_the_engine_launches_a_pass_without_waiting_for_it(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    if model.device.type != "cuda":
        pytest.skip("the tests' model is not on the GPU")
    engine = Engine(model, tok, EngineConfig())
    assert engine._overlap
    launch = engine._launch
    pending: list[bool] = []

    def checked_launch(*args: Any) -> None:
        launch(*args)
        pending.append(not torch.cuda.current_stream().query())

    engine._launch = checked_launch  # type: ignore[method-assign,assignment]
    rng = random.Random(2)
    for i in range(64):
        prompt = [rng.randrange(3, model.config.vocab_size) for _ in range(32)]
        engine.add_request(EngineRequest(f"r{i}", prompt, max_tokens=16, ignore_eos=True))
    outs = engine.run_until_idle()
    assert sum(len(o.token_ids) for o in outs) == 64 * 16
    assert any(pending)  # the host went on while the device still ran the pass


def test_a_request_aborted_between_taking_and_emitting_its_tokens_ends_once(
    lm: tuple[Any, Any],
) -> None:
    model, tok = lm
    engine = overlapped(Engine(model, tok, EngineConfig()))
    prompt = tok("The river runs past the mill")["input_ids"]
    engine.add_request(EngineRequest("a", prompt, max_tokens=200, ignore_eos=True))
    engine.add_request(EngineRequest("b", prompt, max_tokens=10, ignore_eos=True))
    outs: list[StepOutput] = []
    while not any(o.request_id == "a" for o in outs):
        outs += engine.step()
    engine.abort("a")  # drained after the next step has taken a's token, before its text
    outs += engine.run_until_idle()
    a = [o for o in outs if o.request_id == "a"]
    assert a[-1].finish is Status.FINISHED_ABORTED
    assert all(o.finish is None for o in a[:-1])
    b = [o for o in outs if o.request_id == "b"]
    assert sum(len(o.token_ids) for o in b) == 10 and b[-1].finish is Status.FINISHED_LENGTH
    assert engine.stats.kv_used_blocks == 0 and not engine.has_work
    # The same id again runs as a new request.
    engine.add_request(EngineRequest("a", prompt, max_tokens=3, ignore_eos=True))
    again = engine.run_until_idle()
    assert sum(len(o.token_ids) for o in again) == 3
    assert again[-1].finish is Status.FINISHED_LENGTH
