"""The table of every ``TW_*`` setting (docs/settings.md), rendered from the settings models.

The services' settings (``CommonSettings`` and each service's subclass) are pydantic models
whose field ``foo_bar`` is read from ``TW_FOO_BAR``; their rows come from the fields
themselves: type, default and ``description``. The variables the shell scripts and a few
command-line tools read are listed in ``SCRIPT_SETTINGS``. docs/settings.md holds the rendered
table between two marker comments, and a unit test fails while it differs from what this
module renders, so a new setting shows up there or the tests say so.

    python -m shared.settings_doc            # print the table
    python -m shared.settings_doc --write    # rewrite the document's block
    python -m shared.settings_doc --check    # exit 1 while the document's block is stale
"""

from __future__ import annotations

import argparse
import enum
import importlib
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shared.settings import CommonSettings, EnvSettings

BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"
SETTINGS_DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"

# The services' settings models, in the table's order: "module:Class".
SERVICE_MODELS: tuple[tuple[str, str], ...] = (
    ("worker", "services.worker.config:WorkerSettings"),
    ("batcher", "services.batcher.config:BatcherSettings"),
    ("edge", "services.edge.config:EdgeSettings"),
)
# Label of a setting every service reads the same way (the common settings, which the
# bulk, bench and chaos commands and ``shared.producer.Producer`` read too).
ALL = "all"


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the settings table: a variable, who reads it, its default, what it does."""

    variable: str
    where: str
    default: str
    description: str


# Variables read outside the settings models: (variable, who reads it, default, what).
SCRIPT_SETTINGS: tuple[Row, ...] = (
    Row("TW_STACK", "infra scripts", "`demo`", "`demo` or `test`: which ports and folders"),
    Row(
        "TW_RUN_DIR",
        "infra scripts",
        "`~/.cache/tokenwire/run/<stack>`",
        "the stack's pid files, logs and data",
    ),
    Row("TW_KAFKA_PORT", "infra scripts", "`9092` (test: `19092`)", "the broker's port"),
    Row(
        "TW_KAFKA_CONTROLLER_PORT",
        "infra scripts",
        "`9093` (test: `19093`)",
        "the KRaft controller's port",
    ),
    Row(
        "TW_KAFKA_BROKERS",
        "infra scripts",
        "`1` (`infra/stack.sh up --brokers N` keeps N in `$TW_RUN_DIR/kafka-brokers`)",
        "Kafka nodes (KRaft broker and controller each, an N-voter quorum); 3 or more: "
        "replication factor 3 and min.insync.replicas 2 unless those are set",
    ),
    Row(
        "TW_KAFKA_PORTS",
        "infra scripts",
        "`TW_KAFKA_PORT`, `+2`, `+4`, ...",
        "the nodes' client ports, comma-separated (the bootstrap servers list all of them)",
    ),
    Row(
        "TW_KAFKA_CONTROLLER_PORTS",
        "infra scripts",
        "`TW_KAFKA_CONTROLLER_PORT`, `+2`, `+4`, ...",
        "the nodes' controller ports, comma-separated",
    ),
    Row(
        "TW_KAFKA_HEAP",
        "infra/kafka.sh",
        "`512m` (a cluster's node: `256m`)",
        "each broker JVM's largest heap (half of it reserved at start)",
    ),
    Row("TW_REDIS_PORT", "infra scripts", "`6379` (test: `16379`)", "Redis's port"),
    Row(
        "TW_REDIS_SHARDS",
        "infra scripts",
        "`1` (`infra/stack.sh up --redis-cluster N` keeps N in `$TW_RUN_DIR/redis-shards`)",
        "3 or more: Redis as a Redis Cluster of that many masters (`infra/redis.sh`); "
        "1: one plain node",
    ),
    Row(
        "TW_REDIS_REPLICAS",
        "infra/redis.sh",
        "`1`",
        "a Redis Cluster's replicas of each master (one takes over when its master fails)",
    ),
    Row(
        "TW_REDIS_PORTS",
        "infra/redis.sh",
        "`TW_REDIS_PORT`, `+1`, `+2`, ...",
        "a Redis Cluster's client ports, one per node (masters and replicas), comma-separated",
    ),
    Row(
        "TW_REDIS_BUS_PORTS",
        "infra/redis.sh",
        "each of `TW_REDIS_PORTS` `+20000`",
        "a Redis Cluster's bus ports (gossip and failover votes), one per node",
    ),
    Row(
        "TW_REDIS_CLUSTER_NODE_TIMEOUT_MS",
        "infra/redis.sh",
        "`2000`",
        "a Redis Cluster node silent this long is failed over to its replica",
    ),
    Row(
        "TW_REDIS_START_TIMEOUT",
        "infra/redis.sh",
        "`30`",
        "seconds a Redis Cluster's node may take to see every slot served and its replica synced",
    ),
    Row("TW_EDGE_PORT", "infra scripts", "`8000` (test: `18000`)", "the edge's HTTP port"),
    Row(
        "TW_REDIS_PERSIST",
        "infra scripts",
        "`aof` (test: `off`)",
        "`aof`: append-only file, fsynced every second; `off`: nothing on disk",
    ),
    Row(
        "TW_REDIS_MAXMEMORY",
        "infra scripts, compose",
        "`1gb`",
        "Redis's memory cap (policy `noeviction`: writes past it fail, nothing is evicted)",
    ),
    Row(
        "TW_REDIS_ACL",
        "infra/redis.sh",
        "`off`",
        "`on`: the ACL users of `infra/redis-acl.conf`, one per service; the default user off",
    ),
    Row(
        "TW_REDIS_ACL_DIR",
        "infra/redis.sh",
        "`$TW_RUN_DIR/redis-acl`",
        "the ACL users' password files (`<user>.password`, made when missing, 0600)",
    ),
    Row("TW_REDIS_TLS", "infra/redis.sh", "`off`", "`on`: Redis's port speaks TLS only"),
    Row("TW_REDIS_SERVER_CERT_FILE", "infra/redis.sh", "(empty)", "Redis's TLS certificate"),
    Row("TW_REDIS_SERVER_KEY_FILE", "infra/redis.sh", "(empty)", "its private key"),
    Row(
        "TW_KAFKA_SECURITY",
        "infra/kafka.sh",
        "`plaintext`",
        "`sasl_ssl`: SCRAM users over TLS, the StandardAuthorizer and the per-service ACLs of "
        "`infra/kafka-acl.conf` (for `TW_TOPIC_PREFIX` and `TW_REQUEST_SOURCES`); given to "
        "`infra/stack.sh`, the whole stack runs on it, each service as its own user",
    ),
    Row(
        "TW_KAFKA_ACL_DIR",
        "infra/kafka.sh",
        "`$TW_RUN_DIR/kafka-acl`",
        "the Kafka users' password files (`<user>.password`, made when missing, 0600)",
    ),
    Row(
        "TW_KAFKA_MTLS_PORT",
        "infra/kafka.sh",
        "(empty: none)",
        "with `sasl_ssl`: a second client port speaking TLS with required client "
        "certificates signed by `TW_KAFKA_TLS_CA_FILE`; the certificate's CN is the user",
    ),
    Row(
        "TW_KAFKA_TLS_DIR",
        "infra/stack.sh",
        "`$TW_RUN_DIR/kafka-tls`",
        "with `TW_KAFKA_SECURITY=sasl_ssl`: where the stack makes its broker's CA and "
        "certificate once (unless `TW_KAFKA_SERVER_CERT_FILE` and the others name files)",
    ),
    Row("TW_KAFKA_SERVER_CERT_FILE", "infra/kafka.sh", "(empty)", "the broker's TLS certificate"),
    Row("TW_KAFKA_SERVER_KEY_FILE", "infra/kafka.sh", "(empty)", "its private key"),
    Row(
        "TW_REQUESTS_PARTITIONS",
        "infra scripts, `tokenwire topics`",
        "`4`",
        "partitions of the requests topic",
    ),
    Row(
        "TW_BATCHES_PARTITIONS",
        "infra scripts, `tokenwire topics`",
        "`4`",
        "partitions of the batches topic (the most workers that get work)",
    ),
    Row(
        "TW_RESTART_MIN_S",
        "infra/stack.sh",
        "`1`",
        "first delay before a supervisor restarts a service that exited",
    ),
    Row(
        "TW_RESTART_MAX_S",
        "infra/stack.sh",
        "`30`",
        "the restart delay doubles up to this while a service keeps failing",
    ),
    Row(
        "TW_RESTART_RESET_S",
        "infra/stack.sh",
        "`60`",
        "a run that lasted this long starts the restart delay over",
    ),
    Row(
        "TW_BIN",
        "infra/stack.sh",
        "`.venv/bin/tokenwire`",
        "the tokenwire executable the stack runs",
    ),
    Row(
        "TW_MODEL_PRESET",
        "infra scripts",
        "`tiny`",
        "the embedded model built and served when `TW_MODEL_DIR` is not set",
    ),
    Row(
        "TW_PYTHON",
        "infra/bootstrap.sh",
        "`python3`",
        "the Python that creates the virtual environment",
    ),
    Row(
        "TW_FAISS",
        "infra/bootstrap.sh",
        "`gpu` where `nvidia-smi` answers, else `cpu`",
        "which FAISS build the virtual environment gets (`faiss-gpu` or `faiss-cpu`)",
    ),
    Row(
        "TW_RELOCK",
        "infra/bootstrap.sh",
        "`0`",
        "`1`: resolve the dependency ranges afresh, not within infra/constraints.txt, and "
        "write the versions installed there",
    ),
    Row(
        "TW_WITH_TEST_TOOLS",
        "infra/bootstrap.sh",
        "`0`",
        "`1`: also install docker-compose and chromium for the tests (infra/test.sh sets it)",
    ),
    Row(
        "TW_KAFKA_LIBS",
        "infra/kafka.sh",
        "`~/.cache/tokenwire/kafka-libs`",
        "where the broker's jars are",
    ),
    Row(
        "TW_KAFKA_START_TIMEOUT",
        "infra/kafka.sh",
        "`60`",
        "seconds to wait for the broker to answer",
    ),
    Row("TW_KAFKA_WIPE", "infra/kafka.sh", "`0`", "`1`: delete the broker's data before start"),
    Row(
        "TW_API_KEY",
        "`tokenwire ask`, `tokenwire chaos`",
        "(unset)",
        "the API key sent to the edge (chaos: else the stack's development key)",
    ),
    Row("TW_BENCH_API_KEY", "`tokenwire bench`", "(unset)", "the API key sent to the edge"),
    Row(
        "TW_TEST_BATCH_LINES",
        "tests",
        "`500`",
        "lines of the Batch API restart test (fewer for a quick run)",
    ),
    Row(
        "TW_TEST_DEVICE",
        "tests",
        "`cpu`",
        "where the engine's unit tests run the model (`cuda` on a GPU machine)",
    ),
    Row(
        "TW_TEST_DTYPE",
        "tests",
        "`float32`",
        "the engine tests' precision (the exact-match tests expect `float32`)",
    ),
    Row(
        "TW_TEST_KAFKA_LONG_OUTAGE_S",
        "tests",
        "`40`",
        "length of the Kafka outage test's long outage",
    ),
)


def load_models() -> list[tuple[str, type[EnvSettings]]]:
    """The services' settings classes (imported here: ``shared`` does not import
    ``services`` otherwise)."""
    models: list[tuple[str, type[EnvSettings]]] = []
    for service, target in SERVICE_MODELS:
        module, name = target.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, EnvSettings), target
        models.append((service, cls))
    return models


def _choices(annotation: object) -> list[str]:
    """The values a ``Literal`` or enum annotation admits (``None`` of an optional left out)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [c for arg in get_args(annotation) for c in _choices(arg)]
    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(m.value) for m in annotation]
    return []


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(computed)"
    value = field.default
    if value is PydanticUndefined:
        return "**required**"
    if value is None:
        return "(unset)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _describe(field: FieldInfo) -> str:
    text = (field.description or "").strip()
    choices = _choices(field.annotation)
    if choices:
        one_of = "one of " + ", ".join(f"`{c}`" for c in choices)
        text = f"{text} ({one_of})" if text else one_of
    return text


def model_rows(models: list[tuple[str, type[EnvSettings]]] | None = None) -> list[Row]:
    """One row per variable. A setting every service reads as ``CommonSettings`` does is
    read by ``all``; where services read one variable with different defaults or meanings,
    the cells name each reader's."""
    models = load_models() if models is None else models
    order: list[str] = list(CommonSettings.model_fields)
    for _, cls in models:
        order += [f for f in cls.model_fields if f not in order]
    services = [service for service, _ in models]
    rows: list[Row] = []
    for name in order:
        groups: dict[tuple[str, str], list[str]] = {}
        for service, cls in models:
            field = cls.model_fields.get(name)
            if field is not None:
                groups.setdefault((_default(field), _describe(field)), []).append(service)
        readers = [s for group in groups.values() for s in group]
        if len(groups) == 1 and readers == services and name in CommonSettings.model_fields:
            where = ALL
        else:
            where = ", ".join(s for s in services if s in readers)
        by_default: dict[str, list[str]] = {}
        for (d, _), group in groups.items():
            by_default.setdefault(d, []).extend(group)
        if len(by_default) == 1:
            default = next(iter(by_default))
        else:
            default = "; ".join(f"{', '.join(g)}: {d}" for d, g in by_default.items())
        if len(groups) == 1:
            description = next(iter(groups))[1]
        else:
            description = "; ".join(f"{', '.join(g)}: {d}" for (_, d), g in groups.items() if d)
        rows.append(Row(CommonSettings.env_key(name), where, default, description))
    return rows


def all_rows() -> list[Row]:
    return model_rows() + list(SCRIPT_SETTINGS)


def _cell(text: str) -> str:
    """A table cell: pipes escaped, and angle brackets outside code spans (``<hostname>``
    would otherwise be read as an HTML tag and vanish)."""
    parts = text.replace("\n", " ").replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "\\<").replace(">", "\\>")
    return "`".join(parts)


def render(rows: list[Row] | None = None) -> str:
    """The markdown table (no markers), ending in a newline."""
    rows = all_rows() if rows is None else rows
    out = ["| variable | read by | default | what |", "|---|---|---|---|"]
    for r in rows:
        cells = (f"`{r.variable}`", r.where, r.default, r.description)
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def block(text: str) -> str:
    """What lies between the markers in ``text``; ValueError if they are missing."""
    start = text.find(BEGIN)
    end = text.find(END, start + 1)
    if start < 0 or end < 0:
        raise ValueError(f"the markers {BEGIN} and {END} are missing")
    return text[start + len(BEGIN) : end]


def with_table(text: str, table: str) -> str:
    """``text`` with the block between the markers replaced by ``table``."""
    old = block(text)
    start = text.index(BEGIN) + len(BEGIN)
    return text[:start] + "\n" + table + text[start + len(old) :]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shared.settings_doc", description=__doc__)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the settings document's block")
    g.add_argument("--check", action="store_true", help="exit 1 if the document's block is stale")
    p.add_argument("--doc", type=Path, default=SETTINGS_DOC)
    args = p.parse_args(argv)
    table = render()
    if not (args.write or args.check):
        sys.stdout.write(table)
        return 0
    text = args.doc.read_text()
    fresh = with_table(text, table)
    if args.check:
        if fresh != text:
            print(f"{args.doc}: the settings table is stale; run {p.prog} --write")
            return 1
        return 0
    if fresh != text:
        args.doc.write_text(fresh)
        print(f"rewrote the settings table in {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
