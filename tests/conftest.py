"""Test fixtures: the real Kafka and Redis of the test stack, started by the project's own
scripts, and a fresh topic/key prefix per test module so tests never see each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The test stack's ports (infra/env.sh with TW_STACK=test); the environment may override.
os.environ.setdefault("TW_STACK", "test")
os.environ.setdefault("TW_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
os.environ.setdefault("TW_REDIS_URL", "redis://127.0.0.1:16379/0")


def torch_imported_by(code: str, *args: str) -> list[str]:
    """The torch and transformers modules a fresh interpreter holds after running ``code``
    (given ``args`` as ``sys.argv[1:]``)."""
    libs = "('torch', 'transformers')"
    tail = f"\nprint(json.dumps([m for m in sys.modules if m.split('.')[0] in {libs}]))"
    out = subprocess.run(
        [sys.executable, "-c", f"import json, sys\n{code}{tail}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def new_prefix(tag: str) -> str:
    return f"t{uuid.uuid4().hex[:8]}-{tag}"


@pytest.fixture(scope="session")
def infra() -> dict[str, str]:
    """Kafka and Redis of the test stack (started if not yet running; idempotent)."""
    env = {**os.environ, "TW_STACK": "test"}
    for script in ("infra/kafka.sh", "infra/redis.sh"):
        subprocess.run(["bash", script, "start"], cwd=ROOT, env=env, check=True)
    return {
        "TW_KAFKA_BOOTSTRAP": os.environ["TW_KAFKA_BOOTSTRAP"],
        "TW_REDIS_URL": os.environ["TW_REDIS_URL"],
    }


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded tiny model (built once, cached)."""
    explicit = os.environ.get("TW_MODEL_DIR")
    if explicit:
        return explicit
    from services.model.build import default_cache_dir, ensure_model

    return str(ensure_model("tiny", default_cache_dir(), log=lambda _: None))
