"""The plan of one commit, as recorded in the txnlog before it goes to Iceberg."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFile

from service.model.datafile_json import from_json, to_json
from service.model.offsets import Offsets, offsets_from_json, offsets_to_json

SUMMARY_SINK_ID = "icesink.sink-id"
SUMMARY_EPOCH = "icesink.epoch"
SUMMARY_SEQ = "icesink.seq"
SUMMARY_OFFSETS = "icesink.offsets"


def new_snapshot_id() -> int:
    """A positive 63-bit id chosen before the commit, so the commit can be recognised afterwards."""
    return secrets.randbits(63) or 1


@dataclass
class PendingCommit:
    """Files and offsets of one batch. ``snapshot_id`` is None when the batch wrote no file.

    The payload is self-sufficient: any replica can finish the commit from it without Kafka.
    ``topic_ids`` are the ids of the topics the offsets belong to: a topic deleted and re-created
    under the same name has a new id, and its old offsets mean nothing in it. A plan that is not a
    batch (starting offsets recorded, offsets reset by an operator) says what it is in ``note``,
    which the txnlog's history keeps.
    """

    table: str
    offsets: Offsets
    snapshot_id: int | None
    data_files: list[DataFile] = field(default_factory=list)
    delete_files: list[DataFile] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    topic_ids: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    # delete_format: position: the file of the deleted rows' keys and where they were, and the
    # snapshot those positions were resolved against; a commit that finds the rows moved since (a
    # compaction) resolves them again (service.keyindex.refresh)
    position_keys: str | None = None
    resolved_at: int | None = None

    @property
    def has_files(self) -> bool:
        return bool(self.data_files or self.delete_files)

    def to_payload(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "offsets": offsets_to_json(self.offsets),
            "snapshot_id": self.snapshot_id,
            "data_files": [to_json(f) for f in self.data_files],
            "delete_files": [to_json(f) for f in self.delete_files],
            "stats": self.stats,
            "topic_ids": dict(sorted(self.topic_ids.items())),
            **({"note": self.note} if self.note else {}),
            **(
                {"position_keys": self.position_keys, "resolved_at": self.resolved_at}
                if self.position_keys
                else {}
            ),
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> PendingCommit:
        return cls(
            table=payload["table"],
            offsets=offsets_from_json(payload.get("offsets")),
            snapshot_id=payload.get("snapshot_id"),
            data_files=[from_json(f) for f in payload.get("data_files", [])],
            delete_files=[from_json(f) for f in payload.get("delete_files", [])],
            stats=dict(payload.get("stats", {})),
            topic_ids=dict(payload.get("topic_ids", {})),
            note=payload.get("note"),
            position_keys=payload.get("position_keys"),
            resolved_at=payload.get("resolved_at"),
        )

    def summary(self, sink_id: str, epoch: int, seq: int) -> dict[str, str]:
        import json

        return {
            SUMMARY_SINK_ID: sink_id,
            SUMMARY_EPOCH: str(epoch),
            SUMMARY_SEQ: str(seq),
            SUMMARY_OFFSETS: json.dumps(offsets_to_json(self.offsets), separators=(",", ":")),
        }

    def file_paths(self) -> list[str]:
        keys = [self.position_keys] if self.position_keys else []
        return [f.file_path for f in self.data_files + self.delete_files] + keys


@dataclass
class BatchPlan:
    """What one txnlog row records for a batch: where the sink resumes, and one plan per table written.

    ``offsets`` cover every topic the sink reads; each table's plan covers its own topics. A table
    that had no records in the batch has no plan (and gets no snapshot). All the tables' plans are
    precommitted in the one row, so after a crash every one of them is finished from its own files,
    each table checked for its own snapshot: a table committed before the crash is not committed again.

    A plan of one table whose offsets are the sink's is stored as that table's plan alone, the row
    format of a one-table sink; a plan of several tables (or none) nests them under ``tables``.
    """

    offsets: Offsets
    tables: list[PendingCommit] = field(default_factory=list)
    topic_ids: dict[str, str] = field(default_factory=dict)
    routes: dict[str, str] = field(default_factory=dict)  # topic → table: where each topic lands
    note: str | None = None

    @classmethod
    def of_one_table(cls, plan: PendingCommit) -> BatchPlan:
        return cls(offsets=plan.offsets, tables=[plan], topic_ids=plan.topic_ids, note=plan.note)

    @property
    def flat(self) -> bool:
        if len(self.tables) != 1:
            return False
        only = self.tables[0]
        return (only.offsets, only.topic_ids, only.note) == (self.offsets, self.topic_ids, self.note) and (
            not self.routes or set(self.routes.values()) == {only.table}
        )

    @property
    def has_files(self) -> bool:
        return any(t.has_files for t in self.tables)

    def moved(self, offsets: Offsets, topic_ids: dict[str, str], note: str) -> BatchPlan:
        """A plan without files that moves this (committed) plan's offsets, in the same row format."""
        if self.flat:
            only = self.tables[0]
            return BatchPlan.of_one_table(
                PendingCommit(only.table, offsets, None, topic_ids=topic_ids, note=note)
            )
        return BatchPlan(offsets=offsets, topic_ids=topic_ids, routes=dict(self.routes), note=note)

    def file_paths(self) -> list[str]:
        return [path for t in self.tables for path in t.file_paths()]

    def to_payload(self) -> dict[str, Any]:
        if self.flat:
            return self.tables[0].to_payload()
        return {
            "offsets": offsets_to_json(self.offsets),
            "topic_ids": dict(sorted(self.topic_ids.items())),
            "routes": dict(sorted(self.routes.items())),
            "tables": [t.to_payload() for t in self.tables],
            **({"note": self.note} if self.note else {}),
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> BatchPlan:
        if "tables" not in payload:
            return cls.of_one_table(PendingCommit.from_payload(payload))
        return cls(
            offsets=offsets_from_json(payload.get("offsets")),
            tables=[PendingCommit.from_payload(t) for t in payload["tables"]],
            topic_ids=dict(payload.get("topic_ids", {})),
            routes=dict(payload.get("routes", {})),
            note=payload.get("note"),
        )
