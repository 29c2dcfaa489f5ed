"""Peak resident memory of a process tree, by role, sampled from /proc (Linux)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


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
    (the icesink process), ``python_workers`` (Spark's Python daemon and its workers), and ``total``
    (the peak of the sum, not the sum of the peaks).
    """

    def __init__(self, root: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="peak-memory")
        self.root, self.interval = root, interval
        self.peaks: dict[str, int] = {"jvm": 0, "python_driver": 0, "python_workers": 0, "total": 0}
        self._halt = threading.Event()

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
            todo.extend(tree.get(pid, []))
        for role, value in sums.items():
            self.peaks[role] = max(self.peaks[role], value)
        self.peaks["total"] = max(self.peaks["total"], sum(sums.values()))

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self) -> dict[str, int]:
        self._halt.set()
        self.join(timeout=5)
        return dict(self.peaks)


_TICK = os.sysconf("SC_CLK_TCK")


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
