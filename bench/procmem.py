"""Peak resident memory of a process tree, by role, sampled from /proc (Linux)."""

from __future__ import annotations

import bisect
import os
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _cpu_ticks(pid: int) -> int:
    """utime + stime of one process (not its children: they are sampled themselves)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _rss_and_role(pid: int) -> tuple[int, str] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    rss = 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
            break
    if "java" in cmdline.split(" ", 1)[0]:
        role = "jvm"
    elif "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline or "pyspark/daemon" in cmdline:
        role = "python_workers"
    else:
        role = "python_driver"
    return rss, role


class PeakMemory(threading.Thread):
    """Samples the tree under ``root`` every ``interval`` seconds; ``peaks`` holds the peak sum per role.

    Roles: ``jvm`` (Spark's driver JVM, which runs the executors in local mode), ``python_driver``
    (the icesink process), ``python_workers`` (Spark's Python daemons and their workers: the tasks',
    and the helpers that plan a Python data source), ``total`` (the peak of the sum, not the sum of
    the peaks), and ``python_worker_max``: the peak of any one of those Python processes, which is
    what a task's memory bound concerns.
    """

    def __init__(self, root: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="peak-memory")
        self.root, self.interval = root, interval
        self.peaks: dict[str, int] = {
            "jvm": 0,
            "python_driver": 0,
            "python_workers": 0,
            "total": 0,
            "python_worker_max": 0,
        }
        self._halt = threading.Event()
        self._ticks: dict[int, int] = {}  # last CPU ticks seen per pid, exited processes included
        self.cpu_series: list[tuple[float, float]] = []  # (wall clock, CPU seconds so far)

    def sample(self) -> None:
        tree = _children()
        todo, seen = [self.root], set()
        sums = {"jvm": 0, "python_driver": 0, "python_workers": 0}
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            found = _rss_and_role(pid)
            if found:
                sums[found[1]] += found[0]
                if found[1] == "python_workers":
                    self.peaks["python_worker_max"] = max(self.peaks["python_worker_max"], found[0])
                self._ticks[pid] = max(self._ticks.get(pid, 0), _cpu_ticks(pid))
            todo.extend(tree.get(pid, []))
        for role, value in sums.items():
            self.peaks[role] = max(self.peaks[role], value)
        self.peaks["total"] = max(self.peaks["total"], sum(sums.values()))
        self.cpu_series.append((time.time(), self.cpu_seconds))

    def cpu_between(self, start: float, end: float) -> float | None:
        """CPU seconds used between two wall-clock times (nearest samples)."""
        if not self.cpu_series:
            return None
        times = [t for t, _ in self.cpu_series]
        i, j = bisect.bisect_left(times, start), bisect.bisect_left(times, end)
        i, j = min(i, len(times) - 1), min(j, len(times) - 1)
        return self.cpu_series[j][1] - self.cpu_series[i][1]

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the whole tree as last sampled (a process's last < interval is missed)."""
        return sum(self._ticks.values()) / _TICK

    def stop(self) -> dict[str, int]:
        self._halt.set()
        self.join(timeout=5)
        return dict(self.peaks)


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by ``root`` and its descendants, including reaped children.

    CPU time, unlike wall time, barely depends on what else runs on a shared machine: per-phase CPU
    seconds are the profile's steadier figure.
    """
    tree = _children()
    todo, seen, total = [root], set(), 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime are fields 14-17 (1-based); after the ")" they start at index 11
        total += sum(int(x) for x in fields[11:15])
        todo.extend(tree.get(pid, []))
    return total / _TICK
