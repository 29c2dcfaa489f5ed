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

from tests.spark_jvm import driver_java_options

WORKERS = 2  # dev/stack's
# The executors' JVMs start the way the drivers' do in the tests: C1 only, the serial collector.
EXECUTOR_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


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
                "spark.executor.extraJavaOptions": EXECUTOR_JAVA_OPTIONS,
            },
        }

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

    def executor_pids(self, app_id: str) -> list[int]:
        """The executor JVMs of ``app_id`` running on this machine."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "CoarseGrainedExecutorBackend" in cmdline and f"--app-id {app_id} " in cmdline:
                pids.append(int(entry.name))
        return pids


def application_id(log: str) -> str:
    """The application a sink's log names (service.spark_session logs it once Spark is up)."""
    found = re.findall(r"application (app-[0-9]+-[0-9]+)", log)
    assert found, "the sink's log names no standalone application"
    return str(found[-1])


def cluster_from_environment() -> SparkCluster:
    return SparkCluster(os.environ["ICESINK_SPARK_MASTER"], os.environ["ICESINK_SPARK_MASTER_UI"].rstrip("/"))
