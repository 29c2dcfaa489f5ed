"""A whole PostgreSQL database through one sink: a real Debezium connector captures three tables, and
one sink lands each in a table of its own (``kafka.topic_pattern`` + ``{source.table}``), as
docs/debezium.md shows it.

Each Iceberg table is compared value by value with ``SELECT *`` of its source table, through Spark
and DuckDB. The keys come from the Kafka record keys (no ``key`` is configured), one table is
partitioned by a column outside its key (a ``tables`` override), and changes keep coming while the
sink runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog

from readers import duckdb_rows, spark_rows
from tests.cdc import CdcSource, differences
from tests.sink.conftest import Sink

DDL = {
    "customers": "CREATE TABLE {t} (id bigint PRIMARY KEY, name text, country text, since date)",
    "orders": "CREATE TABLE {t} (order_id bigint PRIMARY KEY, customer_id bigint, country text, amount numeric(10,2))",
    "products": "CREATE TABLE {t} (sku text PRIMARY KEY, title text, price double precision, tags text[])",
}
SNAPSHOT = {
    "customers": "INSERT INTO {t} SELECT g, 'c-' || g, (ARRAY['de','fr','us'])[1 + g % 3], date '2020-01-01' + g FROM generate_series(1, 30) g",
    "orders": "INSERT INTO {t} SELECT g, 1 + g % 30, (ARRAY['de','fr','us'])[1 + g % 3], g * 9.99 FROM generate_series(1, 60) g",
    "products": "INSERT INTO {t} SELECT 'sku-' || g, 'p' || g, g * 1.5, ARRAY['a', 'b' || g] FROM generate_series(1, 20) g",
}
CHANGES = {
    "customers": [
        "UPDATE {t} SET country = 'it' WHERE id % 4 = 0",
        "DELETE FROM {t} WHERE id % 7 = 0",
        "INSERT INTO {t} VALUES (100, 'new', 'es', date '2026-01-01')",
    ],
    "orders": [
        "UPDATE {t} SET country = 'it', amount = amount + 1 WHERE order_id % 5 = 0",  # moves partitions
        "DELETE FROM {t} WHERE order_id % 9 = 0",
    ],
    "products": [
        "UPDATE {t} SET tags = tags || ARRAY['sale'] WHERE price > 15",
        "DELETE FROM {t} WHERE sku = 'sku-3'",
    ],
}


def _mismatches(
    cdc: CdcSource, spark: Any, tables: dict[str, tuple[str, str]], keys: dict[str, str]
) -> list[str]:
    problems = []
    for name, (source, target) in tables.items():
        rows = cdc.rows(source)
        problems += differences(rows, spark_rows(spark, target), keys[name], f"{target} spark")
        problems += differences(rows, duckdb_rows(target), keys[name], f"{target} duckdb")
    return problems


def test_a_debezium_database_lands_table_by_table(
    cdc: CdcSource,
    make_sink: Callable[..., Sink],
    unique_name: Callable[[str], str],
    spark: Any,
    rest_catalog: Catalog,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    prefix, namespace = f"shop_{suffix}", unique_name("lake")
    source = {name: f"public.{name}_{suffix}" for name in DDL}
    for name, table in source.items():
        cdc.execute(DDL[name].format(t=table), SNAPSHOT[name].format(t=table))
    connector = cdc.register(prefix, list(source.values()))
    sink = make_sink(
        kafka={"topics": [], "topic_pattern": rf"{prefix}\.public\..*"},
        table={"identifier": f"{namespace}.{{source.table}}", "key": []},
        tables={f"{namespace}.orders_{suffix}": {"partition_by": ["country"]}},
    )
    sink.config["kafka"].pop("topics")
    for name, table in source.items():
        connector.wait_for_events(table, {"customers": 30, "orders": 60, "products": 20}[name])

    run = sink.start()
    targets = {name: (table, f"{namespace}.{name}_{suffix}") for name, table in source.items()}
    keys = {"customers": "id", "orders": "order_id", "products": "sku"}
    try:
        run.wait_for_log(f"to {namespace}.products_{suffix}: snapshot", timeout=180)
        for name, table in source.items():  # changes while the sink runs
            cdc.execute(*[statement.format(t=table) for statement in CHANGES[name]])
        deadline = time.monotonic() + 180
        while (problems := _mismatches(cdc, spark, targets, keys)) and time.monotonic() < deadline:
            time.sleep(3)
        assert not problems, "\n".join(problems[:30])
    finally:
        run.kill()

    orders = rest_catalog.load_table(f"{namespace}.orders_{suffix}")
    assert [f.name for f in orders.spec().fields] == ["country"]
    for name, key in keys.items():  # the keys came from the Kafka record keys
        landed = rest_catalog.load_table(f"{namespace}.{name}_{suffix}")
        assert landed.schema().identifier_field_names() == {key}
