"""Value types returned by the transaction log. Plain frozen dataclasses, no database access."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

JSONDict = dict[str, Any]


class Phase(StrEnum):
    """Where a sink stands in the two-phase protocol.

    ``IDLE``: claimed, nothing ever committed and nothing pending.
    ``PRECOMMIT``: a plan is recorded and may or may not have reached Iceberg; it must be resolved
    (committed or aborted) before the next precommit.
    ``COMMITTED``: the last plan is committed and nothing is pending.
    """

    IDLE = "idle"
    PRECOMMIT = "precommit"
    COMMITTED = "committed"


class Action(StrEnum):
    """Transitions recorded in the history table."""

    CLAIM = "claim"
    PRECOMMIT = "precommit"
    COMMIT = "commit"
    ABORT = "abort"


@dataclass(frozen=True)
class SinkState:
    """One sink's row.

    ``seq`` is the sequence number of the latest precommit (0 before the first); it grows by one on
    every precommit and never goes back, even when a plan is aborted. ``payload`` is that latest plan
    (kept after its commit, cleared by abort) and ``precommit_epoch`` the epoch that recorded it.
    ``committed_*`` describe the last committed plan: that payload holds the offsets to resume from.
    ``committed_epoch`` is the epoch that *committed* it, which differs from ``precommit_epoch`` when a
    new owner finished an older owner's plan during recovery.
    """

    sink_id: str
    epoch: int
    owner: str
    phase: Phase
    seq: int
    payload: JSONDict | None
    precommit_epoch: int | None
    committed_seq: int | None
    committed_epoch: int | None
    committed_payload: JSONDict | None
    created_at: datetime
    claimed_at: datetime
    updated_at: datetime

    @property
    def pending(self) -> JSONDict | None:
        """The plan waiting to be committed, or None when nothing is pending."""
        return self.payload if self.phase is Phase.PRECOMMIT else None


@dataclass(frozen=True)
class Lease:
    """Proof of a claim: writes made with it succeed only while ``epoch`` is the sink's live epoch.

    ``state`` is the row as the claim left it; when ``state.phase`` is ``PRECOMMIT`` the new owner must
    resolve ``state.pending`` (commit it if it reached Iceberg or can be re-applied, else abort).
    """

    sink_id: str
    epoch: int
    owner: str
    state: SinkState


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded transition. ``epoch``/``owner`` are the acting lease's; ``phase`` is the phase after."""

    id: int
    sink_id: str
    at: datetime
    action: Action
    epoch: int
    owner: str
    seq: int | None
    phase: Phase
    payload: JSONDict | None
