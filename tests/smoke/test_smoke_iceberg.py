"""Iceberg: tables on the S3 server through the REST catalog, read back by both reference readers.

Covers plain appends (pyiceberg), position deletes (Spark merge-on-read DELETE/UPDATE) and equality
deletes (a tiny committer in tests/smoke/eq_deletes.py), now and at earlier snapshots.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType, TimestamptzType
from pyspark.sql import SparkSession

from readers import duckdb_rows, spark_rows
from tests.smoke.eq_deletes import commit_equality_deletes

MOR = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}


def by_id(rows: list[dict[str, Any]], *columns: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(row[c] for c in columns) for row in rows)


@pytest.fixture
def namespace(rest_catalog: RestCatalog, unique_name: Callable[[str], str]) -> Iterator[str]:
    ns = unique_name("smoke")
    rest_catalog.create_namespace(ns)
    yield ns
    for ident in rest_catalog.list_tables(ns):
        rest_catalog.purge_table(ident)
    rest_catalog.drop_namespace(ns)


def test_pyiceberg_append_read_by_both_readers(
    rest_catalog: RestCatalog, spark: SparkSession, namespace: str
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "amount", DoubleType()),
        NestedField(4, "ts", TimestamptzType()),
        NestedField(5, "day", DateType()),
        identifier_field_ids=[1],
    )
    table = rest_catalog.create_table(
        f"{namespace}.orders", schema=schema, properties={"format-version": "2"}
    )
    assert table.location().startswith("s3://warehouse/")
    ts = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    rows = pa.Table.from_pylist(
        [
            {"id": 1, "name": "a", "amount": 1.5, "ts": ts, "day": dt.date(2024, 5, 1)},
            {"id": 2, "name": "b", "amount": None, "ts": ts + dt.timedelta(hours=1), "day": None},
            {"id": 3, "name": None, "amount": -2.25, "ts": None, "day": dt.date(1999, 12, 31)},
        ],
        schema=schema.as_arrow(),
    )
    table.append(rows)
    first = table.current_snapshot()
    assert first is not None
    table.append(pa.Table.from_pylist([{"id": 4, "name": "d"}], schema=schema.as_arrow()))
    assert all(task.file.file_path.startswith("s3://warehouse/") for task in table.scan().plan_files())

    expected = [(1, "a", 1.5), (2, "b", None), (3, None, -2.25), (4, "d", None)]
    ident = f"{namespace}.orders"
    assert by_id(spark_rows(spark, ident), "id", "name", "amount") == expected
    duck = duckdb_rows(ident)
    assert by_id(duck, "id", "name", "amount") == expected
    assert {r["id"]: r["ts"] for r in duck}[1] == ts
    assert {r["id"]: r["day"] for r in duck}[3] == dt.date(1999, 12, 31)
    # time travel: the first snapshot has the first three rows only
    assert by_id(spark_rows(spark, ident, first.snapshot_id), "id") == [(1,), (2,), (3,)]
    assert by_id(duckdb_rows(ident, first.snapshot_id), "id") == [(1,), (2,), (3,)]


def test_spark_position_deletes_read_by_both_readers(
    rest_catalog: RestCatalog, spark: SparkSession, namespace: str
) -> None:
    table = f"rest.{namespace}.items"
    props = ", ".join(f"'{k}'='{v}'" for k, v in MOR.items())
    spark.sql(f"CREATE TABLE {table} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ({props})")
    spark.sql(f"INSERT INTO {table} VALUES (1,'a'),(2,'b'),(3,'c'),(4,'d'),(5,'e'),(6,'f')")
    first = rest_catalog.load_table(f"{namespace}.items").current_snapshot()
    assert first is not None
    spark.sql(f"DELETE FROM {table} WHERE id IN (2, 5)")
    spark.sql(f"UPDATE {table} SET v = 'x' WHERE id = 3")

    contents = {r.content for r in spark.sql(f"SELECT content FROM {table}.delete_files").collect()}
    assert contents == {1}, f"expected only position deletes, got contents {contents}"
    expected = [(1, "a"), (3, "x"), (4, "d"), (6, "f")]
    ident = f"{namespace}.items"
    assert by_id(spark_rows(spark, ident), "id", "v") == expected
    assert by_id(duckdb_rows(ident), "id", "v") == expected
    assert len(duckdb_rows(ident, first.snapshot_id)) == 6
    assert len(spark_rows(spark, ident, first.snapshot_id)) == 6


def test_equality_deletes_read_by_both_readers(
    rest_catalog: RestCatalog, spark: SparkSession, namespace: str
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "v", StringType()),
        identifier_field_ids=[1],
    )
    ident = f"{namespace}.cdc"
    table = rest_catalog.create_table(ident, schema=schema, properties=MOR)
    table.append(
        pa.Table.from_pylist([{"id": i, "v": f"v{i}"} for i in range(1, 6)], schema=schema.as_arrow())
    )
    first = table.current_snapshot()
    assert first is not None

    deleted_at = commit_equality_deletes(table, pa.table({"id": pa.array([2, 4], pa.int64())}))
    table = rest_catalog.load_table(ident)
    assert table.current_snapshot() is not None and table.current_snapshot().snapshot_id == deleted_at
    # a row with a deleted key written after the delete (higher sequence number) is live again
    table.append(pa.Table.from_pylist([{"id": 2, "v": "new"}], schema=schema.as_arrow()))

    contents = {r.content for r in spark.sql(f"SELECT content FROM rest.{ident}.delete_files").collect()}
    assert contents == {2}, f"expected an equality-delete file, got contents {contents}"

    expected_now = [(1, "v1"), (2, "new"), (3, "v3"), (5, "v5")]
    assert by_id(spark_rows(spark, ident), "id", "v") == expected_now
    assert by_id(duckdb_rows(ident), "id", "v") == expected_now
    expected_deleted = [(1, "v1"), (3, "v3"), (5, "v5")]
    assert by_id(spark_rows(spark, ident, deleted_at), "id", "v") == expected_deleted
    assert by_id(duckdb_rows(ident, deleted_at), "id", "v") == expected_deleted
    assert len(spark_rows(spark, ident, first.snapshot_id)) == 5
    assert len(duckdb_rows(ident, first.snapshot_id)) == 5
