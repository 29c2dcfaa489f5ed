"""A sink landing a real Debezium connector's topic in upsert mode is SIGKILLed mid-commit.

The capture is tests/sink/debezium_sales.py's (schemas on, ``decimal.handling.mode=precise``; in JSON,
and in Avro through the stack's schema registry); the kill
lands between the Iceberg commit of a batch and its txnlog commit (fail point ``after_catalog_commit``
holding the batch there, then SIGKILL of the whole process group), and the restarted sink must end with
the source's rows, value by value, no key twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.commit.plan import PendingCommit
from tests.chaos import harness as h
from tests.sink.conftest import Sink
from tests.sink.debezium_sales import assert_table_matches, capturing, sales_sink
from tests.sink.expect import assert_seqs_increasing
from txnlog import Phase, TransactionLog

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("connector", ["schemas-precise", "avro-precise"])
def test_debezium_sales_upsert_survives_sigkill_mid_commit(
    connector: str,
    stack: Any,
    make_sink: Callable[..., Sink],
    spark: Any,
    unique_name: Callable[[str], str],
    pg_dsn: str,
) -> None:
    """Batches of at most 20 records; the second batch's snapshot lands in Iceberg and the whole process
    group is SIGKILLed before the txnlog commit. The restarted sink finds that snapshot, commits nothing
    twice, lands the rest: the table is the source's current rows, value by value, no key twice."""
    with capturing(stack) as capture:
        captured = capture(connector)
        sink = sales_sink(make_sink, unique_name, captured, "upsert", max_offsets_per_trigger=20)
        killed = h.start(
            sink, "--until-caught-up", env={"ICESINK_FAILPOINTS": "after_catalog_commit=delay:300@2"}
        )
        killed.wait_for_log("fail point after_catalog_commit: delay", timeout=300)
        h.sigkill(killed)
        assert killed.process.returncode == -9, killed.log()[-4000:]

        # The kill landed mid-commit: batch 2's plan is in Iceberg (the current snapshot), the log still
        # says precommit, and batch 1 is the last committed one.
        log = TransactionLog(pg_dsn)
        try:
            state = log.state(sink.name)
        finally:
            log.close()
        assert state is not None and state.phase is Phase.PRECOMMIT and state.pending is not None, state
        plan = PendingCommit.from_payload(state.pending)
        assert state.seq == 2 and killed.log().count("committed seq") == 1, killed.log()[-4000:]
        table = h.catalog_of(sink).load_table(sink.table)
        assert table.current_snapshot().snapshot_id == plan.snapshot_id  # type: ignore[union-attr]
        assert sum(plan.offsets[captured.topic].values()) < len(captured.records)

        resumed = sink.run_until_caught_up()
        assert f"seq 2 is already in {sink.table} as snapshot {plan.snapshot_id}" in resumed.log()
        assert_table_matches(spark, sink.table, captured.current, key="id")
        seqs = assert_seqs_increasing(h.catalog_of(sink), sink.table, sink.name)
        assert seqs[:2] == [1, 2] and len(seqs) >= 3, seqs
        h.FIGURES.sink_starts += len(sink.runs)
        h.FIGURES.rows_verified += len(captured.current)
        h.FIGURES.snapshots_checked += len(seqs)
        h.FIGURES.count_failpoints(killed.log())
