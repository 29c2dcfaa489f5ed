"""The stack's Spark standalone cluster (dev/stack: a master and two 1-core workers started with a bare
environment), as the tests see it: the sink settings that run a sink there, and what the master and
the workers report about an application (its executors, where they ran, their processes)."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.spark_jvm import LEAN_JVM, driver_java_options

WORKERS = 2  # dev/stack's
REPO = Path(__file__).resolve().parent.parent
RUN = Path(os.environ.get("ICESINK_RUN_DIR") or REPO / ".cache" / "run")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


@dataclass(frozen=True)
class SparkCluster:
    master: str  # spark://127.0.0.1:P
    ui: str  # the master's web UI: http://127.0.0.1:P

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = _get(f"{self.ui}/json/")
        return state

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def spark_settings(self) -> dict[str, Any]:
        """A sink's ``spark`` section for this cluster. The driver listens on loopback (left to itself
        it picks the host's first address); the executors are small enough for a 1 GB worker."""
        return {
            "master": self.master,
            "conf": {
                "spark.driver.memory": "1g",
                "spark.driver.extraJavaOptions": driver_java_options(),
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "512m",
                # the executors' JVMs start the way the tests' drivers do
                "spark.executor.extraJavaOptions": LEAN_JVM,
            },
        }

    def run(self, sink: Any) -> Any:
        """``sink`` (tests/sink/conftest.py's Sink) with its Spark on this cluster."""
        sink.config["spark"] = self.spark_settings()
        return sink

    def executors(self, app_id: str) -> dict[str, list[dict[str, Any]]]:
        """The executors of ``app_id`` each worker ran or runs, by the worker's id."""
        found: dict[str, list[dict[str, Any]]] = {}
        for worker in self.state()["workers"]:
            if worker["state"] != "ALIVE":
                continue
            info = _get(f"{worker['webuiaddress']}/json/")
            ran = [e for e in info["executors"] + info["finishedexecutors"] if e["appid"] == app_id]
            found[worker["id"]] = ran
        return found

    def executor_pids(self, app_id: str) -> dict[str, int]:
        """The executor JVMs of ``app_id`` running on this machine: executor id → pid."""
        pids = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv and app_id in argv:
                pids[argv[argv.index("--executor-id") + 1]] = int(entry.name)
        return pids


@dataclass(frozen=True)
class ExecutorLog:
    """An executor's stderr in its worker's directory (dev/stack's workers: spark-worker-<n>/apps)."""

    worker: int  # dev/stack's worker number
    executor: str  # the executor's id in its application
    path: Path

    def lines(self) -> list[str]:
        return self.path.read_text(errors="replace").splitlines()

    def tasks_in_flight(self) -> list[tuple[str, str]]:
        """The (task, TID) pairs the executor started and has not finished: ("3.0 in stage 12.0", "31")."""
        started: dict[str, str] = {}
        ended: set[str] = set()
        for line in self.lines():
            if match := re.search(r"Running task (\S+ in stage \S+) \(TID (\d+)\)", line):
                started[match[2]] = match[1]
            elif match := re.search(r"(?:Finished|Exception in) task \S+ in stage \S+ \(TID (\d+)\)", line):
                ended.add(match[1])
        return [(task, tid) for tid, task in started.items() if tid not in ended]


def tasks_by_worker(app_id: str) -> dict[int, int]:
    """How many tasks ``app_id``'s executors started on each worker (from their logs)."""
    counts: dict[int, int] = {}
    for log in executor_logs(app_id):
        started = sum("Running task " in line for line in log.lines())
        counts[log.worker] = counts.get(log.worker, 0) + started
    return counts


def executor_logs(app_id: str) -> list[ExecutorLog]:
    """The stderr files of ``app_id``'s executors, on every worker of the stack."""
    found = []
    for path in sorted(RUN.glob(f"spark-worker-*/apps/{app_id}/*/stderr")):
        worker = int(path.parents[3].name.rsplit("-", 1)[1])
        found.append(ExecutorLog(worker, path.parent.name, path))
    return found


def application_id(log: str) -> str:
    """The application a sink's log names (service.spark_session logs it once Spark is up)."""
    found = re.findall(r"application (app-[0-9]+-[0-9]+)", log)
    assert found, "the sink's log names no standalone application"
    return str(found[-1])


def cluster_from_environment() -> SparkCluster:
    return SparkCluster(os.environ["ICESINK_SPARK_MASTER"], os.environ["ICESINK_SPARK_MASTER_UI"].rstrip("/"))
