"""Chaos that only ``delete_format: position`` has: a kill in the middle of building the key index,
and kills while a compaction holds the table's turn (service.commit.turns).
The random kills and every fail point run in position mode too (test_chaos_kills.py), checked by the
same assertions (and pyiceberg, which reads only position deletes)."""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest
from pyiceberg.table.snapshots import Operation

from service.commit.turns import lock_name
from service.keyindex.build import live_files
from tests.chaos.harness import (
    KILLED_BY_FAILPOINT,
    BackgroundProducer,
    catalog_of,
    sigkill,
    start,
    stop_gracefully,
    verify_exact,
    wait_caught_up,
    wait_exit,
    wait_for_commits,
    wait_until,
)
from tests.sink.conftest import Sink
from txnlog import Phase, TransactionLog

pytestmark = pytest.mark.chaos


def test_killed_while_the_key_index_is_built(make_sink: Any, spark: Any) -> None:
    """A run's first batch builds the table's key index from its data files; the sink is killed after
    the first file of the build. Nothing of that batch was precommitted: the next run builds the index
    again from the table and lands the batch once."""
    sink: Sink = make_sink(
        keys=300, partitions=1, kafka={"max_offsets_per_trigger": 200}, table={"delete_format": "position"}
    )
    sink.produce(1200)
    sink.run_until_caught_up()
    table = catalog_of(sink).load_table(sink.table)
    assert table.properties.get("icesink.delete-format") == "position"
    assert len(live_files(table).data) >= 2, "one data file: the kill could not land mid-build"

    sink.produce(400)
    killed = start(sink, env={"ICESINK_FAILPOINTS": "during_key_index_build=kill"})
    assert wait_exit(killed, 300) == KILLED_BY_FAILPOINT, killed.log()[-4000:]
    log = killed.log()
    # The fault: the build started, read one file, and never finished.
    assert "building from" in log and "fail point during_key_index_build: killing" in log
    assert " keys from " not in log

    resumed = sink.run_until_caught_up()
    assert " keys from " in resumed.log()
    verify_exact(spark, sink)


def _turn_holders(name: str) -> dict[str, int]:
    """Who holds or waits for a named lock, from pg_locks: {"ExclusiveLock granted": 1, ...}."""
    dsn = os.environ["ICESINK_PG_DSN"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT mode, granted, count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND (classid::bigint << 32 | objid::bigint) = hashtextextended(%s, 0) GROUP BY mode, granted",
            (name,),
        ).fetchall()
    return {f"{mode} {'granted' if granted else 'waiting'}": int(n) for mode, granted, n in rows}


def test_killed_while_a_compaction_holds_the_table(make_sink: Any, spark: Any) -> None:
    """The maintainer compacts while the sink commits position deletes every second; the maintainer is
    killed twice inside a rewrite that holds the table's turn, and the sink once while its commit waits
    for that turn with its plan precommitted. A killed holder's turn ends with its session, the
    resumed plan's deletes are resolved against whatever the compactions left, and compactions land
    between the kills: the table stays exact."""
    sink: Sink = make_sink(
        partitions=1,
        keys=200,
        kafka={"max_offsets_per_trigger": 60},
        table={"delete_format": "position"},
        maintenance={"interval": "2s", "compaction": {"delete_files": 3, "commits": 4}},
    )
    turn = lock_name(sink.name, sink.table)
    log = TransactionLog(os.environ["ICESINK_PG_DSN"])
    with BackgroundProducer(sink, batch=30, pause=0.5):
        run = start(sink)
        wait_for_commits(run, 3, timeout=240)
        maintainer = sink.start_cli("maintain")
        for _ in range(2):
            wait_until(
                lambda: _turn_holders(turn).get("ExclusiveLock granted"), 240, "a rewrite in its turn", 0.05
            )
            sigkill(maintainer)
            # The fault: the maintainer died holding the turn; Postgres ends it with the session.
            wait_until(
                lambda: not _turn_holders(turn).get("ExclusiveLock granted"),
                30,
                "the dead maintainer's turn to end",
            )
            maintainer = sink.start_cli("maintain")

        wait_until(
            lambda: _turn_holders(turn).get("ShareLock waiting"),
            300,
            "the sink's commit to wait for a rewrite",
            0.05,
        )
        sigkill(run)
        state = log.state(sink.name)
        assert state is not None and state.phase is Phase.PRECOMMIT, (
            "the sink was killed with no plan pending"
        )
        run = start(sink)
        wait_for_commits(run, 2, timeout=240)
    wait_caught_up(sink, run)
    stop_gracefully(run)
    sigkill(maintainer)
    log.close()
    table = catalog_of(sink).load_table(sink.table)
    compactions = [
        s for s in table.snapshots() if s.summary is not None and s.summary.operation == Operation.REPLACE
    ]
    assert compactions, "no compaction landed beside the sink"
    verify_exact(spark, sink)
