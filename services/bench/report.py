"""The end-to-end benchmark's report: per-level rounds summed up into ratios against the
baselines (medians of per-round ratios, with intervals), PNG plots and a printed table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from services.bench.stats import median_interval, median_of


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Add the baselines, the ratios at the top concurrency (with their intervals) and the
    low-load TTFT to a report whose levels are measured."""
    concurrencies = report["config"]["concurrencies"]
    rows = {row["concurrency"]: row for row in report["closed_loop"]}
    top_rounds = rows[max(concurrencies)]["rounds"]
    report["baselines"] = {
        "serial_generate_tok_s": median_of(top_rounds, "serial_generate_tok_s"),
        **{f"engine_alone_tok_s_c{c}": row["engine_alone_tok_s"] for c, row in rows.items()},
    }
    report["ratios"] = {
        "pipeline_vs_engine_alone": median_of(top_rounds, "vs_engine_alone"),
        "pipeline_vs_serial_generate": median_of(top_rounds, "vs_serial_generate"),
        # The same over whole runs, the drain with fewer streams included.
        "pipeline_vs_engine_alone_whole": median_of(top_rounds, "vs_engine_alone_whole"),
        "pipeline_vs_serial_generate_whole": median_of(top_rounds, "vs_serial_generate_whole"),
    }
    report["ratio_intervals"] = {
        "pipeline_vs_engine_alone": rows[max(concurrencies)]["vs_engine_alone_interval"],
        "pipeline_vs_serial_generate": median_interval(
            [r["vs_serial_generate"] for r in top_rounds]
        ),
    }
    report["low_load"] = _low_load(rows[min(concurrencies)]["rounds"], report["config"])
    return report


def _low_load(low: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    """The low-load probes' TTFT, over the lowest concurrency's rounds."""
    return {
        "concurrency": min(config["concurrencies"]),
        "requests_per_round": config["probe_requests"],
        "ttft_p50_ms": median_of(low, "probe_ttft_p50_ms"),
        "engine_alone_ttft_p50_ms": median_of(low, "probe_engine_ttft_p50_ms"),
        # Per request, paired: its TTFT through the pipeline minus the engine's own (its
        # prefill and first sample) on it; the median over every round's requests.
        "added_ttft_p50_ms": statistics.median(a for r in low for a in r["probe_added_ms"]),
        "added_ttft_p50_ms_by_round": [statistics.median(r["probe_added_ms"]) for r in low],
        # The unpaired figure: per round, the pipeline's p50 minus the engine's; median.
        "p50_difference_ms": statistics.median(
            r["probe_ttft_p50_ms"] - r["probe_engine_ttft_p50_ms"] for r in low
        ),
    }


# --- plots ---------------------------------------------------------------------------------
def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def plot(report: dict[str, Any], folder: Path) -> list[Path]:
    """Throughput vs concurrency, the TTFT distribution and latency vs offered load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [
        _plot_throughput(plt, report, folder / "throughput_vs_concurrency.png"),
        _plot_ttft_cdf(plt, report, folder / "ttft_cdf.png"),
        _plot_latency_vs_load(plt, report, folder / "latency_vs_load.png"),
    ]
    plt.close("all")
    return paths


def _plot_throughput(plt: Any, report: dict[str, Any], path: Path) -> Path:
    rows = report["closed_loop"]
    cs = [r["concurrency"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(cs, [r["tok_s"] for r in rows], "o-", label="tokenwire pipeline")
    ax.plot(
        cs,
        [report["baselines"][f"engine_alone_tok_s_c{c}"] for c in cs],
        "s--",
        label="engine alone",
    )
    ax.axhline(
        report["baselines"]["serial_generate_tok_s"],
        color="gray",
        ls=":",
        label="HF generate, one at a time",
    )
    ax.set(
        xlabel="concurrent streams",
        ylabel="tokens/s (all streams busy)",
        title="Throughput vs concurrency",
        xscale="log",
    )
    ax.legend()
    return _save(fig, path)


def _plot_ttft_cdf(plt: Any, report: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in report["closed_loop"]:
        cdf = r["ttft_cdf_ms"]
        ax.plot(
            cdf, [(i + 1) / len(cdf) for i in range(len(cdf))], label=f"{r['concurrency']} streams"
        )
    ax.set(
        xlabel="TTFT (ms)",
        ylabel="share of requests",
        title="Time to first token (CDF)",
        xscale="log",
    )
    ax.legend()
    return _save(fig, path)


def _plot_latency_vs_load(plt: Any, report: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ol = report["open_loop"]
    for q in ("p50", "p95", "p99"):
        ax.plot(
            [r["rate"] for r in ol], [r["e2e_ms"][q] for r in ol], "o-", label=f"end-to-end {q}"
        )
    ax.plot([r["rate"] for r in ol], [r["ttft_ms"]["p50"] for r in ol], "s--", label="TTFT p50")
    ax.set(
        xlabel="offered load (requests/s, Poisson)",
        ylabel="latency (ms)",
        title="Latency vs offered load",
    )
    ax.legend()
    return _save(fig, path)


# --- printed summary -----------------------------------------------------------------------
def print_table(report: dict[str, Any]) -> None:
    print(
        "\ntok/s while all streams are busy (the run with its drain: see the JSON)"
        "\n| streams | tok/s | engine alone tok/s | pipeline / engine | engine busy | req/s "
        "| TTFT p50/p95/p99 ms | ITL p50/p99 ms | e2e p50/p99 ms | prefix hits |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in report["closed_loop"]:
        t, i, e = r["ttft_ms"], r["itl_ms"], r["e2e_ms"]
        print(
            f"| {r['concurrency']} | {r['tok_s']:.0f} | {r['engine_alone_tok_s']:.0f} "
            f"| {r['vs_engine_alone']:.0%} | {r['engine_busy_share']:.0%} | {r['req_s']:.1f} "
            f"| {t['p50']:.0f} / {t['p95']:.0f} / {t['p99']:.0f} "
            f"| {i['p50']:.1f} / {i['p99']:.1f} | {e['p50']:.0f} / {e['p99']:.0f} "
            f"| {r['prefix_hit_rate']:.0%} |"
        )
    ra, b, s, lo = report["ratios"], report["baselines"], report["stages"], report["low_load"]
    intervals = report["ratio_intervals"]
    ia, ig = intervals["pipeline_vs_engine_alone"], intervals["pipeline_vs_serial_generate"]
    top = max(report["config"]["concurrencies"])
    print(
        f"\npipeline at {top} streams (median of per-round ratios, with a "
        f"{ia['coverage']:.0%} interval for it): "
        f"{ra['pipeline_vs_engine_alone']:.0%} of the engine alone "
        f"({ia['low']:.0%}–{ia['high']:.0%}), "
        f"{ra['pipeline_vs_serial_generate']:.1f}x HF generate one at a time "
        f"({ig['low']:.1f}–{ig['high']:.1f}x; "
        f"{b['serial_generate_tok_s']:.0f} tok/s); over whole runs, the drain included: "
        f"{ra['pipeline_vs_engine_alone_whole']:.0%} and "
        f"{ra['pipeline_vs_serial_generate_whole']:.1f}x"
    )
    print(
        f"low load ({lo['concurrency']} stream): TTFT p50 {lo['ttft_p50_ms']:.1f} ms, the engine's "
        f"own {lo['engine_alone_ttft_p50_ms']:.1f} ms; added per request (paired), median "
        f"{lo['added_ttft_p50_ms']:+.1f} ms (p50 difference {lo['p50_difference_ms']:+.1f} ms)"
    )
    print(
        f"stages (mean): {json.dumps({k: v for k, v in s.items() if k != 'batch_size_cumulative'})}"
    )
    cpu = next(r for r in report["closed_loop"] if r["concurrency"] == top)["cpu_us_per_token"]
    print(
        f"CPU per token at {top} streams (us): " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
    )
