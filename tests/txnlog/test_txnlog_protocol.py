"""The protocol, one behaviour per test, against the real Postgres."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

from txnlog import (
    Action,
    Fenced,
    InvalidPhase,
    LockLost,
    LockTimeout,
    Phase,
    SinkNotFound,
    TransactionLog,
    TxnLogError,
)

MakeLog = Callable[..., TransactionLog]


def test_first_claim_creates_idle_row(log: TransactionLog, sink_id: str) -> None:
    assert log.state(sink_id) is None
    lease = log.claim(sink_id, "pod-a")
    assert (lease.sink_id, lease.epoch, lease.owner) == (sink_id, 1, "pod-a")
    st = lease.state
    assert (st.phase, st.seq, st.payload, st.committed_payload) == (Phase.IDLE, 0, None, None)
    assert log.state(sink_id) == st


def test_lifecycle_keeps_committed_and_pending_plans_readable(log: TransactionLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    plan1 = {"offsets": {"orders-0": 10}, "files": ["d1.parquet"], "snapshot_id": 111}
    s = log.precommit(lease, plan1)
    assert (s.phase, s.seq, s.payload, s.pending, s.precommit_epoch) == (Phase.PRECOMMIT, 1, plan1, plan1, 1)
    s = log.commit(lease, seq=1)
    assert (s.phase, s.committed_seq, s.committed_epoch) == (Phase.COMMITTED, 1, 1)
    assert s.committed_payload == plan1
    assert s.pending is None

    plan2 = {"offsets": {"orders-0": 20}, "files": ["d2.parquet"], "snapshot_id": 222}
    s = log.precommit(lease, plan2)
    # During precommit both the pending plan and the last committed one are visible.
    assert (s.seq, s.pending, s.committed_payload, s.committed_seq) == (2, plan2, plan1, 1)
    s = log.commit(lease)
    assert (s.seq, s.committed_seq, s.committed_payload) == (2, 2, plan2)


def test_claim_fences_older_leases_and_leaves_row_untouched(log: TransactionLog, sink_id: str) -> None:
    old = log.claim(sink_id, "pod-a")
    log.precommit(old, {"n": 1})
    new = log.claim(sink_id, "pod-b")
    assert new.epoch == old.epoch + 1
    # The claim does not change the phase: the new owner sees the pending plan to resolve.
    assert new.state.phase is Phase.PRECOMMIT and new.state.pending == {"n": 1}
    before = log.state(sink_id)
    for write in (
        lambda: log.commit(old),
        lambda: log.precommit(old, {"n": 2}),
        lambda: log.abort(old),
    ):
        with pytest.raises(Fenced) as info:
            write()
        assert (info.value.sink_id, info.value.lease_epoch, info.value.current_epoch) == (sink_id, 1, 2)
        assert info.value.current_owner == "pod-b"
        assert f"lease epoch {old.epoch} is fenced" in str(info.value) and "epoch 2" in str(info.value)
    with pytest.raises(Fenced), log.committing(old):
        pytest.fail("a fenced lease must not enter the block")
    assert log.state(sink_id) == before


def test_new_owner_commits_predecessors_plan(log: TransactionLog, sink_id: str) -> None:
    """Recovery: the pending plan of epoch 1 is finished by epoch 2 (found in Iceberg / re-applied)."""
    old = log.claim(sink_id, "pod-a")
    log.precommit(old, {"files": ["x"]})
    new = log.claim(sink_id, "pod-b")
    s = log.commit(new, seq=new.state.seq)
    assert (s.committed_payload, s.committed_seq, s.committed_epoch, s.precommit_epoch) == (
        {"files": ["x"]},
        1,
        2,
        1,
    )
    with pytest.raises(Fenced):
        log.commit(old)


def test_pending_plan_is_never_overwritten(log: TransactionLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    with pytest.raises(InvalidPhase, match="still pending"):
        log.precommit(lease, {"n": 2})
    # The same plan again (a retried call) is accepted without a second seq.
    assert log.precommit(lease, {"n": 1}).seq == 1
    # ...but not from another epoch: the new owner must resolve the plan first.
    new = log.claim(sink_id, "pod-b")
    with pytest.raises(InvalidPhase):
        log.precommit(new, {"n": 1})
    assert log.state(sink_id).pending == {"n": 1}  # type: ignore[union-attr]


def test_commit_checks_phase_and_seq(log: TransactionLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    with pytest.raises(InvalidPhase, match="nothing is pending"):
        log.commit(lease)
    log.precommit(lease, {"n": 1})
    with pytest.raises(InvalidPhase, match="seq 1, not 7"):
        log.commit(lease, seq=7)
    log.commit(lease, seq=1)
    # Committing the same seq again is idempotent; without seq there is nothing pending.
    assert log.commit(lease, seq=1).committed_seq == 1
    with pytest.raises(InvalidPhase):
        log.commit(lease)


def test_abort_drops_plan_and_never_reuses_seq(log: TransactionLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    s = log.abort(lease, seq=1)
    assert (s.phase, s.payload, s.seq, s.committed_seq) == (Phase.IDLE, None, 1, None)
    assert log.abort(lease, seq=1) == s  # idempotent
    log.precommit(lease, {"n": 2})
    log.commit(lease)
    s = log.precommit(lease, {"n": 3})
    assert s.seq == 3
    s = log.abort(lease)
    assert (s.phase, s.committed_payload, s.committed_seq, s.seq) == (Phase.COMMITTED, {"n": 2}, 2, 3)
    with pytest.raises(InvalidPhase, match="already committed"):
        log.abort(lease, seq=2)


def test_unknown_sink_and_foreign_lease(log: TransactionLog, make_log: MakeLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    other = make_log(schema=log.schema + "_x")
    try:
        with pytest.raises(SinkNotFound):
            other.precommit(lease, {"n": 1})
        other.claim(sink_id, "pod-z")
        ahead = log.claim(sink_id, "pod-a")  # epoch 2 here, epoch 1 over there
        with pytest.raises(TxnLogError, match="ahead of the row"):
            other.precommit(ahead, {"n": 1})
    finally:
        with other._engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{other.schema}" CASCADE')


def test_payload_must_be_json(log: TransactionLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    for bad in ({"x": float("nan")}, {"x": object()}, {"x": "nul\x00"}, ["not", "a", "dict"]):
        with pytest.raises(TypeError):
            log.precommit(lease, bad)  # type: ignore[arg-type]
    assert log.state(sink_id).phase is Phase.IDLE  # type: ignore[union-attr]


def test_committing_flips_on_success_and_rolls_back_on_error(log: TransactionLog, sink_id: str) -> None:
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    with pytest.raises(RuntimeError, match="iceberg said no"), log.committing(lease, seq=1) as handle:
        assert (handle.seq, handle.payload) == (1, {"n": 1})
        raise RuntimeError("iceberg said no")
    s = log.state(sink_id)
    assert s is not None and s.phase is Phase.PRECOMMIT and s.pending == {"n": 1}
    with log.committing(lease) as handle:
        pass
    assert handle.committed is not None
    assert (handle.committed.phase, handle.committed.committed_payload) == (Phase.COMMITTED, {"n": 1})
    assert log.state(sink_id) == handle.committed
    with pytest.raises(InvalidPhase), log.committing(lease):
        pytest.fail("nothing pending: the block must not run")


def test_claim_waits_for_committing_then_times_out(make_log: MakeLog, sink_id: str) -> None:
    writer = make_log()
    claimer = make_log(lock_timeout=timedelta(milliseconds=400))
    lease = writer.claim(sink_id, "pod-a")
    writer.precommit(lease, {"n": 1})
    with writer.committing(lease):
        started = time.monotonic()
        with pytest.raises(LockTimeout) as info:
            claimer.claim(sink_id, "pod-b")
        waited = time.monotonic() - started
        assert 0.35 <= waited < 3.0
        assert info.value.retryable and info.value.sink_id == sink_id
        assert "retry later" in str(info.value)
        # Reads never block on the lock.
        assert claimer.state(sink_id).phase is Phase.PRECOMMIT  # type: ignore[union-attr]
    assert writer.state(sink_id).epoch == 1  # type: ignore[union-attr]


def test_claim_waits_for_committing_and_then_wins(make_log: MakeLog, sink_id: str) -> None:
    """A claimer arriving during the Iceberg commit waits, then fences the writer *after* the flip."""
    writer, claimer = make_log(), make_log()
    lease = writer.claim(sink_id, "pod-a")
    writer.precommit(lease, {"n": 1})
    claimed: list[int] = []
    with writer.committing(lease):
        thread = threading.Thread(target=lambda: claimed.append(claimer.claim(sink_id, "pod-b").epoch))
        thread.start()
        time.sleep(0.5)
        assert not claimed, "the claim must wait for the row lock"
    thread.join(timeout=10)
    assert claimed == [2]
    s = writer.state(sink_id)
    assert s is not None and (s.phase, s.committed_epoch, s.epoch) == (Phase.COMMITTED, 1, 2)


def test_history_records_transitions_and_is_pruned(make_log: MakeLog, sink_id: str) -> None:
    log = make_log(history_retention=5)
    lease = log.claim(sink_id, "pod-a")
    for n in range(4):
        log.precommit(lease, {"n": n})
        log.commit(lease)
    entries = log.history(sink_id, limit=100)
    assert len(entries) == 5
    assert [e.action for e in entries] == [
        Action.COMMIT,
        Action.PRECOMMIT,
        Action.COMMIT,
        Action.PRECOMMIT,
        Action.COMMIT,
    ]
    assert entries[0].seq == 4 and entries[1].payload == {"n": 3} and entries[1].phase is Phase.PRECOMMIT
    assert all(e.epoch == 1 and e.owner == "pod-a" for e in entries)
    # Another sink's history is kept separately.
    other = log.claim(sink_id + "-b", "pod-b")
    assert [e.action for e in log.history(other.sink_id)] == [Action.CLAIM]
    assert len(log.history(sink_id)) == 5


def test_reseed_moves_a_log_that_went_back_ahead(log: TransactionLog, sink_id: str) -> None:
    """The row lost its newest transitions; the caller's own record says seq 7 was the last commit."""
    old = log.claim(sink_id, "pod-a")
    log.precommit(old, {"n": 1})
    log.commit(old)
    log.precommit(old, {"n": 2})  # pending, from the lost timeline
    lease = log.claim(sink_id, "operator")
    with pytest.raises(InvalidPhase, match="not ahead"):
        log.reseed(lease, seq=2, payload={"n": 2}, note={})
    with pytest.raises(Fenced):
        log.reseed(old, seq=7, payload={"n": 7}, note={})

    fired = _fail_once(log, "reseed", "after_commit")
    s = log.reseed(lease, seq=7, payload={"n": 7}, note={"from": "table"})
    assert fired, "the retry after a lost acknowledgement must find the reseed done"
    assert (s.phase, s.seq, s.pending, s.committed_seq, s.committed_payload) == (
        Phase.COMMITTED,
        7,
        None,
        7,
        {"n": 7},
    )
    log._fault_hook = None
    entry = log.history(sink_id, limit=1)[0]
    assert (entry.action, entry.seq, entry.payload) == (
        Action.COMMIT,
        7,
        {"operation": "reseed", "from": "table"},
    )
    assert log.precommit(lease, {"n": 8}).seq == 8


def test_list_sinks(log: TransactionLog) -> None:
    assert log.list_sinks() == []
    log.claim("b", "pod-b")
    log.claim("a", "pod-a")
    assert [s.sink_id for s in log.list_sinks()] == ["a", "b"]


# -- lost acknowledgements: the COMMIT reached Postgres but the client saw a connection error ----------


def _fail_once(log: TransactionLog, operation: str, point: str) -> list[str]:
    """Make the next ``operation`` lose its connection at ``point`` once; returns the firing record."""
    fired: list[str] = []

    def hook(op: str, pt: str) -> None:
        if op == operation and pt == point and not fired:
            fired.append(f"{op}:{pt}")
            raise psycopg.OperationalError("injected: server closed the connection unexpectedly")

    log._fault_hook = hook
    return fired


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_retries_do_not_double_apply(log: TransactionLog, sink_id: str, point: str) -> None:
    fired = _fail_once(log, "claim", point)
    lease = log.claim(sink_id, "pod-a")
    assert fired and lease.epoch == 1, "a claim retried after a lost ack must not bump the epoch twice"

    fired = _fail_once(log, "precommit", point)
    assert log.precommit(lease, {"n": 1}).seq == 1 and fired

    fired = _fail_once(log, "commit", point)
    s = log.commit(lease)  # no seq given: the log remembers what its first attempt committed
    assert fired and (s.phase, s.committed_seq) == (Phase.COMMITTED, 1)

    log.precommit(lease, {"n": 2})
    fired = _fail_once(log, "abort", point)
    s = log.abort(lease)
    assert fired and (s.phase, s.seq, s.committed_seq) == (Phase.COMMITTED, 2, 1)

    log.precommit(lease, {"n": 3})
    fired = _fail_once(log, "committing", point)
    with log.committing(lease) as handle:
        pass
    assert fired and handle.committed is not None and handle.committed.committed_seq == 3

    log._fault_hook = None
    actions = [(e.action, e.seq) for e in reversed(log.history(sink_id))]
    assert actions == [
        (Action.CLAIM, 0),
        (Action.PRECOMMIT, 1),
        (Action.COMMIT, 1),
        (Action.PRECOMMIT, 2),
        (Action.ABORT, 2),
        (Action.PRECOMMIT, 3),
        (Action.COMMIT, 3),
    ]


def test_lost_commit_ack_then_fenced_still_reports_success(make_log: MakeLog, sink_id: str) -> None:
    """The commit landed; a claim slipped in before the retry. Reporting Fenced would be a lie."""
    log, rival = make_log(), make_log()
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    claimed: list[int] = []

    def hook(op: str, pt: str) -> None:
        if op == "commit" and pt == "after_commit" and not claimed:
            claimed.append(rival.claim(sink_id, "pod-b").epoch)
            raise psycopg.OperationalError("injected: connection reset")

    log._fault_hook = hook
    s = log.commit(lease)
    assert claimed == [2]
    assert (s.phase, s.committed_seq, s.committed_epoch, s.epoch) == (Phase.COMMITTED, 1, 1, 2)
    log._fault_hook = None
    with pytest.raises(Fenced):
        log.precommit(lease, {"n": 2})


def test_locked_session_lost_during_committing_falls_back(
    make_log: MakeLog, sink_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's session is reaped by idle_in_transaction_timeout while it commits to Iceberg."""
    caplog.set_level(logging.WARNING, logger="txnlog")
    log = make_log(idle_in_transaction_timeout=timedelta(milliseconds=300))
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    with log.committing(lease) as handle:
        time.sleep(1.0)  # a slow Iceberg commit: the server ends the session meanwhile
    assert handle.committed is not None and handle.committed.phase is Phase.COMMITTED
    assert "lost the locked session" in caplog.text

    # Same, but another replica claimed in the gap: the writer learns it is fenced.
    log.precommit(lease, {"n": 2})
    rival = make_log()
    with pytest.raises(Fenced), log.committing(lease):
        time.sleep(1.0)
        rival.claim(sink_id, "pod-b")
    s = rival.state(sink_id)
    assert s is not None and (s.phase, s.pending, s.epoch) == (Phase.PRECOMMIT, {"n": 2}, 2)


def test_heartbeat_keeps_a_long_commit_locked(
    make_log: MakeLog, sink_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A retry loop that heartbeats may outlast idle_in_transaction_timeout and still hold the lock."""
    caplog.set_level(logging.WARNING, logger="txnlog")
    log = make_log(idle_in_transaction_timeout=timedelta(milliseconds=400))
    claimer = make_log(lock_timeout=timedelta(milliseconds=200))
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    with log.committing(lease) as handle:
        for _ in range(5):  # 5 x 0.25 s: three times the idle timeout in total
            time.sleep(0.25)
            handle.heartbeat()
        with pytest.raises(LockTimeout):
            claimer.claim(sink_id, "pod-b")
    assert handle.committed is not None and handle.committed.epoch == 1
    assert "lost the locked session" not in caplog.text, "the flip must use the locked session"


def test_heartbeat_reports_a_lost_lock(make_log: MakeLog, sink_id: str) -> None:
    log = make_log(idle_in_transaction_timeout=timedelta(milliseconds=300))
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"n": 1})
    with pytest.raises(LockLost, match="lost the row lock") as info, log.committing(lease) as handle:
        time.sleep(1.0)
        handle.heartbeat()
        pytest.fail("heartbeat must raise")
    assert info.value.retryable
    s = log.state(sink_id)
    assert s is not None and s.phase is Phase.PRECOMMIT and s.pending == {"n": 1}
