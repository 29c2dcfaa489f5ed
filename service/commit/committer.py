"""The commit protocol: txnlog precommit → one Iceberg snapshot → txnlog commit, and recovery.

Every rule of the design that concerns commits lives here, in one place:

* the snapshot id is chosen before the precommit and recorded with the files, so after any error or
  unknown outcome the table can be asked "did it land?" instead of committing twice: by that snapshot
  id, or, once the snapshot was expired, by the ``icesink.<sink_id>.snapshot-id`` table property set
  in the same catalog commit (:mod:`service.commit.marks`);
* a conflict (the branch moved, or a commit on another branch raised the table's sequence number) is
  never rebased blindly: reload, look for our snapshot, check we are not fenced, then build the
  snapshot again on the new metadata (which catalog answers are retried: ``service.retrying``);
* a plan found in ``precommit`` at start-up is finished with the same files, never redone (a
  table's position deletes are resolved again if a compaction moved the rows they name meanwhile);
* a batch that writes several tables is one plan (:class:`BatchPlan`) in one txnlog row: each table's
  snapshot is committed under the row's lock, at most ``commit.concurrency`` at once, and a plan
  resumed after a crash commits only the tables whose snapshot is not there yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from service.commit.attempt_deletes import PlanDeletes
from service.commit.marks import commit_properties, latest_mark, property_key, property_mark
from service.commit.plan import BatchPlan, PendingCommit
from service.commit.turns import compaction_turn
from service.config import SinkConfig
from service.failpoints import failpoint
from service.iceberg.catalog import connect
from service.iceberg.row_delta import RowDelta
from service.iceberg.tables import KnownTables
from service.metrics import SinkMetrics
from service.retrying import Backoff, CatalogAnswer, catalog_answer, retry_call
from txnlog import Fenced, Lease, LockLost, Phase, TransactionLog

logger = logging.getLogger(__name__)

_WAITED_S = 0.05  # a turn taken after this long was another's first (a compaction's)


@dataclass(frozen=True)
class CommitResult:
    seq: int
    attempts: int  # catalog commit attempts, summed over the tables


def find_commit(table: Table, sink_id: str, snapshot_id: int) -> str | None:
    """How the table shows that the plan with this pre-generated snapshot id landed, or None.

    Only this plan's own id counts. The snapshot itself is the first proof. Maintenance may have
    expired it since (the process died between the catalog commit and the txnlog commit, and the
    sink stayed down meanwhile): then the sink's ``snapshot-id`` table property, set in that same
    catalog commit, still names it, until the sink's next commit — which can't happen while this plan
    is pending. A snapshot of this sink with a seq at or above the plan's is no proof: after the log
    went back in time it is an older plan's (see :meth:`Committer.check_log_is_current`).
    """
    if table.metadata.snapshot_by_id(snapshot_id) is not None:
        return "its snapshot"
    mark = property_mark(table, sink_id)
    if mark is not None and mark.snapshot_id == snapshot_id:
        return f"the table property {property_key(sink_id, 'snapshot-id')} (the snapshot was expired)"
    return None


class LogBehindTable(RuntimeError):
    """The table holds a newer commit of this sink than the txnlog knows: the log went back in time."""


class Committer:
    MAX_RELOCKS = 3

    def __init__(
        self,
        log: TransactionLog,
        lease: Lease,
        catalog: Catalog,
        metrics: SinkMetrics,
        max_attempts: int = 10,
        max_backoff_s: float = 10.0,
        concurrency: int = 1,
        catalog_factory: Callable[[], Catalog] | None = None,
        known: KnownTables | None = None,
        compaction_wait: timedelta = timedelta(minutes=10),
        writer_properties: dict[str, str] | None = None,
    ) -> None:
        """``concurrency`` tables of a batch are committed at once, each thread with a catalog of its
        own from ``catalog_factory`` (a REST catalog's HTTP session is not shared between threads)."""
        self.log = log
        self.lease = lease
        self.catalog = catalog
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.max_backoff_s = max_backoff_s
        self.concurrency = concurrency if catalog_factory is not None else 1
        self._catalog_factory = catalog_factory
        self._thread_catalogs = threading.local()
        self.known = known or KnownTables()  # each table as the last commit left it
        self.compaction_wait = compaction_wait
        self.deletes = PlanDeletes(self.sink_id, writer_properties or {})

    @classmethod
    def of(
        cls, config: SinkConfig, log: TransactionLog, lease: Lease, metrics: SinkMetrics, known: KnownTables
    ) -> Committer:
        """The sink's committer as its configuration says, with catalogs of its own (the commit may
        run in the background: service.commit.overlap)."""
        return cls(
            log,
            lease,
            connect(config),
            metrics,
            max_attempts=config.commit.retries,
            concurrency=config.commit.concurrency,
            catalog_factory=lambda: connect(config),
            known=known,
            compaction_wait=config.commit.compaction_wait,
            writer_properties=config.write.table_properties(),
        )

    @property
    def sink_id(self) -> str:
        return self.lease.sink_id

    def committed(self) -> BatchPlan | None:
        """The last committed plan: its offsets are where the sink resumes."""
        state = self.log.state(self.sink_id)
        payload = state.committed_payload if state else None
        return BatchPlan.from_payload(payload) if payload else None

    def _pool_catalog(self) -> Catalog:
        """A committing thread's own catalog (made once per pool thread)."""
        assert self._catalog_factory is not None
        catalog: Catalog | None = getattr(self._thread_catalogs, "catalog", None)
        if catalog is None:
            catalog = self._thread_catalogs.catalog = self._catalog_factory()
        return catalog

    def check_log_is_current(self, table: Table) -> None:
        """Refuse to run when ``table`` holds a commit of this sink with a seq the log never reached.

        In normal operation the table is never ahead of the log: a seq is precommitted before its
        snapshot exists. A table ahead means the log lost its newest transitions (its database restored
        from a backup, an asynchronous standby promoted, the sink's row deleted or edited). Running on
        would re-read offsets the table already covers and give new plans seqs the table already has;
        ``icesink txnlog reseed`` moves the log to the table's last commit instead.
        """
        mark = latest_mark(table, self.sink_id)
        state = self.lease.state
        if mark is None or mark.seq <= state.seq:
            return
        raise LogBehindTable(
            f"sink {self.sink_id}: table {'.'.join(table.name())} holds commit seq {mark.seq} of this sink "
            f"(snapshot {mark.snapshot_id}, per {mark.source}) but the txnlog's highest seq is "
            f"{state.seq} (schema {self.log.schema!r}): the log went back in time (restored from a "
            "backup, a standby promoted, the row deleted or edited). Nothing was written to the table. "
            "To resume from the table's last commit, run `icesink txnlog reseed --config <this file>` "
            "(docs/operations.md)"
        )

    def recover(self) -> CommitResult | None:
        """Finish a plan left in ``precommit`` by an earlier owner (or by this process before a crash)."""
        state = self.lease.state
        if state.phase is not Phase.PRECOMMIT or state.payload is None:
            return None
        plan = BatchPlan.from_payload(state.payload)
        logger.info(
            "recovering sink %s: plan seq %d (epoch %s) is precommitted; finishing it with its %d file(s) "
            "in %s",
            self.sink_id,
            state.seq,
            state.precommit_epoch,
            len(plan.file_paths()),
            ", ".join(t.table for t in plan.tables if t.has_files) or "no table",
        )
        return self._finish(plan, state.seq, resumed=True)

    def commit(self, plan: BatchPlan | PendingCommit) -> CommitResult:
        """Precommit the plan, commit each of its tables' snapshots, then commit the plan."""
        batch = plan if isinstance(plan, BatchPlan) else BatchPlan.of_one_table(plan)
        failpoint("before_precommit")
        state = self.log.precommit(self.lease, batch.to_payload())
        failpoint("after_precommit")
        return self._finish(batch, state.seq)

    def _finish(self, plan: BatchPlan, seq: int, resumed: bool = False) -> CommitResult:
        writes = [t for t in plan.tables if t.has_files]
        if not writes:
            self.log.commit(self.lease, seq=seq)
            return CommitResult(seq, 0)

        def commit_locked() -> int:
            with self.log.committing(self.lease, seq=seq) as handle:
                beat = threading.Lock()

                def keep_lock() -> None:  # one locked connection, shared by the committing threads
                    with beat:
                        handle.heartbeat()

                def one(pending: PendingCommit, catalog: Catalog) -> int:
                    attempts = self._commit_to_iceberg(
                        pending, seq, keep_lock=keep_lock, resumed=resumed, catalog=catalog
                    )
                    failpoint("after_catalog_commit")
                    return attempts

                if self.concurrency == 1 or len(writes) == 1:
                    return sum(one(p, self.catalog) for p in writes)
                with ThreadPoolExecutor(min(self.concurrency, len(writes)), "icesink-commit") as pool:
                    return sum(pool.map(lambda p: one(p, self._pool_catalog()), writes))

        def lock_lost(attempt: int, exc: BaseException) -> None:
            # The locked session is gone: reaped while this process was frozen or the catalog slow,
            # or Postgres restarted. A replica that claimed meanwhile fences us (exit 3, counted); if
            # we are still the live epoch, lock again (which re-checks the epoch) and look for the
            # snapshot before any further attempt.
            state = self.log.state(self.sink_id)
            if state is not None and state.epoch != self.lease.epoch:
                raise Fenced(self.sink_id, self.lease.epoch, state.epoch, state.owner) from exc
            if attempt <= self.MAX_RELOCKS:
                logger.warning(
                    "commit of seq %d: %s; still the live epoch: locking the sink row again (%d/%d)",
                    seq,
                    exc,
                    attempt,
                    self.MAX_RELOCKS,
                )

        # Before the sink row is locked: a compaction may take minutes.
        deleting = [p.table for p in writes if p.position_keys]
        with compaction_turn(
            self.log, self.sink_id, deleting, rewrite=False, wait=self.compaction_wait
        ) as waited:
            if waited >= _WAITED_S:  # a compaction committed meanwhile: build on the table as it is now
                for table in deleting:
                    self.known.forget(table)
            attempts = retry_call(
                commit_locked,
                Backoff(attempts=self.MAX_RELOCKS + 1, initial_s=0.0, max_s=0.0),
                retry_on=lambda exc: isinstance(exc, LockLost),
                on_failure=lock_lost,
            )
        failpoint("after_log_commit")
        self._drop_position_keys(writes)
        return CommitResult(seq, attempts)

    def _drop_position_keys(self, writes: list[PendingCommit]) -> None:
        """Files of a landed plan that nothing needs any more (:mod:`service.commit.attempt_deletes`)."""
        for pending in writes:
            if not (paths := self.deletes.leftovers(pending)):
                continue
            try:  # best effort: the plan is committed; orphans otherwise
                table = self.known.get(pending.table, self.catalog) or self.catalog.load_table(pending.table)
                _discard(table.io, paths)
            except Exception as exc:
                logger.debug("could not delete %s: %s", paths, exc)

    def _commit_to_iceberg(
        self,
        pending: PendingCommit,
        seq: int,
        keep_lock: Callable[[], None] = lambda: None,
        resumed: bool = False,
        catalog: Catalog | None = None,
    ) -> int:
        """Commit the plan's snapshot; return the number of attempts. The only commit retry loop.

        Every attempt starts from the table as the catalog has it now: our snapshot found → done;
        else the snapshot is built again on the current metadata (parent, sequence number) and sent.
        It runs while the txnlog row is locked, so no other replica can claim meanwhile; before each
        retry ``keep_lock`` proves the lock is still ours (and restarts the idle-in-transaction clock),
        raising ``LockLost`` if the session was reaped: then another replica may own the sink and no
        further attempt is made. A ``resumed`` plan (one found precommitted at start-up) is first
        checked for its files, which may have been deleted since (:class:`PlanUncommittable`).
        """
        assert pending.snapshot_id is not None
        snapshot_id = pending.snapshot_id
        summary = pending.summary(self.sink_id, self.lease.epoch, seq)
        properties = commit_properties(self.sink_id, seq, snapshot_id, pending.offsets)
        attempts = 0
        files_checked = not resumed
        rejected: list[str] = []  # the metadata files of the last attempt the catalog rejected

        def attempt() -> int:
            nonlocal attempts, files_checked
            attempts += 1
            source = catalog or self.catalog
            # The first attempt of a new plan builds on the table as the last commit left it: a
            # conflict (another writer's commit since) makes the next attempt load it.
            table = self.known.get(pending.table, source) if attempts == 1 and not resumed else None
            if table is None:
                table = source.load_table(pending.table)
                self.known.put(pending.table, table, loaded=True)
            if (found := find_commit(table, self.sink_id, snapshot_id)) is not None:
                logger.info(
                    "seq %d is already in %s as snapshot %d: found %s", seq, pending.table, snapshot_id, found
                )
                return attempts
            # Not in the table as the catalog has it now: the rejected attempt's files are garbage.
            _discard(table.io, rejected)
            rejected.clear()
            if not files_checked:
                check_files_exist(table, pending, self.sink_id, seq)
                files_checked = True
            deletes = self.deletes.for_attempt(table, pending, keep_lock)
            delta = RowDelta(
                table,
                snapshot_id,
                pending.data_files,
                deletes.add,
                summary,
                table_properties=properties,
                removed_deletes=deletes.remove,
            )
            failpoint("during_catalog_commit")
            try:
                committed = delta.commit()
            except Exception as exc:
                if _answer(exc) == CatalogAnswer.CONFLICT:
                    rejected.extend(delta.written_metadata_files + deletes.written)
                raise
            self.known.advance(pending.table, table.metadata_location, committed)
            self.deletes.landed(pending, deletes)
            return attempts

        def on_failure(attempt: int, exc: BaseException) -> None:
            answer = _answer(exc)
            assert answer is not None
            self.metrics.commit_failed(answer)
            logger.warning(
                "commit of seq %d to %s: %s (attempt %d/%d): %s: %s; checking and retrying",
                seq,
                pending.table,
                _SAYS[answer],
                attempt,
                self.max_attempts,
                type(exc).__name__,
                exc,
            )

        try:
            return retry_call(
                attempt,
                Backoff(self.max_attempts, initial_s=0.2, max_s=self.max_backoff_s),
                retry_on=lambda exc: _answer(exc) is not None,
                on_failure=on_failure,
                before_retry=keep_lock,
            )
        except Exception as exc:
            if _answer(exc) is None:
                raise
            raise CommitGaveUp(
                f"commit of seq {seq} to {pending.table} failed {self.max_attempts} times; see the log"
            ) from exc


def _discard(io: FileIO, paths: list[str]) -> None:
    """Delete the manifest list and manifests of an attempt the catalog rejected as a conflict, once
    the next attempt has loaded the table and not found the snapshot in it: a catalog may answer a
    conflict for a commit that landed (a retried request whose first try went through), so the
    answer alone is not proof. Next to a compaction every few seconds a busy table conflicts that
    often, and each attempt left three files behind for orphan removal. Best effort: a file left over
    (the last attempt's, or after an unknown outcome) is an orphan like any other."""
    for path in paths:
        try:
            io.delete(path)
        except Exception as exc:
            logger.debug("could not delete %s of a rejected commit attempt: %s", path, exc)


def _answer(exc: BaseException) -> CatalogAnswer | None:
    """The catalog's answers worth another attempt, and the object store failing while the manifests
    are written (pyarrow raises OSError): nothing reached the catalog yet, and every retry looks for
    the snapshot first anyway."""
    answer = catalog_answer(exc)
    if answer is None and isinstance(exc, OSError):
        return CatalogAnswer.UNKNOWN_OUTCOME
    return answer


_SAYS = {
    CatalogAnswer.CONFLICT: "conflicted",
    CatalogAnswer.RATE_LIMITED: "rate-limited by the catalog",
    CatalogAnswer.UNKNOWN_OUTCOME: "outcome unknown or catalog unavailable",
}


def missing_files(io: FileIO, pending: PendingCommit) -> list[str]:
    """The files of ``pending`` that do not exist (any more)."""
    return [path for path in pending.file_paths() if not io.new_input(path).exists()]


def check_files_exist(table: Table, pending: PendingCommit, sink_id: str, seq: int) -> None:
    """Raise :class:`PlanUncommittable` when files of a plan that did not land are gone.

    The catalog would accept the snapshot anyway (it does not look at data files): the table would
    then point at files that do not exist, and every reader of it would fail.
    """
    paths = pending.file_paths()
    if missing := missing_files(table.io, pending):
        raise PlanUncommittable(
            f"sink {sink_id}: the pending plan seq {seq} (snapshot {pending.snapshot_id}) can never be "
            f"committed to {pending.table}: {len(missing)} of its {len(paths)} files are gone (first: "
            f"{missing[0]}). Nothing was committed. Abandon the plan with `icesink txnlog abandon "
            "--config <the sink's file>`, which says what becomes of the batch's records; then start "
            "the sink again"
        )


class PlanUncommittable(RuntimeError):
    """A precommitted plan that can never be committed (its files are gone).

    Retrying would only crash-loop: the sink stops (exit 2) and an operator abandons the plan.
    """


class CommitGaveUp(RuntimeError):
    """The catalog kept failing; the plan stays precommitted and the next start resumes it."""
