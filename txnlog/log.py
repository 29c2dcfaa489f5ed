"""The :class:`TransactionLog`: claim/fence, precommit, commit, abort, inspect.

Every write is one Postgres transaction that locks the sink row, decides with ``transitions.py`` and
writes the row plus a history entry. Transient failures re-run the whole transaction (see
``retry.py``); the decision functions make that re-run safe after a lost acknowledgement.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, create_engine, delete, event, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from txnlog.dsn import masked, parse_dsn, scrub
from txnlog.errors import LockLost, LockTimeout, TxnLogError, Unavailable
from txnlog.model import Action, HistoryEntry, JSONDict, Lease, Phase, SinkState
from txnlog.retry import (
    QUERY_CANCELED,
    RetryPolicy,
    driver_error,
    is_lock_timeout,
    is_transient,
    run_with_retry,
    sqlstate,
)
from txnlog.schema import ensure_schema, tables
from txnlog.settings import SessionSettings
from txnlog.transitions import (
    Change,
    plan_abort,
    plan_commit,
    plan_committing,
    plan_precommit,
    plan_reseed,
    require_row,
)

logger = logging.getLogger("txnlog")

T = TypeVar("T")

DEFAULT_DSN_ENV = "ICESINK_PG_DSN"

# Test hook signature: (operation, point) where point is "before_commit" or "after_commit".
FaultHook = Callable[[str, str], None]


def normalize_payload(payload: JSONDict) -> JSONDict:
    """Round-trip through JSON so that comparisons with what Postgres returns are exact.

    Raises ``TypeError`` for anything JSONB cannot store faithfully (non-dict, NaN, NUL characters).
    """
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict, not {type(payload).__name__}")
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"payload is not JSON-serialisable: {exc}") from exc
    if "\\u0000" in encoded:
        raise TypeError("payload contains a NUL character, which JSONB cannot store")
    decoded: JSONDict = json.loads(encoded)
    return decoded


@dataclass
class CommitHandle:
    """What :meth:`TransactionLog.committing` yields: the locked pending plan.

    ``committed`` is filled in once the block exits normally and the flip is durable.
    """

    lease: Lease
    state: SinkState
    committed: SinkState | None = field(default=None)
    _beat: Callable[[], None] | None = field(default=None, repr=False)

    def heartbeat(self) -> None:
        """Check that the row lock is still held, and restart the idle-in-transaction clock.

        Call it before each Iceberg commit attempt of a retry loop: a loop that heartbeats may run
        longer than ``idle_in_transaction_timeout`` in total, while a hung process is still reaped.
        Raises :class:`LockLost` if the locked session is gone (the lock may already be someone
        else's: do not attempt another Iceberg commit).
        """
        if self._beat is not None:
            self._beat()

    @property
    def payload(self) -> JSONDict:
        assert self.state.payload is not None  # guaranteed by plan_committing (phase is precommit)
        return self.state.payload

    @property
    def seq(self) -> int:
        return self.state.seq


class TransactionLog:
    """A Postgres-backed two-phase log that fences sink replicas by epoch.

    The constructor does not connect; the schema is created (or migrated) on first use.
    All durations are :class:`datetime.timedelta`. See docs/txnlog.md for the protocol and for how
    the timeouts bound the life of a dead writer's lock.
    """

    def __init__(
        self,
        dsn: str | URL,
        *,
        schema: str = "icesink",
        password: str | None = None,
        lock_timeout: timedelta = timedelta(seconds=10),
        idle_in_transaction_timeout: timedelta = timedelta(seconds=60),
        statement_timeout: timedelta = timedelta(seconds=30),
        connect_timeout: timedelta = timedelta(seconds=10),
        keepalives_idle: timedelta = timedelta(seconds=10),
        keepalives_interval: timedelta = timedelta(seconds=5),
        keepalives_count: int = 3,
        tcp_user_timeout: timedelta = timedelta(seconds=30),
        retry: RetryPolicy | None = None,
        history_retention: int = 1000,
        application_name: str = "icesink",
        pool_size: int = 5,
    ) -> None:
        if history_retention < 1:
            raise ValueError("history_retention must be at least 1")
        self._url = parse_dsn(dsn, password)
        self._settings = SessionSettings(
            lock_timeout=lock_timeout,
            idle_in_transaction_timeout=idle_in_transaction_timeout,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            keepalives_idle=keepalives_idle,
            keepalives_interval=keepalives_interval,
            keepalives_count=keepalives_count,
            tcp_user_timeout=tcp_user_timeout,
            application_name=application_name,
        )
        self._retry = retry or RetryPolicy()
        self._history_retention = history_retention
        self._tables = tables(schema)
        self._engine = create_engine(
            self._url,
            pool_pre_ping=True,
            pool_size=pool_size,
            max_overflow=pool_size,
            connect_args=self._settings.connect_args(),
        )
        event.listen(self._engine, "connect", self._on_connect)
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._fault_hook: FaultHook | None = None

    @classmethod
    def from_env(cls, var: str = DEFAULT_DSN_ENV, **kwargs: Any) -> TransactionLog:
        """Build from the DSN in environment variable ``var`` (password included or via ``password=``)."""
        dsn = os.environ.get(var)
        if not dsn:
            raise TxnLogError(f"environment variable {var} is not set; it must hold the Postgres DSN")
        return cls(dsn, **kwargs)

    # -- plumbing ---------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"TransactionLog({masked(self._url)!r}, schema={self.schema!r})"

    @property
    def dsn(self) -> str:
        """The DSN with the password masked, fit for logs and status output."""
        return masked(self._url)

    @property
    def schema(self) -> str:
        return self._tables.schema

    @property
    def settings(self) -> SessionSettings:
        return self._settings

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> TransactionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cur:
            for name, value in self._settings.session_gucs().items():
                cur.execute("SELECT set_config(%s, %s, false)", (name, value))
        dbapi_connection.commit()

    def _describe(self, exc: BaseException) -> str:
        orig = driver_error(exc)
        message = str(orig if orig is not None else exc).strip()
        return f"{type(orig or exc).__name__}: {scrub(message, self._url)} (database {self.dsn})"

    def _fault(self, operation: str, point: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(operation, point)

    def _translate(self, exc: BaseException, operation: str, sink_id: str | None) -> TxnLogError:
        where = f"sink {sink_id!r}: " if sink_id is not None else ""
        if is_lock_timeout(exc):
            return LockTimeout(sink_id or "?", operation, self._settings.lock_timeout.total_seconds())
        if is_transient(exc):
            return Unavailable(f"{where}{operation} gave up after retries: {self._describe(exc)}")
        return TxnLogError(f"{where}{operation} failed: {self._describe(exc)}")

    def _retrying(self, operation: str, sink_id: str | None, attempt: Callable[[], T]) -> T:
        try:
            return run_with_retry(attempt, self._retry, describe=self._describe, logger=logger)
        except TxnLogError:
            raise
        except (SQLAlchemyError, OSError) as exc:
            raise self._translate(exc, operation, sink_id) from exc
        except Exception as exc:
            if driver_error(exc) is not None:  # a raw psycopg error (e.g. from the fault hook)
                raise self._translate(exc, operation, sink_id) from exc
            raise

    def _run(self, operation: str, sink_id: str | None, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one transaction, retrying the whole transaction on transient errors."""

        def attempt() -> T:
            self._ensure_schema_once()
            with self._engine.connect() as conn:
                with conn.begin():
                    result = fn(conn)
                    self._fault(operation, "before_commit")
                self._fault(operation, "after_commit")
            return result

        return self._retrying(operation, sink_id, attempt)

    def _ensure_schema_once(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            with self._engine.begin() as conn:
                version = ensure_schema(conn, self.schema)
            logger.info("txnlog schema %r at version %d on %s", self.schema, version, self.dsn)
            self._schema_ready = True

    def ensure_schema(self) -> int:
        """Create or migrate the schema now (otherwise it happens on first use); returns its version."""

        def attempt() -> int:
            with self._engine.begin() as conn:
                version = ensure_schema(conn, self.schema)
            self._schema_ready = True
            return version

        return self._retrying("ensure_schema", None, attempt)

    # -- row access ---------------------------------------------------------------------------------

    @staticmethod
    def _to_state(row: Row[Any]) -> SinkState:
        m = row._mapping
        return SinkState(
            sink_id=m["sink_id"],
            epoch=m["epoch"],
            owner=m["owner"],
            phase=Phase(m["phase"]),
            seq=m["seq"],
            payload=m["payload"],
            precommit_epoch=m["precommit_epoch"],
            committed_seq=m["committed_seq"],
            committed_epoch=m["committed_epoch"],
            committed_payload=m["committed_payload"],
            created_at=m["created_at"],
            claimed_at=m["claimed_at"],
            updated_at=m["updated_at"],
        )

    def _state_columns(self) -> list[Any]:
        sinks = self._tables.sinks
        return [c for c in sinks.c if c.name != "claim_token"]

    def _read(self, conn: Connection, sink_id: str, *, lock: bool) -> SinkState | None:
        sinks = self._tables.sinks
        stmt = select(*self._state_columns()).where(sinks.c.sink_id == sink_id)
        if lock:
            stmt = stmt.with_for_update()
        row = conn.execute(stmt).first()
        return self._to_state(row) if row is not None else None

    def _record(
        self,
        conn: Connection,
        *,
        sink_id: str,
        action: Action,
        epoch: int,
        owner: str,
        seq: int | None,
        phase: Phase,
        payload: JSONDict | None,
    ) -> None:
        """Append a history entry and prune the sink's history to the retention limit.

        Every caller holds the sink row lock, so appends and prunes for one sink never interleave.
        """
        history = self._tables.history
        conn.execute(
            insert(history).values(
                sink_id=sink_id,
                action=action.value,
                epoch=epoch,
                owner=owner,
                seq=seq,
                phase=phase.value,
                payload=payload,
            )
        )
        cutoff = (
            select(history.c.id)
            .where(history.c.sink_id == sink_id)
            .order_by(history.c.id.desc())
            .offset(self._history_retention)
            .limit(1)
            .scalar_subquery()
        )
        conn.execute(delete(history).where(history.c.sink_id == sink_id, history.c.id <= cutoff))

    def _apply(self, conn: Connection, state: SinkState, lease: Lease, change: Change) -> SinkState:
        sinks = self._tables.sinks
        row = conn.execute(
            update(sinks)
            .where(sinks.c.sink_id == state.sink_id, sinks.c.epoch == lease.epoch)
            .values(**change.values, updated_at=func.now())
            .returning(*self._state_columns())
        ).one()  # the row is locked and its epoch checked, so exactly one row matches
        new_state = self._to_state(row)
        self._record(
            conn,
            sink_id=state.sink_id,
            action=change.action,
            epoch=lease.epoch,
            owner=lease.owner,
            seq=change.seq,
            phase=new_state.phase,
            payload=change.history_payload,
        )
        return new_state

    # -- the protocol ---------------------------------------------------------------------------------

    def claim(self, sink_id: str, owner: str) -> Lease:
        """Take over ``sink_id`` with a new epoch (the row is created on first claim).

        Every older lease is fenced from this point. The phase is left as it was: if it is
        ``precommit`` the caller must resolve ``lease.state.pending``. Waits for a writer inside
        :meth:`committing` for at most ``lock_timeout`` (then :class:`LockTimeout`).
        A claim token makes a retry after a lost acknowledgement return the same epoch instead of
        claiming twice.
        """
        if not sink_id:
            raise ValueError("sink_id must not be empty")
        sinks = self._tables.sinks
        token = uuid.uuid4()

        def fn(conn: Connection) -> SinkState:
            stmt = pg_insert(sinks).values(
                sink_id=sink_id, epoch=1, owner=owner, claim_token=token, phase=Phase.IDLE.value, seq=0
            )
            upsert = stmt.on_conflict_do_update(
                index_elements=[sinks.c.sink_id],
                set_={
                    "epoch": sinks.c.epoch + 1,
                    "owner": stmt.excluded.owner,
                    "claim_token": stmt.excluded.claim_token,
                    "claimed_at": func.now(),
                    "updated_at": func.now(),
                },
                where=sinks.c.claim_token != stmt.excluded.claim_token,
            ).returning(*self._state_columns())
            row = conn.execute(upsert).first()
            if row is None:  # our token is already there: an earlier attempt committed
                state = self._read(conn, sink_id, lock=True)
                assert state is not None
                return state
            state = self._to_state(row)
            self._record(
                conn,
                sink_id=sink_id,
                action=Action.CLAIM,
                epoch=state.epoch,
                owner=owner,
                seq=state.seq,
                phase=state.phase,
                payload=None,
            )
            return state

        state = self._run("claim", sink_id, fn)
        logger.info("claimed sink %r: epoch %d, owner %r, phase %s", sink_id, state.epoch, owner, state.phase)
        return Lease(sink_id=sink_id, epoch=state.epoch, owner=owner, state=state)

    def precommit(self, lease: Lease, payload: JSONDict) -> SinkState:
        """Record ``payload`` as the next plan (``seq`` + 1); returns the new state.

        Raises :class:`Fenced` if the lease is stale and :class:`InvalidPhase` if another plan is
        still pending. Repeating the call with the same payload while it is pending is a no-op.
        """
        plan = normalize_payload(payload)

        def fn(conn: Connection) -> SinkState:
            state = require_row(self._read(conn, lease.sink_id, lock=True), lease)
            change = plan_precommit(state, lease, plan)
            if change is None:
                return state
            return self._apply(conn, state, lease, change)

        state = self._run("precommit", lease.sink_id, fn)
        logger.debug("precommit sink %r epoch %d seq %d", lease.sink_id, lease.epoch, state.seq)
        return state

    def commit(self, lease: Lease, *, seq: int | None = None) -> SinkState:
        """Mark the pending plan committed; returns the new state.

        Pass ``seq`` (from :meth:`precommit`'s result) to make sure the intended plan is the one
        committed and to make a repeated call idempotent. Raises :class:`Fenced` if the lease is stale
        (unless this very plan was already committed by this epoch) and :class:`InvalidPhase` if
        nothing, or another plan, is pending.
        """
        expected = seq

        def fn(conn: Connection) -> SinkState:
            nonlocal expected
            state = require_row(self._read(conn, lease.sink_id, lock=True), lease)
            change = plan_commit(state, lease, expected)
            if change is None:
                return state
            # Remember which plan this call commits: if the COMMIT's acknowledgement is lost, the retry
            # must recognise that plan as done rather than report "nothing pending".
            expected = change.seq
            return self._apply(conn, state, lease, change)

        state = self._run("commit", lease.sink_id, fn)
        logger.debug("commit sink %r epoch %d seq %s", lease.sink_id, lease.epoch, state.committed_seq)
        return state

    def abort(self, lease: Lease, *, seq: int | None = None) -> SinkState:
        """Drop the pending plan. Only for a plan that definitely did not reach Iceberg.

        The phase goes back to ``committed`` (or ``idle``); ``seq`` is not reused. With nothing
        pending this is a no-op. Conditional on the epoch like every write.
        """
        expected = seq

        def fn(conn: Connection) -> SinkState:
            nonlocal expected
            state = require_row(self._read(conn, lease.sink_id, lock=True), lease)
            change = plan_abort(state, lease, expected)
            if change is None:
                return state
            expected = change.seq
            return self._apply(conn, state, lease, change)

        state = self._run("abort", lease.sink_id, fn)
        logger.info("abort sink %r epoch %d seq %d", lease.sink_id, lease.epoch, state.seq)
        return state

    def reseed(self, lease: Lease, *, seq: int, payload: JSONDict, note: JSONDict) -> SinkState:
        """Make ``payload`` the committed plan ``seq`` of a log that lost its newest transitions.

        The caller's own record of its commits (not this log) says what the last one was; ``seq``
        must be ahead of the row's. A pending plan is dropped. The history records a ``commit`` whose
        payload is ``note`` plus ``"operation": "reseed"``. Raises :class:`Fenced` for a stale lease and
        :class:`InvalidPhase` when ``seq`` is not ahead. See docs/txnlog.md.
        """
        plan = normalize_payload(payload)
        history_note = normalize_payload(note)

        def fn(conn: Connection) -> SinkState:
            state = require_row(self._read(conn, lease.sink_id, lock=True), lease)
            change = plan_reseed(state, lease, seq, plan, history_note)
            if change is None:
                return state
            return self._apply(conn, state, lease, change)

        state = self._run("reseed", lease.sink_id, fn)
        logger.warning("reseeded sink %r at seq %d (epoch %d)", lease.sink_id, seq, lease.epoch)
        return state

    @contextmanager
    def committing(
        self, lease: Lease, *, seq: int | None = None, hold_timeout: timedelta | None = None
    ) -> Iterator[CommitHandle]:
        """Hold the sink row locked while the caller commits to Iceberg, then flip to committed.

        The row is locked with ``SELECT ... FOR UPDATE`` and checked (live epoch, a pending plan,
        ``seq`` if given) before the block runs, so a fenced replica never reaches Iceberg and a
        claimer waits (up to its ``lock_timeout``) instead of racing the commit. On normal exit the
        flip to ``committed`` commits in the same transaction; if the block raises, the transaction
        rolls back and the row stays ``precommit``.

        The session is idle in transaction while the block runs, so ``idle_in_transaction_timeout``
        (or ``hold_timeout`` for this call) must exceed the longest Iceberg commit; it is also what
        frees the lock when the writer hangs. If the locked session was lost meanwhile (timeout,
        restart), the flip falls back to :meth:`commit` with the plan's ``seq``, which succeeds if the
        epoch is still live and raises :class:`Fenced` otherwise — the new owner then finds the
        snapshot in Iceberg and marks the plan committed itself.
        """
        sink_id = lease.sink_id

        def acquire() -> tuple[Connection, SinkState, Change]:
            self._ensure_schema_once()
            conn = self._engine.connect()
            try:
                conn.begin()
                if hold_timeout is not None:
                    ms = max(1, round(hold_timeout.total_seconds() * 1000))
                    conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {ms}"))
                state = require_row(self._read(conn, sink_id, lock=True), lease)
                change = plan_committing(state, lease, seq)
                return conn, state, change
            except BaseException:
                _discard(conn)
                raise

        conn, state, change = self._retrying("committing", sink_id, acquire)

        def beat() -> None:
            try:
                conn.execute(text("SELECT 1"))
            except Exception as exc:
                raise LockLost(sink_id, self._describe(exc)) from exc

        handle = CommitHandle(lease=lease, state=state, _beat=beat)
        try:
            yield handle
        except BaseException:
            _discard(conn)
            logger.info("committing sink %r seq %d rolled back: the block raised", sink_id, state.seq)
            raise

        try:
            new_state = self._apply(conn, state, lease, change)
            self._fault("committing", "before_commit")
            conn.commit()
            conn.close()
            self._fault("committing", "after_commit")
        except Exception as exc:
            _discard(conn)
            if not is_transient(exc):
                if isinstance(exc, TxnLogError):
                    raise
                raise self._translate(exc, "committing", sink_id) from exc
            logger.warning(
                "committing sink %r seq %d: lost the locked session (%s); "
                "finishing with a conditional commit",
                sink_id,
                state.seq,
                self._describe(exc),
            )
            new_state = self.commit(lease, seq=state.seq)
        handle.committed = new_state

    # -- named locks ----------------------------------------------------------------------------------

    @contextmanager
    def named_locks(self, names: Sequence[str], *, shared: bool, wait: timedelta) -> Iterator[bool]:
        """Hold the Postgres advisory locks called ``names`` while the block runs; yields whether all
        were taken within ``wait`` (False: none is held, and the block runs without them).

        Many holders may share each, or one holds it alone. They are transaction locks, taken in name
        order in a transaction of their own that stays open, idle, while the block runs (its
        idle-in-transaction timeout switched off: a compaction may take minutes), and ends with the
        block, or with the session when the process dies or its connection is lost. A transaction,
        not a session lock, so that nothing outlives it on a pooled connection (or behind a
        PgBouncer in transaction mode). Nothing in the log depends on these locks: callers use them
        to take turns where the outcome is safe either way (see docs/txnlog.md).
        """
        ordered = sorted(set(names))
        if not ordered:
            yield True
            return
        kind = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        ms = max(1, round(wait.total_seconds() * 1000))

        def acquire() -> tuple[Connection, bool]:
            conn = self._engine.connect()
            try:
                conn.begin()
                conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
                conn.execute(text(f"SET LOCAL lock_timeout = {ms}"))
                conn.execute(text(f"SET LOCAL statement_timeout = {ms}"))  # one deadline for all the locks
                conn.execute(
                    text(f"SELECT {kind}(hashtextextended(n, 0)) FROM unnest(CAST(:names AS text[])) AS n"),
                    {"names": ordered},
                )
                return conn, True
            except BaseException as exc:
                _discard(conn)  # the rollback lets go of any lock taken before the wait ran out
                if isinstance(exc, SQLAlchemyError) and (
                    is_lock_timeout(exc) or sqlstate(exc) == QUERY_CANCELED
                ):
                    return conn, False
                raise

        conn, taken = self._retrying(f"named locks {ordered}", None, acquire)
        try:
            yield taken
        finally:
            if taken:
                _discard(conn)

    # -- inspection ---------------------------------------------------------------------------------

    def state(self, sink_id: str) -> SinkState | None:
        """The sink's current row, or None if it was never claimed. Never blocks on row locks."""
        return self._run("state", sink_id, lambda conn: self._read(conn, sink_id, lock=False))

    def list_sinks(self) -> list[SinkState]:
        """Every sink's row, ordered by sink id."""
        sinks = self._tables.sinks

        def fn(conn: Connection) -> list[SinkState]:
            rows = conn.execute(select(*self._state_columns()).order_by(sinks.c.sink_id)).all()
            return [self._to_state(r) for r in rows]

        return self._run("list_sinks", None, fn)

    def history(self, sink_id: str, limit: int = 100) -> list[HistoryEntry]:
        """The sink's most recent transitions, newest first."""
        history = self._tables.history

        def fn(conn: Connection) -> list[HistoryEntry]:
            rows = conn.execute(
                select(history).where(history.c.sink_id == sink_id).order_by(history.c.id.desc()).limit(limit)
            ).all()
            return [
                HistoryEntry(
                    id=r.id,
                    sink_id=r.sink_id,
                    at=r.at,
                    action=Action(r.action),
                    epoch=r.epoch,
                    owner=r.owner,
                    seq=r.seq,
                    phase=Phase(r.phase),
                    payload=r.payload,
                )
                for r in rows
            ]

        return self._run("history", sink_id, fn)


def _discard(conn: Connection) -> None:
    """Roll back and release a connection that may already be broken or closed."""
    try:
        conn.rollback()
    except Exception:
        with suppress(Exception):
            conn.invalidate()  # never return a connection in an unknown state to the pool
    finally:
        with suppress(Exception):
            conn.close()
