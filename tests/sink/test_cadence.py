"""Commit cadence: ``commit.min_size`` / ``commit.max_period`` buffer micro-batches into one snapshot."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from service.channel.cadence import CommitCadence
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows, sink_snapshots
from tests.sink.test_end_to_end import _catalog


def test_every_trigger_commits_without_limits() -> None:
    assert CommitCadence().due(buffered_bytes=1, now=0.0)


def test_min_size_or_max_period_whichever_first() -> None:
    cadence = CommitCadence(min_size=1000, max_period=timedelta(seconds=10), last_commit=100.0)
    assert not cadence.due(999, now=105.0)
    assert cadence.due(1000, now=105.0)  # size reached
    assert cadence.due(1, now=110.0)  # period passed
    cadence.committed(110.0)
    assert not cadence.due(1, now=115.0)


def test_only_min_size_waits_for_size() -> None:
    cadence = CommitCadence(min_size=50, last_commit=0.0)
    assert not cadence.due(49, now=1e9)
    assert cadence.due(50, now=1.0)


def test_buffered_micro_batches_become_one_exact_snapshot(make_sink: Any, spark: Any) -> None:
    """Six micro-batches, with keys inserted in one and deleted in a later one, land as one snapshot."""
    sink: Sink = make_sink(
        keys=40,
        partitions=1,
        kafka={"max_offsets_per_trigger": 100},
        commit={"min_size": "1GiB", "max_period": "1h"},
        log={"level": "DEBUG"},
    )
    sink.produce(600)
    run = sink.run_until_caught_up()
    assert run.log().count("not yet due") >= 5, run.log()[-3000:]  # 100 records per micro-batch
    assert run.log().count("committed seq") == 1, run.log()[-3000:]
    assert [s["icesink.seq"] for s in sink_snapshots(_catalog(sink), sink.table, sink.name)] == ["1"]
    assert_rows(spark, sink.table, sink.source.expected_rows())
