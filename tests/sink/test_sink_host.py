"""The sink host (tests/sink/host.py): `icesink run` and `icesink maintain --once` in a warm Spark
session answer as the sink process would, with its exit code and its log file or output."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.sink import host
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows
from tests.sink.host import HostedProcess

JVM_BANNER = "Using Spark's default log4j profile"

pytestmark = pytest.mark.skipif(not host.ENABLED, reason="ICESINK_TEST_SINK_HOST=0: every run is a process")


def test_runs_in_the_host_share_one_spark_session(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(keys=50)
    sink.produce(100)
    first = sink.run_until_caught_up()
    sink.produce(100)
    second = sink.run_until_caught_up()

    assert isinstance(first.process, HostedProcess) and isinstance(second.process, HostedProcess)
    log = second.log()
    assert JVM_BANNER not in log, log[-3000:]  # no JVM started for it
    assert "committed seq 2 to" in log and "catch-up progress: 200 of 200 offsets" in log, log[-3000:]
    assert_rows(spark, sink.table, sink.source.expected_rows())


def test_a_run_that_fails_exits_in_the_host_as_the_process_does(make_sink: Any) -> None:
    """A topic that does not exist stops start-up with exit 2; a run whose environment differs from
    the host's is a process of its own, and says the same."""
    sink: Sink = make_sink()
    missing = f"{sink.topic}_missing"
    sink.config["kafka"]["topics"] = [missing]
    hosted = sink.start("--until-caught-up")
    process = sink.start("--until-caught-up", env={"ICESINK_TEST_A_VARIABLE": "1"})

    assert isinstance(hosted.process, HostedProcess)
    assert isinstance(process.process, subprocess.Popen)
    assert hosted.wait(120) == process.wait(120) == 2, hosted.log()[-3000:] + process.log()[-3000:]
    message = f"cannot start: Kafka topic '{missing}' is not available"
    assert message in hosted.log() and message in process.log(), hosted.log()[-3000:]


def test_maintenance_passes_in_the_host_each_reach_their_own_sinks_catalog(
    make_sink: Any, nessie: str
) -> None:
    """Two sinks' ``maintain --once`` in the host's session, one after the other: the second (on Nessie's
    REST catalog) compacts through its own catalog, not the Iceberg REST server's that Spark made for
    the first pass (the maintainer's catalog is named ``icesink`` for both: the host drops it after a
    run)."""
    on_rest: Sink = make_sink(keys=20)
    s3 = {k: v for k, v in on_rest.config["catalog"].items() if k.startswith("s3.")}
    on_nessie: Sink = make_sink(keys=20, catalog={"name": "nessie", "type": "rest", "uri": nessie, **s3})
    for sink in (on_rest, on_nessie):
        for _ in range(2):  # two data files: something to compact
            sink.produce(40)
            sink.run_until_caught_up()

    for sink in (on_rest, on_nessie):
        done = sink.cli("maintain", "--once", timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        assert JVM_BANNER not in done.stderr, done.stderr[-3000:]  # it ran in the host's JVM
        (table,) = json.loads(done.stdout)["tables"]
        assert table["table"] == sink.table and table["failed"] == {}, table
        assert table["tasks"]["compact"]["files_rewritten"] >= 2, table


def _kafka_threads(pid: int) -> list[str]:
    """The librdkafka threads (``rdk:...``) of a process: one set for each Kafka client it holds."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            if name.startswith("rdk:"):
                names.append(name)
    return names


def test_a_stopped_run_leaves_no_kafka_client_in_the_host(make_sink: Any) -> None:
    """A run's job is let go when the run ends, as its process would have exited: the Kafka clients
    the run held (their librdkafka threads) are gone from the host within seconds of its answer, not
    kept by py4j for the callback the JVM had until the JVM collects its handle on it."""
    sink: Sink = make_sink(keys=20)
    sink.produce(40)
    run = sink.start()
    assert isinstance(run.process, HostedProcess)
    run.wait_for_log("committed seq 1 to")
    pid = host._host().pid()
    during = _kafka_threads(pid)
    assert during, "the running sink holds no Kafka client in the host: nothing to let go"
    run.kill(signal.SIGTERM)
    assert run.wait(120) == 0, run.log()[-3000:]
    # A client's threads may take a moment to end (the lag monitor's consumer closes in its own thread);
    # a client the host still held would keep them for good.
    deadline = time.monotonic() + 15
    while (left := _kafka_threads(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"Kafka clients left in the host after the run (during it: {during})"
