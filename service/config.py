"""The sink's configuration: one typed place for every option.

A YAML file is read, ``${VAR}`` / ``${VAR:-default}`` references are replaced from the environment,
and variables named ``ICESINK_<SECTION>__<KEY>`` (for example ``ICESINK_TXNLOG__DSN`` or
``ICESINK_CATALOG__CREDENTIAL``) override single keys, so secrets never have to sit in the file.
Unknown keys are errors that name the key.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pyiceberg.types import PrimitiveType

from service.model.columns import (
    DEFAULT_VARIABLE_SCALE,
    SchemaError,
    check_variable_scale_type,
    parse_iceberg_type,
)
from service.units import parse_duration, parse_size

ENV_PREFIX = "ICESINK_"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """The configuration can't be used; the message says which key and what to change."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Mode(StrEnum):
    UPSERT = "upsert"
    APPEND = "append"


class KafkaConfig(_Section):
    bootstrap_servers: str
    topics: list[str] = Field(default_factory=list, description="The topics to read (or topic_pattern).")
    topic_pattern: str | None = Field(
        default=None,
        description="A regular expression (Java syntax, matched against the whole topic name) instead of "
        "topics: every matching topic is read, those created later too, without a restart.",
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Kafka client properties (security.protocol, sasl.*, ...) for every client.",
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where the sink starts reading a topic it has never read; latest is resolved to "
        "concrete offsets and recorded in the txnlog before anything is read.",
    )
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        default="read_committed",
        description="read_committed: records of aborted producer transactions are never read (Spark's "
        "source and icesink's own consumers alike).",
    )
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    dead_letter_topic: str | None = None

    @model_validator(mode="after")
    def _topics_or_pattern(self) -> KafkaConfig:
        if bool(self.topics) == (self.topic_pattern is not None):
            raise ValueError("set one of kafka.topics (a list) and kafka.topic_pattern (a regex)")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(
                    f"kafka.topic_pattern {self.topic_pattern!r} is not a regex: {exc}"
                ) from None
        return self

    def reads(self, topic: str) -> bool:
        """Whether ``topic`` is one of the sink's topics (a name listed, or one the pattern matches)."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics

    @field_validator("options")
    @classmethod
    def _isolation_is_typed(cls, value: dict[str, str]) -> dict[str, str]:
        """One place for the isolation level: a second one in ``options`` would split Spark's source
        from icesink's own consumers, or silently lose to the typed key."""
        if "isolation.level" in value:
            raise ValueError("isolation.level: set kafka.isolation_level instead (read_committed by default)")
        return value


class SchemaRegistryConfig(_Section):
    """A Confluent-compatible schema registry (Confluent's, Apicurio's ``/apis/ccompat/v7``, Karapace),
    asked for the writer schema of each schema id the records carry."""

    url: str = Field(description="The registry's base URL, e.g. http://registry:8080/apis/ccompat/v7.")
    username: str | None = Field(default=None, description="Basic auth user (with password).")
    password: SecretStr | None = Field(
        default=None, description="Basic auth password: from the environment, as ${REGISTRY_PASSWORD}."
    )
    bearer_token: SecretStr | None = Field(
        default=None, description="A bearer token (instead of basic auth), from the environment."
    )
    ca_file: str | None = Field(
        default=None, description="CA bundle to verify the registry's TLS certificate."
    )
    timeout_s: float = Field(default=10.0, gt=0, description="Timeout of one request to the registry.")
    retries: int = Field(
        default=30,
        ge=1,
        description="Attempts at a registry that does not answer (or answers 5xx), waits doubling up to 10 s "
        "(about 4 minutes in all), before the batch fails and is retried as a whole: a record is never "
        "skipped for it.",
    )

    @model_validator(mode="after")
    def _one_auth(self) -> SchemaRegistryConfig:
        if self.bearer_token is not None and (self.username or self.password):
            raise ValueError("set either username/password or bearer_token, not both")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("url is not an http(s) URL")
        if urlsplit(self.url).username is not None:
            # it would show in logs and dead letters' reasons, which quote the URL
            raise ValueError("url carries credentials: set username and password (from the environment)")
        return self


class SourceConfig(_Section):
    format: Literal["debezium-json", "debezium-avro", "debezium-protobuf"] = Field(
        default="debezium-json",
        description="debezium-json: Kafka Connect's JSON converter, with or without schema sections; "
        "debezium-avro / debezium-protobuf: Avro or Protobuf in the Confluent wire format (magic byte 0, "
        "a 4-byte schema id), keys too, with the writer schemas from source.schema_registry.",
    )
    schema_registry: SchemaRegistryConfig | None = None
    max_record_bytes: int = 8 * 1024 * 1024
    decoder: Literal["auto", "spark"] = Field(
        default="auto",
        description="auto: decode batches with pyarrow in one Spark job, and with Spark's decoder any batch "
        "the Arrow decoder declines (a record it can't vouch for); spark: always Spark's decoder.",
    )
    reader: Literal["tasks", "spark"] = Field(
        default="tasks",
        description="tasks: the stream plans Kafka offset ranges and each Spark task reads its range "
        "itself with librdkafka, decoding it chunk by chunk; spark: Spark's Kafka source reads the "
        "records in the JVM and hands them to the Python tasks.",
    )
    chunk_records: int = Field(
        default=10_000,
        gt=0,
        description="With reader: tasks, how many Kafka records a task reads and decodes at a time.",
    )
    max_task_bytes: int = Field(
        default=256 * 1024 * 1024,
        description="What a task of the Arrow path may hold (the changes it keeps, or with reader: spark "
        "its share of the batch) before it declines the batch to Spark's decoder, which can spill.",
    )
    variable_scale_decimal: str = Field(
        default=str(DEFAULT_VARIABLE_SCALE),
        description="The column type of io.debezium.data.VariableScaleDecimal values (PostgreSQL numeric "
        "without precision and scale, decimal.handling.mode=precise): string, the exact decimal text; or "
        "decimal(P,S), where a value that does not fit without rounding is a dead letter.",
    )

    @field_validator("max_record_bytes", "max_task_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        return parse_size(value)

    @field_validator("variable_scale_decimal")
    @classmethod
    def _variable_scale(cls, value: str) -> str:
        try:
            check_variable_scale_type(parse_iceberg_type(value), "variable_scale_decimal")
        except SchemaError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _framed_needs_a_registry(self) -> SourceConfig:
        if self.framed:
            if self.schema_registry is None:
                raise ValueError(f"format {self.format} needs schema_registry: {{url: ...}}")
            if self.decoder == "spark":
                raise ValueError(
                    f"format {self.format} is decoded in the Python tasks only: set decoder: auto"
                )
        return self

    @property
    def framed(self) -> bool:
        """Records in the Confluent wire format, their schemas in a registry (Avro, Protobuf)."""
        return self.format != "debezium-json"

    @property
    def variable_scale_type(self) -> PrimitiveType:
        parsed = parse_iceberg_type(self.variable_scale_decimal)
        assert isinstance(parsed, PrimitiveType)  # string or decimal(p,s): checked above
        return parsed


class ColumnConfig(_Section):
    """A column of the table, used when the change events carry no schema section."""

    name: str
    type: str = Field(description="Iceberg type: long, int, string, decimal(10,2), date, timestamp, ...")
    required: bool = False
    encoding: str | None = Field(
        default=None,
        description="How the value is encoded in the event, as a Debezium/Kafka Connect logical name, "
        "e.g. io.debezium.time.Timestamp for a millisecond timestamp. Defaults per type.",
    )


# What a table identifier template may name: the record's topic and its Debezium source fields.
TEMPLATE_FIELDS = ("topic", "source.db", "source.schema", "source.table")


def template_fields(identifier: str) -> list[str]:
    """The fields a table identifier names (``lake.{source.table}`` → ``["source.table"]``)."""
    fields = []
    for _, name, spec, conversion in string.Formatter().parse(identifier):
        if name is None:
            continue
        if name not in TEMPLATE_FIELDS:
            raise ValueError(
                f"{identifier!r}: {{{name}}} is not a field a table identifier can name "
                f"(one of {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)})"
            )
        if spec or conversion:
            raise ValueError(f"{identifier!r}: {{{name}}} takes no format spec or conversion")
        fields.append(name)
    return fields


def render_identifier(identifier: str, values: Mapping[str, str]) -> str:
    """The identifier a template gives for one record's fields (a static identifier is itself)."""
    template_fields(identifier)  # only the fields a template may name
    return re.sub(r"\{([a-z.]+)\}", lambda m: values[m.group(1)], identifier)


def _check_identifier(value: str) -> str:
    if "." not in value or value.startswith(".") or value.endswith(".") or ".." in value:
        raise ValueError(f"expected namespace.table, got {value!r}")
    return value


class TableConfig(_Section):
    identifier: str = Field(
        description="namespace.table, or a template over {topic}, {source.db}, {source.schema} and "
        "{source.table} that routes each topic (or each record) to its own table."
    )
    key: list[str] = Field(default_factory=list)
    mode: Mode = Mode.UPSERT
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)
    columns: list[ColumnConfig] = Field(default_factory=list)
    create: bool = True
    schema_evolution: Literal["add_columns", "strict"] = Field(
        default="add_columns",
        description="add_columns: new columns, widened types and relaxed nullability in the events evolve "
        "the table; strict: any difference stops the sink.",
    )
    on_incompatible_schema: Literal["fail", "dead_letter"] = Field(
        default="fail",
        description="What to do with events whose schema can't be an evolution of the table's.",
    )
    delete_format: Literal["auto", "equality", "position"] = Field(
        default="equality",
        description="How an upsert deletes a key's older row: equality: an equality-delete file of the "
        "batch's keys (applies to every older data file; pyiceberg and Snowflake can't read it); "
        "position: a position-delete file naming the row, found in the sink's key index of the table "
        "(every engine reads it; icesink must be the table's only writer besides its maintenance); "
        "auto: position for a table the sink creates (recorded in its icesink.delete-format property), "
        "the recorded format for an existing table, equality for a table without one. equality stays "
        "the default until compaction next to a fast sink works with position deletes: docs/deletes.md.",
    )
    on_failure: Literal["stop", "dead_letter", "pause"] = Field(
        default="stop",
        description="When the table itself fails (it can't be created or loaded, was dropped, refuses "
        "access, or its events' schema is incompatible under on_incompatible_schema: fail): stop the "
        "sink; dead_letter: isolate the table, its records go to the dead-letter topic until the sink "
        "restarts; pause: isolate the table, its topics' offsets stay at its last commit and its records "
        "are read again when the sink restarts. Either way the other tables keep landing.",
    )

    @field_validator("identifier")
    @classmethod
    def _identifier(cls, value: str) -> str:
        fields = template_fields(value)
        sample = {f: "x" for f in fields}
        _check_identifier(render_identifier(value, sample))
        return value

    @model_validator(mode="after")
    def _key_for_upsert(self) -> TableConfig:
        """A template's tables may take their keys from the records' keys; one table needs its own."""
        if self.mode is Mode.UPSERT and not self.key and not self.is_template:
            raise ValueError("upsert mode needs table.key (the primary-key columns)")
        return self

    @property
    def is_template(self) -> bool:
        return bool(template_fields(self.identifier))

    @property
    def namespace(self) -> tuple[str, ...]:
        return tuple(self.identifier.split(".")[:-1])

    @property
    def name(self) -> str:
        return self.identifier.split(".")[-1]


class TableOverride(_Section):
    """Settings of one table that differ from the ``table`` section's (``tables: {lake.orders: ...}``)."""

    key: list[str] | None = None
    mode: Mode | None = None
    partition_by: list[str] | None = None
    properties: dict[str, str] | None = None
    columns: list[ColumnConfig] | None = None
    create: bool | None = None
    schema_evolution: Literal["add_columns", "strict"] | None = None
    on_incompatible_schema: Literal["fail", "dead_letter"] | None = None
    on_failure: Literal["stop", "dead_letter", "pause"] | None = None
    delete_format: Literal["auto", "equality", "position"] | None = None


class TxnLogConfig(_Section):
    dsn: str
    schema_name: str = Field(default="icesink", alias="schema")
    lock_timeout: timedelta = timedelta(seconds=30)
    session_timeout: timedelta = Field(
        default=timedelta(seconds=20),
        description="How long a dead or frozen writer can keep the sink's row locked.",
    )

    @field_validator("lock_timeout", "session_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        return parse_duration(value)


class CommitConfig(_Section):
    min_size: int | None = None
    max_period: timedelta | None = None
    trigger_interval: timedelta = timedelta(seconds=1)
    retries: int = Field(default=10, ge=0)
    concurrency: int = Field(
        default=8, ge=1, description="Tables committed at once when a batch touches several tables."
    )
    overlap: bool = Field(
        default=True,
        description="Commit a batch in the background while the next one is read and written (commits "
        "stay one at a time, in order); false: each batch waits for its commit.",
    )
    # A sink of many tables: a table's changes are held (their offsets not committed) until it has
    # this many, or its oldest held change waited this long (service.pipeline.held).
    table_min_records: int | None = Field(default=None, ge=1)
    table_max_period: timedelta | None = None
    # How long a commit with position deletes waits for a compaction of its table to finish before
    # it goes ahead anyway (service.commit.turns).
    compaction_wait: timedelta = timedelta(minutes=10)

    @property
    def holds_tables(self) -> bool:
        return self.table_min_records is not None or self.table_max_period is not None

    @field_validator("min_size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    @field_validator("max_period", "trigger_interval", "table_max_period", "compaction_wait", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta | None:
        return None if value is None else parse_duration(value)


SUPPORTED_FORMATS = ("parquet",)


# The table property each of icesink's Parquet settings stands for (pyiceberg's writer reads them).
WRITE_PROPERTIES = {
    "target_file_size": "write.target-file-size-bytes",
    "compression": "write.parquet.compression-codec",
    "compression_level": "write.parquet.compression-level",
    "row_group_limit": "write.parquet.row-group-limit",
    "page_size": "write.parquet.page-size-bytes",
}


class WriteConfig(_Section):
    """How files are written. A setting left out follows the table's own property (for a table icesink
    creates: the property icesink gives it, else pyiceberg's default); a setting given overrides it."""

    format: str = Field(default="parquet", description="Data file format; only parquet can be written.")
    target_file_size: int | None = None
    compression: Literal["zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed"] | None = None
    compression_level: int | None = None
    row_group_limit: int | None = Field(default=None, gt=0)
    page_size: int | None = None
    parallelism: int = Field(
        default=2,
        ge=1,
        description="Spark tasks that write files for one batch on the Spark-decoder path (the Arrow path runs one task per Kafka partition).",
    )

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value.lower() not in SUPPORTED_FORMATS:
            raise ValueError(
                f"{value!r} is not supported: icesink writes data and delete files with pyiceberg, whose "
                f"only file writer is Parquet (supported: {', '.join(SUPPORTED_FORMATS)}); ORC and Avro data "
                "files can't be written correctly with the libraries icesink uses"
            )
        return value.lower()

    @field_validator("target_file_size", "page_size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    def table_properties(self) -> dict[str, str]:
        """The table properties the settings given here stand for (none for settings left out)."""
        return {
            prop: str(value)
            for name, prop in WRITE_PROPERTIES.items()
            if (value := getattr(self, name)) is not None
        }


class SparkConfig(_Section):
    master: str = "local[*]"
    app_name: str | None = None
    jars: list[str] = Field(default_factory=list)
    conf: dict[str, str] = Field(default_factory=dict)
    checkpoint_dir: str | None = None


class MetricsConfig(_Section):
    prometheus_port: int | None = None
    otlp_endpoint: str | None = None
    export_interval: timedelta = timedelta(seconds=10)

    @field_validator("export_interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        return parse_duration(value)


class HealthConfig(_Section):
    port: int | None = None
    host: str = "0.0.0.0"


class LogConfig(_Section):
    level: str = "INFO"
    format: Literal["text", "json"] = "text"


class CompactionConfig(_Section):
    """When and how a table's data files are rewritten with their deletes applied (Spark's
    ``rewrite_data_files``). A table is due when any threshold is reached; ``icesink maintain --once``
    compacts every table that holds a delete file or small files, whatever the thresholds."""

    enabled: bool = True
    delete_files: int = Field(
        default=20, ge=1, description="Compact once a table holds this many delete files."
    )
    commits: int = Field(
        default=200,
        ge=1,
        description="Compact once this many snapshots were added since the last compaction.",
    )
    max_age: timedelta | None = Field(
        default=timedelta(hours=1),
        description="Compact a table holding any delete file once its last compaction is this old.",
    )
    target_file_size: int | None = Field(
        default=None,
        description="Size of the rewritten files; default: the table's write.target-file-size-bytes.",
    )
    max_concurrent_groups: int = Field(default=1, ge=1, description="File groups Spark rewrites at once.")

    @field_validator("target_file_size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    @field_validator("max_age", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta | None:
        return None if value is None else parse_duration(value)


class ExpiryConfig(_Section):
    """Snapshot expiry (Spark's ``expire_snapshots``): a snapshot goes when it is older than
    ``older_than`` and not among the ``retain_last`` newest; the current one always stays."""

    enabled: bool = True
    older_than: timedelta = timedelta(days=1)
    retain_last: int = Field(default=100, ge=1)
    min_expirable: int = Field(
        default=10,
        ge=1,
        description="Expire once at least this many snapshots can go (`maintain --once`: once any can).",
    )

    @field_validator("older_than", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        return parse_duration(value)


class OrphanConfig(_Section):
    """Orphan removal: files under the table's location that no snapshot and no txnlog plan names."""

    enabled: bool = True
    older_than: timedelta = Field(
        default=timedelta(days=1),
        description="Safety age: a younger file may belong to a batch or a commit in flight.",
    )
    interval: timedelta = Field(default=timedelta(hours=6), description="How often orphans are looked for.")

    @field_validator("older_than", "interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        return parse_duration(value)

    @field_validator("older_than")
    @classmethod
    def _not_too_young(cls, value: timedelta) -> timedelta:
        if value < timedelta(hours=1):
            raise ValueError(
                "must be at least 1h: a younger file may be one a batch has written and not yet "
                "precommitted (a large catch-up batch takes minutes), or a manifest of a commit in flight"
            )
        return value


class MaintenanceConfig(_Section):
    """``icesink maintain``: table health work for every table of the sink (docs/operations.md)."""

    interval: timedelta = Field(
        default=timedelta(minutes=5), description="How often `icesink maintain` looks at every table."
    )
    compaction: CompactionConfig = CompactionConfig()
    expiry: ExpiryConfig = ExpiryConfig()
    orphans: OrphanConfig = OrphanConfig()
    max_manifests: int = Field(
        default=100, ge=2, description="Rewrite a table's manifests when its current snapshot has more."
    )
    commit_retries: int = Field(
        default=20,
        ge=0,
        description="commit.retry.num-retries of the tables icesink creates (Java writers' commit retries, "
        "at most 1 s apart: the maintainer's compactions against the sink's commits).",
    )
    metadata_versions: int = Field(
        default=20,
        ge=1,
        description="write.metadata.previous-versions-max of the tables icesink creates (old metadata "
        "files beyond it are deleted at each commit).",
    )
    spark_catalog: dict[str, str] = Field(
        default_factory=dict,
        description="Spark Iceberg catalog properties added to (or replacing) those derived from `catalog`.",
    )

    @field_validator("interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        return parse_duration(value)


# Catalog types the sink refuses, and why (docs/configuration.md, "Catalogs, stores and readers").
_IN_MEMORY = (
    "its tables live in one process's memory: the maintainer, another replica, Spark's tasks and every "
    "reader see none of them, and a restart loses them all; use sql (on Postgres) or a catalog server"
)
_FILE_SYSTEM = (
    "a file-system (Hadoop) catalog commits by renaming a metadata file, which an object store can't do "
    "atomically, so two writers can both win; pyiceberg has none either; use sql (on Postgres) for a "
    "catalog without a server, or rest"
)
# Checked by tests/unit/test_config.py against the installed pyiceberg: drop one when that test fails.
_CANT_COMMIT = (
    "pyiceberg's {} catalog can't commit to a table (its commit_table is not implemented), so the sink's "
    "first commit would fail; use glue, sql (on Postgres) or rest"
)
_REFUSED_CATALOGS = {
    "dynamodb": _CANT_COMMIT.format("DynamoDB"),
    "bigquery": _CANT_COMMIT.format("BigQuery metastore"),
    "in-memory": _IN_MEMORY,
    "memory": _IN_MEMORY,
    "hadoop": _FILE_SYSTEM,
    "filesystem": _FILE_SYSTEM,
    "file": _FILE_SYSTEM,
}


class SinkConfig(_Section):
    sink_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    kafka: KafkaConfig
    source: SourceConfig = SourceConfig()
    table: TableConfig
    tables: dict[str, TableOverride] = Field(
        default_factory=dict,
        description="Per-table settings, keyed by the table's identifier (namespace.table); each key "
        "given overrides the table section's for that table.",
    )
    catalog: dict[str, Any]
    txnlog: TxnLogConfig
    commit: CommitConfig = CommitConfig()
    write: WriteConfig = WriteConfig()
    spark: SparkConfig = SparkConfig()
    metrics: MetricsConfig = MetricsConfig()
    health: HealthConfig = HealthConfig()
    log: LogConfig = LogConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()

    @field_validator("catalog", mode="before")
    @classmethod
    def _catalog_strings(cls, value: Any) -> dict[str, Any]:
        """pyiceberg properties are strings, except nested mappings such as REST's ``auth`` section."""
        if not isinstance(value, Mapping):
            raise ValueError("catalog must be a mapping of pyiceberg catalog properties")

        def normalise(v: Any) -> Any:
            if isinstance(v, Mapping):
                return {str(k): normalise(x) for k, x in v.items()}
            return str(v).lower() if isinstance(v, bool) else str(v)

        return {str(k): normalise(v) for k, v in value.items()}

    @field_validator("catalog")
    @classmethod
    def _catalog_supported(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Catalog types the commit protocol can't rely on are refused before anything starts."""
        kind = str(value.get("type", "")).lower()
        if kind in _REFUSED_CATALOGS:
            raise ValueError(f"catalog.type {kind}: {_REFUSED_CATALOGS[kind]}")
        uri = str(value.get("uri", ""))
        if kind == "sql" and (uri.rstrip("/") == "sqlite:" or ":memory:" in uri):
            raise ValueError(f"catalog.uri {uri}: an in-memory SQLite database: {_IN_MEMORY}")
        return value

    @model_validator(mode="after")
    def _overrides_name_tables(self) -> SinkConfig:
        """``tables`` keys are identifiers the sink can write; each table's settings must be whole."""
        for identifier in self.tables:
            try:
                _check_identifier(identifier)
            except ValueError as exc:
                raise ValueError(f"tables.{identifier}: {exc}") from None
            if not self.table.is_template and identifier != self.table.identifier:
                raise ValueError(
                    f"tables.{identifier}: the sink writes only {self.table.identifier} "
                    "(table.identifier is not a template)"
                )
            settings = self.table_settings(identifier)
            if settings.mode is Mode.UPSERT and self.tables[identifier].key == []:
                raise ValueError(f"tables.{identifier}.key: upsert mode needs the primary-key columns")
        return self

    @model_validator(mode="after")
    def _one_value_per_write_property(self) -> SinkConfig:
        """``write`` settings and the table properties of a table icesink creates must not disagree."""
        names = {prop: name for name, prop in WRITE_PROPERTIES.items()}
        sections = {"table.properties": self.table.properties}
        sections |= {f"tables.{t}.properties": o.properties for t, o in self.tables.items() if o.properties}
        for prop, value in self.write.table_properties().items():
            for where, properties in sections.items():
                given = properties.get(prop)
                if given is not None and given.lower() != value.lower():
                    raise ValueError(
                        f"write.{names[prop]} ({value}) and {where} {prop} ({given}) disagree: set one"
                    )
        return self

    @model_validator(mode="after")
    def _framed_batches_are_not_buffered(self) -> SinkConfig:
        """Buffered batches (commit.min_size/max_period) are decoded together by Spark's decoder, which
        reads Debezium JSON only; the Arrow path can't take them whole (a key changed in two of them
        would be in two tasks). Holding each table's changes (commit.table_min_records) works."""
        if self.source.framed and (self.commit.min_size is not None or self.commit.max_period is not None):
            raise ValueError(
                f"commit.min_size/max_period buffer batches for Spark's decoder, which does not read "
                f"{self.source.format}: raise commit.trigger_interval instead (or, in a sink of many tables, "
                "hold each table's changes with commit.table_min_records/table_max_period)"
            )
        return self

    @model_validator(mode="after")
    def _one_commit_cadence(self) -> SinkConfig:
        """The per-table cadence is for a sink of many tables, and not together with the sink's own."""
        commit = self.commit
        if not commit.holds_tables:
            return self
        if not self.table.is_template:
            raise ValueError(
                "commit.table_min_records and commit.table_max_period hold a table's changes in a sink of "
                "many tables (a template table.identifier); a sink of one table buffers batches with "
                "commit.min_size and commit.max_period"
            )
        if commit.min_size is not None or commit.max_period is not None:
            raise ValueError(
                "commit.min_size/max_period (the whole sink's batches buffered) and "
                "commit.table_min_records/table_max_period (each table's changes held) can't be combined: "
                "set one pair"
            )
        if self.source.decoder == "spark":
            raise ValueError(
                "commit.table_min_records/table_max_period hold the tables' decoded changes, which only "
                "the Arrow decoder gives: source.decoder must be auto"
            )
        return self

    @model_validator(mode="after")
    def _dead_letters_are_not_read(self) -> SinkConfig:
        if self.kafka.reads(self.dead_letter_topic):
            raise ValueError(
                f"kafka.topic_pattern matches the dead-letter topic {self.dead_letter_topic}: the sink would "
                "read its own dead letters"
            )
        return self

    def table_settings(self, identifier: str) -> TableConfig:
        """One table's settings: the ``table`` section with the identifier resolved and the table's
        ``tables`` entry applied (for a one-table sink, ``table_settings(table.identifier) == table``)."""
        override = self.tables.get(identifier)
        update: dict[str, Any] = {"identifier": identifier}
        if override is not None:
            update |= {k: v for k, v in override.model_dump(exclude_none=True).items()}
            if override.columns is not None:
                update["columns"] = override.columns
        return self.table.model_copy(update=update)

    @property
    def catalog_name(self) -> str:
        return str(self.catalog.get("name", "default"))

    @property
    def catalog_properties(self) -> dict[str, Any]:
        return {k: v for k, v in self.catalog.items() if k != "name"}

    @property
    def backlog_chunk(self) -> int | None:
        """Records per partition a sink of many tables reads at once while it is behind
        (service.kafka.stream_source.cap): ``commit.table_min_records``, else a tenth of
        ``kafka.max_offsets_per_trigger`` (five to ten partitions a batch, each table's share big
        enough to be worth its snapshot). None without a budget: every batch reads everything."""
        budget = self.kafka.max_offsets_per_trigger
        if budget is None:
            return None
        if self.commit.table_min_records is not None:
            return self.commit.table_min_records
        return max(1, budget // 10)

    @property
    def dead_letter_topic(self) -> str:
        return self.kafka.dead_letter_topic or f"{self.sink_id}.dlq"


def _interpolate(value: Any, env: Mapping[str, str], path: str) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"{path}: environment variable {name} is not set")

        return _ENV_REF.sub(replace, value)
    return value


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``ICESINK_TXNLOG__DSN=...`` sets ``txnlog.dsn``; ``__`` separates levels."""
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: {'.'.join(parts[:-1])} is not a section")
            node = child
        key = parts[-1]
        # Catalog properties use dots and dashes (s3.secret-access-key); env names can't.
        if parts[0] == "catalog" and len(parts) == 2:
            key = key.replace("_", "-") if key.replace("_", "-") in node else key
        node[key] = value
    return raw


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key")
        elif item["type"] == "missing":
            lines.append(f"{where}: required key is missing")
        else:
            lines.append(f"{where}: {item['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> SinkConfig:
    environment = dict(os.environ if env is None else env)
    data = _apply_env_overrides(_interpolate(dict(raw), environment, ""), environment)
    try:
        return SinkConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> SinkConfig:
    file = Path(path)
    try:
        raw = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {file}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a mapping at the top level")
    return parse_config(raw, env)
