"""The protocol's decisions, as pure functions of the locked row.

Each write locks the sink row (``SELECT ... FOR UPDATE``), asks one of these functions what to do,
and applies the answer in the same transaction. A function either raises (``Fenced``,
``InvalidPhase``, ``SinkNotFound``), returns ``None`` when the row *already* shows the requested
outcome — which is how a retry after a lost acknowledgement is recognised instead of re-applied —
or returns the :class:`Change` to write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txnlog.errors import Fenced, InvalidPhase, SinkNotFound, TxnLogError
from txnlog.model import Action, JSONDict, Lease, Phase, SinkState


@dataclass(frozen=True)
class Change:
    """Columns to set on the sink row, plus what to record in the history."""

    action: Action
    values: dict[str, Any]
    seq: int | None
    history_payload: JSONDict | None


def require_row(state: SinkState | None, lease: Lease) -> SinkState:
    if state is None:
        raise SinkNotFound(lease.sink_id)
    return state


def require_live(state: SinkState, lease: Lease) -> None:
    """Raise :class:`Fenced` unless the lease's epoch is the row's epoch."""
    if state.epoch == lease.epoch:
        return
    if state.epoch > lease.epoch:
        raise Fenced(lease.sink_id, lease.epoch, state.epoch, state.owner)
    raise TxnLogError(
        f"sink {lease.sink_id!r}: lease epoch {lease.epoch} is ahead of the row's epoch {state.epoch}; "
        "the lease comes from another database or schema"
    )


def plan_precommit(state: SinkState, lease: Lease, payload: JSONDict) -> Change | None:
    """Record ``payload`` as the next plan, with ``seq + 1``.

    A pending plan is never overwritten: it may already be in Iceberg, and replacing it would lose
    the only record of it. The one exception is the *same* plan from the *same* epoch, which is a
    retried call whose first attempt committed (``None``: nothing to do).
    A fenced lease is refused even if its own precommit landed: the stale replica must stop before
    it touches Iceberg; the new owner will resolve the plan.
    """
    require_live(state, lease)
    if state.phase is Phase.PRECOMMIT:
        if state.precommit_epoch == lease.epoch and state.payload == payload:
            return None
        raise InvalidPhase(
            lease.sink_id,
            "precommit",
            f"plan seq {state.seq} (epoch {state.precommit_epoch}) is still pending; "
            "commit or abort it first",
        )
    seq = state.seq + 1
    return Change(
        Action.PRECOMMIT,
        {"phase": Phase.PRECOMMIT.value, "seq": seq, "payload": payload, "precommit_epoch": lease.epoch},
        seq,
        payload,
    )


def _commit_change(state: SinkState, lease: Lease) -> Change:
    return Change(
        Action.COMMIT,
        {
            "phase": Phase.COMMITTED.value,
            "committed_seq": state.seq,
            "committed_epoch": lease.epoch,
            "committed_payload": state.payload,
        },
        state.seq,
        None,
    )


def _check_pending(state: SinkState, lease: Lease, operation: str, seq: int | None) -> None:
    if state.phase is not Phase.PRECOMMIT:
        last = f", last committed seq {state.committed_seq}" if state.committed_seq is not None else ""
        raise InvalidPhase(lease.sink_id, operation, f"nothing is pending (phase {state.phase.value}{last})")
    if seq is not None and state.seq != seq:
        raise InvalidPhase(lease.sink_id, operation, f"the pending plan is seq {state.seq}, not {seq}")


def plan_commit(state: SinkState, lease: Lease, seq: int | None) -> Change | None:
    """Mark the pending plan committed by ``lease``.

    ``seq`` is the plan the caller means (optional for the first attempt; the log remembers what its
    first attempt saw). If the row shows that plan committed by this epoch, the commit already
    happened — typically the acknowledgement was lost — and this returns ``None`` *even if a newer
    epoch has since taken over*: reporting ``Fenced`` would claim the commit did not take, which is
    false; the replica learns it is fenced on its next write.

    The pending plan may come from an older epoch: a new owner finishing its predecessor's plan is
    the recovery path.
    """
    if seq is not None and state.committed_seq == seq and state.committed_epoch == lease.epoch:
        return None
    require_live(state, lease)
    _check_pending(state, lease, "commit", seq)
    return _commit_change(state, lease)


def plan_committing(state: SinkState, lease: Lease, seq: int | None) -> Change:
    """Like :func:`plan_commit` for the locked path, which never sees a completed retry."""
    require_live(state, lease)
    _check_pending(state, lease, "commit", seq)
    return _commit_change(state, lease)


def plan_abort(state: SinkState, lease: Lease, seq: int | None) -> Change | None:
    """Drop the pending plan; only for a plan that *definitely* never reached Iceberg.

    The phase returns to ``committed`` (or ``idle`` if nothing was ever committed) and ``seq`` is
    not reused. With nothing pending this is a no-op, unless ``seq`` names a plan that was committed.
    """
    if seq is not None and state.committed_seq == seq:
        raise InvalidPhase(lease.sink_id, "abort", f"plan seq {seq} is already committed")
    if seq is not None and state.seq == seq and state.phase is not Phase.PRECOMMIT:
        return None  # aborted already (a retried call)
    require_live(state, lease)
    if state.phase is not Phase.PRECOMMIT:
        return None
    if seq is not None and state.seq != seq:
        raise InvalidPhase(lease.sink_id, "abort", f"the pending plan is seq {state.seq}, not {seq}")
    phase = Phase.COMMITTED if state.committed_seq is not None else Phase.IDLE
    return Change(
        Action.ABORT,
        {"phase": phase.value, "payload": None, "precommit_epoch": None},
        state.seq,
        state.payload,
    )


RESEED = "reseed"  # the ``operation`` of a history entry written by :func:`plan_reseed`


def plan_reseed(state: SinkState, lease: Lease, seq: int, payload: JSONDict, note: JSONDict) -> Change | None:
    """Set the row to a committed plan ``seq`` that the log itself never recorded.

    For a log that lost its newest transitions (restored from a backup, a standby promoted, the row
    deleted) while the caller's own record (the table) holds later commits: the caller hands the last
    of them over. ``seq`` must be ahead of the row's, so the rule that a seq never goes back holds; a
    pending plan is dropped (it belongs to the lost timeline, which the caller's record supersedes).
    The history gets a ``commit`` entry whose payload is ``note`` with ``operation: reseed``: no new
    action, so the schema stays as it is. A retry that finds this very reseed done returns ``None``.
    """
    if (
        state.committed_seq == seq
        and state.committed_epoch == lease.epoch
        and state.committed_payload == payload
        and state.phase is Phase.COMMITTED
    ):
        return None
    require_live(state, lease)
    if seq <= state.seq:
        raise InvalidPhase(
            lease.sink_id,
            RESEED,
            f"seq {seq} is not ahead of the log's seq {state.seq}; a seq never goes back",
        )
    return Change(
        Action.COMMIT,
        {
            "phase": Phase.COMMITTED.value,
            "seq": seq,
            "payload": payload,
            "precommit_epoch": lease.epoch,
            "committed_seq": seq,
            "committed_epoch": lease.epoch,
            "committed_payload": payload,
        },
        seq,
        {"operation": RESEED, **note},
    )
