"""Which tenants, priorities and reply topics each requests topic may carry
(TW_REQUEST_SOURCES)."""

from __future__ import annotations

import pytest

from services.batcher.config import BatcherSettings
from services.batcher.sources import Sources, parse_sources
from services.ops.dlq import replay_topic, service_of
from shared.dead_letters import dead_letter
from shared.messages import Priority
from shared.names import Names
from shared.producer import Producer
from shared.settings import CommonSettings, SettingsError

NAMES = Names("tw")


def test_no_setting_reads_the_shared_topic_alone_for_any_tenant() -> None:
    sources = Sources(NAMES, parse_sources(""))
    assert sources.topics == ["tw.requests"]
    assert sources.refusal("tw.requests", "anyone", Priority.INTERACTIVE) is None


def test_a_service_speaks_for_its_tenants_and_priorities_only() -> None:
    sources = Sources(NAMES, parse_sources("billing: acme, globex : bulk ; search:*"))
    assert sources.topics == ["tw.requests", "tw.requests.from-billing", "tw.requests.from-search"]
    billing = "tw.requests.from-billing"
    assert sources.refusal(billing, "acme", Priority.BULK) is None
    assert sources.refusal(billing, "globex", Priority.BULK) is None
    reason, detail = sources.refusal(billing, "initech", Priority.BULK) or ("", "")
    assert reason == "tenant_not_allowed" and "'initech'" in detail and "'billing'" in detail
    reason, _ = sources.refusal(billing, "acme", Priority.INTERACTIVE) or ("", "")
    assert reason == "priority_not_allowed"
    assert sources.refusal("tw.requests.from-search", "initech", Priority.INTERACTIVE) is None
    assert sources.refusal("tw.requests", "initech", Priority.INTERACTIVE) is None
    assert (sources.refusal("tw.requests.from-x", "acme", Priority.BULK) or ("",))[0] == (
        "unknown_source"
    )


def test_a_service_names_only_its_own_reply_topic_and_those_listed_for_it() -> None:
    sources = Sources(NAMES, parse_sources("billing:acme::billing.out, audit.in;search:*"))
    billing, search = "tw.requests.from-billing", "tw.requests.from-search"
    for allowed in ("tw.completions.to-billing", "billing.out", "audit.in", None):
        assert sources.refusal(billing, "acme", Priority.BULK, allowed) is None, allowed
    for other in ("tw.completions", "tw.completions.to-search", "search.out"):
        reason, detail = sources.refusal(billing, "acme", Priority.BULK, other) or ("", "")
        assert reason == "reply_topic_not_allowed" and repr(other) in detail
        assert "tw.completions.to-billing" in detail
    assert sources.refusal(search, "x", Priority.BULK, "tw.completions.to-search") is None
    reason, _ = sources.refusal(search, "x", Priority.BULK, "billing.out") or ("", "")
    assert reason == "reply_topic_not_allowed"
    # The edge's shared topic names any reply topic (it answers for its callers).
    assert sources.refusal("tw.requests", "x", Priority.BULK, "billing.out") is None


@pytest.mark.parametrize(
    "bad",
    [
        "billing",
        "Billing:acme",
        "billing:acme:urgent",
        "billing:acme;billing:globex",
        "b:a b",
        "b:",
        "b:a:bulk:bad topic",
        "b:a:bulk:t:extra",
    ],
)
def test_a_bad_setting_fails_at_start_naming_it(bad: str) -> None:
    with pytest.raises(SettingsError, match="TW_REQUEST_SOURCES"):
        BatcherSettings.from_env({"TW_REQUEST_SOURCES": bad})


def test_a_producer_writes_its_own_topic_or_the_shared_one() -> None:
    assert Producer(CommonSettings(request_source="billing")).topic == "tw.requests.from-billing"
    assert Producer(CommonSettings()).topic == "tw.requests"
    assert Producer(CommonSettings(request_source="billing")).replies == (
        "tw.completions.to-billing"
    )
    assert Producer(CommonSettings()).replies == "tw.completions"
    with pytest.raises(SettingsError, match="TW_REQUEST_SOURCE"):
        CommonSettings.from_env({"TW_REQUEST_SOURCE": "No Such"})


@pytest.mark.parametrize(
    ("topic", "service", "replayed_to"),
    [
        ("tw.requests.from-billing", "batcher", "tw.requests.from-billing"),
        ("tw.requests", "batcher", "tw.requests"),
        ("tw.batches", "worker", "tw.requests"),
    ],
)
def test_a_dead_letter_of_a_service_topic_is_replayed_to_that_topic(
    topic: str, service: str, replayed_to: str
) -> None:
    """A replay goes back where the batcher checks the tenant again, never to the shared
    topic that speaks for any tenant."""
    letter = dead_letter(
        reason="tenant_not_allowed",
        detail="",
        topic=topic,
        partition=0,
        offset=1,
        key="r1",
        value=b"{}",
        request_id="r1",
    )
    assert service_of(letter, NAMES) == service
    assert replay_topic(letter, NAMES) == replayed_to
