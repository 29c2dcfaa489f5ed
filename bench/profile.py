"""Where a batch's time goes: `python -m bench.profile [--events N --batch B]`.

Runs the real sink (``service.job.SinkJob``) in this process on the standard workload with
``--until-caught-up`` semantics, and times every Spark action the batch path triggers (each
``collect``/``save`` is one Spark job, labelled by the function and line that started it), the
Iceberg + txnlog commit, and the gap between batches (Spark's own micro-batch planning and
checkpointing). Wall time and CPU time (this process, the JVM and its Python workers) per phase;
CPU is the steadier figure on a shared machine. The first ``--warmup`` batches are left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench.procmem import tree_cpu_seconds
from bench.sink import sink_config, unique
from bench.stack import load_stack
from bench.workload import Workload, ensure_topic, produce


class Phases:
    def __init__(self) -> None:
        self.batch = 0
        self.samples: dict[str, list[tuple[int, float, float]]] = defaultdict(list)

    def timed(self, label: Callable[[], str], fn: Callable[..., Any]) -> Callable[..., Any]:
        me = os.getpid()

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = label()
            cpu, started = tree_cpu_seconds(me), time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.samples[name].append(
                    (self.batch, time.monotonic() - started, tree_cpu_seconds(me) - cpu)
                )

        return wrapper


def _label(text: str) -> Callable[[], str]:
    return lambda: text


def _caller(depth: int = 2) -> str:
    frame = sys._getframe(depth)
    while frame is not None and "pyspark" in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    where = os.path.relpath(frame.f_code.co_filename)
    return f"spark job from {frame.f_code.co_name} ({where}:{frame.f_lineno})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("--events", type=int, default=60_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--mode", choices=["upsert", "append"], default="upsert")
    p.add_argument("--warmup", type=int, default=2, help="batches left out of the figures")
    p.add_argument("--decoder", choices=["auto", "spark"], default="auto", help="source.decoder")
    args = p.parse_args(argv)

    from pyspark.rdd import RDD
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.readwriter import DataFrameWriter

    from service.commit.committer import Committer
    from service.config import parse_config
    from service.job import SinkJob

    stack = load_stack()
    workload = Workload(keys=max(args.events // 5, 100))
    workload.generate(args.events)
    topic = unique("bench_prof")
    ensure_topic(stack.kafka, topic, 2)
    produce(stack.kafka, topic, workload.events)
    name = unique("bench_prof")
    extra = {"source": {"decoder": args.decoder}}
    config = parse_config(sink_config(stack, name, topic, f"{name}.t", args.mode, args.batch, 1, extra=extra))

    phases = Phases()
    # The methods are wrapped in place, for this process only.
    DataFrame.collect = phases.timed(lambda: _caller(3), DataFrame.collect)  # type: ignore[method-assign]
    RDD.collect = phases.timed(lambda: _caller(3), RDD.collect)
    DataFrameWriter.save = phases.timed(lambda: _caller(3), DataFrameWriter.save)  # type: ignore[method-assign]
    commit = "commit: txnlog precommit, Iceberg snapshot, txnlog commit"
    Committer.commit = phases.timed(lambda: commit, Committer.commit)  # type: ignore[method-assign]
    import service.pipeline.table as table_module

    for fn in ("decode", "latest_per_key"):  # building (and analysing) the batch's query plan
        setattr(
            table_module, fn, phases.timed(_label(f"driver: build the {fn} plan"), getattr(table_module, fn))
        )
    import service.data.arrow_job as arrow_module

    run_arrow = arrow_module.run

    def arrow_run(*args: Any, **kwargs: Any) -> Any:
        """The Arrow path's one job, and inside its tasks (summed over the tasks, CPU of the workers)."""
        batch = run_arrow(*args, **kwargs)
        for phase, seconds in batch.task_seconds.items():
            what = {
                "read": "Kafka read",
                "decode": "decode + last change per key",
                "write": "Parquet + upload",
            }
            label = f"  in the tasks: {what.get(phase, phase)}"
            phases.samples[label].append((phases.batch, seconds, seconds))
        return batch

    arrow_module.run = arrow_run
    job = SinkJob(config)
    job.catalog.load_table = phases.timed(lambda: "catalog: load_table", job.catalog.load_table)  # type: ignore[method-assign]
    inner = job._on_batch
    bounds: list[tuple[float, float]] = []

    def on_batch(records: Any, batch_id: int) -> None:
        phases.batch += 1
        started = time.monotonic()
        try:
            inner(records, batch_id)
        finally:
            bounds.append((started, time.monotonic()))

    job._on_batch = on_batch  # type: ignore[method-assign, assignment]
    started = time.monotonic()
    job.run(until_caught_up=True)
    total = time.monotonic() - started

    keep = [i for i in range(1, len(bounds) + 1) if i > args.warmup]
    gaps = [bounds[i - 1][0] - bounds[i - 2][1] for i in keep if i >= 2]
    batch_wall = [bounds[i - 1][1] - bounds[i - 1][0] for i in keep]
    print(f"\n{len(bounds)} batches of up to {args.batch:,} events in {total:.1f}s; load {os.getloadavg()}")
    print(f"figures per batch, medians over batches {args.warmup + 1}..{len(bounds)}:")
    print(f"  {'phase':<92} {'wall s':>7} {'cpu s':>7}")
    for label, rows in sorted(phases.samples.items(), key=lambda kv: -sum(r[1] for r in kv[1])):
        kept = [r for r in rows if r[0] > args.warmup]
        if not kept:
            continue
        wall = statistics.median(r[1] for r in kept)
        cpu = statistics.median(r[2] for r in kept)
        per = len(kept) / max(1, len(keep))
        suffix = f" (x{per:.0f})" if per > 1.01 else ""
        print(f"  {label[:90] + suffix:<92} {wall:7.2f} {cpu:7.2f}")
    if batch_wall:
        print(f"  {'whole batch (foreachBatch)':<92} {statistics.median(batch_wall):7.2f}")
    if gaps:
        print(
            f"  {'between batches (Spark planning, offsets, checkpoint)':<92} {statistics.median(gaps):7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
