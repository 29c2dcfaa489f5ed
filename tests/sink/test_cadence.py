"""Commit cadence: ``commit.min_size`` / ``commit.max_period`` buffer micro-batches into one snapshot."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from typing import Any

from service.pipeline.cadence import CommitCadence
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows, sink_snapshots
from tests.sink.test_end_to_end import _catalog


def test_every_trigger_commits_without_limits() -> None:
    assert CommitCadence().due(buffered_bytes=1, buffered_for=0.0)


def test_min_size_or_max_period_whichever_first() -> None:
    cadence = CommitCadence(min_size=1000, max_period=timedelta(seconds=10))
    assert not cadence.due(999, buffered_for=5.0)
    assert cadence.due(1000, buffered_for=5.0)  # size reached
    assert cadence.due(1, buffered_for=10.0)  # period passed


def test_only_min_size_waits_for_size() -> None:
    cadence = CommitCadence(min_size=50)
    assert not cadence.due(49, buffered_for=1e9)
    assert cadence.due(50, buffered_for=1.0)


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


def _logged_at(log: str, needle: str) -> float:
    """The time (seconds since the epoch) of the first log line holding ``needle``."""
    line = next(line for line in log.splitlines() if needle in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_max_period_commits_a_buffer_when_no_more_data_comes(make_sink: Any, spark: Any) -> None:
    """A small batch is buffered (far below min_size), then traffic stops: Spark runs no further
    micro-batch, and the buffer is still committed within commit.max_period of being buffered.

    The batch that proves it comes after a first commit, so that it is buffered whatever the
    start-up took."""
    max_period = 8.0
    sink: Sink = make_sink(
        keys=40,
        partitions=1,
        commit={"min_size": "1GiB", "max_period": f"{max_period:.0f}s"},
        log={"level": "DEBUG"},
    )
    sink.produce(60)
    run = sink.start()
    run.wait_for_log("committed seq 1", timeout=240)
    buffered_before = run.log().count("not yet due")
    sink.produce(20)
    run.wait_for_log("not yet due", count=buffered_before + 1, timeout=60)
    run.wait_for_log("committed seq 2", timeout=max_period + 60)
    log = run.log()
    assert log.count("not yet due") == buffered_before + 1, log[-3000:]  # no further batch came
    after_first = log[log.index("committed seq 1") :]
    buffered = _logged_at(after_first, "not yet due")
    flushed = _logged_at(after_first, "commit.max_period passed with no new batch")
    assert max_period <= flushed - buffered <= max_period + 3, (buffered, flushed)
    assert [s["icesink.seq"] for s in sink_snapshots(_catalog(sink), sink.table, sink.name)] == ["1", "2"]
    assert_rows(spark, sink.table, sink.source.expected_rows())
    run.kill(signal.SIGTERM)
    assert run.wait(120) == 0, run.log()[-3000:]
