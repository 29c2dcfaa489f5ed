"""``icesink txnlog reseed``: move a txnlog that went back in time to the tables' last commits.

The sink refuses to start when the table holds a commit of this sink with a seq the log never
reached (:meth:`service.commit.committer.Committer.check_log_is_current`). The table knows what that
commit covered: its table properties (``icesink.<sink_id>.seq``, ``.snapshot-id``, ``.offsets``) and,
while the snapshot is kept, its summary. This command claims the sink (fencing any replica still
running), then records that commit as the log's committed plan: the sink resumes from the offsets the
table covers, and its next plan takes the next seq. The history shows it as a ``commit`` entry whose
payload says ``operation: reseed`` with the row as it was before.

A sink of many tables is re-seeded from each of its tables' last commit: a table's commit records the
offsets of its own topics (each topic lands in one table), so the sink resumes every topic from its
table's last commit, and its next plan takes a seq above the highest of them. The tables are those
the log's last plan routes to, the ``tables`` overrides, and the tables of the template's namespace
(when the template fixes it, as ``lake.{source.table}`` does) that hold a commit of the sink. A topic
no table's commit names keeps the row's offsets (behind the tables', or the row would not need this),
or is read from the start when the row is gone.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog

from service.commit.marks import Mark, latest_mark
from service.commit.plan import BatchPlan, PendingCommit
from service.commit.sink_tables import sink_tables
from service.config import SinkConfig
from service.iceberg.tables import open_catalog
from service.model.offsets import Offsets, merge_offsets, offsets_to_json
from service.ops.common import command_owner
from service.txnlog_client import open_txnlog


class NothingToReseed(RuntimeError):
    """The log is not behind the tables (or no table has a commit of the sink); nothing was changed."""


def _marks(config: SinkConfig, catalog: Catalog, tables: list[str]) -> dict[str, Mark]:
    marks = {}
    for identifier in tables:
        if not catalog.table_exists(identifier):
            continue
        mark = latest_mark(catalog.load_table(identifier), config.sink_id)
        if mark is None:
            continue
        if not mark.offsets:
            raise NothingToReseed(
                f"sink {config.sink_id}'s last commit in {identifier} (seq {mark.seq}, per {mark.source}) "
                "records no offsets to resume from"
            )
        marks[identifier] = mark
    return marks


def reseed(config: SinkConfig) -> dict[str, Any]:
    """Re-seed the sink's row from its tables; returns what was recorded (the command prints it)."""
    catalog = open_catalog(config)
    log = open_txnlog(config, "reseed")
    try:
        before = log.state(config.sink_id)
        routes = _routes(before.committed_payload if before else None)
        tables = sink_tables(config, catalog, routes)
        marks = _marks(config, catalog, tables)
        if not marks:
            raise NothingToReseed(
                f"no table of sink {config.sink_id} holds a commit of it ({', '.join(tables)})"
            )
        seq = max(m.seq for m in marks.values())
        if before is not None and before.seq >= seq:
            raise NothingToReseed(
                f"the txnlog is not behind the table: its seq for sink {config.sink_id} is {before.seq}, "
                f"the table's highest is {seq}"
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
        # The row's own offsets (behind the tables, or it would not need a re-seed) under the tables':
        # a topic no table's commit names (its table never committed, or isolated) keeps the row's.
        offsets: Offsets = (
            BatchPlan.from_payload(before.committed_payload).offsets
            if before and before.committed_payload
            else {}
        )
        for mark in marks.values():
            offsets = merge_offsets(offsets, mark.offsets)
        if config.table.is_template:
            payload = BatchPlan(
                offsets, routes={t: table for table, m in marks.items() for t in m.offsets}
            ).to_payload()
            note: dict[str, Any] = {"tables": {t: m.source for t, m in marks.items()}, "previous": previous}
        else:
            ((identifier, mark),) = marks.items()
            payload = PendingCommit(
                table=identifier, offsets=mark.offsets, snapshot_id=mark.snapshot_id
            ).to_payload()
            note = {"table": identifier, "source": mark.source, "previous": previous}
        # reseed itself refuses a seq that is not ahead, should a replica have committed meanwhile.
        log.reseed(lease, seq=seq, payload=payload, note=note)
    finally:
        log.close()
    if not config.table.is_template:
        ((identifier, mark),) = marks.items()
        return {
            "sink_id": config.sink_id,
            "table": identifier,
            "seq": mark.seq,
            "snapshot_id": mark.snapshot_id,
            "offsets": offsets_to_json(mark.offsets),
            "source": mark.source,
            "previous": previous,
        }
    return {
        "sink_id": config.sink_id,
        "seq": seq,
        "offsets": offsets_to_json(offsets),
        "tables": {
            t: {
                "seq": m.seq,
                "snapshot_id": m.snapshot_id,
                "offsets": offsets_to_json(m.offsets),
                "source": m.source,
            }
            for t, m in sorted(marks.items())
        },
        "previous": previous,
    }


def _routes(payload: dict[str, Any] | None) -> dict[str, str]:
    return BatchPlan.from_payload(payload).routes if payload else {}
