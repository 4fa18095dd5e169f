"""One row per scenario, printed as a table or as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import orjson

from services.chaos.accounting import Outcome, reasons

COLUMNS = (
    ("scenario", "scenario"),
    ("requests", "requests"),
    ("completed", "completed"),
    ("lost", "lost"),
    ("duplicated", "duplicated"),
    ("exits", "process exits"),
    ("longest_stall_s", "longest stall"),
)


@dataclass
class Row:
    """What one scenario did to the requests it sent. ``exits`` leaves out the one exit a
    scenario causes on purpose (the SIGKILL of ``worker-kill`` and ``edge-kill``)."""

    scenario: str
    requests: int
    completed: int
    lost: int
    duplicated: int
    exits: int
    longest_stall_s: float
    retries: int = 0
    recovered: bool = True  # the stack was whole again after the scenario
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """The target: nothing lost, nothing twice, no process exit (and a stack that
        serves again afterwards)."""
        return self.lost == 0 and self.duplicated == 0 and self.exits == 0 and self.recovered


def row_of(scenario: str, outcomes: Sequence[Outcome], exits: int, notes: Sequence[str]) -> Row:
    completed = sum(o.completed for o in outcomes)
    return Row(
        scenario=scenario,
        requests=len(outcomes),
        completed=completed,
        lost=len(outcomes) - completed,
        duplicated=sum(o.duplicated for o in outcomes),
        exits=exits,
        longest_stall_s=round(max((o.stall_s for o in outcomes), default=0.0), 2),
        retries=sum(o.retries for o in outcomes),
        notes=[*notes, *reasons(outcomes)],
    )


def _cell(row: Row, key: str) -> str:
    if key == "longest_stall_s":
        return f"{row.longest_stall_s:.1f} s"
    return str(getattr(row, key))


def render_table(rows: Sequence[Row]) -> str:
    """A plain-text table, then each row's notes (refusals retried, what was lost)."""
    cells = [[title for _, title in COLUMNS]]
    cells += [[_cell(r, key) for key, _ in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]

    def line(values: list[str]) -> str:
        first = values[0].ljust(widths[0])
        rest = [v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in cells[1:]]
    notes = [
        f"{r.scenario}: {note}"
        for r in rows
        for note in ([f"{r.retries} refusals retried"] if r.retries else []) + r.notes
    ]
    return "\n".join([*out, "", *notes] if notes else out)


def to_json(rows: Sequence[Row]) -> str:
    return orjson.dumps([asdict(r) for r in rows], option=orjson.OPT_INDENT_2).decode()
