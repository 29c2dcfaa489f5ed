"""The side-by-side table (stdout), the JSON file and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _f(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:,.0f}"


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1000:.1f}"


def table(results: dict[str, Any]) -> str:
    head = (
        f"{'configuration':<22} {'events':>9} {'events/s':>10} {'MB/s':>6} {'cold ev/s':>9} "
        f"{'batch p50/p99 s':>16} {'commit p50/p99 s':>17} {'fresh p50/p99 s':>16} "
        f"{'data/del files':>14} {'mem jvm/py/wrk(1) MiB':>25} {'cpu µs/ev':>9}"
    )
    lines = [head, "-" * len(head)]
    for name, r in results["runs"].items():
        t = r.get("throughput", {})
        f = r.get("freshness", {})
        mem = r.get("memory", {})
        batch = t.get("batch_s", {})
        commit = t.get("commit_s", {})
        fresh = f.get("freshness_s", {})
        files = f"{_f(t.get('data_files'))}/{_f(t.get('delete_files'))}" if "data_files" in t else "-"
        memory = (
            f"{_mib(mem.get('jvm'))}/{_mib(mem.get('python_driver'))}/{_mib(mem.get('python_workers'))}"
            f"({_mib(mem.get('python_worker_max'))})"
            if mem
            else "-"
        )
        lines.append(
            f"{name:<22} {_f(t.get('events')):>9} {_f(t.get('events_per_s'), 0):>10} "
            f"{_f(t.get('mb_per_s'), 2):>6} {_f(t.get('cold_events_per_s'), 0):>9} "
            f"{_f(batch.get('p50'), 2) + '/' + _f(batch.get('p99'), 2):>16} "
            f"{_f(commit.get('p50'), 2) + '/' + _f(commit.get('p99'), 2):>17} "
            f"{_f(fresh.get('p50'), 2) + '/' + _f(fresh.get('p99'), 2):>16} "
            f"{files:>14} {memory:>25} {_us(t.get('cpu_ms_per_event')):>9}"
        )
    for name, r in results.get("ratios", {}).items():
        lines.append(f"{name}: {r}")
    read = results.get("read_side")
    if read:
        lines.append("")
        lines.append(
            f"read side ({read['commits']} commits of {read['events_per_commit']} events, "
            f"{read['before']['rows']:,} rows): "
        )
        for stage in ("before", "after"):
            s = read[stage]
            lines.append(
                f"  {stage:<6} compaction: Spark {s['spark_s']:.2f}s, DuckDB {s['duckdb_s']:.2f}s "
                f"({s['data_files']} data + {s['delete_files']} delete files)"
            )
        lines.append(f"  compaction took {read['compaction_s']:.1f}s")
    trino = results.get("trino_partition")
    if trino:
        lines.append("")
        lines.extend(trino_partition_table(trino))
    if results.get("soak"):
        from bench import soak

        lines.append("")
        lines.extend(soak.lines(results["soak"]))
    lines.append("")
    lines.append(f"load average at start {results['load_start']}, at end {results['load_end']}")
    return "\n".join(lines)


def trino_partition_table(trino: dict[str, Any]) -> list[str]:
    """Trino's scan of the partition predicate, one line per table."""
    head = (
        f"{'table':<18} {'row filter':>10} {'query s':>8} {'scan wall s':>11} {'scan cpu s':>10} "
        f"{'splits':>6} {'input rows':>10} {'input MiB':>9} {'after deletes':>13} {'deletes applied':>15}"
    )
    lines = [
        f"Trino, {trino['predicate']} ({trino['commits']} commits of {trino['events_per_commit']} events, "
        f"{trino['live_rows']:,} rows; medians of 5 queries):",
        head,
        "-" * len(head),
    ]
    for label, t in trino["tables"].items():
        deletes = f"{t['deletes_applied_files']} files/{t['deletes_applied_rows']:,}"
        lines.append(
            f"{label:<18} {'kept' if t['filter_kept'] else 'none':>10} {t['elapsed_s']:>8.3f} "
            f"{t['scan_wall_s']:>11.3f} {t['scan_cpu_s']:>10.3f} {t['splits']:>6} {t['input_rows']:>10,} "
            f"{t['input_bytes'] / 2**20:>9.2f} {t['rows_after_deletes']:>13,} {deletes:>15}"
        )
    lines.append(f"  compaction took {trino['compaction_s']:.1f}s")
    return lines


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, default=str))


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    names = [n for n, r in runs.items() if r.get("throughput", {}).get("events_per_s")]
    fresh = [
        n for n, r in runs.items() if r.get("freshness", {}).get("freshness_s", {}).get("p50") is not None
    ]
    fig, axes = plt.subplots(1, 2 if fresh else 1, figsize=(13 if fresh else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    values = [runs[n]["throughput"]["events_per_s"] for n in names]
    bars = ax.barh(names, values, color=["#1f77b4" if n.startswith("icesink") else "#999999" for n in names])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
    ax.set_xlabel("events/s (steady, after the warm-up batches)")
    ax.set_title("throughput")
    ax.invert_yaxis()
    if fresh:
        ax = axes[0][1]
        p50 = [runs[n]["freshness"]["freshness_s"]["p50"] for n in fresh]
        p99 = [runs[n]["freshness"]["freshness_s"]["p99"] for n in fresh]
        y = range(len(fresh))
        ax.barh([i + 0.2 for i in y], p50, height=0.4, label="p50", color="#2ca02c")
        ax.barh([i - 0.2 for i in y], p99, height=0.4, label="p99", color="#d62728")
        ax.set_yticks(list(y), fresh)
        rate = results["params"].get("freshness_rate")
        period = results["params"].get("commit_period_s")
        ax.axvline(2 * period, color="black", linestyle="--", linewidth=1, label="2 x commit period")
        ax.set_xlabel("seconds from produce to committed")
        ax.set_title(f"freshness at {rate:,} events/s")
        ax.legend(fontsize=8)
        ax.invert_yaxis()
    load = results["load_start"]
    fig.suptitle(
        f"icesink bench ({results['params']['size']}, {results['machine']['nproc']} cores, load {load[0]:.1f})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
