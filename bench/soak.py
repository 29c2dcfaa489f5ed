"""The soak (issue 14): thousands of small upsert commits into two tables, one maintained, one not.

Two ``icesink run`` sinks read the same one-partition topic side by side, in the same run, each into
its own table of one namespace: ``maintained``, which an ``icesink maintain`` loop looks after (short
``maintenance.interval``, low thresholds), and ``unmaintained``, which nothing touches. Each micro-batch
holds ``per_commit`` events (``kafka.max_offsets_per_trigger``) and is one Iceberg commit.

The events are produced in chunks of ``every`` commits. After each chunk, once both sinks have
committed it (so both tables hold exactly the same rows, which the model checks), the tables are
measured, the maintained one first, while the maintainer keeps running as it would: Spark (Iceberg
runtime) and DuckDB (iceberg extension) scan time of ``readside.QUERY``; the same rows fully compacted
(a copy written by Spark as one data file, scanned the same way, then dropped); the current metadata
file's size, snapshots, data/delete files and manifests (``service.maintenance.table_health``); the bytes
and objects under each table's location in the object store. Commit durations per batch come from
the sinks' JSON logs (txnlog precommit → Iceberg snapshot → txnlog commit).

``table.delete_format`` of both tables is ``SoakParams.delete_format`` (``--soak-delete-format``,
docs/deletes.md). With ``beside_equality`` (``--soak-beside-equality``, meant for ``position``), a third
sink reads the same topic into ``equality``, a table with equality deletes and no maintenance,
measured like ``unmaintained``.

A second baseline at each checkpoint, "nodeletes": each table without maintenance (``unmaintained``,
``equality``) gets a copy registering its live data files as they are (the same objects, not
rewritten) and none of its delete files, so it reads the table's data files and every row they hold;
``<engine>_vs_nodeletes`` is what the table's delete files cost a scan. The copy is dropped without
purging its files, which are the table's. Not of the maintained table: its maintainer's expiry would
delete files the copy names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.figures import percentile
from bench.readside import QUERY
from bench.sink import Batch, Sink, parse_batches, sink_config, unique
from bench.stack import REPO, Stack
from bench.workload import Workload, ensure_topic, produce

# `icesink maintain` settings of the maintained table (the `maintenance:` section of its sink config):
# a compaction as soon as a commit left a delete file, and a short history, because DuckDB pays for
# both at every scan (docs/performance.md, "Soak").
MAINTENANCE: dict[str, Any] = {
    "interval": "500ms",
    "compaction": {"delete_files": 1, "commits": 20, "max_age": "1m"},
    "expiry": {"older_than": "20s", "retain_last": 10, "min_expirable": 20},
    "orphans": {"older_than": "1h", "interval": "30m"},
    "max_manifests": 20,
}
TABLES = ("maintained", "unmaintained")  # always there; the run's labels are Soak.labels
EQUALITY = "equality"  # the third table (beside_equality): equality deletes, no maintenance
ENGINES = ("spark", "duckdb")
WINDOW = 200  # commits at the start and at the end over which commit p50/p99 are taken
SCAN_TARGET = 1.5  # scan time at most this many times the compacted copy's
COMMIT_TARGET = 1.5  # commit p99 at the end at most this many times the start's
NODELETES_TARGET = 1.3  # a position table's scan at most this many times its files' without deletes


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] soak: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SoakParams:
    commits: int = 2000
    every: int = 200
    per_commit: int = 25
    period_s: float = 2.0  # commit.trigger_interval of both sinks
    keys: int = 10_000
    partitions: int = 1
    scan_timeout_s: float = 180.0
    seed: int = 7
    delete_format: str = "equality"  # table.delete_format of the maintained and unmaintained tables
    beside_equality: bool = False  # a third table, "equality": equality deletes, no maintenance
    compact_every: int | None = None  # compaction every N commits only (not at every delete file)


def maintenance(p: SoakParams) -> dict[str, Any]:
    """The maintained table's ``maintenance:`` section: :data:`MAINTENANCE`, or with
    ``compact_every`` a compaction every that many commits, whatever the delete files (a position
    table's merged deletes stay few, so they need no compaction after every commit)."""
    if p.compact_every is None:
        return MAINTENANCE
    return {
        **MAINTENANCE,
        "compaction": {"delete_files": 1_000_000, "commits": p.compact_every, "max_age": None},
    }


def table_labels(p: SoakParams) -> tuple[str, ...]:
    """The run's tables, in the order they are measured and reported."""
    return (*TABLES, EQUALITY) if p.beside_equality else TABLES


def delete_format(label: str, params: dict[str, Any]) -> str:
    """``table.delete_format`` of a table of a run (``params``: the result's)."""
    return "equality" if label == EQUALITY else str(params.get("delete_format", "equality"))


# -- measuring ---------------------------------------------------------------------------------------


def _timed(run: Callable[[], Any], timeout_s: float, cancel: Callable[[], None]) -> tuple[float | None, Any]:
    """Seconds ``run`` took and its result; (None, None) if it was still running after ``timeout_s``
    (``cancel`` is called then, from a timer thread, and must make ``run`` raise)."""
    timer = threading.Timer(timeout_s, cancel)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    try:
        result = run()
    except Exception:
        if time.monotonic() - started >= timeout_s:
            return None, None
        raise
    finally:
        timer.cancel()
    return time.monotonic() - started, result


def scan(
    spark: Any,
    table: str,
    timeout_s: float,
    snapshot_id: int | None = None,
    engines: tuple[str, ...] = ENGINES,
) -> dict[str, Any]:
    """``readside.QUERY`` through Spark and DuckDB, of one table as of ``snapshot_id`` (default: now)."""
    return scan_side_by_side(spark, {"table": (table, snapshot_id, engines)}, timeout_s)["table"]


def scan_side_by_side(
    spark: Any,
    tables: dict[str, tuple[str, int | None, tuple[str, ...]]],
    timeout_s: float,
    rounds: int = 15,
    quick_s: float = 3.0,
    budget_s: float = 4.0,
) -> dict[str, dict[str, Any]]:
    """``readside.QUERY`` over each ``label → (table, snapshot_id or None for now, engines)``, in
    rounds: every table once, then again those whose first scan took under ``quick_s``, three times
    at least and more until a table's scans by one engine took ``budget_s`` in all (a 10 ms DuckDB
    scan gets 15 rounds, a 2 s Spark scan 3); the median of each table's scans. Rounds rather than
    each table's scans back to back, so the machine's load of the moment (a maintainer's compaction,
    the other sink) falls on every table alike; many rounds, because one compaction's second on this
    2-core machine can double a 10 ms scan.

    Per label and engine: seconds (None: timed out, or not run) and the rows the engine saw."""
    from readers import duckdb_connect

    con = duckdb_connect()
    out: dict[str, dict[str, Any]] = {
        label: {f"{engine}_{k}": None for engine in ENGINES for k in ("s", "rows", "versions")}
        for label in tables
    }
    times: dict[tuple[str, str], list[float]] = {}
    for table, _, engines in tables.values():
        if "spark" in engines:
            spark.sql(f"REFRESH TABLE rest.{table}")  # the scans see the catalog's metadata of now
    try:
        for round_ in range(rounds):
            for label, (table, snapshot_id, engines) in tables.items():
                for engine in engines:
                    key = (label, engine)
                    done = times.get(key)
                    if round_ and not (done and done[0] <= quick_s and (round_ < 3 or sum(done) < budget_s)):
                        continue
                    once = _spark_once if engine == "spark" else _duckdb_once
                    took, row = once(spark if engine == "spark" else con, table, snapshot_id, timeout_s)
                    if took is None:
                        times[key] = []
                        continue
                    times.setdefault(key, []).append(took)
                    out[label][f"{engine}_rows"], out[label][f"{engine}_versions"] = (
                        int(row[0]),
                        int(row[1] or 0),
                    )
    finally:
        con.close()
    for (label, engine), seconds in times.items():
        out[label][f"{engine}_s"] = statistics.median(seconds) if seconds else None
    return out


def _spark_once(
    spark: Any, table: str, snapshot_id: int | None, timeout_s: float
) -> tuple[float | None, Any]:
    sc = spark.sparkContext
    group = f"soak-{unique('scan')}"
    spark_table = f"rest.{table}"
    if snapshot_id is not None:
        spark_table += f" VERSION AS OF {int(snapshot_id)}"
    sc.setJobGroup(group, f"soak scan of {table}", True)
    return _timed(
        lambda: tuple(spark.sql(QUERY.format(table=spark_table)).collect()[0]),
        timeout_s,
        lambda: sc.cancelJobGroup(group),
    )


def _duckdb_once(con: Any, table: str, snapshot_id: int | None, timeout_s: float) -> tuple[float | None, Any]:
    duck_table = ".".join(['"cat"', *[f'"{p}"' for p in table.split(".")]])
    if snapshot_id is not None:
        duck_table += f" AT (VERSION => {int(snapshot_id)})"
    return _timed(lambda: con.execute(QUERY.format(table=duck_table)).fetchone(), timeout_s, con.interrupt)


def store_usage(stack: Stack, location: str) -> dict[str, int]:
    """Objects and bytes under a table's location (``s3://bucket/prefix``), in all and under metadata/."""
    import boto3

    bucket, _, prefix = location.removeprefix("s3://").removeprefix("s3a://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=stack.s3_endpoint,
        aws_access_key_id=stack.access_key,
        aws_secret_access_key=stack.secret_key,
        region_name=stack.region,
    )
    out = {"objects": 0, "bytes": 0, "metadata_objects": 0, "metadata_bytes": 0}
    metadata = prefix.rstrip("/") + "/metadata/"
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix.rstrip("/") + "/"
    ):
        for obj in page.get("Contents", []):
            out["objects"] += 1
            out["bytes"] += int(obj["Size"])
            if obj["Key"].startswith(metadata):
                out["metadata_objects"] += 1
                out["metadata_bytes"] += int(obj["Size"])
    return out


def table_state(stack: Stack, table: str) -> dict[str, Any]:
    """The table's health (service.maintenance.table_health) and what its location holds in the object store."""
    from service.maintenance.table_health import table_health

    t = stack.catalog().load_table(table)
    health = table_health(t, table).to_json()
    keep = (
        "snapshots",
        "data_files",
        "delete_files",
        "equality_deletes",
        "records",
        "data_bytes",
        "manifests",
        "metadata_bytes",
        "commits_since_compaction",
    )
    current = t.current_snapshot()
    return {
        **{k: health[k] for k in keep},
        "snapshot_id": current.snapshot_id if current else None,
        "store": store_usage(stack, t.metadata.location),
    }


def copy_without_deletes(catalog: Any, source: str, copy: str) -> dict[str, Any]:
    """A new table ``copy`` whose one snapshot adds ``source``'s live data files (as of its current
    snapshot) as they are, with none of its delete files: no data rewritten, the copy's files are the
    source's (absolute paths). Drop it with ``catalog.drop_table`` only, never purged.

    The copy's schema and spec are the source's (the catalog assigns fresh field ids: checked to be
    the same, or the files' field ids and column statistics would not match)."""
    from service.commit.plan import new_snapshot_id
    from service.iceberg.row_delta import RowDelta
    from service.keyindex.build import live_files

    table = catalog.load_table(source)
    current = table.current_snapshot()
    live = live_files(table)
    if current is None or not live.data:
        raise ValueError(f"{source} has no live data file")
    spec = table.spec()
    other = sorted({f.spec_id for f, _ in live.data} - {spec.spec_id})
    if other:
        raise ValueError(f"{source} has data files of partition specs {other}, not its current spec")
    target = catalog.create_table(
        copy, schema=table.schema(), partition_spec=spec, properties=table.properties
    )
    try:
        if target.schema().as_struct() != table.schema().as_struct() or target.spec().fields != spec.fields:
            raise ValueError(f"the catalog gave {copy} other field ids than {source}'s")
        files = [f for f, _ in live.data]
        for f in files:
            f.spec_id = target.spec().spec_id
        snapshot_id = new_snapshot_id()
        RowDelta(target, snapshot_id, files, [], {}).commit()
    except BaseException:
        catalog.drop_table(copy)  # never purged: the files are the source's
        raise
    return {
        "table": copy,
        "snapshot_id": snapshot_id,
        "source_snapshot_id": current.snapshot_id,
        "data_files": len(files),
        "records": sum(int(f.record_count) for f in files),  # what a scan of the copy should count
        "source_delete_files": len(live.position_deletes) + len(live.equality_deletes),
    }


# -- the maintainer ----------------------------------------------------------------------------------

_TASK_LINE = re.compile(r"^maintenance of \S+: (\w+) \((.*)\) in ([0-9.]+) s")
_FAILED_LINE = re.compile(r"^maintenance of \S+: (\w+) failed: (.*)")


class Maintainer:
    """``icesink maintain --config ...`` (its loop, no ``--once``) as its own process."""

    def __init__(self, workdir: Path, label: str, config: dict[str, Any]) -> None:
        self.path = workdir / f"{label}.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{label}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "maintain", "--config", str(self.path)],
            cwd=REPO,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": tempfile.gettempdir()},
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 300) -> int | None:
        """SIGTERM: the loop finishes its pass, then exits."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        return self.process.returncode

    def tasks(self) -> dict[str, Any]:
        """Per task: runs, seconds (p50, max) and failures, from the maintainer's JSON log."""
        runs: dict[str, list[float]] = {}
        failed: dict[str, list[str]] = {}
        conflicts = groups_lost = 0
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                # Spark's own log lines: Iceberg retrying a commit the sink's commits got ahead of, and
                # a rewrite's file group given up after its retries (partial progress goes on without it).
                conflicts += "Retrying task after failure" in line and "branch main has changed" in line
                groups_lost += "RewriteDataFilesCommitManager: Cannot commit groups" in line
                continue
            try:
                message = str(json.loads(line).get("message", ""))
            except ValueError:
                continue
            if match := _TASK_LINE.match(message):
                runs.setdefault(match[1], []).append(float(match[3]))
            elif match := _FAILED_LINE.match(message):
                failed.setdefault(match[1], []).append(match[2][:300])
        tasks: dict[str, Any] = {}
        for task in sorted(set(runs) | set(failed)):
            seconds = runs.get(task, [])
            tasks[task] = {
                "runs": len(seconds),
                "seconds_p50": statistics.median(seconds) if seconds else None,
                "seconds_max": max(seconds) if seconds else None,
                "seconds_total": round(sum(seconds), 1),
                "failed": len(failed.get(task, [])),
                "failures": failed.get(task, [])[:3],
            }
        return {
            "tasks": tasks,
            "iceberg_commit_conflicts": conflicts,  # retried by Iceberg (commit.retry.num-retries)
            "rewrite_groups_not_committed": groups_lost,
        }

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]


# -- the run -----------------------------------------------------------------------------------------


def commit_figures(batches: list[Batch], skip: int = 2) -> dict[str, Any]:
    """Commit p50/p99 over the first and the last ``WINDOW`` commits (after ``skip`` warm-up batches)."""
    commits = [b.commit_s for b in batches[skip:]]
    start, end = commits[:WINDOW], commits[-WINDOW:]

    def summary(values: list[float]) -> dict[str, Any]:
        return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}

    out: dict[str, Any] = {
        "commits": len(batches),
        "start": summary(start),
        "end": summary(end),
        "all": summary(commits),
    }
    p99s, p99e = out["start"]["p99"], out["end"]["p99"]
    out["end_vs_start_p99"] = p99e / p99s if p99s and p99e else None
    return out


def commit_windows(batches: list[Batch], marks: list[int]) -> list[dict[str, Any]]:
    """Commit p50/p99 of the batches between consecutive checkpoints (``marks``: commits at each)."""
    out, start = [], 0
    for end in marks:
        values = [b.commit_s for b in batches[start:end]]
        if values:
            out.append(
                {"until": end, "p50": percentile(values, 50), "p99": percentile(values, 99), "n": len(values)}
            )
        start = end
    return out


class Committed:
    """Follows a sink's JSON log: records committed and commits so far (read incrementally)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.offset = 0
        self.records = 0
        self.commits = 0
        self._partial = b""

    def poll(self) -> int:
        try:
            with self.sink.run.log_path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.records
        self.offset += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        for batch in parse_batches(b"\n".join(complete).decode(errors="replace")):
            self.records += batch.records
            self.commits += 1
        return self.records


def _retries(sink: Sink) -> int:
    text = sink.run.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "checking and retrying" in line)


class Soak:
    def __init__(self, stack: Stack, workdir: Path, params: SoakParams, session: Callable[[], Any]) -> None:
        self.stack, self.workdir, self.p, self.session = stack, workdir, params, session
        self.timed_out: set[tuple[str, str]] = set()  # (table, engine): not scanned again, it only grows
        self.warmed = False
        self.labels = table_labels(params)
        # the tables nothing but their sink writes: each gets a copy without its deletes at a checkpoint
        self.bare = tuple(label for label in self.labels if label != "maintained")

    def run(self) -> dict[str, Any]:
        p = self.p
        chunks = -(-p.commits // p.every)
        namespace = unique("bench_soak")
        tables = {label: f"{namespace}.{label}" for label in self.labels}
        topic = unique("bench_soak")
        ensure_topic(self.stack.kafka, topic, p.partitions)
        self.stack.catalog().create_namespace(namespace)
        workload = Workload(keys=p.keys, seed=p.seed + 14)
        sinks: dict[str, Sink] = {}
        configs: dict[str, dict[str, Any]] = {}
        for label, table in tables.items():
            name = f"{namespace}_{label}"
            formats = {"table": {"delete_format": delete_format(label, p.__dict__)}}
            configs[label] = sink_config(
                self.stack, name, topic, table, "upsert", p.per_commit, p.period_s, extra=formats
            )
            sinks[label] = Sink(self.stack, self.workdir, name, configs[label])
        follow = {label: Committed(sink) for label, sink in sinks.items()}
        maintainer = Maintainer(
            self.workdir,
            f"{namespace}_maintain",
            {**configs["maintained"], "maintenance": maintenance(p)},
        )
        result: dict[str, Any] = {
            "params": {**p.__dict__, "chunks": chunks},
            "maintenance": maintenance(p),
            "tables": tables,
            "topic": topic,
            "checkpoints": [],
        }
        log(
            f"{p.commits} commits of {p.per_commit} events into {tables['maintained']} (icesink maintain "
            f"every {MAINTENANCE['interval']}) and {tables['unmaintained']} (no maintenance), measured "
            f"every {p.every} commits"
            + (f", table.delete_format {p.delete_format}" if p.delete_format != "equality" else "")
            + (
                f"; beside them {tables[EQUALITY]} (equality deletes, no maintenance)"
                if p.beside_equality
                else ""
            )
        )
        if p.beside_equality and p.delete_format == "equality":
            log(
                "--soak-beside-equality with equality deletes: the equality table is a second unmaintained one"
            )
        self.session().sql("SELECT 1").collect()  # the reader's JVM, started before the sinks
        started = time.monotonic()
        produced = 0
        try:
            for chunk in range(chunks):
                n = min(p.every, p.commits - chunk * p.every) * p.per_commit
                produce(self.stack.kafka, topic, workload.generate(n))
                produced += n
                live = len(workload.live)
                versions = sum(row["version"] for row in workload.live.values())
                if chunk == 0:
                    # The maintainer runs before its table exists, as a deployed one would: it finds
                    # the table at its first pass after the sink's first commit.
                    maintainer.start()
                    for sink in sinks.values():
                        sink.start()
                caught_up = self._wait_committed(tables, sinks, follow, produced, maintainer)
                point = self._checkpoint(tables, follow, caught_up, produced, live, versions, started)
                result["checkpoints"].append(point)
                log(self._describe(point))
        finally:
            code = maintainer.stop()
            runs: dict[str, Any] = {}
            for label, sink in sinks.items():
                if sink.process is None:
                    continue
                try:
                    runs[label] = sink.stop()
                except RuntimeError as exc:
                    log(f"sink {label}: {exc}")
        result["maintainer"] = {"exit": code, **maintainer.tasks()}
        result["wall_s"] = round(time.monotonic() - started, 1)
        marks = [cp["commits"] for cp in result["checkpoints"]]
        result["commits"] = {}
        for label, run in runs.items():
            result["commits"][label] = {
                **commit_figures(run.batches),
                "windows": commit_windows(run.batches, [m[label] for m in marks]),
                "retries": _retries(sinks[label]),
                "cpu_s": run.cpu_s,
                "memory": run.memory,
            }
        result["targets"] = targets(result)
        result["logs"] = str(self.workdir)
        return result

    def _wait_committed(
        self,
        tables: dict[str, str],
        sinks: dict[str, Sink],
        follow: dict[str, Committed],
        produced: int,
        maintainer: Maintainer,
    ) -> dict[str, dict[str, Any]]:
        """Wait until every sink committed ``produced`` events. Each table's state (health, object
        store, current snapshot) is taken the moment its own sink has: the maintained sink is usually
        done first, and its table is measured as a reader would have found it then, not after the
        maintainer had the idle table to itself while the other sink caught up."""
        caught_up: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            for label, sink in sinks.items():
                if not sink.alive():
                    raise RuntimeError(f"the {label} sink stopped:\n{sink.run.log_tail()}")
            if maintainer.process is not None and not maintainer.alive():
                raise RuntimeError(f"icesink maintain stopped:\n{maintainer.log_tail()}")
            for label in self.labels:
                if label not in caught_up and follow[label].poll() >= produced:
                    caught_up[label] = {**table_state(self.stack, tables[label]), "at": time.monotonic()}
            if len(caught_up) == len(self.labels):
                return caught_up
            time.sleep(0.25)
        raise TimeoutError(f"the sinks did not commit {produced} events within an hour")

    def _checkpoint(
        self,
        tables: dict[str, str],
        follow: dict[str, Committed],
        caught_up: dict[str, dict[str, Any]],
        produced: int,
        live: int,
        versions: int,
        started: float,
    ) -> dict[str, Any]:
        spark = self.session()
        labels = self.labels
        point: dict[str, Any] = {
            "events": produced,
            "commits": {label: follow[label].commits for label in labels},
            "elapsed_s": round(time.monotonic() - started, 1),
            "load_1m": round(os.getloadavg()[0], 2),
            "rows": live,
            "maintained_ahead_s": round(caught_up["unmaintained"]["at"] - caught_up["maintained"]["at"], 1),
        }
        # The same rows, fully compacted: one data file written by Spark, no delete file.
        copy = f"{tables['unmaintained']}_compacted_{produced}"
        t0 = time.monotonic()
        (
            spark.table(f"rest.{tables['unmaintained']}")
            .coalesce(1)
            .writeTo(f"rest.{copy}")
            .using("iceberg")
            .tableProperty("format-version", "2")
            .create()
        )
        copy_s = time.monotonic() - t0
        copy_state = table_state(self.stack, copy)
        engines = {label: tuple(e for e in ENGINES if (label, e) not in self.timed_out) for label in labels}
        states = {label: {k: v for k, v in caught_up[label].items() if k != "at"} for label in labels}
        # Each table without maintenance, its live data files without its deletes (dropped below,
        # never purged: the files are the table's).
        nodeletes = self._copies_without_deletes(tables, states, produced)
        try:
            if not self.warmed:  # the first scans of a session (deletes applied) load and compile code
                scan(spark, tables["unmaintained"], self.p.scan_timeout_s)
                self.warmed = True
            # Each table as of the snapshot its sink's catch-up left, the copies as of their one
            # snapshot (every table read the same way). Side by side, in rounds: the maintained table,
            # the compacted copy, the unmaintained one (its slow scans once), its copy without deletes,
            # then the equality table and its copy without deletes.
            scans: dict[str, tuple[str, int | None, tuple[str, ...]]] = {
                "maintained": (
                    tables["maintained"],
                    states["maintained"]["snapshot_id"],
                    engines["maintained"],
                ),
                "compacted": (copy, copy_state["snapshot_id"], ENGINES),
            }
            for label in labels[1:]:
                scans[label] = (tables[label], states[label]["snapshot_id"], engines[label])
                made = nodeletes.get(label)
                if made and "error" not in made:
                    scans[f"nodeletes:{label}"] = (made["table"], made["snapshot_id"], engines[label])
            got = scan_side_by_side(spark, scans, self.p.scan_timeout_s)
        finally:
            catalog = self.stack.catalog()
            for made in nodeletes.values():
                if "table" in made:
                    try:
                        catalog.drop_table(made["table"])  # NOT purged: its files are the source table's
                    except Exception as exc:
                        log(f"could not drop {made['table']}: {exc!r}")
        for label in labels:
            for engine in engines[label]:
                if got[label][f"{engine}_s"] is None:
                    self.timed_out.add((label, engine))
            point[label] = {
                **states[label],
                **got[label],
                "skipped": [e for e in ENGINES if e not in engines[label]],
            }
        point["compacted"] = {**copy_state, **got["compacted"], "copy_s": copy_s}
        point["nodeletes"] = {
            label: {**made, **got.get(f"nodeletes:{label}", {})} for label, made in nodeletes.items()
        }
        spark.sql(f"DROP TABLE rest.{copy} PURGE")
        for label in (*labels, "compacted"):
            got = point[label]
            for engine in ENGINES:
                rows, v = got[f"{engine}_rows"], got[f"{engine}_versions"]
                if rows is not None and (rows, v) != (live, versions):
                    raise AssertionError(
                        f"soak: {engine} read {rows} rows (versions {v}) from the {label} table after "
                        f"{produced} events; the model says {live} (versions {versions})"
                    )
        for engine in ENGINES:
            ref = point["compacted"][f"{engine}_s"]
            for label in labels:
                took = point[label][f"{engine}_s"]
                point[label][f"{engine}_vs_compacted"] = took / ref if took and ref else None
            # the copy without deletes counts the rows its table's deletes remove too: not checked
            # against the model, only recorded (<engine>_rows, and records: its files' row counts)
            for label, made in point["nodeletes"].items():
                took, ref = point[label][f"{engine}_s"], made.get(f"{engine}_s")
                point[label][f"{engine}_vs_nodeletes"] = took / ref if took and ref else None
        return point

    def _copies_without_deletes(
        self, tables: dict[str, str], states: dict[str, dict[str, Any]], produced: int
    ) -> dict[str, dict[str, Any]]:
        """Per table without maintenance: ``copy_without_deletes`` of it (or ``{"error": ...}``, logged:
        the soak goes on without that baseline)."""
        catalog = self.stack.catalog()
        out: dict[str, dict[str, Any]] = {}
        for label in self.bare:
            name = f"{tables[label]}_nodeletes_{produced}"
            t0 = time.monotonic()
            try:
                made = copy_without_deletes(catalog, tables[label], name)
            except Exception as exc:
                log(f"no copy without deletes of {tables[label]}: {exc!r}")
                out[label] = {"error": repr(exc)[:300]}
                continue
            made["copy_s"] = round(time.monotonic() - t0, 2)
            if made["source_snapshot_id"] != states[label]["snapshot_id"]:
                # nothing but its sink writes the table, and the sink had nothing left to commit
                log(
                    f"{tables[label]} moved on from snapshot {states[label]['snapshot_id']} to "
                    f"{made['source_snapshot_id']}: its copy without deletes is of the latter"
                )
            out[label] = made
        return out

    @staticmethod
    def _describe(point: dict[str, Any]) -> str:
        parts = [f"{point['events']:,} events, commits {point['commits']}, {point['rows']:,} rows:"]

        def took(value: float | None) -> str:
            return "timeout" if value is None else f"{value:.2f}s"

        nodeletes = point.get("nodeletes", {})
        for label in (*point["commits"], "compacted"):
            t = point[label]
            without = ""
            if label in nodeletes:
                n = nodeletes[label]
                without = (
                    f", no copy without deletes ({n['error']})"
                    if "error" in n
                    else f", without deletes Spark {took(n['spark_s'])} ({_x(t['spark_vs_nodeletes'])}), "
                    f"DuckDB {took(n['duckdb_s'])} ({_x(t['duckdb_vs_nodeletes'])})"
                )
            parts.append(
                f"{label}: Spark {took(t['spark_s'])}, DuckDB {took(t['duckdb_s'])}, "
                f"{t['data_files']}+{t['delete_files']} files, "
                f"{t['snapshots']} snapshots, metadata {t['metadata_bytes'] / 1024:.0f} KiB, "
                f"store {t['store']['bytes'] / 2**20:.1f} MiB{without};"
            )
        return " ".join(parts)


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Issue 14's targets, from the maintained table's figures; and per table with a copy without
    deletes, its scan vs that copy's at worst (position tables: at most ``NODELETES_TARGET``)."""
    points = result["checkpoints"]
    out: dict[str, Any] = {}
    for engine in ("spark", "duckdb"):
        ratios = [cp["maintained"][f"{engine}_vs_compacted"] for cp in points]
        known = [r for r in ratios if r is not None]
        worst = max(known) if known else None
        out[f"{engine}_scan_vs_compacted_max"] = worst
        out[f"{engine}_scan_vs_compacted_median"] = statistics.median(known) if known else None
        out[f"{engine}_scan_met"] = worst is not None and worst <= SCAN_TARGET and len(known) == len(ratios)
        # after the first checkpoint: the maintainer's JVM starts once the table exists, and its first
        # pass (cold) ends well into the first chunk
        later = [r for r in ratios[1:] if r is not None]
        out[f"{engine}_scan_vs_compacted_max_after_first"] = max(later) if later else None
    # What each table's delete files cost a scan: the table vs its live data files without deletes.
    for label in result.get("tables", TABLES):
        for engine in ENGINES:
            key = f"{engine}_vs_nodeletes"
            ratios = [cp[label][key] for cp in points if key in cp.get(label, {})]
            if not ratios:
                continue
            known = [r for r in ratios if r is not None]
            worst = max(known) if known else None
            out[f"{label}_{engine}_scan_vs_nodeletes_max"] = worst
            if delete_format(label, result.get("params", {})) == "position":
                out[f"{label}_{engine}_scan_vs_nodeletes_met"] = (
                    worst is not None and worst <= NODELETES_TARGET and len(known) == len(ratios)
                )
    commits = result.get("commits", {}).get("maintained")
    ratio = commits["end_vs_start_p99"] if commits else None
    out["commit_p99_end_vs_start"] = ratio
    out["commit_met"] = ratio is not None and ratio <= COMMIT_TARGET
    # Bounded: no growth from the first half of the run to the second (within 20%).
    sizes = [cp["maintained"]["metadata_bytes"] for cp in points]
    half = len(sizes) // 2
    if half:
        first, second = max(sizes[:half]), max(sizes[half:])
        out["metadata_bytes_first_half_max"] = first
        out["metadata_bytes_second_half_max"] = second
        out["metadata_met"] = second <= 1.2 * first
    return out


# -- the report --------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "timeout" if value is None else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def lines(soak: dict[str, Any]) -> list[str]:
    """The soak's table for stdout."""
    p = soak["params"]
    out = [
        f"soak: {p['commits']:,} commits of {p['per_commit']} events per table, measured every {p['every']} "
        f"({soak['wall_s'] / 60:.1f} min); scan s Spark/DuckDB (x the compacted copy)"
        + (
            f"; table.delete_format {p['delete_format']}"
            if p.get("delete_format", "equality") != "equality"
            else ""
        ),
        f"{'commits':>7} {'rows':>6} {'maintained':>30} {'unmaintained':>30} {'compacted':>12} "
        f"{'files m/u':>13} {'snaps m/u':>10} {'metadata KiB m/u':>17} {'store MiB m/u':>14}",
    ]

    def both(t: dict[str, Any]) -> str:
        return (
            f"{_s(t['spark_s'])}/{_s(t['duckdb_s'])} "
            f"({_x(t['spark_vs_compacted'])}/{_x(t['duckdb_vs_compacted'])})"
        )

    for cp in soak["checkpoints"]:
        m, u, c = cp["maintained"], cp["unmaintained"], cp["compacted"]
        out.append(
            f"{cp['commits']['unmaintained']:>7} {cp['rows']:>6} {both(m):>30} {both(u):>30} "
            f"{_s(c['spark_s']) + '/' + _s(c['duckdb_s']):>12} "
            f"{m['data_files'] + m['delete_files']:>6}/{u['data_files'] + u['delete_files']:<6} "
            f"{m['snapshots']:>4}/{u['snapshots']:<5} "
            f"{m['metadata_bytes'] / 1024:>8.0f}/{u['metadata_bytes'] / 1024:<8.0f} "
            f"{m['store']['bytes'] / 2**20:>6.1f}/{u['store']['bytes'] / 2**20:<7.1f}"
        )
    labels = list(soak.get("tables", TABLES))
    others = [label for label in labels if label not in TABLES]
    if others:
        out.append(
            "beside them, no maintenance: "
            + ", ".join(f"{label} (table.delete_format {delete_format(label, p)})" for label in others)
            + "; scan s Spark/DuckDB (x the compacted copy)"
        )
        out.append(
            f"{'commits':>7} "
            + " ".join(
                f"{label:>30} {'files':>6} {'snaps':>5} {'metadata KiB':>12} {'store MiB':>9}"
                for label in others
            )
        )
        for cp in soak["checkpoints"]:
            cells = [
                f"{both(t):>30} {t['data_files'] + t['delete_files']:>6} {t['snapshots']:>5} "
                f"{t['metadata_bytes'] / 1024:>12.0f} {t['store']['bytes'] / 2**20:>9.1f}"
                for t in (cp[label] for label in others)
            ]
            out.append(f"{cp['commits']['unmaintained']:>7} " + " ".join(cells))
    bare = [label for label in labels if any(label in cp.get("nodeletes", {}) for cp in soak["checkpoints"])]
    if bare:
        out.append(
            "without deletes: scan s Spark/DuckDB of each table's live data files registered without its "
            "delete files, and the rows they hold (x: the table's scan / this one)"
        )
        out.append(f"{'commits':>7} " + " ".join(f"{label:>30} {'rows':>8}" for label in bare))
        for cp in soak["checkpoints"]:
            cells = []
            for label in bare:
                n, t = cp.get("nodeletes", {}).get(label), cp[label]
                if not n or "error" in n:
                    cells.append(f"{'-':>30} {'-':>8}")
                    continue
                scans = (
                    f"{_s(n['spark_s'])}/{_s(n['duckdb_s'])} "
                    f"({_x(t['spark_vs_nodeletes'])}/{_x(t['duckdb_vs_nodeletes'])})"
                )
                rows = n["spark_rows"] if n["spark_rows"] is not None else n["duckdb_rows"]
                cells.append(f"{scans:>30} {'-' if rows is None else rows:>8}")
            out.append(f"{cp['commits']['unmaintained']:>7} " + " ".join(cells))
    for label, c in soak.get("commits", {}).items():
        out.append(
            f"commit s {label}: p50/p99 first {c['start']['n']} {c['start']['p50']:.3f}/{c['start']['p99']:.3f}, "
            f"last {c['end']['n']} {c['end']['p50']:.3f}/{c['end']['p99']:.3f} "
            f"(p99 end/start {_x(c['end_vs_start_p99'])}); {c['retries']} commit retries"
        )
    maintainer = soak.get("maintainer", {})
    for task, t in maintainer.get("tasks", {}).items():
        out.append(
            f"maintain {task}: {t['runs']} runs, p50 {t['seconds_p50'] or 0:.1f}s, max {t['seconds_max'] or 0:.1f}s, "
            f"{t['failed']} failed"
        )
    if maintainer:
        out.append(
            f"maintain: {maintainer['iceberg_commit_conflicts']} Iceberg commit retries after a sink commit, "
            f"{maintainer['rewrite_groups_not_committed']} rewrite file groups not committed; exit {maintainer['exit']}"
        )
    for key, value in soak.get("targets", {}).items():
        out.append(f"target {key}: {value if not isinstance(value, float) else round(value, 2)}")
    return out


def plot(soak: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = soak["checkpoints"]
    x = [cp["commits"]["unmaintained"] for cp in points]
    colours = {
        "maintained": "#1f77b4",
        "unmaintained": "#d62728",
        "compacted": "#2ca02c",
        EQUALITY: "#ff7f0e",
    }
    labels = list(soak.get("tables", TABLES))
    bare = [label for label in labels if any(label in cp.get("nodeletes", {}) for cp in points)]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, engine, title in ((axes[0][0], "spark", "Spark"), (axes[0][1], "duckdb", "DuckDB")):
        for label in (*labels, "compacted"):
            ys = [cp[label][f"{engine}_s"] for cp in points]
            ax.plot(
                x,
                [y if y is not None else float("nan") for y in ys],
                marker="o",
                ms=3,
                label=label,
                color=colours[label],
            )
        for label in bare:  # the table's live data files without its deletes
            ys = [cp.get("nodeletes", {}).get(label, {}).get(f"{engine}_s") for cp in points]
            ax.plot(
                x,
                [y if y is not None else float("nan") for y in ys],
                marker="x",
                ms=3,
                linestyle=":",
                label=f"{label}, without deletes",
                color=colours[label],
            )
        ref = [cp["compacted"][f"{engine}_s"] for cp in points]
        ax.plot(
            x,
            [SCAN_TARGET * r if r else float("nan") for r in ref],
            linestyle="--",
            color="black",
            linewidth=1,
            label=f"{SCAN_TARGET}x compacted (target)",
        )
        ax.set_yscale("log")
        ax.set_title(f"{title}: scan time (median of 3 under 3 s)", fontsize=9)
        ax.set_xlabel("commits")
        ax.set_ylabel("seconds (log)")
        ax.legend(fontsize=7)
    ax = axes[0][2]
    for label in labels:
        windows = soak.get("commits", {}).get(label, {}).get("windows", [])
        ax.plot(
            [w["until"] for w in windows],
            [w["p50"] for w in windows],
            marker="o",
            ms=3,
            color=colours[label],
            label=f"{label} p50",
        )
        ax.plot(
            [w["until"] for w in windows],
            [w["p99"] for w in windows],
            marker="^",
            ms=3,
            linestyle=":",
            color=colours[label],
            label=f"{label} p99",
        )
    ax.set_title(f"commit duration per {soak['params']['every']} commits", fontsize=9)
    ax.set_xlabel("commits")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    for ax, title, value in (
        (axes[1][0], "current metadata file (KiB)", lambda t: t["metadata_bytes"] / 1024),
        (axes[1][1], "snapshots", lambda t: t["snapshots"]),
        (axes[1][2], "object store under the table's location (MiB)", lambda t: t["store"]["bytes"] / 2**20),
    ):
        for label in labels:
            ax.plot(
                x, [value(cp[label]) for cp in points], marker="o", ms=3, color=colours[label], label=label
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("commits")
        ax.legend(fontsize=7)
    p = soak["params"]
    fig.suptitle(
        f"icesink soak: {p['commits']:,} upsert commits of {p['per_commit']} events per table, "
        f"maintained (icesink maintain every {soak['maintenance']['interval']}) vs unmaintained"
        + (
            f", table.delete_format {p['delete_format']}"
            if p.get("delete_format", "equality") != "equality"
            else ""
        )
        + (f" (and {EQUALITY}: equality deletes, no maintenance)" if EQUALITY in labels else "")
        + ", same events",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
