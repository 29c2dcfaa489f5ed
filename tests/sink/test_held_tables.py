"""A sink of many tables holding quiet tables' changes (``commit.table_min_records`` /
``commit.table_max_period``): a busy table is committed batch by batch, quiet ones only when due, and
each lands exactly, also when the sink dies while it holds their changes."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog

from service.sample import SampleSource, ensure_topic, produce
from tests.sink.conftest import Sink, SinkRun
from tests.sink.expect import assert_rows, sink_snapshots


def _sink(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], commit: dict[str, Any]
) -> tuple[Sink, str, str]:
    prefix = unique_name("held")
    namespace = unique_name("lake")
    sink = make_sink(
        kafka={"topics": [], "topic_pattern": rf"{prefix}\..*", "max_offsets_per_trigger": 880},
        table={"identifier": f"{namespace}.{{source.table}}", "mode": "upsert", "key": []},
        commit=commit,
        log={"level": "DEBUG"},
    )
    sink.config["kafka"].pop("topics")
    return sink, prefix, namespace


def _feed(sink: Sink, prefix: str, sources: dict[str, SampleSource], counts: dict[str, int]) -> None:
    for name, n in counts.items():
        topic = f"{prefix}.{name}"
        ensure_topic(sink.bootstrap, topic, 1)
        produce(sink.bootstrap, topic, [sources[name].next_change() for _ in range(n)])


def _snapshots(catalog: Catalog, table: str, sink: Sink) -> list[dict[str, str]]:
    return sink_snapshots(catalog, table, sink.name) if catalog.table_exists(table) else []


def test_quiet_tables_are_held_across_batches_and_land_exactly_once_due(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    """Changes arrive while the sink runs, three rounds of 400 to a busy table and 40 to each of two
    quiet ones: every round's batch reads them all (no backlog), the busy table's share is due on its
    own and gets a snapshot, the quiet tables' shares are held round after round; a graceful stop
    lands each quiet table in one snapshot (its changes of every batch merged, updates and deletes
    across batches included)."""
    sink, prefix, namespace = _sink(
        make_sink, unique_name, {"table_min_records": 300, "table_max_period": "1h"}
    )
    sources = {n: SampleSource(keys=40, seed=i, table=n) for i, n in enumerate(["busy", "quiet", "calm"])}
    busy = f"{namespace}.busy"
    # The topics exist before the sink starts: its first plan finds all three. A topic made later is
    # planned when the source next asks the broker (up to 5 s: stream_source.PARTITIONS_MAX_AGE_S),
    # and a quiet table's first rounds, made faster than that, would be read in one batch.
    for name in sources:
        ensure_topic(sink.bootstrap, f"{prefix}.{name}", 1)

    run = sink.start()
    try:
        for round_ in range(1, 4):
            _feed(sink, prefix, sources, {"busy": 400, "quiet": 40, "calm": 40})
            run.wait_for_log(f"to {busy}:", timeout=180, count=round_)
        for name in ["quiet", "calm"]:  # every change read (and held) before the stop
            run.wait_for_log(f"{namespace}.{name} (120)", timeout=60)
        held = [line for line in run.log().splitlines() if "changes held (records) for" in line]
        # The story: the quiet tables' changes were held in more than one batch, and none committed.
        assert sum(f"{namespace}.quiet (" in line for line in held) >= 2, run.log()[-4000:]
        assert _snapshots(rest_catalog, f"{namespace}.quiet", sink) == []
    finally:
        run.kill(signal.SIGTERM)
    assert run.wait() == 0, run.log()[-4000:]

    for name in ["quiet", "calm"]:
        table = f"{namespace}.{name}"
        assert len(_snapshots(rest_catalog, table, sink)) == 1, f"{table} committed more than once"
        assert_rows(spark, table, sources[name].expected_rows())
    assert len(_snapshots(rest_catalog, busy, sink)) >= 3
    assert_rows(spark, busy, sources["busy"].expected_rows())


def test_a_backlog_of_quiet_tables_is_read_in_whole_chunks_each_table_once(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    """Six tables with 500 changes each wait in Kafka and a batch reads at most 1,000 records: shared
    out thinly, every batch would bring each table ~160 changes, held batch after batch. In chunks
    (``table_min_records`` 300; under two chunks left, a table's whole backlog) each batch reads two
    tables whole, due on their own: every table gets one snapshot of its 500 changes, read once."""
    sink, prefix, namespace = _sink(
        make_sink, unique_name, {"table_min_records": 300, "table_max_period": "1h"}
    )
    sink.config["kafka"]["max_offsets_per_trigger"] = 1_000
    names = [f"t{i}" for i in range(6)]
    sources = {n: SampleSource(keys=60, seed=i, table=n) for i, n in enumerate(names)}
    _feed(sink, prefix, sources, dict.fromkeys(names, 500))

    run = sink.run_until_caught_up()

    log = run.log()
    assert "changes held (records) for" not in log  # every table's share was due on its own
    for name in names:
        table = f"{namespace}.{name}"
        commits = [line for line in log.splitlines() if f"to {table}:" in line]
        assert len(commits) == 1 and ", 500 records " in commits[0], commits
        assert len(_snapshots(rest_catalog, table, sink)) == 1
        assert_rows(spark, table, sources[name].expected_rows())


def test_held_changes_are_read_again_after_the_sink_is_killed(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    """The sink dies while it holds a quiet table's changes and the busy table's batches are committed:
    the txnlog kept the quiet topic at its last commit, so the next run reads it again and the quiet
    table lands exactly, without a duplicate."""
    sink, prefix, namespace = _sink(
        make_sink, unique_name, {"table_min_records": 300, "table_max_period": "1h"}
    )
    sources = {n: SampleSource(keys=40, seed=i, table=n) for i, n in enumerate(["busy", "quiet"])}
    _feed(sink, prefix, sources, {"busy": 2400, "quiet": 150})
    busy, quiet = f"{namespace}.busy", f"{namespace}.quiet"

    run = sink.start(process=True)  # SIGKILLed below, its held changes with it
    try:
        run.wait_for_log(f"to {busy}:", timeout=180, count=2)
        run.wait_for_log("changes held (records) for", timeout=60)
        # Every busy change committed first: the next run then reads the quiet topic alone, so the
        # quiet table becomes due by table_max_period between batches, not beside a busy batch.
        lags = _wait_for_lags(sink, run, lambda lags: lags.get(busy) == 0)
        assert (lags[quiet] or 0) >= 150, lags  # never committed: every record Kafka holds is behind
        # The fault: the quiet table's changes were read and are held in this process only.
        assert _snapshots(rest_catalog, quiet, sink) == []
        committed = {s["icesink.seq"] for s in _snapshots(rest_catalog, busy, sink)}
        assert len(committed) >= 2
    finally:
        run.kill()
    assert f"to {quiet}:" not in run.log()

    _feed(sink, prefix, sources, {"quiet": 30})
    sink.config["commit"] = {"table_min_records": 300, "table_max_period": "2s"}
    run = sink.start()
    try:
        _wait_for_lags(sink, run, lambda lags: len(lags) == 2 and set(lags.values()) == {0})
    finally:
        run.kill()
    assert "due, no new batch" in run.log()  # committed by table_max_period, between batches
    assert len(_snapshots(rest_catalog, quiet, sink)) == 1
    assert_rows(spark, quiet, sources["quiet"].expected_rows())
    assert_rows(spark, busy, sources["busy"].expected_rows())


def _wait_for_lags(
    sink: Sink, run: SinkRun, caught_up: Callable[[dict[str, int | None]], bool]
) -> dict[str, int | None]:
    """Wait until ``icesink status``'s lag per table satisfies ``caught_up``; that lag."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = json.loads(sink.cli("status").stdout)
        lags = {t["table"]: t["lag"] for t in status["tables"]}
        if caught_up(lags):
            return lags
        time.sleep(2)
    raise AssertionError(f"the sink did not catch up: {status}\n{run.log()[-4000:]}")


def test_held_rows_land_before_a_batch_that_takes_sparks_path(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    """A table holds a batch's rows (not yet due); the next batch brings a new column, which the
    Arrow path declines: the held rows are committed first, as a plan of their own, then Spark's path
    evolves the table and writes the new batch, each in its own snapshot. (Held rows due by age would
    be committed between the batches when the next one is slow to start, and the story not told.)"""
    from tests.sink.test_many_tables import _with_a_new_column

    sink, prefix, namespace = _sink(
        make_sink, unique_name, {"table_min_records": 100_000, "table_max_period": "1h"}
    )
    sink.config["kafka"]["max_offsets_per_trigger"] = 100
    source = SampleSource(keys=30, seed=3, table="items")
    topic = f"{prefix}.items"
    ensure_topic(sink.bootstrap, topic, 1)
    produce(sink.bootstrap, topic, [source.next_change() for _ in range(100)])
    evolved = [_with_a_new_column(source.next_change()) for _ in range(100)]
    produce(sink.bootstrap, topic, evolved)
    notes: dict[int, str | None] = {}
    for change in evolved:
        key = change.key["payload"]["id"]
        notes[key] = None if change.op == "d" else f"note-{key}"

    run = sink.run_until_caught_up()

    log = run.log()
    table = f"{namespace}.items"
    assert "its batch takes Spark's path" in log, log[-4000:]  # the decline really happened
    seqs = [s["icesink.seq"] for s in _snapshots(rest_catalog, table, sink)]
    assert len(seqs) == len(set(seqs)) >= 2, seqs  # one snapshot per plan: held rows apart
    assert_rows(spark, table, [{**row, "note": notes.get(row["id"])} for row in source.expected_rows()])
