"""Two replicas at once (a rolling update's overlap) and a zombie (frozen mid-commit, woken after a new
replica took over): the older one is fenced, writes nothing more, exits 3 with a clear message, and
its fenced counter (``icesink.fenced``, read from its last OTLP export) goes up. The table stays exact.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import pytest

from service.cli import EXIT_FENCED
from tests.chaos import harness as h
from tests.sink.conftest import Sink, SinkRun
from tests.sink.expect import sink_snapshots
from txnlog import Action, TransactionLog

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1800)]  # slow machines: beyond the default 900 s

FENCED_MESSAGE = "this replica was fenced by a newer one and wrote nothing more"


def epoch_of(run: SinkRun) -> int:
    match = re.search(r"claimed epoch (\d+)", run.log())
    assert match, f"no claim in the log:\n{run.log()[-3000:]}"
    return int(match.group(1))


def assert_wrote_nothing_after(sink: Sink, pg_dsn: str, old: int, new: int) -> None:
    """After the claim of epoch ``new``, epoch ``old`` changed nothing: no txnlog transition, and no
    snapshot of its own beyond the plan that was already precommitted when it was fenced."""
    log = TransactionLog(pg_dsn)
    try:
        history = list(reversed(log.history(sink.name, limit=10_000)))
    finally:
        log.close()
    claim = next(e for e in history if e.action is Action.CLAIM and e.epoch == new)
    later = [e for e in history if e.id > claim.id and e.epoch == old]
    assert not later, f"epoch {old} wrote to the txnlog after epoch {new} claimed: {later}"
    seq_at_claim = claim.seq or 0
    own = [
        int(s["icesink.seq"])
        for s in sink_snapshots(h.catalog_of(sink), sink.table, sink.name)
        if int(s["icesink.epoch"]) == old
    ]
    assert all(seq <= seq_at_claim for seq in own), (
        f"epoch {old} committed seq(s) {[s for s in own if s > seq_at_claim]} after it was fenced "
        f"(seq at the claim: {seq_at_claim})"
    )


def assert_fenced(run: SinkRun, otlp: h.OtlpSink) -> None:
    code = h.wait_exit(run, timeout=300)
    assert code == EXIT_FENCED, (
        f"the fenced replica exited {code}, expected {EXIT_FENCED}:\n{run.log()[-5000:]}"
    )
    assert FENCED_MESSAGE in run.log(), run.log()[-3000:]
    h.wait_until(
        lambda: otlp.values.get("icesink.fenced", 0) >= 1, 30, "the fenced counter in the last export"
    )
    h.FIGURES.fenced_exits += 1


def test_two_replicas_at_once_the_older_is_fenced(make_sink: Any, spark: Any, pg_dsn: str) -> None:
    sink: Sink = make_sink(keys=200, commit={"trigger_interval": "500ms"})
    sink.produce(300)
    otlp = h.OtlpSink()
    try:
        with h.BackgroundProducer(sink, batch=20, pause=0.5):
            old = h.start(sink, env={"ICESINK_METRICS__OTLP_ENDPOINT": otlp.endpoint})
            h.wait_for_commits(old, 2, timeout=400)
            new = h.start(sink)  # the new pod starts while the old one still runs
            new.wait_for_log("claimed epoch", timeout=300)
            assert_fenced(old, otlp)
            h.wait_for_commits(new, 2, timeout=400)
        h.wait_caught_up(sink, new)
        h.stop_gracefully(new)
    finally:
        otlp.close()
    assert_wrote_nothing_after(sink, pg_dsn, epoch_of(old), epoch_of(new))
    h.verify_exact(spark, sink)


def test_zombie_frozen_mid_commit_is_fenced_when_it_wakes(make_sink: Any, spark: Any, pg_dsn: str) -> None:
    """SIGSTOP inside the Iceberg commit (held there by a ``delay`` fail point) with the txnlog row
    locked; Postgres ends the frozen session after ``txnlog.session_timeout``, the new replica claims,
    finishes the zombie's plan with the same files and commits more; then SIGCONT."""
    sink: Sink = make_sink(keys=200, commit={"trigger_interval": "500ms"}, txnlog={"session_timeout": "6s"})
    sink.produce(300)
    otlp = h.OtlpSink()
    try:
        with h.BackgroundProducer(sink, batch=20, pause=0.5):
            zombie = h.start(
                sink,
                env={
                    "ICESINK_FAILPOINTS": "during_catalog_commit=delay:4@2",
                    "ICESINK_METRICS__OTLP_ENDPOINT": otlp.endpoint,
                },
            )
            zombie.wait_for_log("fail point during_catalog_commit: delay", timeout=400)
            os.killpg(zombie.process.pid, signal.SIGSTOP)
            try:
                new = h.start(sink)
                h.wait_for_commits(new, 2, timeout=400)
                assert "recovering sink" in new.log(), "the new replica did not finish the zombie's plan"
            finally:
                os.killpg(zombie.process.pid, signal.SIGCONT)
            assert_fenced(zombie, otlp)
        h.wait_caught_up(sink, new)
        h.stop_gracefully(new)
    finally:
        otlp.close()
    assert_wrote_nothing_after(sink, pg_dsn, epoch_of(zombie), epoch_of(new))
    h.verify_exact(spark, sink)
