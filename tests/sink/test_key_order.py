"""A key whose changes sit in two Kafka partitions keeps its newest change, by the event's source position.

After a topic's partition count grows (or when two topics feed one table), one batch can hold an older
change of a key at a high offset of one partition and its newer change at a low offset of another.
Offsets order changes only within a partition; across partitions the Debezium source position
(Postgres ``lsn``, MySQL binlog ``file``/``pos``/``row``) says which change is the newer one.
"""

from __future__ import annotations

import json
from typing import Any

from pyiceberg.catalog import Catalog

from readers import duckdb_rows, spark_rows
from service.commit.plan import SUMMARY_OFFSETS
from tests.sink.conftest import Sink, change
from tests.sink.expect import sink_snapshots


def test_a_key_in_two_partitions_keeps_its_newest_change(
    make_sink: Any, spark: Any, rest_catalog: Catalog
) -> None:
    sink: Sink = make_sink(partitions=2)
    # Partition 0: other keys, then the OLDER changes of keys 1 (Postgres) and 2 (MySQL) at offsets 5, 6.
    older = sink.send(
        [change(k, f"other-{k}", {"lsn": 50 + k, "ts_ms": 1_000}) for k in range(10, 15)]
        + [
            change(1, "old", {"lsn": 100, "ts_ms": 2_000}),
            change(2, "old", {"file": "mysql-bin.000003", "pos": 9_000, "row": 0, "ts_ms": 2_000}),
        ],
        partition=0,
    )
    # Partition 1: their NEWER changes at offsets 0 and 1 (the binlog rolled over: a new file, a lower pos).
    newer = sink.send(
        [
            change(1, "new", {"lsn": 200, "ts_ms": 3_000}),
            change(2, "new", {"file": "mysql-bin.000004", "pos": 4, "row": 0, "ts_ms": 3_000}),
        ],
        partition=1,
    )
    assert older[-2:] == [(0, 5), (0, 6)] and newer == [
        (1, 0),
        (1, 1),
    ]  # offset order is source order reversed

    run = sink.run_until_caught_up()

    # The fault happened: one batch held both changes of each key (the Arrow path saw a key in two
    # partitions and handed the batch to Spark's decoder, which compacts across partitions).
    snapshots = sink_snapshots(rest_catalog, sink.table, sink.name)
    assert len(snapshots) == 1, snapshots
    assert json.loads(snapshots[0][SUMMARY_OFFSETS]) == {sink.topic: {"0": 7, "1": 2}}
    assert "committed seq 1 " in run.log() and ", 9 records (u=9)" in run.log()
    assert "a key has changes in two Kafka partitions" in run.log()

    expected = {1: "new", 2: "new", **{k: f"other-{k}" for k in range(10, 15)}}
    for reader, rows in (("spark", spark_rows(spark, sink.table)), ("duckdb", duckdb_rows(sink.table))):
        assert {r["id"]: r["name"] for r in rows} == expected, reader
