"""Named locks: shared holders side by side, one exclusive holder alone, a wait that runs out, and a
lock that ends with its holder's session."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg

from txnlog import TransactionLog

SHORT = timedelta(milliseconds=300)


def test_shared_holders_coexist_and_keep_an_exclusive_one_out(log: TransactionLog, sink_id: str) -> None:
    name = f"{sink_id}/compaction/t"
    with (
        log.named_locks([name], shared=True, wait=SHORT) as first,
        log.named_locks([name], shared=True, wait=SHORT) as second,
    ):
        assert first and second
        started = time.monotonic()
        with log.named_locks([name], shared=False, wait=SHORT) as alone:
            assert not alone, "an exclusive lock was granted beside shared holders"
        assert time.monotonic() - started >= SHORT.total_seconds() * 0.9
    with log.named_locks([name], shared=False, wait=SHORT) as alone:
        assert alone, "the shared holders did not release the lock"
        with log.named_locks([name], shared=True, wait=SHORT) as shared:
            assert not shared
    with log.named_locks([f"{name}-other"], shared=False, wait=SHORT) as other:
        assert other


def test_a_waiter_gets_the_lock_when_the_holder_lets_go(log: TransactionLog, sink_id: str) -> None:
    name = f"{sink_id}/compaction/t"
    release = threading.Event()
    held = threading.Event()

    def holder() -> None:
        with log.named_locks([name], shared=False, wait=SHORT) as taken:
            assert taken
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    threading.Timer(1.0, release.set).start()
    started = time.monotonic()
    with log.named_locks([name], shared=True, wait=timedelta(seconds=20)) as taken:
        waited = time.monotonic() - started
    thread.join(10)
    assert taken and 0.8 <= waited < 15


def test_a_lock_ends_with_its_session(log: TransactionLog, txnlog_dsn: str, sink_id: str) -> None:
    """The holder's process dies: Postgres ends its session, and its locks with it."""
    name = f"{sink_id}/compaction/t"
    holder = psycopg.connect(txnlog_dsn.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (name,))
    with log.named_locks([name], shared=True, wait=SHORT) as shared:
        assert not shared, "the lock is not the one its name says"
    holder.close()  # as a killed process's session ends
    with log.named_locks([name], shared=True, wait=timedelta(seconds=5)) as shared:
        assert shared


def test_several_locks_are_taken_together_or_not_at_all(log: TransactionLog, sink_id: str) -> None:
    """A batch committing to three tables takes their turns on one connection; one of them held
    alone elsewhere means none is taken, and the two it got before the wait ran out are let go."""
    names = [f"{sink_id}/compaction/{t}" for t in ("a", "b", "c")]
    with log.named_locks([names[2]], shared=False, wait=SHORT) as alone:
        assert alone
        with log.named_locks(names, shared=True, wait=SHORT) as all_three:
            assert not all_three
    with log.named_locks(names[:2], shared=False, wait=SHORT) as others:
        assert others, "the locks taken before the wait ran out were kept"
    with log.named_locks(names, shared=True, wait=SHORT) as all_three:
        assert all_three
