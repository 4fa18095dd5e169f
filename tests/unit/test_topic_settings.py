"""Topic durability from one place: the replication settings every created topic gets."""

from __future__ import annotations

import pytest

from shared.kafka_io import MAX_MESSAGE_BYTES, topic_configs
from shared.settings import CommonSettings, SettingsError


def test_one_broker_by_default() -> None:
    settings = CommonSettings.from_env({})
    assert (settings.kafka_replication_factor, settings.kafka_min_insync_replicas) == (1, 1)
    assert topic_configs(settings) == {
        "max.message.bytes": str(MAX_MESSAGE_BYTES),
        "min.insync.replicas": "1",
    }


def test_a_cluster_profile_sets_both() -> None:
    settings = CommonSettings.from_env(
        {"TW_KAFKA_REPLICATION_FACTOR": "3", "TW_KAFKA_MIN_INSYNC_REPLICAS": "2"}
    )
    assert settings.kafka_replication_factor == 3
    assert topic_configs(settings)["min.insync.replicas"] == "2"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TW_KAFKA_REPLICATION_FACTOR": "2", "TW_KAFKA_MIN_INSYNC_REPLICAS": "3"}, "exceeds"),
        ({"TW_KAFKA_MIN_INSYNC_REPLICAS": "2"}, "TW_KAFKA_MIN_INSYNC_REPLICAS=2"),
        ({"TW_KAFKA_REPLICATION_FACTOR": "0"}, "TW_KAFKA_REPLICATION_FACTOR"),
    ],
)
def test_a_minimum_no_send_could_meet_is_refused(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        CommonSettings.from_env(env)
