"""Which metrics a Grafana dashboard's PromQL queries name, and which series names a
Prometheus exposition offers: enough to check that a dashboard only queries metrics that
exist, without a Prometheus server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_NAME_MATCHER = re.compile(r"""__name__\s*=\s*["'`]([A-Za-z_:][A-Za-z0-9_:]*)["'`]""")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")  # Grafana's $__rate_interval, ${job}
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2", "start", "end",
}  # fmt: skip

# The series names each metric type exposes (a counter's family name lacks its _total).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: those of ``__name__="..."`` matchers,
    and what is left of it once strings, template variables, label matchers, ranges,
    grouping clauses, function and aggregation calls, keywords and numbers are taken
    out."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _VARIABLE.sub("", _STRING.sub('""', expr))
    text = _GROUPING.sub(" ", _RANGE.sub(" ", _MATCHERS.sub(" ", text)))
    for m in _NAME.finditer(text):
        name, rest = m.group(), text[m.end() :].lstrip()
        if rest.startswith("(") or name.lower() in _KEYWORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(name)
    return names


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def dashboard_queries(folder: Path) -> dict[str, set[str]]:
    """Every ``expr`` of every dashboard JSON under ``folder`` (panels, rows, templating,
    annotations alike), with the metric names it selects."""
    out: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.json")):
        for expr in _exprs(json.loads(path.read_text())):
            out[expr] = metric_names(expr)
    return out


def exposed_series(text: str) -> dict[str, str]:
    """Series name → its metric family, for every series a /metrics page offers: those it
    has samples of, and those its declared families would have (a labelled metric with no
    child yet is declared without samples)."""
    out: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            out[family.name + suffix] = family.name
        for sample in family.samples:
            out[sample.name] = family.name
    return out
