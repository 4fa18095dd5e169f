"""``tokenwire bench e2e --profile cluster``: the pipeline on the cluster profile (three
Kafka brokers replicating every topic 3 times with min.insync.replicas=2, and a Redis
Cluster of three masters with a replica each, on sharded pub/sub) beside the single-node
stack, in the same run, on the same requests.

Each profile gets its own servers (started here with the project's infra scripts, on free
ports under the report folder; the single-node ones too, so that neither side shares a
server with anything else) and its own worker, batcher and edge on the one model. Rounds
alternate which profile goes first; each round drives ``concurrency`` closed-loop streams
through one stack's edge, then the same requests through the other's. Reported: each
profile's tokens/s and each service's CPU per token (the worker's engine process apart),
and the median of the per-round ratios of tokens/s with a distribution-free interval.

On one machine the cluster's extra brokers and Redis nodes share its cores with the
services: the ratio is the cost of replication (acks from two brokers, a replica's WAIT on
every token write, routing by slot), not what more machines would add.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from services.bench.cluster import Stack
from services.bench.drivers import closed_loop
from services.bench.e2e_bench import SERVICES, service_cpu, start_stack
from services.bench.servers import (
    Server,
    private_kafka_cluster,
    private_redis_cluster,
    private_server,
)
from services.bench.stats import median_interval, median_of
from services.bench.workload import Mix, Workload

PROFILES = ("single", "cluster")


@dataclass
class ProfileConfig:
    """The comparison's load."""

    concurrency: int = 16
    rounds: int = 5
    requests_per_stream: int = 3
    warmup_requests: int = 200
    workload: Workload = field(default_factory=Workload)


QUICK = ProfileConfig(
    concurrency=4,
    rounds=2,
    requests_per_stream=2,
    warmup_requests=16,
    workload=Workload(system_words=40, prompt_words=(4, 16), output_tokens=(4, 8)),
)


def servers(folder: Path) -> dict[str, tuple[Server, Server]]:
    """(Kafka, Redis) of each profile, not started."""
    return {
        "single": (
            private_server("kafka", folder / "single-kafka"),
            private_server("redis", folder / "single-redis"),
        ),
        "cluster": (
            private_kafka_cluster(folder / "cluster-kafka", brokers=3),
            private_redis_cluster(folder / "cluster-redis", shards=3),
        ),
    }


def profile_env(kafka: Server, redis: Server, cluster: bool) -> dict[str, str]:
    env = {**kafka.client_env, "TW_REDIS_URL": redis.url}
    if cluster:
        env["TW_REDIS_CLUSTER"] = "true"
    return env


async def _run(stack: Stack, bodies: list[dict[str, Any]], c: int, model: str) -> dict[str, Any]:
    cpu0 = service_cpu(stack)
    samples, wall, tput = await closed_loop(stack, bodies, c, model)
    cpu1 = service_cpu(stack)
    tokens = sum(x.tokens for x in samples)
    return {
        "tok_s": tput.full,
        "tok_s_whole": tput.whole,
        "requests": len(samples),
        "tokens": tokens,
        "wall_s": wall,
        "cpu_s": {k: cpu1[k] - cpu0[k] for k in SERVICES},
    }


async def measure(
    env: dict[str, str], model_dir: str, model_name: str, cfg: ProfileConfig, folder: Path
) -> dict[str, Any]:
    pairs = servers(folder)
    started: list[Server] = []
    stacks: dict[str, Stack] = {}
    t0 = time.monotonic()
    try:
        for kafka, redis in pairs.values():
            for srv in (kafka, redis):
                await asyncio.to_thread(srv.start)
                started.append(srv)
        for name, (kafka, redis) in pairs.items():
            penv = {**env, **profile_env(kafka, redis, name == "cluster")}
            stacks[name] = await start_stack(penv, model_dir, model_name, folder)
        for stack in stacks.values():
            await stack.wait_ready(within_s=300)
        ready_s = time.monotonic() - t0
        mix = Mix(cfg.workload)
        warm = [{**mix.body(), "max_tokens": 2} for _ in range(cfg.warmup_requests)]
        for stack in stacks.values():
            await closed_loop(stack, warm, 8, model_name)
        rounds = []
        n = cfg.requests_per_stream * cfg.concurrency
        for r in range(cfg.rounds):
            rmix = Mix(replace(cfg.workload, seed=cfg.workload.seed + r))
            bodies = [rmix.body() for _ in range(n)]
            order = PROFILES if r % 2 == 0 else PROFILES[::-1]
            row: dict[str, Any] = {"first": order[0]}
            for name in order:
                row[name] = await _run(stacks[name], bodies, cfg.concurrency, model_name)
            row["cluster_vs_single"] = row["cluster"]["tok_s"] / row["single"]["tok_s"]
            rounds.append(row)
            print(json.dumps({"round": r, **row}), flush=True)
    finally:
        for stack in stacks.values():
            stack.stop_all()
        for srv in reversed(started):
            await asyncio.to_thread(srv.stop)
    report: dict[str, Any] = {
        "model": model_dir,
        "config": asdict(cfg),
        "ready_s": ready_s,
        "rounds": rounds,
        "cluster_vs_single": median_of(rounds, "cluster_vs_single"),
        "cluster_vs_single_interval": median_interval([r["cluster_vs_single"] for r in rounds]),
    }
    for name in PROFILES:
        runs = [r[name] for r in rounds]
        tokens = sum(x["tokens"] for x in runs)
        report[name] = {
            "tok_s": median_of(runs, "tok_s"),
            "cpu_us_per_token": {
                k: sum(x["cpu_s"][k] for x in runs) * 1e6 / tokens for k in SERVICES
            },
        }
    return report


def print_table(report: dict[str, Any]) -> None:
    iv = report["cluster_vs_single_interval"]
    print(
        f"\ncluster profile vs single node, {report['config']['concurrency']} streams, "
        f"{len(report['rounds'])} rounds: tokens/s {report['cluster_vs_single']:.2f}x "
        f"({iv['coverage']:.0%} interval {iv['low']:.2f}-{iv['high']:.2f}); on one machine "
        "this is the cost of replication, not scaling"
    )
    print("| profile | tok/s | " + " | ".join(f"{k} µs CPU/token" for k in SERVICES) + " |")
    print("|---|---|" + "---|" * len(SERVICES))
    for name in PROFILES:
        p = report[name]
        cpu = " | ".join(f"{p['cpu_us_per_token'][k]:.0f}" for k in SERVICES)
        print(f"| {name} | {p['tok_s']:.0f} | {cpu} |")


def run(
    env: dict[str, str], model_dir: str, model_name: str, cfg: ProfileConfig, folder: Path
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(measure(env, model_dir, model_name, cfg, folder))
    (folder / "profiles.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    return report
