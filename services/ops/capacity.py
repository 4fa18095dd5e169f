"""The capacity model: how many of each part a target load needs, from measured costs.

Pure arithmetic on plain data (no I/O): ``tokenwire plan`` (:mod:`services.ops.plan`) reads
the costs file the benchmarks write and prints what :func:`plan` returns. Each count comes
with its formula and the inputs it used, so a reader can check it by hand.

The model, per part (``h`` is the headroom: the share of a measured capacity planned for):

- workers: a running stream gets one token per engine step, so at a step of ``S`` ms it
  gets at most ``1000 / S`` tokens/s; a target above that is refused. Otherwise a worker
  holds ``B`` streams (its ``max_running``), fewer if its loop cannot publish ``B x T``
  tokens/s within ``h`` of one core. The step time is the engine's at batch ``B``.
- batches-topic partitions: one per worker (a worker consumes the partitions its group
  assigns it; a worker without one idles).
- batchers: the request rate over what one batcher routes, times ``h``.
- requests-topic partitions: one per batcher (the batchers' group's unit of parallelism).
- edges and Redis shards: token events/s (one event per token per stream) over what one
  edge relays, and one Redis core appends and publishes, times ``h``.
- Kafka brokers: the replication factor at least; enough for the replicated record writes
  (a request record and, at worst, one batch record per request, each written to every
  replica) and for the partition replicas a broker holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

REPLICATION = 3  # the replication factor of every topic on a cluster


class PlanError(ValueError):
    """A target or a costs file the model refuses, with the reason."""


@dataclass(frozen=True)
class Target:
    """The load to plan for."""

    streams: int  # concurrent streams
    tokens_per_s: float  # per stream
    request_rate: float  # requests/s arriving
    step_ms: float  # the engine's step time at batch ``max_running``
    max_running: int = 256  # streams one worker runs at once
    headroom: float = 0.7
    replication: int = REPLICATION

    def check(self) -> None:
        """Refuse zero, negative and non-finite inputs, naming the first bad one."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value) or value <= 0:
                raise PlanError(f"{f.name} must be a positive number, not {value}")
        if self.headroom > 1:
            raise PlanError(f"headroom is a share of capacity, at most 1, not {self.headroom}")


@dataclass(frozen=True)
class Costs:
    """Measured per-part capacities (see ``services/ops/costs.json`` for their sources)."""

    edge_events_per_s: float  # token events one edge process relays per second
    batcher_requests_per_s: float  # requests one batcher routes per second
    redis_events_per_s: float  # events (log append + publish) one Redis core takes per second
    kafka_records_per_s: float  # request records one broker takes per second (acks=all)
    kafka_partitions_per_broker: float  # partition replicas one broker holds
    worker_cpu_us_per_token: float  # the worker loop's CPU per token it publishes

    @classmethod
    def from_values(cls, values: dict[str, float]) -> Costs:
        """The costs named in ``values`` (extra keys ignored); a missing, zero or negative
        one is refused by name."""
        missing = [f.name for f in fields(cls) if f.name not in values]
        if missing:
            raise PlanError(f"the costs file lacks {', '.join(missing)}")
        costs = cls(**{f.name: float(values[f.name]) for f in fields(cls)})
        for f in fields(cls):
            value = getattr(costs, f.name)
            if not math.isfinite(value) or value <= 0:
                raise PlanError(f"cost {f.name} must be a positive number, not {value}")
        return costs


@dataclass(frozen=True)
class Need:
    """How many of one part, the formula and the inputs it was computed from."""

    part: str
    count: int
    formula: str
    inputs: dict[str, float]


@dataclass(frozen=True)
class Plan:
    """What a target needs, part by part."""

    target: Target
    needs: tuple[Need, ...]

    def count(self, part: str) -> int:
        """The count of ``part`` (KeyError for a part the plan does not have)."""
        for need in self.needs:
            if need.part == part:
                return need.count
        raise KeyError(part)


def streams_per_worker(t: Target, c: Costs) -> tuple[int, dict[str, float]]:
    """Streams one worker serves at the target rate, and the inputs that decided it."""
    per_stream_max = 1000.0 / t.step_ms
    if per_stream_max < t.tokens_per_s:
        raise PlanError(
            f"the model cannot serve {t.tokens_per_s:g} tokens/s per stream: at a "
            f"{t.step_ms:g} ms step (batch {t.max_running}) one stream gets at most "
            f"{per_stream_max:.1f} tokens/s; plan a smaller batch with a faster step, a "
            "faster accelerator, or a lower rate per stream"
        )
    loop_bound = math.floor(t.headroom * 1e6 / (c.worker_cpu_us_per_token * t.tokens_per_s))
    if loop_bound < 1:
        raise PlanError(
            f"a worker's loop cannot publish {t.tokens_per_s:g} tokens/s for one stream at "
            f"{c.worker_cpu_us_per_token:g} us of CPU per token within headroom {t.headroom:g}"
        )
    return min(t.max_running, loop_bound), {
        "max_running": t.max_running,
        "step_ms": t.step_ms,
        "per_stream_max_tok_s": round(per_stream_max, 2),
        "worker_cpu_us_per_token": c.worker_cpu_us_per_token,
        "loop_bound_streams": loop_bound,
    }


def _ceil(x: float) -> int:
    # 1e-9 absorbs float noise: 3 x 0.1 / 0.3 must be 1, not 2.
    return max(1, math.ceil(x - 1e-9))


def plan(t: Target, c: Costs) -> Plan:
    """The parts ``t`` needs at the capacities ``c``; raises :class:`PlanError` for a target
    the model refuses."""
    t.check()
    h = t.headroom
    per_worker, worker_inputs = streams_per_worker(t, c)
    workers = _ceil(t.streams / per_worker)
    events = t.streams * t.tokens_per_s
    batchers = _ceil(t.request_rate / (c.batcher_requests_per_s * h))
    partitions = {"requests": batchers, "batches": workers}
    writes = t.replication * 2 * t.request_rate
    replicas = t.replication * (partitions["requests"] + partitions["batches"])
    brokers = max(
        t.replication,
        _ceil(writes / (c.kafka_records_per_s * h)),
        _ceil(replicas / c.kafka_partitions_per_broker),
    )
    needs = (
        Need(
            "workers",
            workers,
            "ceil(streams / min(max_running, floor(h x 1e6 / (worker_cpu_us_per_token x T))))",
            {"streams": t.streams, "tokens_per_s": t.tokens_per_s, "headroom": h}
            | worker_inputs
            | {"streams_per_worker": per_worker},
        ),
        Need(
            "batches_partitions",
            workers,
            "workers (one partition per worker)",
            {"workers": workers},
        ),
        Need(
            "batchers",
            batchers,
            "ceil(request_rate / (batcher_requests_per_s x h))",
            {
                "request_rate": t.request_rate,
                "batcher_requests_per_s": c.batcher_requests_per_s,
                "headroom": h,
            },
        ),
        Need(
            "requests_partitions",
            batchers,
            "batchers (one partition per batcher)",
            {"batchers": batchers},
        ),
        Need(
            "edges",
            _ceil(events / (c.edge_events_per_s * h)),
            "ceil(streams x T / (edge_events_per_s x h))",
            {"events_per_s": events, "edge_events_per_s": c.edge_events_per_s, "headroom": h},
        ),
        Need(
            "kafka_brokers",
            brokers,
            "max(RF, ceil(RF x 2 x request_rate / (kafka_records_per_s x h)), "
            "ceil(RF x partitions / kafka_partitions_per_broker))",
            {
                "replication": t.replication,
                "record_writes_per_s": writes,
                "kafka_records_per_s": c.kafka_records_per_s,
                "partition_replicas": replicas,
                "kafka_partitions_per_broker": c.kafka_partitions_per_broker,
                "headroom": h,
            },
        ),
        Need(
            "redis_shards",
            _ceil(events / (c.redis_events_per_s * h)),
            "ceil(streams x T / (redis_events_per_s x h))",
            {"events_per_s": events, "redis_events_per_s": c.redis_events_per_s, "headroom": h},
        ),
    )
    return Plan(t, needs)
