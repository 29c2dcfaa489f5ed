"""Trino and a partition predicate on a column outside the key, on the same rows in three tables.

The icesink table is partitioned by ``country``, which is not a key column: a row can move to another
partition on update, so icesink writes its equality deletes with an unpartitioned spec (global deletes,
``delete_spec`` in service/iceberg/tables.py). Trino then can't take ``WHERE country = 'de'`` as
enforced by partition pruning and keeps a row filter on the scan, and every split of the partition
must load every delete file of the table. The same rows, side by side:

* ``merge-into``: the same change batches (same topic, same ``maxOffsetsPerTrigger``) merged by Spark's
  ``MERGE INTO`` into a table with the same partitioning, merge-on-read: position deletes, written in
  the partition of the rows they delete (partition-scoped);
* ``icesink compacted``: the icesink table after Spark's ``rewrite_data_files``
  (``readside.compact``): deletes applied and dropped, every data file in the partitioned spec. The
  compaction's snapshot still lists the emptied delete manifests of the unpartitioned spec, and
  Trino reads the specs from the snapshot's manifests, so it still keeps the row filter: this row is
  the filter without the deletes;
* ``copy``: the same rows copied by Trino (``CREATE TABLE ... AS SELECT``, same partitioning): one
  spec, no deletes, no row filter.

Each table is queried ``repeats`` times after one warm-up with :data:`QUERY`; the three results must
agree. Per table: whether Trino's plan keeps a row filter, the query's elapsed time, the scan
operator's wall and CPU time, what the scan read (physical input rows and bytes of the data files),
its rows after deletes, and the delete files (with their rows) that apply to the partition's splits.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
import urllib.request
from typing import Any

from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from bench.stack import Stack

PARTITION_BY = "country"
PREDICATE = "country = 'de'"
QUERY = f"SELECT count(*) AS n, sum(version) AS v, max(updated_at) AS t FROM {{table}} WHERE {PREDICATE}"
SCAN_OPERATORS = ("ScanFilterAndProjectOperator", "TableScanOperator")

_SIZE = {"B": 1, "kB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}
_TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _parse(text: str, units: dict[str, Any]) -> float:
    """Airlift's DataSize and Duration strings ("7032B", "1.21MB", "26.51ms", "1.20s")."""
    match = re.fullmatch(r"([0-9.]+)\s*([a-zA-Z]+)", text.strip())
    if not match or match[2] not in units:
        raise ValueError(f"unexpected quantity {text!r}")
    return float(match[1]) * units[match[2]]


def _trino_table(table: str) -> str:
    from readers import trino_table

    return trino_table(table)


def keeps_filter(table: str) -> bool:
    """Whether Trino's plan of the predicate keeps a row filter on the scan (``filterPredicate``)."""
    from readers import trino_query

    plan = "\n".join(
        r["Query Plan"] for r in trino_query(f"EXPLAIN {QUERY.format(table=_trino_table(table))}")
    )
    return re.search(r"filterPredicate = [^\n]*country", plan) is not None


@retry(
    retry=retry_if_result(lambda info: not info.get("finalQueryInfo")),
    stop=stop_after_delay(30),
    wait=wait_fixed(0.2),
)
def _query_info(query_id: str) -> dict[str, Any]:
    """The finished query's statistics (``GET /v1/query/<id>``), once Trino has its final figures."""
    uri = os.environ["ICESINK_TRINO_URI"].rstrip("/")
    request = urllib.request.Request(f"{uri}/v1/query/{query_id}", headers={"X-Trino-User": "icesink"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        info: dict[str, Any] = json.load(resp)
    return info


def _run(cursor: Any, sql: str) -> dict[str, Any]:
    started = time.monotonic()
    cursor.execute(sql)
    result = tuple(cursor.fetchall()[0])
    elapsed = time.monotonic() - started
    stats = _query_info(cursor.query_id)["queryStats"]
    scans = [op for op in stats["operatorSummaries"] if op["operatorType"] in SCAN_OPERATORS]
    return {
        "result": [str(v) for v in result],
        "elapsed_s": elapsed,
        "scan_wall_s": sum(
            _parse(op[k], _TIME) for op in scans for k in ("addInputWall", "getOutputWall", "finishWall")
        ),
        "scan_cpu_s": sum(
            _parse(op[k], _TIME) for op in scans for k in ("addInputCpu", "getOutputCpu", "finishCpu")
        ),
        "splits": sum(int(op["totalDrivers"]) for op in scans),
        "input_rows": sum(int(op["physicalInputPositions"]) for op in scans),
        "input_bytes": int(sum(_parse(op["physicalInputDataSize"], _SIZE) for op in scans)),
        "rows_after_deletes": sum(int(op["inputPositions"]) for op in scans),
    }


def copy(table: str) -> str:
    """A copy of `table`'s rows made by Trino, with the same partitioning (no delete files)."""
    from readers import trino_query

    target = f"{table}_copy"
    trino_query(
        f"CREATE TABLE {_trino_table(target)} WITH (partitioning = ARRAY['{PARTITION_BY}']) "
        f"AS SELECT * FROM {_trino_table(table)}"
    )
    return target


def applicable_deletes(stack: Stack, table: str) -> dict[str, int]:
    """The table's delete files, and those (with their rows) that apply to the ``'de'`` partition:
    every delete of an unpartitioned spec (global), and the partition's own."""
    t = stack.catalog().load_table(table)
    specs = t.specs()
    total = files = rows = 0
    for f in t.inspect.files().to_pylist():
        if f["content"] == 0:
            continue
        total += 1
        spec = specs[f["spec_id"]]
        if spec.is_unpartitioned() or (f["partition"] or {}).get(PARTITION_BY) == "de":
            files += 1
            rows += int(f["record_count"])
    return {"delete_files": total, "deletes_applied_files": files, "deletes_applied_rows": rows}


def measure(stack: Stack, table: str, repeats: int = 5) -> dict[str, Any]:
    from readers import trino_connect

    sql = QUERY.format(table=_trino_table(table))
    con = trino_connect()
    try:
        cursor = con.cursor()
        runs = [_run(cursor, sql) for _ in range(repeats + 1)][1:]  # the first one warms Trino's caches
    finally:
        con.close()
    results = {json.dumps(r["result"]) for r in runs}
    if len(results) != 1:
        raise AssertionError(f"{table}: the query gave different results: {results}")
    last = runs[-1]
    return {
        "filter_kept": keeps_filter(table),
        "result": last["result"],
        **{k: statistics.median(r[k] for r in runs) for k in ("elapsed_s", "scan_wall_s", "scan_cpu_s")},
        **{k: last[k] for k in ("splits", "input_rows", "input_bytes", "rows_after_deletes")},
        **applicable_deletes(stack, table),
    }
