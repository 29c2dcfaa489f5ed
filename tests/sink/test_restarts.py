"""The sink stopped and restarted in the middle of a workload (kill -9 and SIGTERM) ends exact.

A kill at a random moment: part of `make chaos`; the kills at each fail point of the commit are in
tests/chaos and tests/sink/test_recovery.py.
"""

from __future__ import annotations

import random
import signal
import threading
from typing import Any

import pytest

from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows, assert_seqs_increasing
from tests.sink.test_end_to_end import _catalog

pytestmark = pytest.mark.chaos


def test_killed_and_restarted_mid_workload(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(partition_by=["country"], keys=150, commit={"trigger_interval": "500ms"})
    rng = random.Random(3)
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            sink.produce(60)
            stop.wait(0.3)

    producer = threading.Thread(target=keep_producing, daemon=True)
    sink.produce(300)
    producer.start()
    try:
        for how in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
            run = sink.start()
            run.wait_for_log("committed seq", count=1 + rng.randint(0, 2), timeout=240)
            run.kill(how)
            code = run.wait(120)
            if how == signal.SIGTERM:
                assert code == 0, f"graceful stop exited {code}:\n{run.log()[-3000:]}"
                assert "stop requested" in run.log()
    finally:
        stop.set()
        producer.join(30)
    sink.produce(200)
    sink.run_until_caught_up()

    assert_rows(spark, sink.table, sink.source.expected_rows())
    seqs = assert_seqs_increasing(_catalog(sink), sink.table, sink.name)
    assert len(seqs) >= 4, seqs
