"""One Spark job per batch: Kafka rows → (Python worker) decode, last change per key, files.

The Spark path (``service.pipeline.table.TablePipeline``) runs three Spark jobs per batch and builds a large
plan each time. When every record of a batch is one the Arrow decoder accepts
(:mod:`service.data.arrow_decode`), this module does the same work in a single Spark job: each task
(one Kafka partition) reads its offset range itself (:class:`Ranges`, an RDD job), or takes the rows of
Spark's Kafka source (a ``mapInArrow``), decodes its records, keeps each key's last change, writes
the data and equality-delete files, and hands back their metadata, its Kafka positions and its keys
(:class:`Output` rows). No cache, no shuffle.

Keeping the last change per key task by task is right only if no key is in two tasks. Debezium keys
records by primary key, so a key's changes share a Kafka partition; the driver checks it anyway
(:func:`run`), and a batch where a key shows up in two tasks is declined and takes the Spark path,
which compacts across partitions. A declined batch's files are deleted; the Spark path writes its own.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyspark.sql import DataFrame, SparkSession

from service.data import registry_decode
from service.data.arrow_decode import Declined, Decoded, LatestPerKey, decode
from service.data.files import (
    DELETE_OP,
    OP_COLUMN,
    WriteSpec,
    Written,
    file_io,
    ipc_bytes,
    located_of,
    write_files,
)
from service.data.registry import Registry
from service.model.columns import Column
from service.model.datafile_json import from_json, to_json
from service.pyworker import freeze_survivors, quiet_zip_importers

logger = logging.getLogger(__name__)
# Imported in the Python workers (the tasks' functions live here): set them up once.
quiet_zip_importers()

OUTPUT_SCHEMA = "kind string, text string, blob binary, target string"
# The default of source.max_task_bytes: a task of the Arrow path declines past this many bytes of
# Kafka rows (Spark's Kafka source: the task holds its share of the batch) or of changes kept (the task
# reader: it holds one chunk of records and the changes it keeps), and Spark's path, which can spill
# to disk, takes the batch.
MAX_TASK_BYTES = 256 * 1024 * 1024
KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp"]


@dataclass(frozen=True)
class ArrowTaskSpec:
    """What a task needs; pickled to the Python workers."""

    write: WriteSpec
    columns: list[Column]
    max_record_bytes: int
    schema_sections: bool = False  # events carry schema sections; hand them back for checking
    max_task_bytes: int = MAX_TASK_BYTES
    hold: bool = False  # hand the rows back instead of writing files (the table's changes are held)
    # source.format debezium-avro/-protobuf: the registry of the records' writer schemas (None: Debezium
    # JSON), and the schema sections whose records are dead letters (why), an incompatible change refused
    registry: Registry | None = None
    format: str = "debezium-json"
    strict: bool = False  # table.on_incompatible_schema: fail (an unreadable writer schema stops the batch)
    rejected: dict[str, str] = field(default_factory=dict)


@dataclass
class ArrowResult:
    """The outcome of a batch written by :func:`run`."""

    files: list[DataFile] = field(default_factory=list)
    located: pa.Table | None = None  # delete_format: position: where the keys' rows are
    rows: list[pa.Table] = field(default_factory=list)  # a held table's rows, partition by partition
    dead: pa.Table | None = None  # Avro: the records the tasks found bad (registry_decode.DEAD_COLUMNS)
    newest: datetime | None = None
    bytes: int = 0
    records: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    task_seconds: dict[str, float] = field(default_factory=dict)  # decode / write, summed over tasks


def _positions(table: pa.Table) -> list[dict[str, int | str | None]]:
    """Per topic-partition: the newest record's timestamp (µs) and the value bytes.

    Where the batch ends is not the last offset read (see service.pipeline.positions.batch_end_offsets)."""
    sizes = pc.fill_null(pc.binary_length(table["value"]), 0)
    grouped = (
        table.select(["topic", "partition"])
        .append_column("ts", pc.cast(table["timestamp"], pa.int64()))
        .append_column("bytes", pc.cast(sizes, pa.int64()))
        .group_by(["topic", "partition"], use_threads=False)
        .aggregate([("ts", "max"), ("bytes", "sum")])
    )
    return [
        {
            "topic": r["topic"],
            "partition": r["partition"],
            "newest_us": r["ts_max"],
            "bytes": r["bytes_sum"],
        }
        for r in grouped.to_pylist()
    ]


class Output(NamedTuple):
    """One row a task hands back (:data:`OUTPUT_SCHEMA`): a file, held rows, its summary, or its decline."""

    kind: str
    text: str
    blob: bytes | None = None
    target: str = ""


def _as_batch(out: Output) -> pa.RecordBatch:
    """An output row for ``mapInArrow`` (the tasks over Spark's rows)."""
    return pa.RecordBatch.from_pydict(
        {
            "kind": pa.array([out.kind]),
            "text": pa.array([out.text]),
            "blob": pa.array([out.blob], pa.binary()),
            "target": pa.array([out.target]),
        }
    )


def process_partition(spec: ArrowTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: one task's Kafka rows → its files, positions and keys, or a decline."""
    yield from process_tables({"": spec}, {}, batches)


def process_tables(
    specs: dict[str, ArrowTaskSpec], targets: dict[str, str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body for a batch of several tables: each topic's rows are written into its
    table (``targets``: topic → table, ``specs``: table → spec; with one table, ``""``)."""
    freeze_survivors()
    collected: list[pa.RecordBatch] = []
    held = 0
    limit = min(spec.max_task_bytes for spec in specs.values())
    for batch in batches:  # read to the end either way; keep nothing past the limit
        held += batch.nbytes
        if held <= limit:
            collected.append(batch)
    if not collected and held <= limit:
        return
    if held > limit:
        reason = f"a task's share of the batch is over {limit >> 20} MiB (cap batches with kafka.max_offsets_per_trigger)"
        for target in specs:
            yield _as_batch(Output("declined", reason, target=target))
        return
    table = pa.Table.from_batches(collected)
    if not targets:
        task = TaskTable(specs[""], "")
        task.add(table)
        yield from map(_as_batch, task.finish())
        return
    # One Kafka partition at a time, as if each had its task (the job coalesces small partitions).
    for topic in pc.unique(table["topic"]).to_pylist():
        rows = table.filter(pc.equal(table["topic"], topic))
        for partition in pc.unique(rows["partition"]).to_pylist():
            task = TaskTable(specs[targets[topic]], targets[topic])
            task.add(rows.filter(pc.equal(rows["partition"], partition)))
            yield from map(_as_batch, task.finish())


class Range(Protocol):
    """A Kafka offset range (:class:`service.kafka.reader.OffsetRange`), as far as this module needs it."""

    @property
    def topic(self) -> str: ...


# How a task reads a range: its Kafka rows (KAFKA_COLUMNS), chunk by chunk.
RangeRead = Callable[[Any], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class Ranges:
    """A batch given as Kafka offset ranges, which the tasks read themselves."""

    spark: SparkSession
    ranges: Sequence[Range]
    read: RangeRead

    def run(
        self, body: Callable[[Iterable[Range]], Iterable[Output]], tasks: int | None = None
    ) -> list[Output]:
        """``body`` over the ranges in one Spark job: a task per core, at most ``tasks`` and at most
        one per range.

        An RDD job, not a DataFrame's ``mapInArrow`` over a ``VALUES`` list of the ranges: it has no
        query to parse, analyse, optimise and plan. Measured on two cores, a job of two trivial Python
        tasks took ~70 ms and ~35 ms of the JVM's CPU, against ~100-115 ms and ~75-110 ms; the sink's
        20,000-event batches went from 0.31-0.34 s to 0.25-0.27 s (``python -m bench.profile``)."""
        if not self.ranges:
            return []
        sc = self.spark.sparkContext
        slices = max(1, min(len(self.ranges), sc.defaultParallelism, tasks or sc.defaultParallelism))
        return list(sc.parallelize(list(self.ranges), slices).mapPartitions(body).collect())

    def of_topics(self, topics: Collection[str]) -> Ranges:
        return replace(self, ranges=[r for r in self.ranges if r.topic in topics])


def process_ranges(
    specs: dict[str, ArrowTaskSpec],
    targets: dict[str, str],
    read: RangeRead,
    ranges: Iterable[Range],
) -> Iterator[Output]:
    """A task of :meth:`Ranges.run`: each range is read by the task itself, chunk by chunk, into its
    topic's table (``targets`` as in :func:`process_tables`)."""
    freeze_survivors()
    for r in ranges:
        target = targets.get(r.topic, "") if targets else ""
        task = TaskTable(specs[target], target)
        chunks = read(r)
        while task.declined is None:  # once declined, its table takes Spark's path, which reads again
            started = time.perf_counter()
            chunk = next(chunks, None)
            task.seconds["read"] += time.perf_counter() - started
            if chunk is None:
                break
            task.add(pa.Table.from_batches([chunk]))
        yield from task.finish()


class TaskTable:
    """One table's rows of one task (one Kafka partition), given chunk by chunk: decoded, each key's
    last change kept as they come (:class:`LatestPerKey`), its files written at the end.

    What a task holds is one chunk of raw records and the rows it keeps (per key, in upsert mode; every
    change but deletes in append mode), declining past ``max_task_bytes`` of them."""

    def __init__(self, spec: ArrowTaskSpec, target: str) -> None:
        self.spec = spec
        self.target = target
        self.declined: str | None = None
        self.records = 0
        self.by_op: dict[str, int] = {}
        self.schemas: set[str] = set()
        self.positions: dict[tuple[str, int], dict[str, Any]] = {}
        self.seconds = {"read": 0.0, "decode": 0.0, "write": 0.0}
        self.latest = LatestPerKey(spec.write.key) if spec.write.upsert else None
        self.appended: list[pa.Table] = []
        self.kept = 0
        self.framed = (
            registry_decode.Schemas(spec.registry, spec.format, spec.strict)
            if spec.registry is not None
            else None
        )
        self.dead: list[pa.Table] = []
        self.empty = pa.table({})  # the decoded rows' columns, without rows

    def add(self, table: pa.Table) -> None:
        if self.declined is not None:
            return
        for p in _positions(table):
            where = (str(p["topic"]), int(p["partition"] or 0))
            seen = self.positions.setdefault(where, {**p, "bytes": 0, "newest_us": None})
            seen["bytes"] += p["bytes"]
            if p["newest_us"] is not None:
                seen["newest_us"] = max(seen["newest_us"] or p["newest_us"], p["newest_us"])
        write = self.spec.write
        # Tombstones are deletes in upsert mode and ignored in append mode, as in Spark's path.
        live = table if write.upsert else table.filter(pc.is_valid(table["value"]))
        started = time.perf_counter()
        try:
            decoded = self._decode(live)
            self.records += decoded.records
            self.empty = decoded.rows.slice(0, 0)
            for op, n in decoded.by_op.items():
                self.by_op[op] = self.by_op.get(op, 0) + n
            self.schemas.update(decoded.schemas)
            if self.latest is not None:
                self.latest.add(decoded.rows)
                self.kept = self.latest.nbytes
            else:
                rows = decoded.rows.filter(pc.not_equal(decoded.rows[OP_COLUMN], DELETE_OP))
                self.appended.append(rows)
                self.kept += rows.nbytes
            if self.kept > self.spec.max_task_bytes:
                raise Declined(
                    f"the changes a task keeps are over {self.spec.max_task_bytes >> 20} MiB "
                    "(cap batches with kafka.max_offsets_per_trigger)"
                )
        except Declined as exc:
            self.declined = str(exc)
        finally:
            self.seconds["decode"] += time.perf_counter() - started

    def _decode(self, live: pa.Table) -> Decoded:
        """The rows' changes, with the JSON decoder (declining at the first record it can't vouch for)
        or the Avro one (its bad records kept as dead letters)."""
        too_big = pc.greater(pc.binary_length(live["value"]), self.spec.max_record_bytes)
        if self.framed is None:
            if pc.any(too_big).as_py():
                raise Declined("a record over source.max_record_bytes")
            return decode(
                live["value"],
                live["key"],
                live,
                self.spec.columns,
                self.spec.write.key,
                self.spec.schema_sections,
            )
        limit = self.spec.max_record_bytes
        result = registry_decode.decode(
            live["value"].to_pylist(),
            live["key"].to_pylist(),
            live,
            self.spec.columns,
            self.spec.write.key,
            self.framed,
            too_big=pc.fill_null(too_big, False).to_pylist(),
            rejected=self.spec.rejected,
            reason_too_big=f"a record over source.max_record_bytes ({limit} bytes)",
        )
        if result.dead.num_rows:
            self.dead.append(result.dead)
        return result.decoded

    def finish(self) -> Iterator[Output]:
        """The task's output rows for this table: its files, held rows, and summary; or its decline."""
        if self.declined is not None:
            yield Output("declined", self.declined, target=self.target)
            return
        if not self.positions:
            return
        write, spec = self.spec.write, self.spec
        started = time.perf_counter()
        rows = self._rows().select([c.name for c in spec.columns] + [OP_COLUMN])
        written = Written() if spec.hold or not rows.num_rows else write_files(write, rows)
        self.seconds["write"] += time.perf_counter() - started
        for f in written.files:
            yield Output("file", json.dumps(to_json(f)), target=self.target)
        if written.located is not None:
            yield Output("located", "", ipc_bytes(written.located), target=self.target)
        if spec.hold and rows.num_rows:
            yield Output("rows", "", ipc_bytes(rows), target=self.target)
        if self.dead:
            yield Output("dead", "", ipc_bytes(pa.concat_tables(self.dead)), target=self.target)
        summary = {
            "positions": list(self.positions.values()),
            "records": self.records,
            "by_op": self.by_op,
            "schemas": sorted(self.schemas),
            "seconds": self.seconds,
        }
        keys = ipc_bytes(rows.select(write.key)) if write.upsert else None
        yield Output("summary", json.dumps(summary), keys, target=self.target)

    def _rows(self) -> pa.Table:
        """The rows to write: every key's last change (upsert), or every change but deletes (append);
        a task with records always added some (a chunk is never empty; its rows are, when every
        record of an Avro task was a dead letter)."""
        if self.latest is not None:
            return self.latest.result() if self.latest.rows is not None else self.empty
        return pa.concat_tables(self.appended) if self.appended else self.empty


def _delete_quietly(spec: WriteSpec, files: list[DataFile]) -> None:
    io = file_io(spec)
    for f in files:
        try:
            io.delete(f.file_path)
        except Exception as exc:  # an orphan then: `icesink orphans` lists it
            logger.warning("could not delete %s of a declined batch: %s", f.file_path, exc)


def _keys_in_two_tasks(blobs: list[bytes]) -> bool:
    if len(blobs) < 2:
        return False
    tables = [pa.ipc.open_stream(b).read_all() for b in blobs]
    keys = pa.concat_tables(tables)
    names = keys.column_names
    counts = keys.group_by(names, use_threads=False).aggregate([([], "count_all")])
    return bool(pc.any(pc.greater(counts["count_all"], 1)).as_py())


def run(
    records: DataFrame | Ranges,
    spec: ArrowTaskSpec,
    check_schemas: Callable[[set[str]], str | None] | None = None,
) -> ArrowResult:
    """Write one batch of Kafka rows in one Spark job; raises Declined (having deleted its files) when
    a task declined, a key turned up in two tasks, or ``check_schemas`` gives a reason not to take
    the events' schema sections (a schema the table must evolve for first). ``records``: the rows
    of Spark's source, or the batch's offset :class:`Ranges`, which the tasks read themselves (a
    task per core, each reading its ranges one by one)."""
    rows: list[Any]
    if isinstance(records, Ranges):
        rows = records.run(partial(process_ranges, {"": spec}, {}, records.read))
    else:
        rows = (
            records.select(*KAFKA_COLUMNS)
            .mapInArrow(partial(process_partition, spec), OUTPUT_SCHEMA)
            .collect()
        )
    outcome = _outcome(spec, rows, check_schemas)
    if isinstance(outcome, str):
        raise Declined(outcome)
    return outcome


@dataclass(frozen=True)
class TableSpec:
    """One table of a batch of several: what its tasks need, its topics, how to check its schemas."""

    spec: ArrowTaskSpec
    topics: list[str]
    check_schemas: Callable[[set[str]], str | None] | None = None


def run_tables(
    records: DataFrame | Ranges, tables: dict[str, TableSpec], tasks: int
) -> dict[str, ArrowResult | str]:
    """Write a batch of several tables in one Spark job: each Kafka partition's rows go into its
    topic's table. Per table, its :class:`ArrowResult`, or why it was declined (its files deleted):
    the declined tables take Spark's path, the others are done.

    A database's topics are many and mostly small: Spark's one task per Kafka partition would spend
    more on scheduling tasks than on their rows, so the partitions are coalesced (no shuffle) into at
    most ``tasks`` tasks, each of which still handles partition by partition."""
    specs = {name: t.spec for name, t in tables.items()}
    targets = {topic: name for name, t in tables.items() for topic in t.topics}
    rows: list[Any]
    if isinstance(records, Ranges):
        rows = records.of_topics(targets).run(partial(process_ranges, specs, targets, records.read), tasks)
    else:
        rows = (
            records.where(records["topic"].isin(list(targets)))
            .coalesce(tasks)
            .select(*KAFKA_COLUMNS)
            .mapInArrow(partial(process_tables, specs, targets), OUTPUT_SCHEMA)
            .collect()
        )
    by_table: dict[str, list[Any]] = {name: [] for name in tables}
    for r in rows:
        by_table[r.target].append(r)
    return {name: _outcome(t.spec, by_table[name], t.check_schemas) for name, t in tables.items()}


def _outcome(
    spec: ArrowTaskSpec, rows: list[Any], check_schemas: Callable[[set[str]], str | None] | None
) -> ArrowResult | str:
    """One table's rows of the job's output → its ArrowResult, or the reason it is declined."""
    files = [from_json(json.loads(r.text)) for r in rows if r.kind == "file"]
    declined = [r.text for r in rows if r.kind == "declined"]
    summaries = [(json.loads(r.text), r.blob) for r in rows if r.kind == "summary"]
    if not declined and spec.write.upsert and _keys_in_two_tasks([b for _, b in summaries if b]):
        declined.append("a key has changes in two Kafka partitions")
    if not declined and check_schemas is not None:
        reason = check_schemas({text for summary, _ in summaries for text in summary["schemas"]})
        if reason:
            declined.append(reason)
    if declined:
        _delete_quietly(spec.write, files)
        return declined[0]
    result = ArrowResult(
        files=files,
        located=located_of([r.blob for r in rows if r.kind == "located"]),
        rows=[pa.ipc.open_stream(r.blob).read_all() for r in rows if r.kind == "rows"],
    )
    dead = [pa.ipc.open_stream(r.blob).read_all() for r in rows if r.kind == "dead"]
    if dead:
        result.dead = pa.concat_tables(dead)
    newest_us: int | None = None
    for summary, _ in summaries:
        for p in summary["positions"]:
            result.bytes += int(p["bytes"] or 0)
            if p["newest_us"] is not None:
                newest_us = max(newest_us or p["newest_us"], p["newest_us"])
        result.records += int(summary["records"])
        for op, n in summary["by_op"].items():
            result.by_op[op] = result.by_op.get(op, 0) + int(n)
        for phase, seconds in summary["seconds"].items():
            result.task_seconds[phase] = result.task_seconds.get(phase, 0.0) + float(seconds)
    if newest_us is not None:
        result.newest = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=newest_us)
    return result
