"""Secrets from settings: inline or from a file, never in a repr."""

from __future__ import annotations

from pathlib import Path

from shared.credentials import secret
from shared.kafka_access import KafkaAccess
from shared.redis_client import RedisAccess


def test_a_secret_is_inline_or_read_from_its_file(tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    assert secret("inline", str(f)) == "inline"
    assert secret("", str(f)) == "from-file"
    assert secret("", "") == ""


def test_passwords_stay_out_of_reprs() -> None:
    for access in (RedisAccess("redis://h", "u", "hunter2"), KafkaAccess(password="hunter2")):
        assert "hunter2" not in repr(access)
