"""Configuration loading: errors name the key; secrets come from the environment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from service.config import ConfigError, load_config, parse_config
from service.units import parse_duration, parse_size

BASE: dict[str, Any] = {
    "sink_id": "orders",
    "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
    "table": {"identifier": "ns.orders", "key": ["id"]},
    "catalog": {"type": "rest", "uri": "http://c"},
    "txnlog": {"dsn": "postgresql+psycopg://u@h/db"},
}


def with_(**sections: Any) -> dict[str, Any]:
    return {**BASE, **sections}


def test_defaults() -> None:
    config = parse_config(BASE, env={})
    assert config.table.mode.value == "upsert"
    # Write settings left out follow the table's properties.
    assert config.write.compression is None and config.write.target_file_size is None
    assert config.write.table_properties() == {}
    assert config.dead_letter_topic == "orders.dlq"
    assert config.commit.min_size is None and config.commit.max_period is None
    assert config.kafka.isolation_level == "read_committed"
    assert config.source.variable_scale_decimal == "string"


def test_variable_scale_decimal_is_a_string_or_a_decimal() -> None:
    config = parse_config(with_(source={"variable_scale_decimal": "decimal(38, 10)"}), env={})
    assert str(config.source.variable_scale_type) == "decimal(38, 10)"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (with_(kafka={"bootstrap_server": "k", "topics": ["t"]}), "kafka.bootstrap_server: unknown key"),
        (with_(surprise=1), "surprise: unknown key"),
        ({k: v for k, v in BASE.items() if k != "txnlog"}, "txnlog: required key is missing"),
        (with_(table={"identifier": "orders", "key": ["id"]}), "expected namespace.table"),
        (with_(table={"identifier": "ns.t", "mode": "upsert"}), "upsert mode needs table.key"),
        (with_(commit={"max_period": "soon"}), "not a duration"),
        (with_(write={"target_file_size": "lots"}), "not a size"),
        (with_(write={"format": "orc"}), "only file writer is Parquet"),
        (
            with_(
                write={"compression": "snappy"},
                table={
                    "identifier": "ns.t",
                    "key": ["id"],
                    "properties": {"write.parquet.compression-codec": "gzip"},
                },
            ),
            r"write.compression \(snappy\) and table.properties write.parquet.compression-codec \(gzip\) disagree",
        ),
        (with_(sink_id="has space"), "sink_id"),
        (
            with_(source={"variable_scale_decimal": "double"}),
            "source.variable_scale_decimal: .*string or decimal",
        ),
        (with_(source={"variable_scale_decimal": "decimal(39,2)"}), "source.variable_scale_decimal: .*1..38"),
        (
            with_(kafka={"bootstrap_servers": "k", "topics": ["t"], "options": {"isolation.level": "x"}}),
            "kafka.options: .*set kafka.isolation_level instead",
        ),
        (with_(source={"format": "debezium-avro"}), "source: .*format debezium-avro needs schema_registry"),
        (
            with_(
                source={
                    "format": "debezium-protobuf",
                    "decoder": "spark",
                    "schema_registry": {"url": "http://r"},
                }
            ),
            "source: .*decoded in the Python tasks only",
        ),
        (
            with_(source={"format": "debezium-avro", "schema_registry": {"url": "http://u:secret@r"}}),
            "source.schema_registry: .*url carries credentials",
        ),
        (
            with_(
                source={"format": "debezium-avro", "schema_registry": {"url": "http://r", "username": "u"}}
            ),
            "source.schema_registry: .*username and password go together",
        ),
        (
            with_(
                source={"format": "debezium-avro", "schema_registry": {"url": "http://r"}},
                commit={"min_size": "64MiB"},
            ),
            "commit.min_size/max_period buffer batches for Spark's decoder, which does not read debezium-avro",
        ),
        (
            with_(catalog={"type": "in-memory"}),
            "catalog: .*catalog.type in-memory: its tables live in one process's memory",
        ),
        (
            with_(catalog={"type": "sql", "uri": "sqlite:///:memory:"}),
            "catalog: .*an in-memory SQLite database: its tables live in one process's memory",
        ),
        (
            with_(catalog={"type": "hadoop", "warehouse": "s3://b/w"}),
            "catalog: .*catalog.type hadoop: a file-system .* can't do atomically",
        ),
        (
            with_(catalog={"type": "dynamodb", "warehouse": "s3://b/w"}),
            "catalog: .*catalog.type dynamodb: pyiceberg's DynamoDB catalog can't commit to a table",
        ),
        (
            with_(catalog={"type": "bigquery", "gcp.bigquery.project-id": "p"}),
            "catalog: .*catalog.type bigquery: pyiceberg's BigQuery metastore catalog can't commit",
        ),
    ],
)
def test_errors_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, env={})


@pytest.mark.parametrize(
    ("module", "name"),
    [("dynamodb", "DynamoDbCatalog"), ("bigquery_metastore", "BigQueryMetastoreCatalog")],
)
def test_catalogs_refused_for_their_commit_still_cannot_commit(module: str, name: str) -> None:
    """The config refuses ``type: dynamodb`` and ``bigquery`` because their pyiceberg catalogs can't
    commit; when a pyiceberg upgrade implements one's commit this fails, and its refusal should go.
    Read from the module's source: the BigQuery one imports Google's clients, which icesink does not
    install."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(f"pyiceberg.catalog.{module}")
    assert spec is not None and spec.origin, module
    tree = ast.parse(Path(spec.origin).read_text())
    (catalog_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    (commit,) = [n for n in catalog_class.body if isinstance(n, ast.FunctionDef) and n.name == "commit_table"]
    body = [n for n in commit.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert [ast.unparse(n) for n in body] == ["raise NotImplementedError"], ast.unparse(commit)


def test_environment_references_and_overrides() -> None:
    raw = with_(
        catalog={
            "type": "rest",
            "uri": "http://c",
            "credential": "${CLIENT}:${SECRET}",
            "warehouse": "${WH:-main}",
        }
    )
    config = parse_config(
        raw,
        env={"CLIENT": "id", "SECRET": "s3cr3t", "ICESINK_TXNLOG__DSN": "postgresql+psycopg://other@h/db"},
    )
    assert config.catalog["credential"] == "id:s3cr3t" and config.catalog["warehouse"] == "main"
    assert config.txnlog.dsn == "postgresql+psycopg://other@h/db"
    with pytest.raises(ConfigError, match=r"catalog\.credential: environment variable SECRET is not set"):
        parse_config(raw, env={"CLIENT": "id"})


def test_nested_catalog_properties_stay_mappings() -> None:
    raw = with_(catalog={"type": "rest", "uri": "u", "auth": {"type": "basic", "basic": {"username": "a"}}})
    assert parse_config(raw, env={}).catalog_properties["auth"] == {
        "type": "basic",
        "basic": {"username": "a"},
    }


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sink_id: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_units() -> None:
    assert parse_size("64MiB") == 64 * 1024**2 and parse_size("10MB") == 10**7 and parse_size(4096) == 4096
    assert parse_duration("250ms") == timedelta(milliseconds=250) and parse_duration("5m") == timedelta(
        minutes=5
    )
    assert parse_duration(3) == timedelta(seconds=3)


# ---- many tables: topics or a pattern, identifier templates, per-table overrides

MANY: dict[str, Any] = {
    **BASE,
    "kafka": {"bootstrap_servers": "k:9092", "topic_pattern": r"shop\.public\..*"},
    "table": {"identifier": "lake.{source.table}", "mode": "upsert"},
    "tables": {
        "lake.orders": {"mode": "append"},
        "lake.customers": {"key": ["id"], "partition_by": ["country"]},
    },
}


def test_a_one_table_file_gives_the_same_settings_through_table_settings() -> None:
    config = parse_config(BASE, env={})
    assert config.table_settings("ns.orders") == config.table
    assert not config.table.is_template and config.kafka.reads("t") and not config.kafka.reads("u")


def test_overrides_apply_to_their_table_only() -> None:
    config = parse_config(MANY, env={})
    assert config.table.is_template
    orders, customers, other = (config.table_settings(t) for t in ("lake.orders", "lake.customers", "lake.x"))
    assert (orders.identifier, orders.mode.value, orders.key) == ("lake.orders", "append", [])
    assert (customers.mode.value, customers.key, customers.partition_by) == ("upsert", ["id"], ["country"])
    assert (other.identifier, other.mode.value, other.partition_by) == ("lake.x", "upsert", [])
    assert config.kafka.reads("shop.public.orders") and not config.kafka.reads("shop.public")
    assert config.commit.concurrency == 8


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (with_(kafka={"bootstrap_servers": "k"}), "set one of kafka.topics .* and kafka.topic_pattern"),
        (
            with_(kafka={"bootstrap_servers": "k", "topics": ["t"], "topic_pattern": "t.*"}),
            "set one of kafka.topics",
        ),
        (with_(kafka={"bootstrap_servers": "k", "topic_pattern": "(unclosed"}), "is not a regex"),
        (
            with_(kafka={"bootstrap_servers": "k", "topic_pattern": ".*"}),
            "topic_pattern matches the dead-letter topic orders.dlq",
        ),
        (with_(table={"identifier": "lake.{source.tabel}"}), r"\{source.tabel\} is not a field"),
        (with_(table={"identifier": "lake.{topic!r}"}), "takes no format spec or conversion"),
        (with_(table={"identifier": "{source.table}"}), "expected namespace.table"),
        (with_(tables={"ns.other": {"mode": "append"}}), "tables.ns.other: the sink writes only ns.orders"),
        (with_(tables={"ns.orders": {"surprise": 1}}), r"tables.ns.orders.surprise: unknown key"),
        ({**MANY, "tables": {"orders": {}}}, "tables.orders: expected namespace.table"),
        ({**MANY, "tables": {"lake.a": {"key": []}}}, "tables.lake.a.key: upsert mode needs"),
        (
            {
                **MANY,
                "write": {"compression": "zstd"},
                "tables": {"lake.a": {"properties": {"write.parquet.compression-codec": "gzip"}}},
            },
            r"tables.lake.a.properties write.parquet.compression-codec \(gzip\) disagree",
        ),
    ],
)
def test_many_table_errors_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, env={})


def test_a_templates_namespace_is_split_at_its_last_dot_outside_braces() -> None:
    from service.commit.sink_tables import _split

    assert _split("lake.{source.table}") == ("lake", "{source.table}")
    assert _split("{source.schema}.{source.table}") == ("{source.schema}", "{source.table}")
    assert _split("a.b.{topic}") == ("a.b", "{topic}")


def test_a_sink_behind_reads_its_backlog_in_chunks_of_a_tenth_of_the_budget_or_table_min_records() -> None:
    kafka = {"bootstrap_servers": "k:9092", "topic_pattern": "shop\\..*"}
    many = {"identifier": "lake.{source.table}", "key": []}
    assert parse_config(with_(kafka=kafka, table=many), env={}).backlog_chunk is None  # no budget
    budget = {**kafka, "max_offsets_per_trigger": 20_000}
    assert parse_config(with_(kafka=budget, table=many), env={}).backlog_chunk == 2_000
    held = with_(kafka=budget, table=many, commit={"table_min_records": 500})
    assert parse_config(held, env={}).backlog_chunk == 500
    unbounded = with_(kafka=kafka, table=many, commit={"table_min_records": 500})
    assert parse_config(unbounded, env={}).backlog_chunk is None


def test_registry_secrets_stay_out_of_the_configuration_and_its_repr() -> None:
    raw = with_(
        source={
            "format": "debezium-avro",
            "schema_registry": {"url": "https://r", "username": "u", "password": "${REGISTRY_PASSWORD}"},
        }
    )
    config = parse_config(raw, env={"REGISTRY_PASSWORD": "s3cret"})
    registry = config.source.schema_registry
    assert registry is not None and registry.password is not None
    assert registry.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(config) and "s3cret" not in str(config.model_dump())
