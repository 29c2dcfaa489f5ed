"""Recovery when the table and the txnlog tell different stories, with the real sink process."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from service.channel.pending import PendingCommit
from service.failpoints import KILL_EXIT_CODE
from tests.sink.conftest import Sink
from tests.sink.expect import appended_rows, assert_rows, assert_seqs_increasing
from tests.sink.test_end_to_end import _catalog
from txnlog import Phase, TransactionLog


def txnlog_of(sink: Sink, pg_dsn: str) -> TransactionLog:
    return TransactionLog(pg_dsn, schema=sink.config["txnlog"].get("schema", "icesink"))


def test_recovery_after_snapshot_expiry_commits_nothing_twice(
    make_sink: Any, spark: SparkSession, pg_dsn: str
) -> None:
    """The snapshot lands, the process dies before the txnlog commit, maintenance compacts the table
    and expires that snapshot (deleting its files) before the sink restarts."""
    sink: Sink = make_sink(mode="append", keys=100)
    sink.produce(300)
    killed = sink.start(env={"ICESINK_FAILPOINTS": "after_catalog_commit=kill"})
    assert killed.wait() == KILL_EXIT_CODE, killed.log()[-4000:]
    assert "fail point after_catalog_commit: killing the process" in killed.log()

    # The fault: the plan landed as snapshot S, the log still says precommit.
    state = txnlog_of(sink, pg_dsn).state(sink.name)
    assert state is not None and state.phase is Phase.PRECOMMIT and state.pending is not None
    plan = PendingCommit.from_payload(state.pending)
    catalog = _catalog(sink)
    table = catalog.load_table(sink.table)
    assert table.current_snapshot().snapshot_id == plan.snapshot_id  # type: ignore[union-attr]

    # Maintenance: compaction makes S not current, then S is expired and its files deleted.
    spark.sql(
        f"CALL rest.system.rewrite_data_files(table => '{sink.table}', options => map('rewrite-all', 'true'))"
    )
    spark.sql(
        f"CALL rest.system.expire_snapshots(table => '{sink.table}', snapshot_ids => array({plan.snapshot_id}))"
    )
    table = catalog.load_table(sink.table)
    assert table.metadata.snapshot_by_id(plan.snapshot_id) is None  # type: ignore[arg-type]
    assert len(table.metadata.snapshots) == 1  # the compaction's
    assert not any(table.io.new_input(path).exists() for path in plan.file_paths())

    sink.produce(100)
    resumed = sink.run_until_caught_up()
    assert_rows(spark, sink.table, appended_rows(sink.history))
    assert f"seq {state.seq} is already in {sink.table} as snapshot {plan.snapshot_id}" in resumed.log()
    assert_seqs_increasing(catalog, sink.table, sink.name)
    after = txnlog_of(sink, pg_dsn).state(sink.name)
    assert after is not None and after.phase is Phase.COMMITTED and after.committed_seq > state.seq  # type: ignore[operator]
