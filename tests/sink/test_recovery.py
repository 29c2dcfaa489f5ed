"""Recovery when the table and the txnlog tell different stories, with the real sink process."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession

from service.commit.plan import PendingCommit
from service.failpoints import KILL_EXIT_CODE
from tests.sink.conftest import Sink
from tests.sink.expect import (
    appended_rows,
    assert_rows,
    assert_seqs_increasing,
    send_txnlog_back,
    sink_snapshots,
)
from tests.sink.test_end_to_end import _catalog
from txnlog import Action, Phase, TransactionLog


def txnlog_schema(sink: Sink) -> str:
    return str(sink.config["txnlog"].get("schema", "icesink"))


def txnlog_of(sink: Sink, pg_dsn: str) -> TransactionLog:
    return TransactionLog(pg_dsn, schema=txnlog_schema(sink))


def last_commit_in_table(sink: Sink) -> dict[str, str]:
    """The summary of the sink's newest snapshot (read directly, not through the sink's code)."""
    summaries = sink_snapshots(_catalog(sink), sink.table, sink.name)
    assert summaries, f"no snapshot of {sink.name} in {sink.table}"
    return summaries[-1]


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


def test_txnlog_behind_the_table_refuses_to_start(make_sink: Any, pg_dsn: str) -> None:
    """The log's row is restored to an older state (a backup, a promoted standby) while the table keeps
    the newer commits: the sink must not start (new plans would reuse seqs the table already has)."""
    sink: Sink = make_sink(keys=100)
    log = txnlog_of(sink, pg_dsn)
    sink.produce(200)
    sink.run_until_caught_up()
    older = log.state(sink.name)
    sink.produce(200)
    sink.run_until_caught_up()
    newest = log.state(sink.name)
    assert older is not None and newest is not None and newest.seq > older.seq

    send_txnlog_back(pg_dsn, txnlog_schema(sink), sink.name, older)
    table_seq = int(last_commit_in_table(sink)["icesink.seq"])
    went_back = log.state(sink.name)
    assert went_back is not None and went_back.seq == older.seq < table_seq == newest.seq
    table_before = _catalog(sink).load_table(sink.table).metadata

    sink.produce(50)
    refused = sink.start("--until-caught-up")
    assert refused.wait() == 2, refused.log()[-4000:]
    message = refused.log()
    for needle in (
        f"sink {sink.name}: table {sink.table} holds commit seq {table_seq} of this sink",
        f"the txnlog's highest seq is {older.seq}",
        "icesink txnlog reseed",
    ):
        assert needle in message, message[-4000:]
    table_after = _catalog(sink).load_table(sink.table).metadata
    assert table_after.snapshots == table_before.snapshots
    after = log.state(sink.name)
    assert after is not None
    assert (after.seq, after.phase, after.committed_payload) == (
        older.seq,
        older.phase,
        older.committed_payload,
    )


def test_txnlog_reseed_resumes_from_the_table(make_sink: Any, spark: SparkSession, pg_dsn: str) -> None:
    """The sink's row was deleted; `icesink txnlog reseed` takes the table's last commit as the log's,
    and the sink resumes from the offsets that commit covers (append mode: a re-read would duplicate)."""
    sink: Sink = make_sink(mode="append", keys=100)
    log = txnlog_of(sink, pg_dsn)
    sink.produce(300)
    sink.run_until_caught_up()
    last = last_commit_in_table(sink)
    send_txnlog_back(pg_dsn, txnlog_schema(sink), sink.name, None)
    assert log.state(sink.name) is None

    refused = sink.start("--until-caught-up")
    assert refused.wait() == 2, refused.log()[-4000:]
    assert "the txnlog's highest seq is 0" in refused.log()

    reseeded = sink.cli("txnlog", "reseed")
    assert reseeded.returncode == 0, reseeded.stderr[-4000:]
    done = json.loads(reseeded.stdout)
    assert (done["seq"], done["offsets"]) == (int(last["icesink.seq"]), json.loads(last["icesink.offsets"]))
    entry = log.history(sink.name, limit=1)[0]
    assert entry.action is Action.COMMIT and entry.payload is not None
    assert entry.payload["operation"] == "reseed" and entry.seq == done["seq"]
    again = sink.cli("txnlog", "reseed")
    assert again.returncode == 2 and "not behind the table" in again.stderr, again.stderr[-4000:]

    sink.produce(200)
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, appended_rows(sink.history))
    assert assert_seqs_increasing(_catalog(sink), sink.table, sink.name)[-1] > done["seq"]


def test_txnlog_reseed_and_orphans_cover_every_table_of_a_sink_of_many(
    make_sink: Any, unique_name: Any, spark: SparkSession, pg_dsn: str, rest_catalog: Any
) -> None:
    """A sink of two tables (one in append mode, where a re-read would duplicate) loses its row;
    `icesink txnlog reseed` resumes each topic from its own table's last commit, and `icesink orphans`
    lists (and deletes) a stray file under either table."""
    from service.sample import SampleSource, ensure_topic, produce

    prefix, namespace = unique_name("db"), unique_name("lake")
    topics = {name: f"{prefix}.{name}" for name in ("orders", "events")}
    sink: Sink = make_sink(
        kafka={"topics": list(topics.values())},
        table={"identifier": f"{namespace}.{{source.table}}", "key": []},
        tables={f"{namespace}.events": {"mode": "append"}},
    )
    sources = {name: SampleSource(keys=40, seed=i, table=name) for i, name in enumerate(topics)}
    history: dict[str, list[Any]] = {name: [] for name in topics}

    def feed(n: int) -> None:
        for name, topic in topics.items():
            ensure_topic(sink.bootstrap, topic, 2)
            changes = [sources[name].next_change() for _ in range(n)]
            produce(sink.bootstrap, topic, changes)
            history[name].extend(changes)

    feed(150)
    sink.run_until_caught_up()
    changes = [sources["orders"].next_change() for _ in range(60)]  # one table only: their last
    produce(sink.bootstrap, topics["orders"], changes)  # commits differ
    history["orders"].extend(changes)
    sink.run_until_caught_up()
    marks = {
        f"{namespace}.{n}": sink_snapshots(rest_catalog, f"{namespace}.{n}", sink.name)[-1] for n in topics
    }
    log = txnlog_of(sink, pg_dsn)
    send_txnlog_back(pg_dsn, txnlog_schema(sink), sink.name, None)
    refused = sink.start("--until-caught-up")
    assert refused.wait() == 2, refused.log()[-4000:]

    reseeded = sink.cli("txnlog", "reseed")
    assert reseeded.returncode == 0, reseeded.stderr[-4000:]
    done = json.loads(reseeded.stdout)
    assert done["seq"] == max(int(m["icesink.seq"]) for m in marks.values())
    assert set(done["tables"]) == set(marks)
    for table, mark in marks.items():
        assert done["tables"][table]["offsets"] == json.loads(mark["icesink.offsets"])
        assert set(done["tables"][table]["offsets"]) == {topics[table.rsplit(".", 1)[1]]}
    assert log.state(sink.name) is not None

    feed(50)
    sink.run_until_caught_up()
    assert_rows(spark, f"{namespace}.orders", sources["orders"].expected_rows())
    assert_rows(spark, f"{namespace}.events", appended_rows(history["events"]))  # nothing read twice

    # A stray file under one table's data location is that table's orphan.
    events = rest_catalog.load_table(f"{namespace}.events")
    stray = f"{events.location_provider().data_path.rstrip('/')}/stray-file.parquet"
    with events.io.new_output(stray).create() as out:
        out.write(b"not a table file")
    listed = sink.cli("orphans", "--older-than", "0s", "--delete")
    assert listed.returncode == 0, listed.stderr[-4000:]
    reports = {r["table"]: r for r in json.loads(listed.stdout)["tables"]}
    assert set(reports) == set(marks)
    assert [o["path"] for o in reports[f"{namespace}.events"]["orphans"]] == [stray]
    assert reports[f"{namespace}.orders"]["orphans"] == [] and reports[f"{namespace}.events"]["deleted"] == 1
    assert not events.io.new_input(stray).exists()
    assert_rows(spark, f"{namespace}.events", appended_rows(history["events"]))
