"""The command line hands each subcommand its own options."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from services import cli
from services.bench import edge_bench, infra_bench


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


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_of_every_subcommand_says_what_it_is() -> None:
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for root in (cli.build_parser(), edge_bench.build_parser(), infra_bench.build_parser())
        for p in _parsers(root)
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
    ]
    assert missing == []
