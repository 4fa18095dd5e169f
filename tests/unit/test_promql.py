"""The metric names a dashboard's PromQL names, and the series a /metrics page offers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tests.promql import exposed_series, metric_names


def test_functions_labels_ranges_and_groupings_are_not_metric_names() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(tw_ttft_seconds_bucket{job="w",'
        'le!="+Inf"}[5m]))) / on (instance) group_left (worker) tw_worker_info offset 1m'
    )
    assert metric_names(expr) == {"tw_ttft_seconds_bucket", "tw_worker_info"}


def test_aggregations_with_trailing_clauses_keywords_and_numbers() -> None:
    expr = (
        "sum(rate(tw_a_total[$__rate_interval])) without (reason) / ignoring(x) "
        "sum(tw_b) > bool 1e3 and tw_c unless tw_d{x=~'a|b'} or vector(0)"
    )
    assert metric_names(expr) == {"tw_a_total", "tw_b", "tw_c", "tw_d"}


def test_a_label_value_or_string_never_counts_as_a_name() -> None:
    assert metric_names('label_replace(tw_up, "dst", "$1", "src", "(tw_fake).*")') == {"tw_up"}
    assert metric_names('{__name__="tw_x", job="a"}') == {"tw_x"}


def test_exposed_series_follow_each_metric_type() -> None:
    r = CollectorRegistry()
    Counter("tw_c", "c", ["reason"], registry=r)  # labelled, no child: declared only
    Gauge("tw_g", "g", registry=r)
    Histogram("tw_h_seconds", "h", registry=r)
    series = exposed_series(generate_latest(r).decode())
    assert {"tw_c_total", "tw_g", "tw_h_seconds_bucket", "tw_h_seconds_count"} <= series.keys()
    assert "tw_c" not in series  # a counter is queried with its _total
    assert "tw_g_bucket" not in series and "tw_h_seconds" not in series
    assert series["tw_h_seconds_sum"] == "tw_h_seconds"
