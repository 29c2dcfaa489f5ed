"""The sink stopped and restarted in the middle of a workload (kill -9 and SIGTERM) ends exact.

A kill at a random moment: part of `make chaos`; the kills at each fail point of the commit are in
tests/chaos and tests/sink/test_recovery.py. Each SIGKILL is shown to have landed where this test says:
on a sink still streaming (its Spark JVM with it), which died of the signal, whole process group, with
records in the topic it had not committed; a kill that caught a plan precommitted (mid-commit) is
finished by the next run's recovery.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import committed_offsets, end_offsets
from tests.sink.conftest import Sink, SinkRun
from tests.sink.expect import assert_rows, assert_seqs_increasing
from tests.sink.test_end_to_end import _catalog
from txnlog import Phase, SinkState, TransactionLog

pytestmark = pytest.mark.chaos


def live_group_members(pgid: int) -> list[int]:
    """Processes of the process group ``pgid`` that are still running (zombies not counted)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                if int(pgrp) == pgid and state != "Z":
                    members.append(int(entry.name))
    return members


def txnlog_state(sink: Sink) -> SinkState:
    log = TransactionLog(os.environ["ICESINK_PG_DSN"])
    try:
        state = log.state(sink.name)
    finally:
        log.close()
    assert state is not None, f"sink {sink.name} has no txnlog row"
    return state


def sigkill_mid_workload(sink: Sink, run: SinkRun, burst: Callable[[], object]) -> SinkState:
    """SIGKILL the streaming sink's process group and prove the kill landed mid-workload; returns the
    txnlog row the kill left (phase ``precommit``: it landed mid-commit). ``burst`` produces changes
    right before the kill: between the producer's small rounds the sink may have caught up, and a
    kill then would land on an idle sink."""
    assert isinstance(run.process, subprocess.Popen), "a SIGKILL needs a process: Sink.start(process=True)"
    pgid = run.process.pid
    members = live_group_members(pgid)
    assert run.process.poll() is None, f"the sink exited ({run.process.returncode}) before the kill"
    assert len(members) > 1, f"no Spark JVM in the sink's process group: {members}"
    burst()
    produced = end_offsets(sink)
    run.kill(signal.SIGKILL)
    code = run.wait(120)
    assert code == -signal.SIGKILL, f"the sink exited {code}, not of the SIGKILL:\n{run.log()[-3000:]}"
    deadline = time.monotonic() + 30
    while survivors := live_group_members(pgid):
        assert time.monotonic() < deadline, f"processes of the killed group still run: {survivors}"
        time.sleep(0.2)
    assert "stop requested" not in run.log()
    state = txnlog_state(sink)
    committed = committed_offsets(sink)
    behind = {p: (committed.get(p, 0), end) for p, end in produced.items() if committed.get(p, 0) < end}
    assert behind, f"the sink had committed everything produced ({committed}): not killed mid-workload"
    print(f"SIGKILL at seq {state.seq} ({state.phase}); partitions behind (committed, produced): {behind}")
    return state


def test_killed_and_restarted_mid_workload(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(partition_by=["country"], keys=150, commit={"trigger_interval": "500ms"})
    rng = random.Random(3)
    stop = threading.Event()
    producing = threading.Lock()  # one producer at a time: a key's changes reach Kafka in model order

    def produce(n: int) -> None:
        with producing:
            sink.produce(n)

    def keep_producing() -> None:
        while not stop.is_set():
            produce(60)
            stop.wait(0.3)

    producer = threading.Thread(target=keep_producing, daemon=True)
    sink.produce(300)
    producer.start()
    left: SinkState | None = None  # the txnlog row the last SIGKILL left, until the next run
    try:
        for how in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
            run = sink.start(process=True)
            if left is not None and left.phase is Phase.PRECOMMIT:  # the kill landed mid-commit
                run.wait_for_log(f"recovering sink {sink.name}: plan seq {left.seq} ", timeout=240)
            run.wait_for_log("committed seq", count=1 + rng.randint(0, 2), timeout=240)
            if how == signal.SIGKILL:
                left = sigkill_mid_workload(sink, run, lambda: produce(300))
            else:
                left = None
                run.kill(how)
                code = run.wait(120)
                assert code == 0, f"graceful stop exited {code}:\n{run.log()[-3000:]}"
                assert "stop requested" in run.log()
    finally:
        stop.set()
        producer.join(30)
    sink.produce(200)
    last = sink.run_until_caught_up()
    if left is not None and left.phase is Phase.PRECOMMIT:
        assert f"recovering sink {sink.name}: plan seq {left.seq} " in last.log(), last.log()[-4000:]

    assert_rows(spark, sink.table, sink.source.expected_rows())
    seqs = assert_seqs_increasing(_catalog(sink), sink.table, sink.name)
    assert len(seqs) >= 4, seqs
