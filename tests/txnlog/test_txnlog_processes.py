"""Real concurrency and real process death: separate OS processes against one Postgres."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from sqlalchemy import text

from txnlog import Phase, TransactionLog


class WorkerProcess(Protocol):
    """What conftest's ``spawn_worker`` returns (conftest modules are not importable)."""

    proc: subprocess.Popen[str]

    def send(self, line: str) -> None: ...
    def expect(self, prefix: str, timeout: float = ...) -> str: ...


MakeLog = Callable[..., TransactionLog]
SpawnWorker = Callable[..., WorkerProcess]

N_CLAIMERS = 8


def test_concurrent_claims_leave_exactly_one_live_epoch(
    log: TransactionLog, spawn_worker: SpawnWorker, sink_id: str
) -> None:
    log.claim(sink_id, "seed")  # the race is on an existing row (its creation race is covered below)
    workers = [spawn_worker("claim-race", log.schema, sink_id, f"pod-{i}") for i in range(N_CLAIMERS)]
    for w in workers:
        w.expect("ready")
    for w in workers:
        w.send("go")
    epochs = {w: int(w.expect("epoch")) for w in workers}
    assert sorted(epochs.values()) == list(range(2, N_CLAIMERS + 2)), "every claim got its own epoch"
    live = max(epochs.values())

    for step in ("precommit", "commit"):
        for w in workers:
            w.send("go")
        for w, epoch in epochs.items():
            result = w.expect(step)
            assert result == ("ok" if epoch == live else f"fenced {live}"), (step, epoch, result)

    s = log.state(sink_id)
    assert s is not None
    assert (s.epoch, s.phase, s.committed_epoch, s.seq) == (live, Phase.COMMITTED, live, 1)
    assert s.committed_payload == {"owner": s.owner, "epoch": live}


def test_concurrent_first_claims_create_one_row(
    log: TransactionLog, spawn_worker: SpawnWorker, sink_id: str
) -> None:
    log.ensure_schema()
    workers = [spawn_worker("claim-race", log.schema, sink_id, f"pod-{i}") for i in range(N_CLAIMERS)]
    for w in workers:
        w.expect("ready")
    for w in workers:
        w.send("go")
    epochs = sorted(int(w.expect("epoch")) for w in workers)
    assert epochs == list(range(1, N_CLAIMERS + 1))
    assert len(log.list_sinks()) == 1


def _writer_sessions(log: TransactionLog, owner: str) -> int:
    with log._engine.connect() as conn:
        n: int = conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app"),
            {"app": f"txnlog-hold-{owner}"},
        ).scalar_one()
    return n


def _claim_and_time(claimer: TransactionLog, sink_id: str) -> float:
    started = time.monotonic()
    claimer.claim(sink_id, "pod-new")
    return time.monotonic() - started


IDLE_BOUND_S = 2.0
SLACK_S = 2.0


def test_killed_writer_releases_lock_and_leaves_precommit(
    make_log: MakeLog, spawn_worker: SpawnWorker, sink_id: str
) -> None:
    """SIGKILL inside `committing`: the kernel closes the socket, Postgres rolls back at once."""
    claimer = make_log(lock_timeout=timedelta(seconds=15))
    claimer.ensure_schema()
    writer = spawn_worker("hold", claimer.schema, sink_id, "pod-old", str(IDLE_BOUND_S))
    epoch, seq = map(int, writer.expect("locked").split())

    # A claimer arriving now waits on the row lock...
    waited: list[float] = []
    thread = threading.Thread(target=lambda: waited.append(_claim_and_time(claimer, sink_id)))
    thread.start()
    time.sleep(0.5)
    assert not waited, "the claim must wait while the writer holds the row"

    killed_at = time.monotonic()
    writer.proc.send_signal(signal.SIGKILL)
    thread.join(timeout=IDLE_BOUND_S + SLACK_S + 10)
    got_lock_after = time.monotonic() - killed_at
    assert waited, "claim never returned"
    assert got_lock_after < IDLE_BOUND_S + SLACK_S, got_lock_after

    s = claimer.state(sink_id)
    assert s is not None
    assert (s.epoch, s.phase, s.seq, s.precommit_epoch) == (epoch + 1, Phase.PRECOMMIT, seq, epoch)
    assert s.pending == {"owner": "pod-old", "files": ["a.parquet", "b.parquet"], "offsets": {"0": 42}}
    assert s.committed_payload is None
    assert _writer_sessions(claimer, "pod-old") == 0


def test_hung_writer_lock_is_bounded_by_idle_in_transaction_timeout(
    make_log: MakeLog, spawn_worker: SpawnWorker, sink_id: str
) -> None:
    """SIGSTOP inside `committing`: the socket stays open, so only the server-side timeout frees it.

    When the writer wakes up it is fenced: its flip fails (session gone) and the conditional
    fallback commit sees the new epoch.
    """
    claimer = make_log(lock_timeout=timedelta(seconds=15))
    claimer.ensure_schema()
    writer = spawn_worker("hold", claimer.schema, sink_id, "pod-old", str(IDLE_BOUND_S))
    epoch, seq = map(int, writer.expect("locked").split())
    locked_at = time.monotonic()
    writer.proc.send_signal(signal.SIGSTOP)

    waited = _claim_and_time(claimer, sink_id)
    got_lock_after = time.monotonic() - locked_at
    assert got_lock_after < IDLE_BOUND_S + SLACK_S, got_lock_after
    assert got_lock_after > IDLE_BOUND_S * 0.75, "the lock was held until the timeout fired"
    assert waited > 0.5

    s = claimer.state(sink_id)
    assert s is not None and (s.epoch, s.phase, s.seq) == (epoch + 1, Phase.PRECOMMIT, seq)
    assert s.pending is not None and s.pending["owner"] == "pod-old"

    writer.proc.send_signal(signal.SIGCONT)
    writer.send("finish")
    assert writer.expect("done") == f"fenced {epoch + 1}"
    s2 = claimer.state(sink_id)
    assert s2 is not None and (s2.phase, s2.pending) == (Phase.PRECOMMIT, s.pending)
