"""``icesink txnlog reseed``: move a txnlog that went back in time to the table's last commit.

The sink refuses to start when the table holds a commit of this sink with a seq the log never
reached (:meth:`service.channel.committer.Committer.check_log_is_current`). The table knows what that
commit covered: its table properties (``icesink.<sink_id>.seq``, ``.snapshot-id``, ``.offsets``) and,
while the snapshot is kept, its summary. This command claims the sink (fencing any replica still
running), then records that commit as the log's committed plan: the sink resumes from the offsets the
table covers, and its next plan takes the next seq. The history shows it as a ``commit`` entry whose
payload says ``operation: reseed`` with the row as it was before.
"""

from __future__ import annotations

from typing import Any

from service.channel.marks import latest_mark
from service.channel.pending import PendingCommit
from service.config import SinkConfig
from service.iceberg.tables import open_catalog
from service.model.offsets import offsets_to_json
from service.operator import command_owner
from service.txnlog_client import open_txnlog


class NothingToReseed(RuntimeError):
    """The log is not behind the table (or the table has no commit of the sink); nothing was changed."""


def reseed(config: SinkConfig) -> dict[str, Any]:
    """Re-seed the sink's row from the table; returns what was recorded (the command prints it)."""
    identifier = config.the_table("icesink txnlog reseed")
    table = open_catalog(config).load_table(identifier)
    mark = latest_mark(table, config.sink_id)
    if mark is None:
        raise NothingToReseed(f"table {identifier} holds no commit of sink {config.sink_id}")
    if not mark.offsets:
        raise NothingToReseed(
            f"sink {config.sink_id}'s last commit in {identifier} (seq {mark.seq}, per {mark.source}) "
            "records no offsets to resume from"
        )
    log = open_txnlog(config, "reseed")
    try:
        before = log.state(config.sink_id)
        if before is not None and before.seq >= mark.seq:
            raise NothingToReseed(
                f"the txnlog is not behind the table: its seq for sink {config.sink_id} is {before.seq}, "
                f"the table's highest is {mark.seq}"
            )
        previous: dict[str, Any] = (
            {
                "seq": before.seq,
                "phase": str(before.phase),
                "committed_seq": before.committed_seq,
                "committed_offsets": before.committed_payload.get("offsets")
                if before.committed_payload
                else None,
            }
            if before is not None
            else {"row": "absent"}
        )
        lease = log.claim(config.sink_id, command_owner("txnlog reseed"))
        plan = PendingCommit(table=identifier, offsets=mark.offsets, snapshot_id=mark.snapshot_id)
        # reseed itself refuses a seq that is not ahead, should a replica have committed meanwhile.
        log.reseed(
            lease,
            seq=mark.seq,
            payload=plan.to_payload(),
            note={"table": identifier, "source": mark.source, "previous": previous},
        )
    finally:
        log.close()
    return {
        "sink_id": config.sink_id,
        "table": identifier,
        "seq": mark.seq,
        "snapshot_id": mark.snapshot_id,
        "offsets": offsets_to_json(mark.offsets),
        "source": mark.source,
        "previous": previous,
    }
