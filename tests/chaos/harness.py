"""Shared pieces of the chaos suite: the figures it reports, a background producer, exactness checks,
server outages through ``dev/stack``, and a tiny OTLP receiver for the fenced counter.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog

from readers import duckdb_rows, pyiceberg_rows, spark_rows
from tests.sink.conftest import REPO, Sink, SinkRun
from tests.sink.expect import assert_seqs_increasing, diff, sink_snapshots

DEV_STACK = REPO / "dev" / "stack"
FAILPOINT_LINE = re.compile(r"fail point (\w+): (kill|raise|delay)\b")
KILLED_BY_FAILPOINT = 137  # service.failpoints.KILL_EXIT_CODE


# -- figures -----------------------------------------------------------------------------------------


@dataclass
class Figures:
    """What the suite proved, summed over its tests; printed at the end of the run."""

    kills_survived: int = 0
    sigkills: int = 0
    failpoint_kills: int = 0
    failpoints_hit: Counter[str] = field(default_factory=Counter)
    failpoint_kill_paths: Counter[str] = field(default_factory=Counter)
    sigkill_moments: Counter[str] = field(default_factory=Counter)
    sink_starts: int = 0
    fenced_exits: int = 0
    outages: list[str] = field(default_factory=list)
    rows_verified: int = 0
    duplicates_found: int = 0
    rows_lost: int = 0
    stale_rows: int = 0
    snapshots_checked: int = 0
    dead_letters_expected: int = 0
    dead_letters_found: int = 0
    dead_letters_distinct: int = 0
    orphans_deleted: int = 0
    runtimes: dict[str, float] = field(default_factory=dict)

    def count_failpoints(self, log: str) -> Counter[str]:
        hits = Counter(m.group(1) for m in FAILPOINT_LINE.finditer(log))
        self.failpoints_hit.update(hits)
        return hits

    def lines(self) -> list[str]:
        points = ", ".join(f"{k}={v}" for k, v in sorted(self.failpoints_hit.items())) or "none"
        return [
            f"kills survived:          {self.kills_survived} "
            f"({self.sigkills} SIGKILL at random moments, {self.failpoint_kills} by fail points)",
            f"fail points hit:         {sum(self.failpoints_hit.values())} ({points})",
            "random SIGKILLs, counted from: "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.sigkill_moments.items())) or "none"),
            "fail point kills by path: "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.failpoint_kill_paths.items())) or "none"),
            f"sink processes started:  {self.sink_starts}; fenced replicas exited 3: {self.fenced_exits}",
            f"outages survived:        {', '.join(self.outages) or 'none'}",
            f"rows verified:           {self.rows_verified} (each through Spark and DuckDB)",
            f"sink snapshots checked:  {self.snapshots_checked} (icesink.seq unique and increasing)",
            f"duplicates found:        {self.duplicates_found}",
            f"rows lost:               {self.rows_lost}",
            f"stale rows:              {self.stale_rows}",
            f"dead letters expected:   {self.dead_letters_expected}; found: {self.dead_letters_found} "
            f"({self.dead_letters_distinct} distinct source positions)",
            f"orphan files deleted:    {self.orphans_deleted} (left by killed batches; the table read the same "
            "afterwards)",
            "runtimes:                "
            + ", ".join(f"{k} {v:.0f}s" for k, v in self.runtimes.items())
            + f" (total {sum(self.runtimes.values()):.0f}s)",
        ]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["failpoints_hit"] = dict(self.failpoints_hit)
        out["failpoint_kill_paths"] = dict(self.failpoint_kill_paths)
        out["sigkill_moments"] = dict(self.sigkill_moments)
        return out


FIGURES = Figures()


def write_report(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(FIGURES.to_json(), indent=2) + "\n")


# -- sink processes ----------------------------------------------------------------------------------


def start(sink: Sink, *args: str, env: dict[str, str] | None = None) -> SinkRun:
    return sink.start(*args, env=env)


def wait_exit(run: SinkRun, timeout: float) -> int:
    return run.wait(timeout)


def sigkill(run: SinkRun) -> None:
    """SIGKILL the whole process group (Python driver, JVM, Python workers) and reap it."""
    if run.process.poll() is None:
        run.kill(signal.SIGKILL)
        FIGURES.sigkills += 1
        FIGURES.kills_survived += 1
    run.wait(60)


def stop_gracefully(run: SinkRun, timeout: float = 240) -> None:
    """SIGTERM to the sink's own process, as Kubernetes or Docker send it to the container's main
    process (not to the whole group: the JVM would die under the batch in flight)."""
    if run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)  # a process's or a hosted run's
    code = run.wait(timeout)
    assert code == 0, f"graceful stop exited {code}:\n{run.log()[-3000:]}"
    assert "stop requested" in run.log()


def end_offsets(sink: Sink) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": sink.bootstrap, "group.id": f"chaos-{uuid.uuid4()}"})
    try:
        parts = consumer.list_topics(sink.topic, timeout=30).topics[sink.topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(sink.topic, p), timeout=30)[1] for p in parts
        }
    finally:
        consumer.close()


def committed_offsets(sink: Sink) -> dict[int, int]:
    """What the sink's txnlog says is committed (topic partition → next offset)."""
    from txnlog import TransactionLog

    log = TransactionLog(os.environ["ICESINK_PG_DSN"])
    try:
        state = log.state(sink.name)
    finally:
        log.close()
    payload = (state.committed_payload if state else None) or {}
    return {int(p): int(o) for p, o in payload.get("offsets", {}).get(sink.topic, {}).items()}


def wait_caught_up(sink: Sink, run: SinkRun, timeout: float = 400) -> None:
    """Once production has stopped: wait until the running sink committed everything in the topic."""
    target = end_offsets(sink)

    def done() -> bool:
        if run.process.poll() is not None:
            raise AssertionError(
                f"the sink exited ({run.process.returncode}) before catching up:\n{run.log()[-4000:]}"
            )
        committed = committed_offsets(sink)
        return all(committed.get(p, 0) >= end for p, end in target.items())

    wait_until(done, timeout, f"the sink to commit up to {target}", interval=1.0)


def catalog_of(sink: Sink) -> Catalog:
    props = {k: os.path.expandvars(v) for k, v in sink.config["catalog"].items() if k != "name"}
    return load_catalog(sink.config["catalog"].get("name", "default"), **props)


def committed_count(run: SinkRun) -> int:
    return run.log().count("committed seq")


def wait_for_commits(run: SinkRun, count: int, timeout: float) -> None:
    run.wait_for_log("committed seq", count=count, timeout=timeout)


# -- exactness ----------------------------------------------------------------------------------------


def _exactness(expected: dict[int, dict[str, Any]], rows: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(duplicates, lost, stale) of a keyed table against the model."""
    ids = Counter(r["id"] for r in rows)
    duplicates = sum(n - 1 for n in ids.values() if n > 1)
    lost = sum(1 for k in expected if k not in ids)
    stale = sum(1 for r in rows if r["id"] in expected and r["version"] != expected[r["id"]]["version"])
    stale += sum(1 for k in ids if k not in expected)  # deleted in the source, still in the table
    return duplicates, lost, stale


def verify_exact(spark: Any, sink: Sink, extra_rows: list[dict[str, Any]] | None = None) -> None:
    """The table equals the model through Spark and DuckDB (and pyiceberg for a table in position
    mode); the sink's seqs are unique and increasing.

    ``extra_rows`` are rows another writer put in the same table (they must still be there); their
    ids lie outside the model's key space (``>= sink.source.keys``).
    """
    model = dict(sink.source.rows)
    expected = sink.source.expected_rows() + list(extra_rows or [])
    problems = []
    readers = [("spark", spark_rows(spark, sink.table)), ("duckdb", duckdb_rows(sink.table))]
    table = catalog_of(sink).load_table(sink.table)
    if table.properties.get("icesink.delete-format") == "position":  # pyiceberg reads no equality deletes
        readers.append(("pyiceberg", pyiceberg_rows(sink.table)))
    for reader, rows in readers:
        sink_rows = [r for r in rows if r["id"] < sink.source.keys]
        duplicates, lost, stale = _exactness(model, sink_rows)
        FIGURES.duplicates_found += duplicates
        FIGURES.rows_lost += lost
        FIGURES.stale_rows += stale
        if problem := diff(expected, rows, reader):
            problems.append(f"{problem}\n  duplicates {duplicates}, lost {lost}, stale {stale}")
    assert not problems, "\n".join(problems)
    FIGURES.rows_verified += len(expected)
    FIGURES.sink_starts += len(sink.runs)
    for run in sink.runs:
        FIGURES.count_failpoints(run.log())
    catalog = catalog_of(sink)
    seqs = assert_seqs_increasing(catalog, sink.table, sink.name)
    snapshots = sink_snapshots(catalog, sink.table, sink.name)
    FIGURES.snapshots_checked += len(snapshots)
    assert len(seqs) == len(snapshots)


# -- servers ---------------------------------------------------------------------------------------


def dev_stack(*args: str, timeout: float = 240) -> None:
    res = subprocess.run([str(DEV_STACK), *args], capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"dev/stack {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-3000:]}")


@contextlib.contextmanager
def server_down(name: str) -> Iterator[None]:
    """``dev/stack stop <name>`` for the block; the server is started again whatever happens."""
    dev_stack("stop", name)
    try:
        yield
    finally:
        dev_stack("start", name)


def server_pid(name: str) -> int:
    """The pid of a stack server (``dev/stack status``)."""
    res = subprocess.run([str(DEV_STACK), "status"], capture_output=True, text=True, timeout=60)
    for line in res.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == name and "pid" in fields:
            return int(fields[fields.index("pid") + 1])
    raise RuntimeError(f"no pid for {name} in dev/stack status:\n{res.stdout}")


@contextlib.contextmanager
def server_frozen(name: str) -> Iterator[int]:
    """The server's process group stopped (SIGSTOP) for the block: it holds its connections and state
    and answers nothing, as a hung server does; SIGCONT whatever happens. Yields its pid."""
    pid = server_pid(name)
    os.killpg(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.killpg(pid, signal.SIGCONT)


# -- a producer in the background ---------------------------------------------------------------------


class BackgroundProducer:
    """Keeps producing keyed changes (``batch`` every ``pause`` seconds) while the sink is abused."""

    def __init__(self, sink: Sink, batch: int = 40, pause: float = 0.5) -> None:
        self.sink, self.batch, self.pause = sink, batch, pause
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._idle = threading.Lock()  # held while a batch is being produced
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._idle:
                    if not self._paused.is_set():
                        self.sink.produce(self.batch)
                self._stop.wait(self.pause)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No production in the block (e.g. while Kafka itself is down: the model must match Kafka)."""
        with self._idle:
            self._paused.set()
        try:
            yield
        finally:
            self._paused.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        if self.error is not None:
            raise AssertionError(f"the background producer failed: {self.error!r}")


# -- OTLP ---------------------------------------------------------------------------------------------


class OtlpSink:
    """A minimal OTLP/HTTP metrics endpoint; remembers the largest value seen per metric name."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
                    ExportMetricsServiceRequest,
                    ExportMetricsServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                for rm in request.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            kind = m.WhichOneof("data")
                            for p in getattr(getattr(m, kind or "", None), "data_points", []):
                                if kind in ("sum", "gauge"):
                                    v = float(p.as_int) if p.WhichOneof("value") == "as_int" else p.as_double
                                    outer.values[m.name] = max(outer.values.get(m.name, 0.0), v)
                data = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="otlp", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
