"""The pure parts of ``tokenwire chaos``: accounting for a stream's events, judging each
request, counting exits, and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services import cli
from services.chaos.accounting import (
    Expect,
    Outcome,
    check_stream,
    cut_stream_outcome,
    log_outcome,
    meets,
    reply_outcome,
    stream_outcome,
    unfollowed_outcome,
)
from services.chaos.load import StreamRun
from services.chaos.report import Row, render_table, row_of, to_json
from services.chaos.stack import ChaosError, Snapshot, check_profile, exits_between


def test_a_contiguous_stream_has_no_gap_no_duplicate_and_its_longest_wait_as_stall() -> None:
    check = check_stream([(0, 1.5), (1, 1.7), (2, 4.2), (3, 4.3)], started_at=1.0)
    assert (check.events, check.duplicates, check.gaps) == (4, 0, 0)
    assert check.stall_s == pytest.approx(2.5)


def test_duplicates_and_gaps_are_counted() -> None:
    check = check_stream([(0, 1.0), (1, 1.1), (1, 1.2), (4, 1.3), (0, 1.4)], started_at=1.0)
    assert check.duplicates == 2  # 1 and 0 again
    assert check.gaps == 2  # 2 and 3 never came


def test_the_wait_before_the_first_event_and_after_the_last_count_as_stalls() -> None:
    assert check_stream([(0, 9.0)], started_at=1.0).stall_s == pytest.approx(8.0)
    cut = check_stream([(0, 1.0)], started_at=1.0, ended_at=12.0)
    assert cut.stall_s == pytest.approx(11.0)
    assert check_stream([], started_at=1.0) == check_stream([], started_at=1.0, ended_at=None)
    assert check_stream([], started_at=1.0).stall_s == 0.0


def test_a_stream_completes_only_whole_and_ended_as_expected() -> None:
    whole = check_stream([(0, 1.0), (1, 1.1)], started_at=1.0)
    assert stream_outcome(whole, "length", True, Expect.OK).completed
    gap = check_stream([(0, 1.0), (2, 1.1)], started_at=1.0)
    lost = stream_outcome(gap, "length", True, Expect.OK)
    assert not lost.completed and "1 ids missing" in lost.why
    assert stream_outcome(whole, "length", False, Expect.OK).why == "no [DONE]"
    assert not stream_outcome(whole, "error", True, Expect.OK).completed
    assert stream_outcome(whole, "error", True, Expect.ANSWERED).completed
    twice = check_stream([(0, 1.0), (0, 1.0), (1, 1.1)], started_at=1.0)
    both = stream_outcome(twice, "stop", True, Expect.OK, retries=2)
    assert both.completed and both.duplicated and both.retries == 2


def test_expectations() -> None:
    assert meets(Expect.OK, "stop") and meets(Expect.OK, "length")
    assert not meets(Expect.OK, "cancelled") and not meets(Expect.OK, None)
    assert meets(Expect.CANCELLED, "cancelled") and not meets(Expect.CANCELLED, "length")
    assert meets(Expect.ERROR, "error") and not meets(Expect.ERROR, "stop")
    assert meets(Expect.ANSWERED, "error") and not meets(Expect.ANSWERED, None)


def test_a_kafka_reply_request_is_owed_exactly_one_completion() -> None:
    assert reply_outcome(["length"], Expect.OK) == Outcome(completed=True)
    assert reply_outcome([], Expect.OK) == Outcome(completed=False, why="no Completion")
    twice = reply_outcome(["length", "length"], Expect.OK)
    assert twice.completed and twice.duplicated


def test_replay_logs_and_cut_streams() -> None:
    assert log_outcome([0, 1, 2], "cancelled", Expect.CANCELLED).completed
    assert not log_outcome([0, 2], "cancelled", Expect.CANCELLED).completed
    ran_on = log_outcome([0, 1], "length", Expect.CANCELLED)
    assert ran_on.why == "replay log length (expected cancelled)"
    seen = check_stream([(0, 1.0), (1, 1.2), (1, 1.3)], started_at=1.0, ended_at=2.0)
    cut = cut_stream_outcome(seen, log_outcome([0, 1, 2], "cancelled", Expect.CANCELLED))
    assert cut.completed and cut.duplicated and cut.stall_s == pytest.approx(0.7)
    assert not cut_stream_outcome(seen, ran_on).completed


def test_a_stream_left_without_a_follower_owes_a_cancel_only_past_its_grace() -> None:
    # Finished on its own 8 s after its edge died, with a 10 s grace: nothing was owed
    # (a chaos run on an idle machine ran its 1,500 tokens to the end in that time).
    assert unfollowed_outcome([0, 1, 2], "length", ended_s=8.0, grace_s=10.0).completed
    assert unfollowed_outcome([0, 1, 2], "cancelled", ended_s=12.0, grace_s=10.0).completed
    late = unfollowed_outcome([0, 1, 2], "length", ended_s=12.0, grace_s=10.0)
    assert late.why == "replay log length (expected cancelled)"
    assert not unfollowed_outcome([0, 2], "length", ended_s=1.0, grace_s=10.0).completed
    assert not unfollowed_outcome([0, 1], None, ended_s=40.0, grace_s=10.0).completed


def test_a_stream_run_reads_ids_finish_and_done_from_sse_lines() -> None:
    run = StreamRun(started_at=0.0)
    chunk = '{"choices":[{"index":0,"text":"a","finish_reason":%s}]}'
    for t, line in enumerate(
        [
            "id: 0",
            "data: " + chunk % "null",
            "",
            ": keep-alive",
            "id: 1",
            "data: " + chunk % '"length"',
            "data: [DONE]",
        ]
    ):
        run.feed(line, float(t))
    assert run.events == [(0, 0.0), (1, 4.0)] and run.finish == "length" and run.done
    assert run.outcome(Expect.OK).completed
    failed = StreamRun()
    failed.feed('data: {"error": {"message": "x", "code": "engine_error"}}', 1.0)
    assert failed.finish == "error"
    refused = StreamRun(refused="HTTP 400: bad", retries=1)
    assert refused.outcome() == Outcome(completed=False, retries=1, why="HTTP 400: bad")


def test_exits_are_restarts_counted_or_a_changed_pid() -> None:
    before = Snapshot({"worker": 10, "batcher": 20, "edge": 30}, {"worker": 0, "batcher": 1})
    after = Snapshot({"worker": 11, "batcher": 20, "edge": 31}, {"worker": 2, "batcher": 1})
    assert exits_between(before, after) == {"worker": 2, "batcher": 0, "edge": 1}


def test_rows_sum_their_outcomes_and_render_as_an_aligned_table() -> None:
    outcomes = [
        Outcome(completed=True, stall_s=1.25, retries=2),
        Outcome(completed=True, duplicated=True, stall_s=0.5),
        Outcome(completed=False, why="no Completion", request_id="req-1"),
        Outcome(completed=False, why="no Completion", request_id="req-2"),
    ]
    row = row_of("worker-kill", outcomes, exits=0, notes=["edge exited 1×"])
    assert (row.requests, row.completed, row.lost, row.duplicated) == (4, 2, 2, 1)
    assert row.longest_stall_s == 1.25 and row.retries == 2 and not row.clean
    assert row.notes == ["edge exited 1×", "2× no Completion (e.g. req-2)", "1× duplicated"]
    quiet = Row("redis-restart", 16, 16, 0, 0, 0, 5.06)
    assert quiet.clean
    lines = render_table([quiet, row]).splitlines()
    assert lines[0].split("  ")[0].strip() == "scenario"
    assert "process exits" in lines[0] and "longest stall" in lines[0]
    assert len({len(line) for line in lines[:4]}) == 1  # header, rule and rows line up
    assert lines[2].split() == ["redis-restart", "16", "16", "0", "0", "0", "5.1", "s"]
    assert lines[5:] == [
        "worker-kill: 2 refusals retried",
        "worker-kill: edge exited 1×",
        "worker-kill: 2× no Completion (e.g. req-2)",
        "worker-kill: 1× duplicated",
    ]
    assert json.loads(to_json([quiet]))[0] == {
        "scenario": "redis-restart",
        "requests": 16,
        "completed": 16,
        "lost": 0,
        "duplicated": 0,
        "exits": 0,
        "longest_stall_s": 5.06,
        "retries": 0,
        "recovered": True,
        "notes": [],
    }


def test_the_command_line_refuses_an_unknown_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["chaos", "--scenarios", "poison,redis-restart"])
    assert args.scenarios == ["poison", "redis-restart"] and args.streams == 8
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["chaos", "--scenarios", "poison,meteor"])
    assert exc.value.code == 2
    assert "unknown scenario meteor" in capsys.readouterr().err


def test_a_stack_of_more_than_one_of_anything_is_refused_with_what_it_runs(
    tmp_path: Path,
) -> None:
    check_profile(tmp_path)  # nothing recorded: the one-node stack
    (tmp_path / "kafka-brokers").write_text("1\n")
    (tmp_path / "redis-shards").write_text("1\n")
    (tmp_path / "service-counts").write_text("1 1 1\n")
    check_profile(tmp_path)
    (tmp_path / "redis-shards").write_text("3\n")
    (tmp_path / "service-counts").write_text("2 2 2\n")
    with pytest.raises(ChaosError) as refused:
        check_profile(tmp_path)
    assert "3 Redis masters, 2/2/2 workers, batchers and edges" in str(refused.value)
    assert "Kafka brokers" not in str(refused.value)
