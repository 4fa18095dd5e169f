"""``tokenwire chaos`` against a whole stack of its own (``infra/stack.sh up`` on free
ports, its own run folder and topic prefix, as in ``test_supervision``): the scenarios stop
and start that stack's Redis, never the session's shared one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, new_prefix
from tests.integration.test_supervision import OwnStack, _started_by

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def chaos_stack(tmp_path: Path, model_dir: str) -> Iterator[OwnStack]:
    st = OwnStack(tmp_path / "run", model_dir)
    st.env["TW_TOPIC_PREFIX"] = new_prefix("chaos")
    try:
        yield st
    finally:
        # As test_supervision's own_stack: the script's `down`, then whatever of this
        # stack is still alive is killed, so a failure leaks nothing.
        subprocess.run(
            ["bash", "infra/stack.sh", "down"],
            cwd=ROOT,
            env=st.env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        for pid in _started_by(st.run_dir):
            os.kill(pid, signal.SIGKILL)


def test_a_redis_restart_and_poisons_lose_nothing_and_stop_nothing(
    chaos_stack: OwnStack,
) -> None:
    st = chaos_stack
    st.script("up")
    args = ["chaos", "--scenarios", "redis-restart,poison", "--streams", "4", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        env=st.env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}"
    rows = json.loads(done.stdout)
    assert [r["scenario"] for r in rows] == ["redis-restart", "poison"], report
    for row in rows:
        assert row["requests"] > 0 and row["completed"] == row["requests"], report
        assert (row["lost"], row["duplicated"], row["exits"]) == (0, 0, 0), report
        assert row["recovered"], report
    assert done.returncode == 0, report
    st.script("down")
