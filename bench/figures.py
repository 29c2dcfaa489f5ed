"""From per-batch commit times to the benchmark's figures: throughput, latency and freshness."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def warmup_batches(n: int) -> int:
    """Batches treated as warm-up: the first pays for the JVM's start (first Kafka read, first Python
    worker), the second still for much of its JIT compilation; with few batches only the first."""
    return 2 if n >= 5 else 1


def steady_rate(commits: Sequence[tuple[float, int]]) -> float | None:
    """Events per second between the end of the warm-up batches and the last full commit.

    A small last batch (the remainder, under half the median batch) is left out.
    """
    if len(commits) < 2:
        return None
    sizes = sorted(r for _, r in commits)
    median = sizes[len(sizes) // 2]
    usable = list(commits)
    if len(usable) > 2 and usable[-1][1] < median / 2:
        usable = usable[:-1]
    skip = min(warmup_batches(len(commits)), len(usable) - 1)
    span = usable[-1][0] - usable[skip - 1][0]
    records = sum(r for _, r in usable[skip:])
    return records / span if span > 0 else None


def freshness(
    record_times: dict[int, list[tuple[int, float]]],
    commits: Sequence[tuple[float, dict[int, int]]],
    since: float,
) -> tuple[list[float], int]:
    """Per event produced at or after ``since``: seconds from its Kafka timestamp to the commit that
    made it visible. ``commits`` are (commit time, next offset per partition). Returns the values and
    the number of such events that no commit covered."""
    ordered = sorted(commits, key=lambda c: c[0])
    values: list[float] = []
    missing = 0
    for partition, records in record_times.items():
        ends = []
        times = []
        best = -1
        for at, offsets in ordered:
            end = offsets.get(partition, -1)
            if end > best:  # offsets only grow; keep the first commit reaching each new end
                best = end
                ends.append(end)
                times.append(at)
        for offset, ts in records:
            if ts < since:
                continue
            i = bisect.bisect_right(ends, offset)
            if i == len(ends):
                missing += 1
            else:
                values.append(max(0.0, times[i] - ts))
    return values, missing


def summarise(values: Sequence[float]) -> dict[str, Any]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }
