"""``tokenwire plan``: the workers, batchers, edges, partitions, Kafka brokers and Redis
shards a target load needs, from the costs file the benchmarks write (the arithmetic:
:mod:`services.ops.capacity`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TypeAlias

from services.ops.capacity import Costs, Plan, Target, plan
from services.ops.costs import DEFAULT_COSTS, read_costs, values

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _number(v: float) -> str:
    if float(v).is_integer() or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def render_table(p: Plan, costs_path: Path) -> str:
    """The plan as a Markdown table: part, count, formula, inputs."""
    t = p.target
    lines = [
        f"target: {t.streams:,} streams x {t.tokens_per_s:g} tokens/s, "
        f"{t.request_rate:,g} requests/s, step {t.step_ms:g} ms at batch {t.max_running}, "
        f"headroom {t.headroom:g}, replication {t.replication} (costs: {costs_path})",
        "",
        "| part | count | formula | inputs |",
        "|---|---|---|---|",
    ]
    for n in p.needs:
        inputs = ", ".join(f"{k}={_number(v)}" for k, v in n.inputs.items())
        lines.append(f"| {n.part} | {n.count:,} | {n.formula} | {inputs} |")
    return "\n".join(lines)


def to_json(p: Plan, costs_path: Path) -> str:
    return json.dumps(
        {
            "target": asdict(p.target),
            "costs_file": str(costs_path),
            "needs": {n.part: asdict(n) for n in p.needs},
        },
        indent=2,
    )


def cmd_plan(args: argparse.Namespace) -> None:
    path = Path(args.costs)
    try:
        costs = Costs.from_values(values(read_costs(path)))
        target = Target(
            streams=args.streams,
            tokens_per_s=args.tokens_per_s,
            request_rate=args.request_rate,
            step_ms=args.step_ms,
            max_running=args.max_running,
            headroom=args.headroom,
        )
        result = plan(target, costs)
    except (OSError, ValueError, TypeError) as exc:  # PlanError is a ValueError
        sys.exit(f"tokenwire plan: {exc}")
    print(to_json(result, path) if args.json else render_table(result, path))


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "plan",
        help="workers, batchers, edges, partitions, brokers and Redis shards for a target load",
        description=__doc__,
    )
    p.add_argument("--streams", type=int, required=True, help="concurrent streams")
    p.add_argument(
        "--tokens-per-s", type=float, required=True, help="tokens per second of each stream"
    )
    p.add_argument("--request-rate", type=float, required=True, help="requests per second")
    p.add_argument(
        "--step-ms",
        type=float,
        required=True,
        help="the engine's step time (ms) at batch --max-running",
    )
    p.add_argument(
        "--max-running", type=int, default=256, help="streams one worker runs (default: 256)"
    )
    p.add_argument(
        "--costs",
        default=str(DEFAULT_COSTS),
        help="the costs file the benchmarks write (default: the checked-in figures)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=0.7,
        help="share of each measured capacity to plan for (default: 0.7)",
    )
    p.add_argument("--json", action="store_true", help="JSON, not a table")
    p.set_defaults(fn=cmd_plan)
