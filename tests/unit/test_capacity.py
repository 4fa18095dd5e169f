"""The capacity model's arithmetic on plain data, and the costs file it is fed from."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from services import cli
from services.ops import costs as costs_file
from services.ops.capacity import Costs, PlanError, Target, plan

COSTS = Costs(
    edge_events_per_s=100_000,
    batcher_requests_per_s=2_000,
    redis_events_per_s=200_000,
    kafka_records_per_s=50_000,
    kafka_partitions_per_broker=4_000,
    worker_cpu_us_per_token=10,
)
TARGET = Target(streams=1000, tokens_per_s=30, request_rate=100, step_ms=25, max_running=100)


def test_a_worker_holds_max_running_streams_when_the_step_is_fast_enough() -> None:
    p = plan(TARGET, COSTS)
    assert p.count("workers") == 10
    assert p.count("batches_partitions") == 10
    assert plan(replace(TARGET, streams=1001), COSTS).count("workers") == 11
    assert plan(replace(TARGET, streams=1), COSTS).count("workers") == 1


def test_each_count_follows_its_formula() -> None:
    t = Target(
        streams=1_000_000, tokens_per_s=30, request_rate=100_000, step_ms=26.5, max_running=256
    )
    p = plan(t, COSTS)
    h = t.headroom
    assert p.count("workers") == math.ceil(1_000_000 / 256)
    assert p.count("edges") == math.ceil(30e6 / (100_000 * h))
    assert p.count("redis_shards") == math.ceil(30e6 / (200_000 * h))
    assert p.count("batchers") == math.ceil(100_000 / (2_000 * h))
    assert p.count("requests_partitions") == p.count("batchers")
    by_rate = math.ceil(3 * 2 * 100_000 / (50_000 * h))
    by_partitions = math.ceil(3 * (p.count("batchers") + p.count("workers")) / 4_000)
    assert p.count("kafka_brokers") == max(3, by_rate, by_partitions)


def test_every_count_shows_its_inputs() -> None:
    p = plan(TARGET, COSTS)
    edges = next(n for n in p.needs if n.part == "edges")
    assert edges.inputs["events_per_s"] == 30_000 and edges.inputs["edge_events_per_s"] == 100_000
    workers = next(n for n in p.needs if n.part == "workers")
    assert workers.inputs["per_stream_max_tok_s"] == 40.0
    assert workers.inputs["streams_per_worker"] == 100


def test_a_small_load_still_needs_one_of_each_and_a_replicated_cluster() -> None:
    p = plan(Target(streams=1, tokens_per_s=1, request_rate=0.01, step_ms=10), COSTS)
    assert {n.part: n.count for n in p.needs} == {
        "workers": 1,
        "batches_partitions": 1,
        "batchers": 1,
        "requests_partitions": 1,
        "edges": 1,
        "kafka_brokers": 3,
        "redis_shards": 1,
    }


def test_more_headroom_needs_more_parts() -> None:
    tight = plan(replace(TARGET, streams=100_000, headroom=1.0), COSTS)
    loose = plan(replace(TARGET, streams=100_000, headroom=0.5), COSTS)
    assert loose.count("edges") == 2 * tight.count("edges")
    assert loose.count("workers") == tight.count("workers")  # slots, not a throughput


def test_brokers_grow_with_partitions_when_records_are_few() -> None:
    c = replace(COSTS, kafka_partitions_per_broker=30)
    p = plan(replace(TARGET, streams=10_000), c)  # 100 workers -> 100 batches partitions
    assert p.count("kafka_brokers") == math.ceil(3 * (100 + 1) / 30)


def test_a_rate_above_what_the_step_allows_is_refused_clearly() -> None:
    with pytest.raises(PlanError, match=r"cannot serve 41 tokens/s per stream.*at most 40\.0"):
        plan(replace(TARGET, tokens_per_s=41), COSTS)
    plan(replace(TARGET, tokens_per_s=40), COSTS)  # exactly the step's rate is servable


def test_a_worker_loop_too_slow_for_the_streams_caps_them() -> None:
    slow = replace(COSTS, worker_cpu_us_per_token=1000)  # 700 tokens/s within h = 0.7
    p = plan(TARGET, slow)
    assert p.count("workers") == math.ceil(1000 / 23)  # floor(700 / 30) streams each
    with pytest.raises(PlanError, match="loop cannot publish"):
        plan(replace(TARGET, tokens_per_s=1), replace(COSTS, worker_cpu_us_per_token=800_000))


@pytest.mark.parametrize(
    "field,value",
    [
        ("streams", 0),
        ("streams", -5),
        ("tokens_per_s", 0),
        ("tokens_per_s", float("nan")),
        ("request_rate", -1),
        ("step_ms", 0),
        ("max_running", 0),
        ("headroom", 0),
        ("headroom", 1.5),
        ("replication", 0),
    ],
)
def test_zero_or_negative_inputs_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(PlanError, match=field):
        plan(replace(TARGET, **{field: value}), COSTS)


def test_costs_missing_or_not_positive_are_refused_by_name() -> None:
    good = {
        "edge_events_per_s": 1.0,
        "batcher_requests_per_s": 1.0,
        "redis_events_per_s": 1.0,
        "kafka_records_per_s": 1.0,
        "kafka_partitions_per_broker": 1.0,
        "worker_cpu_us_per_token": 1.0,
        "pipeline_tok_s": 5.0,  # others in the file are not the model's
    }
    assert Costs.from_values(good).edge_events_per_s == 1.0
    with pytest.raises(PlanError, match="lacks redis_events_per_s"):
        Costs.from_values({k: v for k, v in good.items() if k != "redis_events_per_s"})
    with pytest.raises(PlanError, match="edge_events_per_s must be a positive"):
        Costs.from_values(good | {"edge_events_per_s": 0.0})


def test_the_checked_in_costs_hold_every_figure_the_model_needs() -> None:
    entries = costs_file.read_costs()
    Costs.from_values(costs_file.values(entries))
    for name, c in entries.items():
        assert c.unit, name
        if c.source.startswith("tokenwire "):  # measured here: when, and on what
            assert c.measured and c.host, name
        else:  # an assumption, which must say so and why
            assert c.source.startswith("not measured") and c.note, name


def test_a_benchmark_merges_its_figures_into_a_copy_of_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    new = {"edge_events_per_s": costs_file.measured(123.0, "events/s", source="tokenwire x")}
    costs_file.merge_costs(path, new)
    merged = costs_file.read_costs(path)
    assert merged["edge_events_per_s"].value == 123.0
    assert merged["edge_events_per_s"].source == "tokenwire x"
    defaults = costs_file.read_costs()
    assert set(merged) == set(defaults)  # the rest came from the defaults, untouched
    assert merged["redis_events_per_s"] == defaults["redis_events_per_s"]
    again = {"redis_events_per_s": costs_file.measured(7.0, "events/s", source="tokenwire y")}
    costs_file.merge_costs(path, again)
    assert costs_file.read_costs(path)["edge_events_per_s"].value == 123.0  # kept


def test_the_plan_command_prints_a_table_json_and_refuses_bad_targets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "costs.json"
    costs_file.merge_costs(
        path, {k: costs_file.measured(v, "unit") for k, v in COSTS.__dict__.items()}
    )
    capsys.readouterr()
    args = ["plan", "--streams", "512", "--tokens-per-s", "30", "--request-rate", "10"]
    args += ["--costs", str(path)]
    cli.main([*args, "--step-ms", "25", "--max-running", "256"])
    table = capsys.readouterr().out
    assert "| workers | 2 |" in table and "| kafka_brokers |" in table
    cli.main([*args, "--step-ms", "25", "--max-running", "256", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["needs"]["workers"]["count"] == 2
    assert out["needs"]["workers"]["inputs"]["step_ms"] == 25
    with pytest.raises(SystemExit) as exc:
        cli.main([*args, "--step-ms", "50"])
    assert "cannot serve 30 tokens/s per stream" in str(exc.value.code)
    with pytest.raises(SystemExit) as exc:
        cli.main([*args[:-2], "--step-ms", "25", "--costs", str(tmp_path / "none.json")])
    assert "none.json" in str(exc.value.code)
