"""Who may speak for which tenant on the bus: the requests topics a batcher reads, and the
tenants, priorities and reply topics each may carry.

Kafka does not tell a consumer who produced a record, but its ACLs say who may write a
topic. So each backend service gets a requests topic of its own, which only its Kafka
user may write (``infra/kafka-acl.conf``), and ``TW_REQUEST_SOURCES`` says which tenants
(and priorities) that topic may speak for. The shared requests topic is the edge's: the
edge authenticates each caller by API key, so it speaks for any tenant. A request whose
topic may not carry its tenant or priority is refused (a dead letter with the reason).

Replies go where a request's ``reply.kafka_topic`` says, so a service could otherwise have
its completions written into another's topic. A backend service may name its own
completions topic (``<prefix>.completions.to-<service>``, which only its Kafka user reads)
and the topics listed for it here; any other is refused (``reply_topic_not_allowed``).

``TW_REQUEST_SOURCES``: sources joined by ``;``, each
``service:tenants[:priorities[:reply_topics]]``, lists joined by ``,``; ``*`` (or no
priorities) allows any tenant or priority; reply topics are full topic names besides the
service's own. Example: ``billing:acme,globex:bulk;search:initech:*:search.results``.
Empty: the shared topic alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from shared.messages import Priority
from shared.names import Names

SOURCE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")
TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True, slots=True)
class Source:
    """A backend service's requests topic and what it may carry (None: any tenant or
    priority); ``reply_topics``: the topics it may name for replies besides its own."""

    name: str
    tenants: frozenset[str] | None
    priorities: frozenset[Priority] | None
    reply_topics: frozenset[str] = frozenset()

    def refusal(
        self, tenant: str, priority: Priority, reply_topic: str | None, own_replies: str
    ) -> tuple[str, str] | None:
        """(reason, detail) when this source may not send such a request, else None;
        ``own_replies`` is its own completions topic (always allowed)."""
        if self.tenants is not None and tenant not in self.tenants:
            return "tenant_not_allowed", f"source {self.name!r} may not speak for tenant {tenant!r}"
        if self.priorities is not None and priority not in self.priorities:
            detail = f"source {self.name!r} may not send {priority.value} requests"
            return "priority_not_allowed", detail
        allowed = {own_replies, *self.reply_topics}
        if reply_topic is not None and reply_topic not in allowed:
            detail = (
                f"source {self.name!r} may not have replies written to {reply_topic!r} "
                f"(allowed: {', '.join(sorted(allowed))})"
            )
            return "reply_topic_not_allowed", detail
        return None


def parse_sources(text: str) -> tuple[Source, ...]:
    """The sources of a ``TW_REQUEST_SOURCES`` value; ValueError says what is wrong."""
    out: dict[str, Source] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = [f.strip() for f in part.split(":")]
        if len(fields) not in (2, 3, 4):
            raise ValueError(f"{part!r}: expected service:tenants[:priorities[:reply_topics]]")
        name = fields[0]
        if not SOURCE_NAME.match(name):
            raise ValueError(f"{name!r}: a service name is lower-case letters, digits, - or _")
        if name in out:
            raise ValueError(f"service {name!r} is listed twice")
        out[name] = Source(name, _tenants(fields[1]), _priorities(fields[2:]), _topics(fields[3:]))
    return tuple(out.values())


def _tenants(text: str) -> frozenset[str] | None:
    items = _items(text)
    if items == ["*"]:
        return None
    bad = [t for t in items if not TENANT.match(t)]
    if bad or not items:
        raise ValueError(f"bad tenant list {text!r}")
    return frozenset(items)


def _priorities(rest: list[str]) -> frozenset[Priority] | None:
    if not rest or _items(rest[0]) in ([], ["*"]):
        return None
    try:
        return frozenset(Priority(p) for p in _items(rest[0]))
    except ValueError:
        allowed = ", ".join(p.value for p in Priority)
        raise ValueError(f"bad priorities {rest[0]!r} (allowed: {allowed}, *)") from None


def _topics(rest: list[str]) -> frozenset[str]:
    topics = _items(rest[0]) if rest else []
    bad = [t for t in topics if not TOPIC.match(t)]
    if bad:
        raise ValueError(f"bad reply topics {bad} (a topic name is letters, digits, ., _ or -)")
    return frozenset(topics)


def _items(text: str) -> list[str]:
    return [i.strip() for i in text.split(",") if i.strip()]


class Sources:
    """The requests topics of a batcher and the check of each request against its topic."""

    def __init__(self, names: Names, sources: Iterable[Source] = ()) -> None:
        self._names = names
        self._by_topic: dict[str, Source | None] = {names.requests: None}
        for s in sources:
            self._by_topic[names.requests_from(s.name)] = s

    @property
    def topics(self) -> list[str]:
        return list(self._by_topic)

    def refusal(
        self, topic: str, tenant: str, priority: Priority, reply_topic: str | None = None
    ) -> tuple[str, str] | None:
        """(reason, detail) when a request on ``topic`` may not carry this tenant,
        priority or reply topic; None when it may (the shared topic: always)."""
        if topic not in self._by_topic:
            return "unknown_source", f"topic {topic!r} is no requests topic of this batcher"
        source = self._by_topic[topic]
        if source is None:
            return None
        own = self._names.completions_to(source.name)
        return source.refusal(tenant, priority, reply_topic, own)
