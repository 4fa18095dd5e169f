"""The command line hands each subcommand its own options."""

from __future__ import annotations

import pytest

from services import cli


def test_bench_edge_takes_the_edge_benchmarks_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "edge", "--quick", "--concurrency", "1", "8", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "tokenwire bench edge" in out and "--flood-events" in out


def test_bench_edge_refuses_an_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "edge", "--no-such-option"])
    assert exc.value.code == 2
    assert "--no-such-option" in capsys.readouterr().err
