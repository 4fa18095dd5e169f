"""The costs file: per-token and per-request costs the benchmarks measure, which
``tokenwire plan`` reads.

A JSON object, one entry per cost: ``{"value", "unit", "source", "measured", "host",
"note"}``; ``source`` is the command that measured it and ``measured`` its date. The
checked-in default, ``costs.json`` beside this module, holds figures measured on this
project's machines. A benchmark run with ``--costs PATH`` merges what it measured into
``PATH`` (starting from the default when ``PATH`` does not exist yet, so the file is always
complete), leaving the other entries as they were.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_COSTS = Path(__file__).with_name("costs.json")


@dataclass(frozen=True)
class Cost:
    """One measured figure with where it came from."""

    value: float
    unit: str
    source: str  # the command that measured it
    measured: str = ""  # its date, YYYY-MM-DD
    host: str = ""
    note: str = ""


def measured(value: float, unit: str, note: str = "", source: str = "") -> Cost:
    """A cost measured now by this process's command (or ``source``), on this host."""
    return Cost(
        value=round(value, 6),
        unit=unit,
        source=source or invocation(),
        measured=datetime.date.today().isoformat(),
        host=f"{os.cpu_count()} CPUs",
        note=note,
    )


def invocation() -> str:
    """The command line this process runs, as ``tokenwire ...``."""
    return shlex.join(["tokenwire", *sys.argv[1:]])


def read_costs(path: Path = DEFAULT_COSTS) -> dict[str, Cost]:
    """The entries of a costs file."""
    raw = json.loads(path.read_text())
    return {name: Cost(**entry) for name, entry in raw.items()}


def merge_costs(path: Path, new: dict[str, Cost]) -> dict[str, Cost]:
    """Write ``new`` into the costs file at ``path`` (started from the default when it does
    not exist), replacing entries of the same names; returns the merged entries."""
    base = path if path.exists() else DEFAULT_COSTS
    merged = (read_costs(base) if base.exists() else {}) | new
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({k: asdict(v) for k, v in sorted(merged.items())}, indent=2) + "\n")
    tmp.replace(path)  # whole or not at all: a reader never sees half a file
    print(f"merged {', '.join(sorted(new))} into {path}")
    return merged


def values(costs: dict[str, Cost]) -> dict[str, float]:
    """Name → value, what the capacity model reads."""
    return {name: c.value for name, c in costs.items()}


def add_costs_option(p: argparse.ArgumentParser, names: str) -> None:
    """A benchmark's ``--costs PATH``: merge the figures ``names`` says into that file."""
    p.add_argument(
        "--costs",
        default="",
        metavar="PATH",
        help=f"merge {names} into this costs file (read by `tokenwire plan`), "
        "e.g. reports/costs.json",
    )
