"""CPU seconds a local process has used, from ``/proc`` (Linux): what the benchmarks divide
by the events, tokens or requests a service handled to get its CPU cost per unit."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # the fields after the command's name


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` (its threads, not its children)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / _TICK


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(_stat(int(entry.name))[1])
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def tree_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds of ``pids`` together, skipping any that exited."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue
    return total
