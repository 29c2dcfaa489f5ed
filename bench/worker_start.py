"""`python -m bench.worker_start --idle 80`: what a Python worker of the sink's Spark costs to start,
forked from PySpark's daemon against icesink's (``service.pydaemon``), side by side in one run.

Each daemon gets a local[2] session of its own (one process each, one after the other). A job of two
tasks imports what a batch's tasks import; then the same job after ``--idle`` seconds, over the minute
after which Spark stops idle workers, so a new worker may run it (Spark's monitor looks every 10 s:
the workers that ran each job are printed by process id). Printed per job: its seconds, and each
worker's process id and CPU seconds so far (a worker forked from icesink's daemon starts with the
modules loaded; one from PySpark's imports them on its first task).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

from service.pydaemon import TASK_MODULES

DAEMONS = {"pyspark": "pyspark.daemon", "icesink": "service.pydaemon"}


def _task(modules: tuple[str, ...], _: Iterable[int]) -> Iterator[tuple[int, float]]:
    import importlib
    import resource

    for name in modules:
        importlib.import_module(name)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    yield os.getpid(), round(usage.ru_utime + usage.ru_stime, 2)


def _one(daemon: str, idle: float, jobs: int) -> list[dict[str, Any]]:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMONS[daemon])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = []
    try:
        for job in range(jobs):
            if job:
                time.sleep(idle)
            started = time.monotonic()
            task = partial(_task, TASK_MODULES)  # what a batch's tasks import
            workers = spark.sparkContext.parallelize(range(2), 2).mapPartitions(task).collect()
            out.append({"job": job, "seconds": round(time.monotonic() - started, 2), "workers": workers})
    finally:
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--idle", type=float, default=80, help="seconds between two jobs (default 80)")
    parser.add_argument("--jobs", type=int, default=3, help="jobs per daemon (default 3)")
    parser.add_argument("--only", choices=sorted(DAEMONS), help=argparse.SUPPRESS)  # one daemon, in a child
    args = parser.parse_args()
    if args.only:
        print(json.dumps(_one(args.only, args.idle, args.jobs)))
        return
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    for daemon in DAEMONS:
        print(f"{daemon}'s daemon ({DAEMONS[daemon]}), {args.jobs} jobs {args.idle:.0f} s apart", flush=True)
        child = [sys.executable, "-m", "bench.worker_start", "--only", daemon]
        child += ["--idle", str(args.idle), "--jobs", str(args.jobs)]
        done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"{daemon}: exit {done.returncode}\n{done.stderr[-3000:]}")
        for job in json.loads(done.stdout.strip().splitlines()[-1]):
            workers = ", ".join(f"pid {pid} {cpu:.2f} CPU-s" for pid, cpu in job["workers"])
            print(f"  job {job['job']}: {job['seconds']:.2f} s; workers: {workers}")


if __name__ == "__main__":
    main()
