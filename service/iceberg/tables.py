"""The sink's table: catalog connection, automatic creation, compatibility checks, delete spec."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs
from pyiceberg.manifest import ManifestContent
from pyiceberg.partitioning import (
    PartitionField,
    PartitionSpec,
    _PartitionNameGenerator,
    _visit_partition_field,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddPartitionSpecUpdate, AssertLastAssignedPartitionId
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

from service.config import Mode, SinkConfig, TableConfig
from service.iceberg.evolution import EvolutionPolicy, apply, check, plan
from service.iceberg.hive import bound_metastore_calls, check_metastore_calls
from service.model.columns import Column, SchemaError, check_key_types, columns_for_table, iceberg_schema
from service.model.object_store import with_object_store_io
from service.units import parse_duration

logger = logging.getLogger(__name__)

# Table properties set on tables icesink creates (the user's table.properties win).
# The delete format an upsert table was created with (service.config.TableConfig.delete_format: auto
# reads it; a table without it was not created by a sink that chose: equality).
DELETE_FORMAT_PROPERTY = "icesink.delete-format"

DEFAULT_TABLE_PROPERTIES = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.parquet.compression-codec": "zstd",
}


def metadata_properties(config: SinkConfig) -> dict[str, str]:
    """A streaming table commits every few seconds and each commit writes a new metadata file: the
    catalog deletes those beyond the newest ``maintenance.metadata_versions`` at each commit.

    Every other writer of the table (the maintainer's compactions, a user's Spark job) commits between
    the sink's commits, and when one lands first, Iceberg's Java writers reload and try again, up to
    ``commit.retry.num-retries`` times (4 by default, with waits growing to seconds): next to a sink
    committing every second, a compaction lost all four often enough to redo its whole rewrite.
    ``maintenance.commit_retries`` more tries, each soon after the last, keep it."""
    return {
        TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
        TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: str(config.maintenance.metadata_versions),
        "commit.retry.num-retries": str(config.maintenance.commit_retries),
        "commit.retry.max-wait-ms": "1000",
    }


_TRANSFORM_RE = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([\w.]+)\s*\)\s*$")


REQUEST_TIMEOUT_PROPERTY = "icesink.request-timeout"  # catalog property, a duration (default 60s)


def request_timeout_s(config: SinkConfig) -> float:
    return parse_duration(config.catalog.get(REQUEST_TIMEOUT_PROPERTY, "60s")).total_seconds()


def open_catalog(config: SinkConfig) -> Catalog:
    catalog = load_catalog(config.catalog_name, **with_object_store_io(config.catalog_properties))
    bound_metastore_calls(catalog, request_timeout_s(config))
    check_metastore_calls(catalog)
    return catalog


def parse_partition_field(text: str) -> tuple[str, Transform[Any, Any]]:
    """``country`` → identity; ``day(ts)``, ``bucket(16, id)``, ``truncate(4, name)``, ``hour(ts)`` ..."""
    if re.fullmatch(r"\s*[\w.]+\s*", text):
        return text.strip(), IdentityTransform()
    match = _TRANSFORM_RE.match(text)
    if match is None:
        raise SchemaError(
            f"partition_by: can't parse {text!r} (use col, day(col), bucket(16, col), truncate(4, col))"
        )
    name, number, column = match.group(1).lower(), match.group(2), match.group(3)
    simple: dict[str, Transform[Any, Any]] = {
        "identity": IdentityTransform(),
        "year": YearTransform(),
        "years": YearTransform(),
        "month": MonthTransform(),
        "months": MonthTransform(),
        "day": DayTransform(),
        "days": DayTransform(),
        "hour": HourTransform(),
        "hours": HourTransform(),
    }
    if name in simple and number is None:
        return column, simple[name]
    if name == "bucket" and number is not None:
        return column, BucketTransform(int(number))
    if name == "truncate" and number is not None:
        return column, TruncateTransform(int(number))
    raise SchemaError(f"partition_by: unknown transform in {text!r}")


# The one table format the writer serves: equality deletes and sequence numbers need v2, and pyiceberg
# (the writer) can't write v3 (row lineage, deletion vectors).
FORMAT_VERSION = 2
_WHY_NOT = {
    1: "format v1 has no delete files and no sequence numbers, which the sink's commits need; "
    "upgrade the table to v2 (in Spark: ALTER TABLE ... SET TBLPROPERTIES ('format-version'='2'))",
    3: "pyiceberg, the sink's writer, can't write format v3 tables (row lineage, deletion vectors)",
}


def format_version_problem(identifier: str, version: int | str) -> str | None:
    """Why a table of this format version can't be served, or None for v2."""
    if str(version) == str(FORMAT_VERSION):
        return None
    why = _WHY_NOT.get(int(version) if str(version).isdigit() else -1, "an unknown format version")
    return f"table {identifier}: format v{version}, but icesink writes format v{FORMAT_VERSION} only: {why}"


def check_writable(table: Table, identifier: str) -> None:
    """Refuse, before anything is written, a table the sink could never commit a batch to.

    Found at the first commit instead, such a table fails after the batch's precommit: the plan can
    never be committed and every restart tries it again. Nested columns are refused here too.
    """
    if (problem := format_version_problem(identifier, table.metadata.format_version)) is not None:
        raise SchemaError(problem)
    columns_for_table(table.schema())


def ensure_table(
    catalog: Catalog, config: SinkConfig, columns: list[Column] | None, settings: TableConfig | None = None
) -> Table:
    """Load the table, or create it (namespace too) from ``columns`` when allowed."""
    cfg = settings or config.table
    try:
        table = catalog.load_table(cfg.identifier)
        check_writable(table, cfg.identifier)
    except NoSuchTableError:
        if not cfg.create:
            raise SchemaError(f"table {cfg.identifier} does not exist and table.create is false") from None
        if not columns:
            raise SchemaError(
                f"table {cfg.identifier} does not exist and its schema is unknown: configure table.columns "
                "or send events with a schema section"
            ) from None
        table = _create(catalog, config, columns, cfg)
    if columns:
        evolution = plan(table.schema(), columns)
        check(evolution, EvolutionPolicy(cfg.schema_evolution), cfg.identifier)
        table = apply(table, evolution)
    types = {f.name: f.field_type for f in table.schema().fields}
    missing = [k for k in cfg.key if k not in types]
    if missing:
        raise SchemaError(f"key column(s) {missing} are not in table {cfg.identifier}")
    check_key_types(types, cfg.key)
    return table


def _create(catalog: Catalog, config: SinkConfig, columns: list[Column], cfg: TableConfig) -> Table:
    """Create the table in one catalog commit: schema with the key as identifier fields, partition
    spec, sort order (none: icesink's files are not sorted) and properties, among them the write
    settings icesink's files will have, so that the table says what its files are."""
    try:
        catalog.create_namespace(cfg.namespace)
        logger.info("created namespace %s", ".".join(cfg.namespace))
    except NamespaceAlreadyExistsError:
        pass
    schema: Schema = iceberg_schema(columns, cfg.key)
    spec = partition_spec(schema, cfg.partition_by)
    properties = {
        **DEFAULT_TABLE_PROPERTIES,
        **metadata_properties(config),
        **cfg.properties,
        **config.write.table_properties(),
        **({DELETE_FORMAT_PROPERTY: created_delete_format(cfg)} if cfg.mode is Mode.UPSERT else {}),
    }
    try:
        table = catalog.create_table(
            cfg.identifier,
            schema=schema,
            partition_spec=spec,
            sort_order=UNSORTED_SORT_ORDER,
            properties=properties,
        )
    except TableAlreadyExistsError:
        return catalog.load_table(cfg.identifier)
    logger.info(
        "created table %s (format v2, key %s, partitioned by %s, %s Parquet)",
        cfg.identifier,
        cfg.key,
        cfg.partition_by or "nothing",
        properties[TableProperties.PARQUET_COMPRESSION],
    )
    return table


def created_delete_format(cfg: TableConfig) -> str:
    """The delete format of an upsert table the sink creates: ``auto`` is ``position``."""
    return "position" if cfg.delete_format == "auto" else cfg.delete_format


def delete_format(table: Table, cfg: TableConfig) -> str:
    """The delete format the sink writes ``table`` with: as configured, else (``auto``) the one the
    table was created with, and ``equality`` for a table no sink created (other writers may change
    it, and a key index assumes none does)."""
    if cfg.delete_format != "auto":
        return cfg.delete_format
    return table.properties.get(DELETE_FORMAT_PROPERTY, "equality")


def partition_spec(schema: Schema, partition_by: list[str]) -> PartitionSpec:
    """The spec of ``partition_by`` (``country``, ``day(ts)``, ``bucket(16, id)`` ...) over ``schema``,
    its fields named as Iceberg names them (``ts_day``, ``id_bucket_16``)."""
    fields = []
    for i, text in enumerate(partition_by):
        column, transform = parse_partition_field(text)
        try:
            source = schema.find_field(column)
        except ValueError:
            raise SchemaError(f"partition_by: column {column!r} is not among the table's columns") from None
        field = PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name="")
        name = _visit_partition_field(schema, field, _PartitionNameGenerator())
        fields.append(field.model_copy(update={"name": name}))
    return PartitionSpec(*fields)


def check_write_properties(table: Table, overrides: dict[str, str]) -> None:
    """Refuse to start when the table's Parquet settings (``write.parquet.*``, with the sink's
    ``write`` settings on top) can't be written, before anything is read or precommitted: otherwise
    every batch would fail on it (a codec pyarrow lacks, such as lzo, say)."""
    properties = {**table.properties, **overrides}
    try:
        kwargs = _get_parquet_writer_kwargs(properties)
        pq.write_table(pa.table({"probe": [1]}), pa.BufferOutputStream(), **kwargs)
    except (ValueError, OSError, pa.ArrowException) as exc:
        settings = {k: v for k, v in properties.items() if k.startswith("write.parquet.")}
        raise SchemaError(
            f"table {'.'.join(table.name())}: its Parquet settings {settings} can't be written ({exc}); "
            "change the table property or override it in the sink's write section"
        ) from None


def live_data_spec_ids(table: Table) -> set[int]:
    """The specs of the data files in the table's current snapshot (read from its manifest list)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return set()
    return {
        m.partition_spec_id
        for m in snapshot.manifests(table.io)
        if m.content == ManifestContent.DATA and (m.added_files_count or 0) + (m.existing_files_count or 0)
    }


def delete_spec(table: Table, key: list[str]) -> tuple[Table, int]:
    """The spec a batch's equality deletes are written with, and the table (reloaded if a spec was added).

    An equality delete scoped to a partition applies only to data files of that partition and spec,
    so it is right only when a key always maps to the same partition of the files it must reach:
    the default spec partitions by key columns only and every live data file was written with it.
    Otherwise (rows may move between partitions, or older files sit in another spec, say after another
    engine added a partition field) deletes are global: written with an unpartitioned spec, which is
    added to the table's specs, without becoming the default, if the table has none. Chosen again for
    every batch, since another engine may change the spec at any time.
    """
    metadata = table.metadata
    default = metadata.spec()
    if default.is_unpartitioned():
        return table, default.spec_id
    schema = table.schema()
    key_ids = {schema.find_field(k).field_id for k in key}
    if {f.source_id for f in default.fields} <= key_ids and live_data_spec_ids(table) <= {default.spec_id}:
        return table, default.spec_id
    for spec in metadata.partition_specs:
        if spec.is_unpartitioned():
            return table, spec.spec_id
    return _add_unpartitioned_spec(table)


def _add_unpartitioned_spec(table: Table) -> tuple[Table, int]:
    new_id = max(s.spec_id for s in table.metadata.partition_specs) + 1
    spec = PartitionSpec(spec_id=new_id)
    table.catalog.commit_table(
        table,
        (AssertLastAssignedPartitionId(last_assigned_partition_id=table.metadata.last_partition_id),),
        (AddPartitionSpecUpdate(spec=spec),),
    )
    logger.info(
        "added unpartitioned spec %d to %s for global equality deletes", new_id, ".".join(table.name())
    )
    return table.catalog.load_table(table.name()), new_id


class KnownTables:
    """Each table as the sink's own last commit left it, so that the next batch writes and commits
    on that metadata instead of loading the table again (two catalog round trips a batch per table).

    Another writer's commit in between (a compaction, another engine) moves the table's branch: the
    first commit attempt on the known metadata then conflicts, and the retry loads the table, as any
    conflict does. A schema or partition change by another engine makes no snapshot; it is seen when
    the sink next loads the table: at most ``MAX_AGE_S`` after the last load, as the sink's own
    loads used to see it at most a batch apart.
    """

    MAX_AGE_S = 30.0

    def __init__(self) -> None:
        self._tables: dict[str, tuple[Table, float]] = {}
        self._lock = threading.Lock()

    def get(self, identifier: str, catalog: Catalog | None = None) -> Table | None:
        """The known table, fresh enough, bound to ``catalog`` if given (a REST catalog's session
        belongs to one thread)."""
        with self._lock:
            known = self._tables.get(identifier)
        if known is None or time.monotonic() - known[1] > self.MAX_AGE_S:
            return None
        table = known[0]
        if catalog is None or catalog is table.catalog:
            return table
        return Table(
            table.name(),
            metadata=table.metadata,
            metadata_location=table.metadata_location,
            io=table.io,
            catalog=catalog,
        )

    def put(self, identifier: str, table: Table, loaded: bool = False) -> None:
        """Remember ``table``: just committed by the sink, or (``loaded``) just loaded, which also
        restarts the clock of :attr:`MAX_AGE_S`."""
        with self._lock:
            since = self._tables.get(identifier, (None, time.monotonic()))[1]
            self._tables[identifier] = (table, time.monotonic() if loaded else since)

    def advance(self, identifier: str, base: str, table: Table) -> None:
        """Remember ``table``, just committed on the metadata at ``base``, unless the known table is
        no longer that one (loaded again meanwhile, say after a schema change): a commit in the
        background never puts back older metadata than what the sink loaded since."""
        with self._lock:
            known = self._tables.get(identifier)
            if known is None or known[0].metadata_location == base:
                self._tables[identifier] = (table, known[1] if known is not None else time.monotonic())

    def forget(self, identifier: str) -> None:
        with self._lock:
            self._tables.pop(identifier, None)
