"""A Postgres restart in the middle of the protocol is survived by retries, with the right end state.

Needs a way to restart the server: ICESINK_PG_RESTART_CMD, or the dev stack (see conftest).
Marked ``chaos`` (run with ``pytest -m chaos tests/txnlog``): restarting the *shared* dev Postgres
would break whatever else is using it at that moment (the REST catalog's JDBC pool, other test runs),
so the default suite leaves it alone. Each test takes a few seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest

from txnlog import Action, Phase, TransactionLog

pytestmark = pytest.mark.chaos

MakeLog = Callable[..., TransactionLog]


class SinkWorker(threading.Thread):
    """Runs batches (precommit + commit, a re-claim every 10th) on one sink until told to stop."""

    def __init__(self, log: TransactionLog, sink_id: str, done: threading.Event) -> None:
        super().__init__(daemon=True)
        self.log, self.sink_id, self.done = log, sink_id, done
        self.progress: list[int] = []  # completed batch numbers
        self.claims: list[int] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            lease = self.log.claim(self.sink_id, "pod-a")
            self.claims.append(lease.epoch)
            n = 0
            while not self.done.is_set():
                n += 1
                if n % 10 == 0:  # a re-claim now and then, as a restarted replica would do
                    lease = self.log.claim(self.sink_id, "pod-a")
                    self.claims.append(lease.epoch)
                state = self.log.precommit(lease, {"batch": n, "offsets": {"0": n * 100}})
                assert state.seq == n
                self.log.commit(lease, seq=n)
                self.progress.append(n)
        except BaseException as exc:
            self.errors.append(exc)

    def check(self) -> None:
        """The final row and history are exactly what the completed batches imply."""
        assert not self.errors, self.errors
        last = self.progress[-1]
        assert self.progress == list(range(1, last + 1))
        s = self.log.state(self.sink_id)
        assert s is not None
        assert (s.phase, s.seq, s.committed_seq) == (Phase.COMMITTED, last, last)
        assert s.committed_payload == {"batch": last, "offsets": {"0": last * 100}}
        # One epoch per claim call: a claim retried across the restart did not claim twice.
        assert self.claims == list(range(1, len(self.claims) + 1)) and s.epoch == len(self.claims)
        history = list(reversed(self.log.history(self.sink_id, limit=10_000)))
        assert [e.action for e in history].count(Action.CLAIM) == len(self.claims)
        commits = [e.seq for e in history if e.action is Action.COMMIT]
        assert commits == list(range(1, last + 1)), "each batch committed exactly once"


def test_sequence_of_operations_survives_restart(
    make_log: MakeLog,
    sink_id: str,
    restart_postgres: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="txnlog")
    log = make_log()
    log.ensure_schema()
    done = threading.Event()
    workers = [SinkWorker(log, f"{sink_id}-{i}", done) for i in range(4)]
    for w in workers:
        w.start()

    def all_progressed(n: int) -> bool:
        return all(len(w.progress) >= n or w.errors for w in workers)

    _wait_for(lambda: all_progressed(20))
    before = max(len(w.progress) for w in workers)
    restart_postgres()
    _wait_for(lambda: all_progressed(before + 20))
    done.set()
    for w in workers:
        w.join(timeout=60)
    assert "transient database error" in caplog.text, "the restart never interrupted an operation"
    for w in workers:
        w.check()


def test_committing_block_survives_restart(
    make_log: MakeLog,
    sink_id: str,
    restart_postgres: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The locked session dies with the server; the flip falls back to a conditional commit."""
    caplog.set_level(logging.WARNING, logger="txnlog")
    log = make_log()
    lease = log.claim(sink_id, "pod-a")
    log.precommit(lease, {"batch": 1})
    with log.committing(lease) as handle:
        restart_postgres()  # meanwhile: "the Iceberg commit"

    # The flip on the locked session failed and the conditional commit finished it: the log says so
    # once, for this sink's seq 1 (txnlog.log.TransactionLog.committing).
    fallbacks = [r for r in caplog.records if "finishing with a conditional commit" in r.getMessage()]
    assert len(fallbacks) == 1, f"no fallback to a conditional commit: {caplog.text}"
    args = fallbacks[0].args
    assert isinstance(args, tuple) and args[:2] == (sink_id, 1), fallbacks[0].getMessage()
    assert "lost the locked session" in fallbacks[0].getMessage()
    assert handle.committed is not None
    assert (handle.committed.phase, handle.committed.committed_payload) == (Phase.COMMITTED, {"batch": 1})
    assert log.state(sink_id) == handle.committed
    commits = [e for e in log.history(sink_id) if e.action is Action.COMMIT]
    assert [e.seq for e in commits] == [1], "the plan was committed once, by the fallback"


def _wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)
