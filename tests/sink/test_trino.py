"""Trino reads icesink's tables: upserts with equality deletes, time travel and a partition predicate.

One sink run builds the table all the tests read: an upsert table keyed by ``id`` and partitioned by
``country`` (a column outside the key, so rows move between partitions on update), fed from one
Kafka partition in two batches (``kafka.max_offsets_per_trigger``): inserts, then updates and deletes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestContent

from readers import duckdb_rows, spark_rows, trino_query, trino_rows, trino_table
from tests.sink.conftest import Sink, new_sink
from tests.sink.expect import diff
from tests.sink.test_end_to_end import _catalog

KEYS = 150
BATCH = 200  # events per batch: the first batch is the inserts, the second the updates and deletes


@dataclass
class Landed:
    sink: Sink
    catalog: Catalog
    first_snapshot: int  # the snapshot of the first batch (inserts only)
    first_rows: list[dict[str, Any]]  # the source's rows after the first batch


@pytest.fixture(scope="module")
def landed(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Landed]:
    directory: Path = tmp_path_factory.mktemp("trino")
    sink = new_sink(
        stack,
        lambda prefix: f"{prefix}_trino_{uuid.uuid4().hex[:8]}",
        directory,
        partition_by=["country"],
        partitions=1,
        keys=KEYS,
        kafka={"max_offsets_per_trigger": BATCH},
        table={"delete_format": "equality"},  # what these tests are about (position: test_position_deletes)
    )
    sink.produce(BATCH, mix=(1.0, 0.0, 0.0))
    first_rows = [dict(row) for row in sink.source.expected_rows()]
    sink.produce(BATCH, mix=(0.1, 0.5, 0.4))
    try:
        sink.run_until_caught_up()
    finally:
        for run in sink.runs:
            run.kill()
    catalog = _catalog(sink)
    table = catalog.load_table(sink.table)
    commits = sorted(
        (s for s in table.snapshots() if s.summary and s.summary.get("icesink.offsets")),
        key=lambda s: s.sequence_number or 0,
    )
    offsets = [json.loads(cast(str, s.summary["icesink.offsets"]))[sink.topic] for s in commits if s.summary]
    # The fixture's premise: two commits, the first covering exactly the inserts.
    assert offsets == [{"0": BATCH}, {"0": 2 * BATCH}], offsets
    yield Landed(sink, catalog, commits[0].snapshot_id, first_rows)


def test_trino_reads_upserts_with_equality_deletes_as_spark_and_duckdb(
    landed: Landed, trino: str, spark: Any
) -> None:
    """Trino applies icesink's equality deletes: its rows are the source's, and Spark's and DuckDB's."""
    sink = landed.sink
    files = trino_query(
        f"SELECT content, sum(record_count) AS n FROM {trino_table(sink.table + '$files')} GROUP BY content"
    )
    by_content = {row["content"]: row["n"] for row in files}
    expected = sink.source.expected_rows()
    # The deletes really matter: the data files hold more rows than the table has (old images, deleted
    # keys), and equality deletes (content 2) are what hides them.
    assert by_content.get(2, 0) > 0, by_content
    assert by_content[0] > len(expected), (by_content, len(expected))

    read = trino_rows(sink.table)
    problems = [
        diff(expected, read, "trino"),
        diff(spark_rows(spark, sink.table), read, "trino vs spark"),
        diff(duckdb_rows(sink.table), read, "trino vs duckdb"),
    ]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_trino_for_version_as_of_returns_the_earlier_state(landed: Landed, trino: str) -> None:
    """``FOR VERSION AS OF`` the first commit's snapshot gives the rows after the inserts only."""
    sink = landed.sink
    assert diff(landed.first_rows, sink.source.expected_rows(), "now") != "", (
        "the second batch changed nothing"
    )
    then = trino_rows(sink.table, snapshot_id=landed.first_snapshot)
    assert diff(landed.first_rows, then, "trino at the first snapshot") == ""
    assert diff(sink.source.expected_rows(), trino_rows(sink.table), "trino now") == ""


def _scan_filter(sql: str) -> list[str]:
    """The row filters (``filterPredicate``) of the table scans in Trino's plan of `sql`."""
    plan = "\n".join(row["Query Plan"] for row in trino_query(f"EXPLAIN {sql}"))
    return re.findall(r"filterPredicate = ([^\n\]]+)", plan)


def test_trino_keeps_a_row_filter_for_a_partition_predicate_outside_the_key(
    landed: Landed, trino: str
) -> None:
    """``WHERE country = 'de'`` (the partition column, not the key): the rows are right, and Trino keeps
    a row filter on the scan because icesink's equality deletes are global (the unpartitioned spec), so
    the predicate is not enforced by partition pruning alone. A copy with no deletes (CTAS, the same
    partitioning) shows the contrast: there the scan carries no filter."""
    sink = landed.sink
    table = landed.catalog.load_table(sink.table)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    specs = table.specs()
    delete_specs = {
        m.partition_spec_id for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES
    }
    # The premise: the default spec partitions by country; the deletes are written with an unpartitioned spec.
    assert [f.name for f in table.spec().fields] == ["country"], table.spec()
    assert delete_specs and all(specs[i].is_unpartitioned() for i in delete_specs), (delete_specs, specs)

    name = trino_table(sink.table)
    predicate = "country = 'de'"
    rows = trino_query(f"SELECT * FROM {name} WHERE {predicate}")
    expected = [r for r in sink.source.expected_rows() if r["country"] == "de"]
    assert expected, "no row in partition de"
    assert diff(expected, rows, "trino where country = 'de'") == ""
    filters = _scan_filter(f"SELECT * FROM {name} WHERE {predicate}")
    assert any("country" in f for f in filters), filters

    copy = trino_table(sink.table + "_copy")
    trino_query(f"CREATE TABLE {copy} WITH (partitioning = ARRAY['country']) AS SELECT * FROM {name}")
    try:
        assert _scan_filter(f"SELECT * FROM {copy} WHERE {predicate}") == []
    finally:
        trino_query(f"DROP TABLE {copy}")
