"""icesink end to end: `icesink run` as its own process on a topic filled before timing starts.

Per batch, the sink's JSON log says when the commit finished, how many records it held and how long
writing and committing took; the table's snapshot summaries say which Kafka offsets each commit
covers (``icesink.offsets``) and how many data and delete files it added.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.figures import warmup_batches
from bench.procmem import PeakMemory
from bench.stack import REPO, Stack
from bench.workload import COLUMNS

_COMMITTED = "committed seq "


@dataclass
class Batch:
    seq: int
    committed_at: float  # wall clock, after the txnlog commit
    records: int
    write_s: float
    commit_s: float
    snapshots: int = 1  # tables committed by the batch's plan (a sink of many tables)


@dataclass
class SinkRun:
    name: str
    table: str
    log_path: Path
    wall_s: float = 0.0
    exit_code: int | None = None
    batches: list[Batch] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of the sink's process tree (driver, JVM, Python workers)
    steady_cpu_s: float | None = None  # between the end of the warm-up and the last commit
    steady_records: int = 0
    stream_s: float | None = None  # from the stream's start (the "consuming" line) to the last commit

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]


def sink_config(
    stack: Stack,
    name: str,
    topic: str,
    table: str,
    mode: str,
    max_offsets: int | None,
    trigger_s: float,
    parallelism: int = 2,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "sink_id": name,
        "kafka": {"bootstrap_servers": stack.kafka, "topics": [topic]},
        "table": {"identifier": table, "key": ["id"], "mode": mode, "columns": COLUMNS},
        "catalog": {"name": "rest", "type": "rest", **stack.catalog_properties()},
        "txnlog": {"dsn": stack.pg_dsn},
        "commit": {"trigger_interval": f"{trigger_s}s"},
        "write": {"parallelism": parallelism},
        "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "2g"}},
        "log": {"format": "json"},
    }
    if max_offsets:
        config["kafka"]["max_offsets_per_trigger"] = max_offsets
    for section, values in (extra or {}).items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    return config


def stream_seconds(log: str, batches: list[Batch]) -> float | None:
    """Seconds from the stream's start (the sink's ``consuming ...`` line) to the last commit.

    Unlike the steady rate it needs no run of equal batches: a sink holding quiet tables' changes
    (``commit.table_min_records``) commits them in bursts, or once at the end."""
    if not batches:
        return None
    for line in log.splitlines():
        if line.startswith("{") and '"consuming ' in line:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if str(entry.get("message", "")).startswith("consuming "):
                started = datetime.fromisoformat(entry["time"]).timestamp()
                return max(b.committed_at for b in batches) - started
    return None


def parse_batches(log: str) -> list[Batch]:
    """One Batch per committed seq, from the commit lines (JSON logs).

    A sink of many tables logs one line per table a batch wrote: their records add up; the write
    time is the longest table's (tables the Arrow path takes are written in one job, all with its
    time), the commit is one (the plan's).
    """
    batches: dict[int, Batch] = {}
    for line in log.splitlines():
        if not line.startswith("{") or _COMMITTED not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("message", "")
        if not message.startswith(_COMMITTED) or "write_s" not in entry:  # an offsets-only commit
            continue
        seq = int(entry["seq"])
        committed_at = datetime.fromisoformat(entry["time"]).timestamp()
        write_s, commit_s, records = float(entry["write_s"]), float(entry["commit_s"]), int(entry["records"])
        if seq in batches:
            b = batches[seq]
            b.records += records
            b.snapshots += 1
            b.write_s = max(b.write_s, write_s)
            b.commit_s = max(b.commit_s, commit_s)
            b.committed_at = max(b.committed_at, committed_at)
        else:
            batches[seq] = Batch(seq, committed_at, records, write_s, commit_s)
    return [batches[seq] for seq in sorted(batches)]


class Sink:
    """One icesink process: ``start`` → (``wait`` | ``stop``)."""

    def __init__(
        self, stack: Stack, workdir: Path, label: str, config: dict[str, Any], repo: Path = REPO
    ) -> None:
        self.stack = stack
        self.repo = repo  # the checkout whose icesink runs (another one for side-by-side variants)
        self.config = config
        self.path = workdir / f"{label}.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.run = SinkRun(label, config["table"]["identifier"], workdir / f"{label}.log")
        self.process: subprocess.Popen[bytes] | None = None
        self.memory: PeakMemory | None = None

    def start(self, *args: str) -> None:
        env = {**os.environ, "TMPDIR": tempfile.gettempdir()}
        if self.repo != REPO:  # the driver and Spark's Python workers import this checkout's service
            env["PYTHONPATH"] = os.pathsep.join([str(self.repo), env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            )
        self.run.started_at = time.time()
        self._t0 = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "run", "--config", str(self.path), *args],
            cwd=self.repo,
            stdout=self.run.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.memory = PeakMemory(self.process.pid)
        self.memory.start()

    def batches(self) -> list[Batch]:
        return parse_batches(self.run.log_path.read_text(errors="replace"))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout: float) -> SinkRun:
        assert self.process is not None and self.memory is not None
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise RuntimeError(
                f"icesink {self.run.name} did not finish in {timeout}s:\n{self.run.log_tail()}"
            ) from None
        return self._finish()

    def stop(self, timeout: float = 120) -> SinkRun:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def _finish(self) -> SinkRun:
        assert self.process is not None and self.memory is not None
        self.run.wall_s = time.monotonic() - self._t0
        self.run.exit_code = self.process.returncode
        self.run.memory = self.memory.stop()
        self.run.cpu_s = self.memory.cpu_seconds
        self.run.batches = self.batches()
        if len(self.run.batches) >= 2:  # after the warm-up, as figures.steady_rate counts it
            skip = warmup_batches(len(self.run.batches))
            first, last = self.run.batches[skip - 1], self.run.batches[-1]
            self.run.steady_cpu_s = self.memory.cpu_between(first.committed_at, last.committed_at)
            self.run.steady_records = sum(b.records for b in self.run.batches[skip:])
        self.run.batches = self.batches()
        self.run.stream_s = stream_seconds(self.run.log_path.read_text(errors="replace"), self.run.batches)
        if self.run.exit_code != 0:
            raise RuntimeError(f"icesink {self.run.name} exited {self.run.exit_code}:\n{self.run.log_tail()}")
        return self.run


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def snapshots(stack: Stack, table: str) -> list[dict[str, Any]]:
    """The table's snapshots, oldest first: sequence, commit offsets, files added."""
    t = stack.catalog().load_table(table)
    out = []
    for s in t.metadata.snapshots:
        summary = s.summary.additional_properties if s.summary is not None else {}
        out.append(
            {
                "snapshot_id": s.snapshot_id,
                "timestamp": s.timestamp_ms / 1000,
                "seq": int(summary["icesink.seq"]) if "icesink.seq" in summary else None,
                "offsets": json.loads(summary["icesink.offsets"]) if "icesink.offsets" in summary else None,
                "data_files": int(summary.get("added-data-files", 0)),
                "delete_files": int(summary.get("added-delete-files", 0)),
                "data_rows": int(summary.get("added-records", 0)),
                "delete_rows": int(summary.get("added-equality-deletes", 0))
                + int(summary.get("added-position-deletes", 0)),
                "bytes": int(summary.get("added-files-size", 0)),
            }
        )
    return out
