"""The sink on the stack's Spark standalone cluster, its processes killed under it.

An executor JVM, then a whole worker (its JVM and its executor), are SIGKILLed while they run a task of
a batch: Spark reruns the lost tasks on what is left, the lost attempts' files never reach a commit,
and the table stays exact. The driver (the sink's process) killed between its precommit and the
Iceberg commit: the cluster ends its application, and a replacement driver finishes the plan from
the txnlog.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from service.failpoints import KILL_EXIT_CODE
from tests.chaos import harness as h
from tests.cluster import ExecutorLog, SparkCluster, application_id, executor_logs
from tests.sink.conftest import SinkRun
from txnlog import Phase, TransactionLog

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200)]


def _running_a_task(app: str, worker: int, timeout: float = 180) -> tuple[ExecutorLog, str, str]:
    """An executor of ``app`` on ``worker`` while it runs a task: (its log, the task, its TID)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in executor_logs(app):
            if log.worker == worker and (flight := log.tasks_in_flight()):
                return log, *flight[-1]
        time.sleep(0.05)
    raise AssertionError(f"no executor of {app} on worker {worker} ran a task within {timeout}s")


def _assert_rerun(run: SinkRun, killed: ExecutorLog, task: str, tid: str, driver_saw: str) -> None:
    """The killed attempt never finished, the driver saw the loss (``driver_saw`` in its log), and an
    executor ran the task again: a later attempt of the same partition in the same stage."""
    assert (task, tid) in killed.tasks_in_flight(), f"TID {tid} finished after all:\n{killed.lines()[-5:]}"
    run.wait_for_log(driver_saw, timeout=120)
    index, stage = task.split(" in stage ")
    partition = index.split(".")[0]
    app = killed.path.parent.parent.name

    def rerun() -> bool:
        return any(
            f"Running task {partition}." in line
            and f" in stage {stage} " in line
            and f"(TID {tid})" not in line
            for log in executor_logs(app)
            for line in log.lines()
        )

    h.wait_until(rerun, 180, f"task {partition} of stage {stage} to run again")


# A burst of changes before each kill: the batch that reads it runs tasks of seconds, not the tenths
# of a second of the steady stream, so a kill that follows a task's start lands inside it.
BURST = 20_000


def test_executor_then_worker_killed_mid_task_table_stays_exact(
    make_sink: Any, spark: Any, spark_cluster: SparkCluster
) -> None:
    sink = spark_cluster.run(make_sink(keys=400))
    run = h.start(sink)
    worker = h.server_pid("spark-worker-2")
    try:
        with h.BackgroundProducer(sink, batch=300, pause=0.2) as producer:
            h.wait_for_commits(run, 1, timeout=300)
            app = application_id(run.log())

            # An executor JVM, mid-task: its worker starts another for the application.
            with producer.paused():  # one producer at a time: the model is the order Kafka holds
                sink.produce(BURST)
            log, task, tid = _running_a_task(app, worker=1)
            os.kill(spark_cluster.executor_pids(app)[log.executor], signal.SIGKILL)
            h.FIGURES.sigkills += 1
            # the task's failure is the driver's warning: the executor died with exit code 137
            _assert_rerun(run, log, task, tid, f"Lost task {task} (TID {tid})")
            h.wait_for_commits(run, h.committed_count(run) + 2, timeout=300)

            # A whole worker (its JVM and its executor: one process group), mid-task.
            with producer.paused():  # one producer at a time: the model is the order Kafka holds
                sink.produce(BURST)
            log, task, tid = _running_a_task(app, worker=2)
            os.killpg(worker, signal.SIGKILL)
            h.FIGURES.sigkills += 1
            # a worker's loss is not the task's fault: the driver reports the executor lost, not the task
            # (as "worker lost", or first as its RPC client gone)
            _assert_rerun(run, log, task, tid, f"Lost executor {log.executor} on 127.0.0.1")
            h.wait_for_commits(run, h.committed_count(run) + 2, timeout=300)
        h.wait_caught_up(sink, run)
        h.stop_gracefully(run)
    finally:
        h.dev_stack("start", "spark-worker-2")
    h.verify_exact(spark, sink)


def test_driver_killed_mid_commit_is_resumed_by_a_new_driver(
    make_sink: Any, spark: Any, spark_cluster: SparkCluster, pg_dsn: str
) -> None:
    sink = spark_cluster.run(make_sink(keys=300))
    sink.produce(1500)
    first = h.start(sink, env={"ICESINK_FAILPOINTS": "after_precommit=kill"})
    assert h.wait_exit(first, 300) == KILL_EXIT_CODE, first.log()[-4000:]
    app = application_id(first.log())
    log = TransactionLog(pg_dsn)
    try:
        state = log.state(sink.name)
        assert state is not None and state.phase is Phase.PRECOMMIT, f"not killed mid-commit: {state}"
        seq = state.seq
    finally:
        log.close()
    # The cluster ends the dead driver's application: no executor of it is left running.
    h.wait_until(lambda: not spark_cluster.executor_pids(app), 120, f"{app}'s executors to end")

    sink.produce(500)
    second = sink.run_until_caught_up(timeout=400)
    assert f"plan seq {seq} (epoch 1) is precommitted" in second.log(), second.log()[-4000:]
    assert application_id(second.log()) != app
    h.verify_exact(spark, sink)
