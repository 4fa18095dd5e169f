"""The command line hands each subcommand its own options."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services import cli
from services.bench import edge_bench, infra_bench
from services.bench.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]


def tokenwire(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``tokenwire ARGS`` run as a command, with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


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


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["keys", "list"], "Redis is not answering"),
        (["cache", "purge", "--tenant", "t"], "Redis is not answering"),
        (["dlq", "list"], "Kafka is not answering"),
        (["ask", "--url", "http://127.0.0.1:{port}", "hi"], "no answer from http://127.0.0.1:"),
    ],
)
def test_a_command_whose_server_is_away_says_so_in_one_line(
    command: list[str], says: str, tmp_path: Path
) -> None:
    cli.main(["keys", "pepper", "--file", str(tmp_path / "pepper")])
    # Nothing listens on these ports: each command ends with its reason and what names
    # the server, never a traceback or a client left unclosed (the Kafka client logs each
    # attempt on the way).
    port = free_port()
    env = {
        **os.environ,
        "TW_REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "TW_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}",
        "TW_KEY_PEPPER_FILE": str(tmp_path / "pepper"),
    }
    done = tokenwire([*(a.format(port=port) for a in command)], env)
    assert done.returncode == 1, done.stderr
    *before, last = done.stderr.strip().splitlines()
    assert last.startswith(f"tokenwire {command[0]}: {says}"), done.stderr
    assert all(line.startswith("Unable connect to") for line in before), done.stderr


def test_a_missing_pepper_file_is_named_with_the_command_that_makes_it(tmp_path: Path) -> None:
    missing = tmp_path / "pepper"
    env = {**os.environ, "TW_KEY_PEPPER_FILE": str(missing)}
    done = tokenwire(["keys", "list"], env)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"tokenwire keys list: TW_KEY_PEPPER_FILE: cannot read {missing} "
        "(No such file or directory); "
        f"make one with: tokenwire keys pepper --file {missing}"
    )


def test_a_redis_that_refuses_the_login_is_not_called_away() -> None:
    import redis.exceptions

    refused = cli.unreachable(redis.exceptions.AuthenticationError("invalid password"))
    assert refused is not None and refused.startswith("Redis refused this client")
    away = cli.unreachable(redis.exceptions.ConnectionError("Error 111"))
    assert away is not None and away.startswith("Redis is not answering")
    assert cli.unreachable(RuntimeError("a bug")) is None


def test_the_workers_engine_takes_its_engine_settings_from_the_environment() -> None:
    from services.worker.config import WorkerSettings

    default = cli.worker_engine_spec(WorkerSettings.from_env({}, model_dir="/m")).config
    assert default.pad_products and default.cuda_graphs and default.speculation.k == 0
    env = {
        "TW_PAD_PRODUCTS": "false",
        "TW_CUDA_GRAPHS": "false",
        "TW_SPEC_NGRAM_K": "3",
        "TW_MAX_RUNNING": "5",
        "TW_PREFIX_CACHE": "false",
    }
    spec = cli.worker_engine_spec(WorkerSettings.from_env(env, model_dir="/m"))
    assert spec.model_dir == "/m" and spec.draft_model_dir == ""
    config = spec.config
    assert not config.pad_products and not config.cuda_graphs
    assert config.speculation.k == 3 and config.max_running == 5
    assert not config.enable_prefix_cache


@pytest.mark.parametrize("service", ["worker", "batcher", "edge"])
@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_model_folder_that_is_not_one_is_named_in_one_line(
    service: str, folder: str, tmp_path: Path
) -> None:
    """``TW_MODEL_DIR`` naming no folder, or one with no model in it: the service says so
    and exits, with no traceback (the worker with no engine process started)."""
    (tmp_path / "empty").mkdir()
    path = tmp_path / folder
    env = {**os.environ, "TW_MODEL_DIR": str(path)}
    done = tokenwire([service], env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f"TW_MODEL_DIR={str(path)!r} is not a model folder: it holds no config.json "
        "(a Hugging Face model as save_pretrained writes it)"
    )
