"""Read cost after many small commits: Spark and DuckDB scan the table, then again after compaction.

Every upsert commit adds an equality-delete file that readers must apply to all older data files, so
scans slow down as commits pile up. Compaction is Spark's Iceberg procedure
``rewrite_data_files`` with ``delete-file-threshold = 1`` (every data file with a delete is rewritten,
deletes applied) and ``remove-dangling-deletes`` (delete files that no longer apply to any data file are
dropped from the table).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.stack import Stack

QUERY = "SELECT count(*) AS n, sum(version) AS v, max(updated_at) AS t FROM {table}"


def _time(fn: Any, repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        started = time.monotonic()
        result = fn()
        times.append(time.monotonic() - started)
    return statistics.median(times), result


def table_files(stack: Stack, table: str) -> dict[str, int]:
    t = stack.catalog().load_table(table)
    data = deletes = 0
    for task in t.inspect.files().to_pylist():
        if task["content"] == 0:
            data += 1
        else:
            deletes += 1
    return {"data_files": data, "delete_files": deletes, "snapshots": len(t.metadata.snapshots)}


def scan_times(spark: Any, stack: Stack, table: str, repeats: int = 3) -> dict[str, Any]:
    from readers import duckdb_connect

    spark_table = f"rest.{table}"
    spark.sql(f"REFRESH TABLE {spark_table}")
    spark_s, spark_result = _time(lambda: spark.sql(QUERY.format(table=spark_table)).collect()[0], repeats)
    con = duckdb_connect()
    try:
        duck_table = ".".join(['"cat"', *[f'"{p}"' for p in table.split(".")]])
        duck_s, duck_result = _time(lambda: con.execute(QUERY.format(table=duck_table)).fetchone(), repeats)
    finally:
        con.close()
    spark_rows = (int(spark_result["n"]), int(spark_result["v"] or 0))
    duck_rows = (int(duck_result[0]), int(duck_result[1] or 0))
    if spark_rows != duck_rows:
        raise AssertionError(f"Spark and DuckDB disagree on {table}: {spark_rows} vs {duck_rows}")
    return {"spark_s": spark_s, "duckdb_s": duck_s, "rows": spark_rows[0], **table_files(stack, table)}


def compact(spark: Any, table: str) -> float:
    started = time.monotonic()
    spark.sql(
        f"CALL rest.system.rewrite_data_files(table => '{table}', "
        "options => map('delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"
    ).collect()
    return time.monotonic() - started
