"""How every Kafka client of the project logs in: the security protocol, the SASL user and
its password, and TLS.

``KafkaAccess`` is built once from a service's settings (``CommonSettings.kafka``) and
gives the keyword arguments every aiokafka client takes (``options``); the builders of
``shared.kafka_io`` apply them to each producer, consumer and admin client. With
``TW_KAFKA_SECURITY_PROTOCOL=PLAINTEXT`` (the default) they are empty. ``SASL_SSL`` logs
in as ``TW_KAFKA_USERNAME`` with a SCRAM mechanism over TLS; ``SSL`` uses TLS alone. TLS
verifies the broker against ``TW_KAFKA_TLS_CA_FILE`` (the system's CAs when empty) and
presents a client certificate (mTLS) when ``TW_KAFKA_TLS_CERT_FILE`` is set.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from shared.credentials import client_tls, secret

if TYPE_CHECKING:
    from shared.settings import CommonSettings


class SecurityProtocol(StrEnum):
    """How a client speaks to the brokers."""

    PLAINTEXT = "PLAINTEXT"
    SASL_SSL = "SASL_SSL"
    SSL = "SSL"


class SaslMechanism(StrEnum):
    """The SASL mechanisms the project's clients use (SCRAM: no password on the wire)."""

    SCRAM_SHA_512 = "SCRAM-SHA-512"
    SCRAM_SHA_256 = "SCRAM-SHA-256"


@dataclass(frozen=True, slots=True)
class KafkaAccess:
    """How to reach and log in to Kafka: protocol, SASL login and TLS files."""

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    mechanism: SaslMechanism = SaslMechanism.SCRAM_SHA_512
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def of(cls, settings: CommonSettings) -> KafkaAccess:
        password = secret(settings.kafka_password, settings.kafka_password_file)
        return cls(
            settings.kafka_security_protocol,
            settings.kafka_sasl_mechanism,
            settings.kafka_username,
            password,
            settings.kafka_tls_ca_file,
            settings.kafka_tls_cert_file,
            settings.kafka_tls_key_file,
        )

    @property
    def tls(self) -> bool:
        return self.protocol in (SecurityProtocol.SASL_SSL, SecurityProtocol.SSL)

    def login(self) -> str:
        """How this client logs in, in words for a log line (never a secret): a refused
        TLS handshake says nothing of why, so the line names what was presented."""
        if self.protocol is SecurityProtocol.PLAINTEXT:
            return "PLAINTEXT, no login"
        if self.protocol is SecurityProtocol.SASL_SSL:
            return f"SASL_SSL as user {self.username!r} ({self.mechanism.value})"
        if self.cert_file:
            return f"SSL with the client certificate {self.cert_file}"
        return "SSL without a client certificate (TW_KAFKA_TLS_CERT_FILE is empty)"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (None over PLAINTEXT): the broker's certificate and host name
        verified, a client certificate presented when one is set."""
        if not self.tls:
            return None
        return client_tls(self.ca_file, self.cert_file, self.key_file)

    def options(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client (producer, consumer, admin)."""
        if not self.tls:
            return {}
        out: dict[str, Any] = {
            "security_protocol": self.protocol.value,
            "ssl_context": self.ssl_context(),
        }
        if self.protocol is SecurityProtocol.SASL_SSL:
            out |= {
                "sasl_mechanism": self.mechanism.value,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.password,
            }
        return out
