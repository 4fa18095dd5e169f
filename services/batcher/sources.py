"""Who may speak for which tenant on the bus: the requests topics a batcher reads, and the
tenants and priorities each may carry.

Kafka does not tell a consumer who produced a record, but its ACLs say who may write a
topic. So each backend service gets a requests topic of its own, which only its Kafka
user may write (``infra/kafka-acl.conf``), and ``TW_REQUEST_SOURCES`` says which tenants
(and priorities) that topic may speak for. The shared requests topic is the edge's: the
edge authenticates each caller by API key, so it speaks for any tenant. A request whose
topic may not carry its tenant or priority is refused (a dead letter with the reason).

``TW_REQUEST_SOURCES``: sources joined by ``;``, each ``service:tenants[:priorities]``,
tenants and priorities joined by ``,``; ``*`` (or no priorities) allows any. Example:
``billing:acme,globex:bulk;search:initech``. Empty: the shared topic alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from shared.messages import Priority
from shared.names import Names

SOURCE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")
TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Source:
    """A backend service's requests topic and what it may carry (None: anything)."""

    name: str
    tenants: frozenset[str] | None
    priorities: frozenset[Priority] | None

    def refusal(self, tenant: str, priority: Priority) -> tuple[str, str] | None:
        """(reason, detail) when this source may not send such a request, else None."""
        if self.tenants is not None and tenant not in self.tenants:
            return "tenant_not_allowed", f"source {self.name!r} may not speak for tenant {tenant!r}"
        if self.priorities is not None and priority not in self.priorities:
            detail = f"source {self.name!r} may not send {priority.value} requests"
            return "priority_not_allowed", detail
        return None


def parse_sources(text: str) -> tuple[Source, ...]:
    """The sources of a ``TW_REQUEST_SOURCES`` value; ValueError says what is wrong."""
    out: dict[str, Source] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = [f.strip() for f in part.split(":")]
        if len(fields) not in (2, 3):
            raise ValueError(f"{part!r}: expected service:tenants[:priorities]")
        name = fields[0]
        if not SOURCE_NAME.match(name):
            raise ValueError(f"{name!r}: a service name is lower-case letters, digits, - or _")
        if name in out:
            raise ValueError(f"service {name!r} is listed twice")
        out[name] = Source(name, _tenants(fields[1]), _priorities(fields[2:]))
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
    if not rest or _items(rest[0]) == ["*"]:
        return None
    try:
        return frozenset(Priority(p) for p in _items(rest[0]))
    except ValueError:
        allowed = ", ".join(p.value for p in Priority)
        raise ValueError(f"bad priorities {rest[0]!r} (allowed: {allowed}, *)") from None


def _items(text: str) -> list[str]:
    return [i.strip() for i in text.split(",") if i.strip()]


class Sources:
    """The requests topics of a batcher and the check of each request against its topic."""

    def __init__(self, names: Names, sources: Iterable[Source] = ()) -> None:
        self._by_topic: dict[str, Source | None] = {names.requests: None}
        for s in sources:
            self._by_topic[names.requests_from(s.name)] = s

    @property
    def topics(self) -> list[str]:
        return list(self._by_topic)

    def refusal(self, topic: str, tenant: str, priority: Priority) -> tuple[str, str] | None:
        """(reason, detail) when a request on ``topic`` may not carry this tenant or
        priority; None when it may (the shared topic: always)."""
        if topic not in self._by_topic:
            return "unknown_source", f"topic {topic!r} is no requests topic of this batcher"
        source = self._by_topic[topic]
        return None if source is None else source.refusal(tenant, priority)
