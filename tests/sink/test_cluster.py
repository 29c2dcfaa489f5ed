"""The sink on a Spark standalone cluster (the stack's master and two 1-core workers): the driver is the
sink's process, the reading, decoding and writing run in executors on both workers. The workers start
with none of the test's environment (no credentials, no PYSPARK_PYTHON, no stack variables): the
configuration and credentials reach the tasks inside the tasks, the jars through the driver's file
server. They share this machine's disk, so the venv at the driver's path stands for the image a real
node runs. The tables must land exactly, as in local mode.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from service.cli import EXIT_CONFIG
from service.sample import SampleSource, ensure_topic, produce
from tests.cluster import WORKERS, SparkCluster, application_id, tasks_by_worker
from tests.sink.conftest import Sink
from tests.sink.debezium_sales import Captured, assert_table_matches, capturing, sales_sink
from tests.sink.expect import appended_rows, assert_rows
from txnlog import TransactionLog


@pytest.fixture(scope="module")
def captures(stack: Any) -> Iterator[Callable[[str], Captured]]:
    with capturing(stack) as capture:
        yield capture


def _ran_on_every_worker(cluster: SparkCluster, log: str) -> None:
    """The run's application had an executor on each worker, and each of them ran tasks."""
    app = application_id(log)
    executors = cluster.executors(app)
    assert len(executors) == WORKERS and all(executors.values()), f"{app}'s executors by worker: {executors}"
    tasks = tasks_by_worker(app)
    assert len(tasks) == WORKERS and all(tasks.values()), f"{app}'s tasks by worker: {tasks}"


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_sales_lands_exactly_on_a_cluster(
    captures: Callable[[str], Captured],
    make_sink: Callable[..., Sink],
    spark: Any,
    spark_cluster: SparkCluster,
    unique_name: Callable[[str], str],
    mode: str,
) -> None:
    """The sales table captured by Debezium lands exactly through executors on both workers."""
    captured = captures("schemas-precise")
    sink: Sink = spark_cluster.run(sales_sink(make_sink, unique_name, captured, mode))
    run = sink.run_until_caught_up(timeout=400)
    _ran_on_every_worker(spark_cluster, run.log())
    if mode == "upsert":
        assert_table_matches(spark, sink.table, captured.current, key="id")
    else:
        assert_table_matches(spark, sink.table, captured.appended, key=None)


def test_many_tables_land_exactly_on_a_cluster(
    make_sink: Callable[..., Sink],
    spark: Any,
    spark_cluster: SparkCluster,
    unique_name: Callable[[str], str],
) -> None:
    """A database's topics, each its own table (upsert with position deletes, partitioned, append)."""
    prefix, namespace = unique_name("shop"), unique_name("lake")
    sink = make_sink(
        kafka={"topics": [], "topic_pattern": rf"{prefix}\..*"},
        table={"identifier": f"{namespace}.{{source.table}}", "key": [], "delete_format": "position"},
        tables={
            f"{namespace}.orders": {"partition_by": ["country"]},
            f"{namespace}.events": {"mode": "append"},
        },
    )
    sink.config["kafka"].pop("topics")
    spark_cluster.run(sink)
    sources = {
        name: SampleSource(keys=60, seed=i, table=name)
        for i, name in enumerate(["customers", "orders", "events"])
    }
    history: dict[str, list[Any]] = {}
    for name, source in sources.items():
        ensure_topic(sink.bootstrap, f"{prefix}.{name}", 2)
        history[name] = [source.next_change() for _ in range(250)]
        produce(sink.bootstrap, f"{prefix}.{name}", history[name])

    run = sink.run_until_caught_up(timeout=400)
    _ran_on_every_worker(spark_cluster, run.log())
    for name in ["customers", "orders"]:
        assert_rows(spark, f"{namespace}.{name}", sources[name].expected_rows())
    assert_rows(spark, f"{namespace}.events", appended_rows(history["events"]))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_master_that_does_not_answer_stops_start_up_before_the_claim(
    make_sink: Callable[..., Sink], pg_dsn: str, spark_cluster: SparkCluster
) -> None:
    """spark.master names a port where no master listens: `icesink run` exits 2 with one line naming it,
    before its claim (the epoch stays 1); `icesink check` says the same."""
    master = f"spark://127.0.0.1:{_free_port()}"
    sink: Sink = spark_cluster.run(make_sink(columns=[{"name": "id", "type": "long", "required": True}]))
    sink.config["spark"]["master"] = master
    log = TransactionLog(pg_dsn)
    try:
        assert log.claim(sink.name, "test").epoch == 1
        run = sink.start()
        code = run.wait(120)
        output = run.log()
        assert code == EXIT_CONFIG, f"exit {code}, expected {EXIT_CONFIG}:\n{output[-4000:]}"
        refusal = [line for line in output.splitlines() if "cannot start: " in line]
        assert refusal and f"spark.master {master}: no master answers" in refusal[-1], output[-4000:]
        assert "claimed epoch" not in output and "Traceback" not in output
        state = log.state(sink.name)
        assert state is not None and state.epoch == 1, f"the sink was claimed: {state}"
    finally:
        log.close()
    check = sink.cli("check")
    assert check.returncode == 1 and "FAIL spark master: SparkUnavailable: " in check.stdout, check.stdout
