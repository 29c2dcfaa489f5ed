"""Where a test run's CPU goes, by kind of process: the suite is CPU-bound on a 2-core machine, so its
time is cut by cutting CPU, and this says whose.

    python dev/cpu_by_process.py sample cpu.jsonl &   # every 5 s from /proc, until killed
    make test                                          # (or any command)
    python dev/cpu_by_process.py report cpu.jsonl      # CPU-minutes by kind, while pytest ran

A JVM and Spark's Python workers are counted with the Python process that started them ("jvm of
icesink-process": the Spark driver of an ``icesink`` process a test started; "jvm of sink-host": the
sink host's, tests/sink/host.py; "jvm of pytest-worker": a worker's reader Spark). The stack's servers
are named after their main class or binary. A process counts from the first sample that sees it; the
machine's own count (/proc/stat) in the report's second line has the rest.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
SERVERS = (
    "kafka.Kafka",
    "ConnectDistributed",
    "trino",
    "apicurio",
    "deploy.master",
    "deploy.worker",
    "CoarseGrainedExecutorBackend",
    "minio",
    "moto",
    "postgres",
)
SPARK = ("jvm of ", "workers of ")


def kind(cmdline: str) -> str:
    if "tests.sink.host" in cmdline:
        return "sink-host"
    if "dev/stack" in cmdline:
        return "dev-stack"
    if "-m service.cli" in cmdline or "bin/icesink" in cmdline:
        return "icesink-process"
    if "SparkSubmit" in cmdline:
        return "spark-jvm"
    if "pyspark" in cmdline and ("daemon" in cmdline or "worker" in cmdline):
        return "spark-workers"
    if "execnet" in cmdline or "import sys;exec(eval(sys.stdin.readline()))" in cmdline:
        return "pytest-worker"
    if "pytest" in cmdline:
        return "pytest"
    for server in SERVERS:
        if server.lower() in cmdline.lower():
            return server
    if "rest-catalog" in cmdline:
        return "rest-catalog"
    return "java-other" if "java" in cmdline else "other"


def _read(pid: int) -> tuple[float, int, str] | None:
    """CPU seconds, parent pid and command line of a process, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return None
    return (int(stat[11]) + int(stat[12])) / HZ, int(stat[1]), cmdline


def machine_busy() -> float:
    """CPU seconds this machine's processes and kernel used since boot (/proc/stat's user, nice,
    system, irq and softirq: not idle, iowait, or steal, the time the hypervisor gave other guests)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[i] for i in (0, 1, 2, 5, 6)) / HZ


def sample(out: Path, every: float = 5.0) -> None:
    kinds: dict[int, str] = {}
    last: dict[int, float] = {}
    totals: dict[str, float] = {}
    with out.open("a") as file:
        while True:
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                read = _read(pid)
                if read is None:
                    continue
                cpu, parent, cmdline = read
                if pid not in kinds:
                    found = kind(cmdline)
                    if found in ("spark-jvm", "spark-workers"):
                        owner = kinds.get(parent) or kind((_read(parent) or (0, 0, ""))[2])
                        for prefix in SPARK:
                            owner = owner.removeprefix(prefix)
                        found = ("jvm of " if found == "spark-jvm" else "workers of ") + owner
                    kinds[pid] = found
                    last[pid] = cpu  # what it used before it was first seen is not this run's
                totals[kinds[pid]] = totals.get(kinds[pid], 0.0) + cpu - last[pid]
                last[pid] = cpu
            file.write(json.dumps({"t": time.time(), "cpu_s": totals, "machine_s": machine_busy()}) + "\n")
            file.flush()
            time.sleep(every)


def report(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    ran = [r for r in rows if r["cpu_s"].get("pytest-worker", 0) + r["cpu_s"].get("pytest", 0) > 0]
    if len(ran) < 2:
        sys.exit(f"{path}: no two samples while pytest ran")
    first, end = ran[0], ran[-1]
    minutes = (end["t"] - first["t"]) / 60
    used = {k: (v - first["cpu_s"].get(k, 0.0)) / 60 for k, v in end["cpu_s"].items()}
    total = sum(used.values())
    cores = os.cpu_count() or 1
    print(
        f"{minutes:.1f} min: {total:.1f} CPU-min used of {cores * minutes:.1f} ({total / (cores * minutes):.0%})"
        " by the processes sampled"
    )
    if "machine_s" in first and "machine_s" in end:
        # A process is counted from the first sample that sees it to the last: what it used before (a
        # JVM's start, all of a process that lived between two samples) and after, and the kernel's own
        # work, only the machine's count has.
        machine = (end["machine_s"] - first["machine_s"]) / 60
        print(
            f"{machine:.1f} CPU-min used by the machine ({machine / (cores * minutes):.0%}): "
            f"{machine - total:.1f} unattributed (before a process's first sample or after its last)"
        )
    for name, value in sorted(used.items(), key=lambda item: -item[1]):
        if value >= 0.05:
            print(f"{value:7.1f}  {name}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sample", "report"):
        sys.exit(__doc__)
    (sample if sys.argv[1] == "sample" else report)(Path(sys.argv[2]))
