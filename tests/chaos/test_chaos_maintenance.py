"""Maintenance under fire: the sink and `icesink maintain` running together, killed mid-work, racing.

A compaction racing the streaming writer is where peers resurrect deleted rows, and a maintainer that
knows nothing of a pending commit is where they delete its files. Each test keeps a producer and the
sink running against one upsert table while maintainers compact, expire and clean it every couple of
seconds, abuses them, proves the abuse landed (a kill inside a maintenance task, a kill between the
sink's precommit and its commit, two maintainers fencing each other), and then checks that the table
equals the model through Spark and DuckDB, that every file the table references exists, and that
the pending plans found after the kills still had all their files.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from service.commit.plan import BatchPlan
from service.maintenance.lease import lease_id
from tests.chaos.harness import (
    BackgroundProducer,
    catalog_of,
    sigkill,
    stop_gracefully,
    verify_exact,
    wait_caught_up,
    wait_for_commits,
    wait_until,
)
from tests.sink.conftest import Sink, SinkRun
from txnlog import Phase, SinkState, TransactionLog

pytestmark = pytest.mark.chaos

MAINTENANCE = {
    "interval": "2s",
    "compaction": {"delete_files": 4, "commits": 6},
    "expiry": {"older_than": "10s", "retain_last": 5},
    "orphans": {"older_than": "1h", "interval": "20s"},
}


def _sink(make_sink: Any) -> Sink:
    sink: Sink = make_sink(
        partitions=1, keys=200, kafka={"max_offsets_per_trigger": 60}, maintenance=MAINTENANCE
    )
    return sink


def _state(log: TransactionLog, row: str) -> SinkState | None:
    return log.state(row)


def _missing_files(sink: Sink) -> list[str]:
    """Files the table's current snapshot references (manifest list, manifests, data, deletes) that are gone."""
    table = catalog_of(sink).load_table(sink.table)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    io = table.io
    paths = [snapshot.manifest_list]
    for manifest in snapshot.manifests(io):
        paths.append(manifest.manifest_path)
        paths.extend(e.data_file.file_path for e in manifest.fetch_manifest_entry(io))
    return [p for p in paths if not io.new_input(p).exists()]


def _plan_files_missing(sink: Sink, state: SinkState) -> list[str]:
    io = catalog_of(sink).load_table(sink.table).io
    assert state.pending is not None
    return [p for p in BatchPlan.from_payload(state.pending).file_paths() if not io.new_input(p).exists()]


def _finish(spark: Any, sink: Sink, run: SinkRun, maintainers: list[SinkRun]) -> None:
    """Let the sink catch up, stop everything, run one last full maintenance, check the table."""
    wait_caught_up(sink, run)
    stop_gracefully(run)
    for maintainer in maintainers:
        # A maintainer started a moment ago may not have its SIGTERM handler yet (Python's default
        # ends it with -15): stop it once its Spark session is up, as a pod would be after start-up.
        wait_until(
            lambda m=maintainer: "Spark jars: " in m.log() or m.process.poll() is not None,
            180,
            "the maintainer's start-up",
        )
        if maintainer.process.poll() is None:
            os.kill(maintainer.process.pid, 15)
            assert maintainer.wait(120) in (0, 3), maintainer.log()[-3000:]
    done = sink.cli("maintain", "--once", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert json.loads(done.stdout)["tables"][0]["after"]["delete_files"] == 0
    verify_exact(spark, sink)
    assert _missing_files(sink) == []


def test_kills_of_the_sink_and_the_maintainer_mid_work_lose_nothing(make_sink: Any, spark: Any) -> None:
    sink = _sink(make_sink)
    lease_row = lease_id(sink.name, sink.table)
    log = TransactionLog(os.environ["ICESINK_PG_DSN"])
    maintainer_kills_in_task = sink_kills_in_commit = 0
    try:
        with BackgroundProducer(sink, batch=30, pause=0.5):
            run = sink.start()
            wait_for_commits(run, 3, timeout=240)
            maintainer = sink.start_cli("maintain")
            for _ in range(3):
                # The maintainer, inside a task: its lease row precommitted and locked.
                wait_until(
                    lambda: (s := _state(log, lease_row)) is not None and s.phase is Phase.PRECOMMIT,
                    180,
                    "a maintenance task to start",
                    interval=0.05,
                )
                sigkill(maintainer)
                if (s := _state(log, lease_row)) is not None and s.phase is Phase.PRECOMMIT:
                    maintainer_kills_in_task += 1
                maintainer = sink.start_cli("maintain")

                # The sink, between its precommit and its commit.
                wait_until(
                    lambda: (s := _state(log, sink.name)) is not None and s.phase is Phase.PRECOMMIT,
                    120,
                    "the sink to precommit a batch",
                    interval=0.01,
                )
                sigkill(run)
                state = _state(log, sink.name)
                if state is not None and state.phase is Phase.PRECOMMIT:
                    sink_kills_in_commit += 1
                    assert _plan_files_missing(sink, state) == []
                time.sleep(3)  # the maintainer works on while the sink is down with its plan pending
                if state is not None and state.phase is Phase.PRECOMMIT:
                    assert _plan_files_missing(sink, state) == []
                run = sink.start()
                wait_for_commits(run, 1, timeout=240)
        assert maintainer_kills_in_task == 3, "every maintainer kill must land inside a task"
        assert sink_kills_in_commit >= 1, "no sink kill landed between a precommit and its commit"
        _finish(spark, sink, run, [maintainer])
    finally:
        log.close()


def test_two_maintainers_racing_fence_each_other_and_lose_nothing(make_sink: Any, spark: Any) -> None:
    sink = _sink(make_sink)
    fenced = skipped = 0
    with BackgroundProducer(sink, batch=30, pause=0.5):
        run = sink.start()
        wait_for_commits(run, 3, timeout=240)
        maintainers = [sink.start_cli("maintain"), sink.start_cli("maintain")]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for i, maintainer in enumerate(maintainers):
                if maintainer.process.poll() is not None:
                    assert maintainer.wait(10) == 3, maintainer.log()[-3000:]
                    assert "a newer maintainer took over" in maintainer.log()
                    fenced += 1
                    maintainers[i] = sink.start_cli("maintain")
            time.sleep(1)
        skipped = sum(m.log().count("skipped: another maintainer") for m in sink.runs)
    assert fenced >= 1, "the two maintainers never fenced each other"
    _finish(spark, sink, run, maintainers)
    print(f"two maintainers: {fenced} fenced, {skipped} table passes skipped while the other held the lease")
