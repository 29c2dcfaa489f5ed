"""One table's pipeline: its Kafka rows → decoded changes → last change per key → files → TableWrite.

A batch takes one of two paths, both ending in a :class:`TableWrite`:

* the Arrow path (:mod:`service.data.arrow_job`): one Spark job whose Python tasks decode, compact
  and write; it declines a batch it can't vouch for, and
* Spark's path: Spark's decoder (:mod:`service.data.spark_decode`), schema evolution first, then one
  ``mapInArrow`` that writes the compacted rows; the dead letters are sent last.

Either is retried as a whole (:meth:`TablePipeline._retrying`): nothing is precommitted before it
returns, so an attempt that failed leaves only orphan files.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.config import Mode, SinkConfig, TableConfig
from service.data import arrow_job, registry_decode
from service.data.arrow_decode import Declined, unsupported
from service.data.envelope import ERROR_COLUMN, KAFKA_POSITION, SOURCE_COLUMNS
from service.data.files import (
    DELETE_OP,
    LOCATED,
    OP_COLUMN,
    OUTPUT_SCHEMA,
    WriteSpec,
    located_of,
    writable,
    write_partition,
)
from service.data.registry import Registry
from service.data.spark_decode import decode, latest_per_key
from service.iceberg.catalog import catalog_retries
from service.iceberg.tables import (
    DEFAULT_TABLE_PROPERTIES,
    KnownTables,
    check_write_properties,
    delete_format,
    delete_spec,
    ensure_table,
    format_version_problem,
    parse_partition_field,
)
from service.kafka.lookups import Peek, peek
from service.kafka.records import KafkaRecords
from service.metrics import SinkMetrics
from service.model.columns import (
    Column,
    Encoding,
    SchemaError,
    check_key_types,
    column_from_config,
    columns_from_envelope_schema,
)
from service.model.datafile_json import from_json
from service.model.offsets import Offsets
from service.pipeline.dead_letters import send_decoded, send_found
from service.pipeline.isolation import isolates
from service.pipeline.result import TableWrite
from service.pipeline.schemas import EVOLVED, SchemaTracker
from service.retrying import Backoff, brief, retry_call

logger = logging.getLogger(__name__)
T = TypeVar("T")


# A batch with new schema versions evolves its table and is written again; it can take a few turns (a
# version refused, another one evolving), never more than this.
MAX_EVOLUTIONS = 5


class FramedBatchRefused(SchemaError):
    """An Avro or Protobuf batch the Arrow path can't write (a key in two Kafka partitions, a task over
    source.max_task_bytes, a column without an Arrow conversion): Debezium JSON would take Spark's
    path, these formats have none. The table's own failure: ``table.on_failure`` may isolate it."""


class StopRequested(RuntimeError):
    """A batch that began after a stop request is not processed (its offsets stay uncommitted)."""


def check_new_table(
    config: SinkConfig, settings: TableConfig, catalog: Catalog, declared: list[Column] | None
) -> None:
    """Refuse key and partition settings a new table can't have, before anything is created.

    Otherwise the error surfaces halfway: after the namespace was created, or (a transform that does
    not fit its column's type) after the table was created without its partitioning.
    """
    cfg = settings
    if not cfg.create or declared is None or catalog.table_exists(cfg.identifier):
        return
    version = {**DEFAULT_TABLE_PROPERTIES, **cfg.properties}["format-version"]
    if (problem := format_version_problem(cfg.identifier, version)) is not None:
        raise SchemaError(f"table.properties: {problem}")
    types = {c.name: c.type for c in declared}
    missing = [k for k in cfg.key if k not in types]
    if missing:
        raise SchemaError(f"table.key: column(s) {missing} are not among the columns {sorted(types)}")
    check_key_types(types, cfg.key)
    for text in cfg.partition_by:
        column, transform = parse_partition_field(text)
        if column not in types:
            raise SchemaError(f"partition_by: column {column!r} is not among the columns {sorted(types)}")
        if not transform.can_transform(types[column]):
            raise SchemaError(
                f"partition_by: {text!r}: {transform} can't be applied to {column} (type {types[column]})"
            )


def registry(config: SinkConfig) -> Registry | None:
    """The schema registry of an Avro or Protobuf source; None for Debezium JSON."""
    source = config.source
    return Registry(source.schema_registry) if source.framed and source.schema_registry is not None else None


def peek_topics(config: SinkConfig, topics: list[str]) -> Peek:
    """What the first records of ``topics`` say (their schema, source, key fields), in the source's format."""
    framed = registry(config)
    if framed is None:
        return peek(config.kafka, topics)
    return peek(
        config.kafka, topics, parse=registry_decode.Schemas(framed, config.source.format).as_json_event
    )


def resolve_key(
    settings: TableConfig, catalog: Catalog, peeked: Peek, declared: list[Column] | None
) -> TableConfig:
    """The table's settings with its key: configured, else the Kafka record key's fields (Debezium keys
    records by primary key), else the existing table's identifier fields. An upsert table with none
    of the three can't be written."""
    if settings.key or settings.mode is not Mode.UPSERT:
        return settings
    columns = {c.name for c in declared or []}
    if peeked.key_fields and (not columns or set(peeked.key_fields) <= columns):
        key = list(peeked.key_fields)
    elif catalog.table_exists(settings.identifier):
        key = sorted(catalog.load_table(settings.identifier).schema().identifier_field_names())
    else:
        key = []
    if not key:
        raise SchemaError(
            f"table {settings.identifier}: upsert mode needs a key, and none was found: its records have no "
            f"key fields and the table has no identifier fields; set tables.{settings.identifier}.key (or "
            "table.key), or mode: append"
        )
    logger.info(
        "table %s: key %s (from %s)",
        settings.identifier,
        key,
        "the records' keys" if peeked.key_fields else "the table",
    )
    return settings.model_copy(update={"key": key})


def resolve_table(
    config: SinkConfig, settings: TableConfig, catalog: Catalog, topics: list[str]
) -> tuple[Table, TableConfig, dict[str, Encoding]]:
    """The table (created or evolved if needed), its settings with the key resolved, and the
    encodings the events use per column."""
    declared: list[Column] | None = None
    peeked = Peek()
    if settings.columns:
        declared = [column_from_config(c.name, c.type, c.required, c.encoding) for c in settings.columns]
    if not settings.columns or (settings.mode is Mode.UPSERT and not settings.key):
        peeked = peek_topics(config, topics)
    if not settings.columns and peeked.schema is not None:
        declared = columns_from_envelope_schema(
            peeked.schema, variable_scale=config.source.variable_scale_type
        )
    settings = resolve_key(settings, catalog, peeked, declared)
    check_new_table(config, settings, catalog, declared)
    table = ensure_table(catalog, config, declared, settings)
    if settings.mode is Mode.UPSERT:
        settings = settings.model_copy(update={"delete_format": delete_format(table, settings)})
        logger.info("table %s: upserts write %s deletes", settings.identifier, settings.delete_format)
    return table, settings, {c.name: c.encoding for c in declared or []}


class TablePipeline:
    """Writes batches into one table; :meth:`open` loads (or creates) the table first."""

    def __init__(
        self,
        config: SinkConfig,
        settings: TableConfig,
        catalog: Catalog,
        metrics: SinkMetrics,
        schemas: SchemaTracker,
        known: KnownTables,
    ) -> None:
        self.config = config
        self.settings = settings
        self.catalog = catalog
        self.metrics = metrics
        self.schemas = schemas
        self.known = known  # the table as the sink's last commit left it
        self._last: Table | None = None  # the table as last loaded

    @classmethod
    def open(
        cls,
        config: SinkConfig,
        settings: TableConfig,
        topics: list[str],
        catalog: Catalog,
        metrics: SinkMetrics,
        known: KnownTables,
    ) -> TablePipeline:
        """Load the table (creating it from its topics' schema or the configured columns if needed) and
        check that icesink can write it as configured."""
        table, settings, encodings = catalog_retries(
            config,
            f"loading (or creating) the table {settings.identifier}",
            lambda: resolve_table(config, settings, catalog, topics),
        )
        check_write_properties(table, config.write.table_properties())
        schemas = SchemaTracker(
            settings,
            table,
            encodings,
            config.source.variable_scale_type,
            tasks_dead_letter=config.source.framed,
        )
        return cls(config, settings, catalog, metrics, schemas, known)

    @property
    def identifier(self) -> str:
        return self.settings.identifier

    @property
    def upsert(self) -> bool:
        return self.settings.mode is Mode.UPSERT

    def arrow_ready(self) -> bool:
        return self.schemas.arrow_ready()

    def write_arrow(self, records: KafkaRecords, offsets: Offsets) -> TableWrite | None:
        """The batch through the one-job Arrow path; None if the Arrow decoder declined it (JSON;
        Avro and Protobuf have no other path: :func:`write_framed`)."""
        if self.config.source.framed:
            return write_framed(self, records, offsets)
        started = time.monotonic()
        try:
            batch = self._retrying(lambda: self._arrow_run(records))
        except Declined as exc:
            self.declined(str(exc))
            return None
        return self.arrow_written(batch, offsets, started)

    def evolved(self, reason: str) -> bool:
        """Whether an Avro/Protobuf batch was declined because the table evolved for it: its write
        starts again from the catalog's table (the one the sink knew is older)."""
        if reason != EVOLVED:
            return False
        logger.info("table %s: %s", self.identifier, EVOLVED)
        self.known.forget(self.identifier)
        return True

    def declined(self, reason: str) -> None:
        logger.info(
            "batch of %s declined by the Arrow decoder (%s); decoding it with Spark", self.identifier, reason
        )
        self.metrics.declined_batches.add(1, self.metrics.attrs(table=self.identifier))

    def arrow_written(self, batch: arrow_job.ArrowResult, offsets: Offsets, started: float) -> TableWrite:
        """The TableWrite of a batch the Arrow path wrote."""
        written = time.monotonic()
        logger.debug(
            "Arrow batch: %d records; in the tasks: decode + compaction %.2fs, files %.2fs; job %.2fs",
            batch.records,
            batch.task_seconds.get("decode", 0.0),
            batch.task_seconds.get("write", 0.0),
            written - started,
        )
        return TableWrite(
            table=self.identifier,
            offsets=offsets,
            started=started,
            written=written,
            files=batch.files,
            records=batch.records + (0 if batch.dead is None else batch.dead.num_rows),
            by_op=batch.by_op,
            newest=batch.newest,
            decoder=self.config.source.format.removeprefix("debezium-")
            if self.config.source.framed
            else "arrow",
            located=batch.located,
            dead_letters=0 if batch.dead is None else batch.dead.num_rows,
        )

    def write_spark(self, records: DataFrame, offsets: Offsets, newest: datetime | None = None) -> TableWrite:
        """The batch through Spark's decoder: the table evolved first if the events' schema changed
        (so the table is loaded again, here and for the commit)."""
        if self.config.source.framed:
            reason = unsupported(self.schemas.columns) or "its events' schema is being dead-lettered"
            raise FramedBatchRefused(
                f"table {self.identifier}: the Arrow decoder can't take it ({reason}), and Spark's decoder "
                f"reads Debezium JSON only, not {self.config.source.format}"
            )
        started = time.monotonic()
        self.known.forget(self.identifier)
        return self._retrying(
            lambda: self._spark_write(
                records, offsets, self.schemas.evolve(records, self.catalog), started, newest
            )
        )

    def _retrying(self, write: Callable[[], T]) -> T:
        """Run ``write`` (a batch's files, no commit), retrying failures that are not the records' fault.

        A batch that fails as a whole (catalog or object store down, the dead-letter topic refusing
        writes) is retried with bounded exponential backoff, and its records are never dead-lettered
        for it. Nothing is precommitted before this returns, so a retry is safe; the files of a failed
        attempt are orphans (``icesink orphans``). After ``commit.retries`` attempts the error stops the
        sink, and a restart resumes from the committed offsets.
        """
        attempts = self.config.commit.retries
        final = (SchemaError, StopRequested, Declined)

        def on_failure(attempt: int, exc: BaseException) -> None:
            logger.warning(
                "writing the batch failed (attempt %d/%d): %s", attempt, max(1, attempts), brief(exc)
            )

        return retry_call(
            write,
            Backoff(attempts, initial_s=1.0, max_s=30.0),
            # a failure that isolates the table does so now, rather than stall the others
            retry_on=lambda exc: (
                isinstance(exc, Exception) and not isinstance(exc, final) and not isolates(self.settings, exc)
            ),
            on_failure=on_failure,
        )

    def write_spec(self) -> WriteSpec:
        """What a writer needs to write files into the table as it is now (held rows, written outside
        a batch's retried job: a catalog answer that may pass is retried here)."""
        return self._write_spec(
            catalog_retries(self.config, f"loading the table {self.identifier}", self._load)
        )

    def _load(self) -> Table:
        """The table as the sink's last commit left it (service.iceberg.tables.KnownTables), else loaded."""
        table = self.known.get(self.identifier, self.catalog)
        if table is None:
            table = self.catalog.load_table(self.identifier)
            self.known.put(self.identifier, table, loaded=True)
        self._last = table
        return table

    def _write_spec(self, table: Table) -> WriteSpec:
        """What the tasks need to write this batch's files into ``table`` as it is now."""
        delete_spec_id = None
        positions = self.settings.delete_format == "position"
        if self.upsert and not positions:
            with_spec, delete_spec_id = delete_spec(table, self.settings.key)
            if with_spec is not table:  # a spec was added: the table was loaded again
                self.known.put(self.identifier, with_spec, loaded=True)
            table = with_spec
        return WriteSpec(
            metadata=writable(table.metadata),
            io_properties=dict(table.io.properties),
            key=list(self.settings.key),
            upsert=self.upsert,
            delete_spec_id=delete_spec_id,
            writer_properties=self.config.write.table_properties(),
            delete_format=self.settings.delete_format,
        )

    def arrow_spec(self, topics: list[str], hold: bool = False) -> arrow_job.TableSpec:
        """What the Arrow path's tasks need to write this table's rows of a batch, as the table is now
        (``hold``: to hand them back instead, service.pipeline.held; the tasks write nothing then, so
        the table as last loaded serves, and the held rows are written later with a fresh load)."""
        table = self._last if hold and self._last is not None else self._load()
        spec = arrow_job.ArrowTaskSpec(
            write=self._write_spec(table),
            columns=self.schemas.columns,
            max_record_bytes=self.config.source.max_record_bytes,
            max_task_bytes=self.config.source.max_task_bytes,
            schema_sections=self.schemas.track,
            hold=hold,
            registry=registry(self.config),
            format=self.config.source.format,
            strict=self.settings.on_incompatible_schema == "fail",
            rejected=dict(self.schemas.rejected),
        )
        check_schemas: Callable[[set[str]], str | None] | None = None
        if self.schemas.track and self.config.source.framed:  # new versions evolve the table, then again
            check_schemas = partial(self.schemas.adopt, table, catalog=self.catalog)
        elif self.schemas.track:  # new versions decline the batch to Spark's path, which evolves
            check_schemas = partial(self.schemas.arrow_reason, table)
        return arrow_job.TableSpec(spec, topics, check_schemas)

    def _arrow_run(self, records: KafkaRecords) -> arrow_job.ArrowResult:
        table_spec = self.arrow_spec([])
        result = arrow_job.run(arrow_input(records), table_spec.spec, table_spec.check_schemas)
        send_found(self.config, self.metrics, result.dead)
        return result

    def _spark_write(
        self,
        records: DataFrame,
        offsets: Offsets,
        versions: dict[str, list[Column]],
        started: float,
        newest: datetime | None,
    ) -> TableWrite:
        columns = [F.col(f"`{c.name}`") for c in self.schemas.columns]
        # Only what counting and writing need is cached: the raw key and value (most of the bytes)
        # stay in the persisted records, from which the rare dead-letter write decodes again.
        changes = (
            self._decode(records, versions)
            .select(*columns, F.col(OP_COLUMN), *SOURCE_COLUMNS, *KAFKA_POSITION, F.col(ERROR_COLUMN))
            .persist()
        )
        try:
            records_n, dead_letters = 0, 0
            by_op: dict[str, int] = {}
            for row in (
                changes.groupBy(OP_COLUMN, F.col(ERROR_COLUMN).isNotNull().alias("bad")).count().collect()
            ):
                records_n += row["count"]
                if row["bad"]:
                    dead_letters += row["count"]
                else:
                    by_op[row[OP_COLUMN]] = by_op.get(row[OP_COLUMN], 0) + row["count"]
            good = changes.where(F.col(ERROR_COLUMN).isNull()).drop(ERROR_COLUMN)
            rows = (
                latest_per_key(good, self.settings.key)
                if self.upsert
                else good.where(F.col(OP_COLUMN) != DELETE_OP)
            )
            table = self.catalog.load_table(self.identifier)  # as evolved
            self.known.put(self.identifier, table, loaded=True)
            rows = rows.select(*columns, F.col(OP_COLUMN))
            spec = table.spec()
            if not spec.is_unpartitioned():
                sources = [table.schema().find_column_name(f.source_id) for f in spec.fields]
                rows = rows.repartition(
                    self.config.write.parallelism, *[F.col(f"`{s}`") for s in sources if s]
                )
            write_spec = self._write_spec(table)
            write = partial(write_partition, write_spec, names=rows.columns)
            out = positional(rows).mapInArrow(write, OUTPUT_SCHEMA).collect()
            files = [from_json(json.loads(r["file"])) for r in out if r["content"] != LOCATED]
            located = located_of([r["located"] for r in out if r["content"] == LOCATED])
            # Last, so that a batch retried because its files could not be written (catalog or object
            # store down) does not send its dead letters twice.
            if dead_letters:
                bad = self._decode(records, versions).where(F.col(ERROR_COLUMN).isNotNull())
                send_decoded(self.config, self.metrics, bad)
        finally:
            changes.unpersist()
        return TableWrite(
            table=self.identifier,
            offsets=offsets,
            started=started,
            written=time.monotonic(),
            files=files,
            records=records_n,
            dead_letters=dead_letters,
            by_op=by_op,
            newest=newest,
            located=located,
        )

    def _decode(self, records: DataFrame, versions: dict[str, list[Column]]) -> DataFrame:
        """Spark's decoder; tombstones are deletes in upsert mode and ignored in append mode;
        ``versions``: see :meth:`SchemaTracker.evolve`."""
        return decode(
            records,
            self.schemas.columns,
            self.settings.key,
            self.config.source.max_record_bytes,
            self.schemas.rejected,
            tombstones=self.upsert,
            versions=versions,
        )


def positional(rows: DataFrame) -> DataFrame:
    """``rows`` with its columns named by position (``_0``, ``_1``, ...): PySpark's ``mapInArrow``
    refers to each column by its unquoted name, which fails for a name with a dot in it (a source
    column ``"customer.name"``); the task renames them back (``write_partition``'s ``names``)."""
    return rows.toDF(*[f"_{i}" for i in range(len(rows.columns))])


def write_framed(pipeline: TablePipeline, records: KafkaRecords, offsets: Offsets) -> TableWrite:
    """An Avro or Protobuf batch through the Arrow path, its only one: a batch with new schema versions
    evolves the table and is written again; any other decline is an error that names its cause."""
    started = time.monotonic()
    for _ in range(MAX_EVOLUTIONS):
        try:
            batch = pipeline._retrying(lambda: pipeline._arrow_run(records))
        except Declined as exc:
            if pipeline.evolved(str(exc)):
                continue
            raise FramedBatchRefused(
                f"table {pipeline.identifier}: the batch can't be written: {exc}; batches of "
                f"{pipeline.config.source.format} have no second decoder to take them"
            ) from None
        return pipeline.arrow_written(batch, offsets, started)
    raise FramedBatchRefused(
        f"table {pipeline.identifier}: the batch still needs the table evolved after {MAX_EVOLUTIONS} evolutions"
    )


@dataclass
class ArrowTables:
    """What one Arrow job did for a batch's tables: the tables it wrote, and the rows of those whose
    changes are held (``hold``); a declined table is in neither (Spark's path takes it)."""

    writes: dict[str, TableWrite] = field(default_factory=dict)
    held: dict[str, arrow_job.ArrowResult] = field(default_factory=dict)


def arrow_input(records: KafkaRecords) -> DataFrame | arrow_job.Ranges:
    """What the Arrow path's tasks read: the batch's offset ranges when the source planned them (Spark's
    rows of them are then never planned), else the rows of Spark's source."""
    if records.ranges is None or records.read is None or records.spark is None:
        return records.rows
    return arrow_job.Ranges(records.spark, records.ranges, records.read)


def write_arrow_tables(
    records: KafkaRecords,
    tables: dict[str, tuple[TablePipeline, list[str], Offsets]],
    hold: frozenset[str] | set[str] = frozenset(),
) -> ArrowTables:
    """Several tables' rows of one batch through the Arrow path in one Spark job (each task writes
    its topic's rows into the topic's table, or hands them back for the tables in ``hold``). The job
    is retried as a whole, as one table's would be."""
    started = time.monotonic()
    first = next(iter(tables.values()))[0]
    specs: dict[str, arrow_job.TableSpec] = {}

    def attempt() -> dict[str, arrow_job.ArrowResult | str]:
        specs.clear()
        for name, (pipeline, topics, _) in tables.items():
            specs[name] = pipeline.arrow_spec(topics, hold=name in hold)
        specified = time.monotonic()
        outcomes = arrow_job.run_tables(arrow_input(records), specs, first.config.write.parallelism)
        for name, outcome in outcomes.items():
            if isinstance(outcome, arrow_job.ArrowResult):
                pipeline = tables[name][0]
                send_found(pipeline.config, pipeline.metrics, outcome.dead)
        if logger.isEnabledFor(logging.DEBUG):
            seconds: dict[str, float] = {}
            for outcome in outcomes.values():
                if isinstance(outcome, arrow_job.ArrowResult):
                    for phase, s in outcome.task_seconds.items():
                        seconds[phase] = seconds.get(phase, 0.0) + s
            logger.debug(
                "%d tables in one job (%d held): their specs (table metadata) %.2fs, the job %.2fs; "
                "in the tasks, summed: %s",
                len(tables),
                len(hold & set(tables)),
                specified - started,
                time.monotonic() - specified,
                ", ".join(f"{phase} {s:.2f}s" for phase, s in sorted(seconds.items())) or "nothing",
            )
        return outcomes

    result = ArrowTables()
    for name, outcome in first._retrying(attempt).items():
        pipeline, _, offsets = tables[name]
        if isinstance(outcome, str):
            if not pipeline.evolved(outcome):  # an evolved table is written again on its own
                pipeline.declined(outcome)
        elif name in hold:
            result.held[name] = outcome
        else:
            result.writes[name] = pipeline.arrow_written(outcome, offsets, started)
    return result
