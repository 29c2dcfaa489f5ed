"""A table's health, as its metadata tells it: what maintenance decides on, reports and exports.

Everything here is read from the table's current metadata file, its current snapshot's summary
(running totals Iceberg keeps for every snapshot) and its manifest list: no manifest is opened, so
looking at a hundred tables every few minutes stays cheap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from service.iceberg.row_delta import ManifestMerge


@dataclass(frozen=True)
class TableHealth:
    table: str
    snapshots: int
    data_files: int
    delete_files: int
    equality_deletes: int  # rows in equality-delete files
    position_deletes: int  # rows in position-delete files
    records: int
    data_bytes: int  # every live file, data and delete
    manifests: int  # of the current snapshot
    manifests_to_rewrite: int  # of those, the ones `icesink maintain` may rewrite (ManifestMerge.rewritable)
    metadata_bytes: int  # the current metadata file
    commits_since_compaction: int  # snapshots added after the last compaction (all of them if none)
    last_compaction: datetime | None
    first_snapshot: datetime | None  # the oldest snapshot still in the metadata
    # When the table began, if its metadata still tells: its first snapshot while expiry has not taken
    # it, else (no snapshot yet) its oldest metadata version kept; None once expiry removed the start.
    born: datetime | None
    # When each snapshot of main's history was made, oldest first: what expiry may remove (Iceberg
    # keeps the newest retain_last of them; a snapshot a tag also names stays too, counted here as
    # expirable: tags on a sink's table are rare). Not reported.
    snapshot_times: tuple[datetime, ...] = field(default=(), repr=False)
    # The table's ``gc.enabled``: false where the catalog shares files between tables or branches (Nessie
    # sets it on every table); then expiry and orphan removal are not icesink's to run.
    gc_enabled: bool = True

    def expirable(self, older_than: timedelta, retain_last: int, now: datetime) -> int:
        """How many snapshots are older than ``older_than`` and not among the newest ``retain_last``."""
        candidates = self.snapshot_times[: max(0, len(self.snapshot_times) - retain_last)]
        return sum(1 for at in candidates if now - at >= older_than)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["snapshot_times"]
        for key in ("last_compaction", "first_snapshot", "born"):
            out[key] = out[key].isoformat() if out[key] else None
        return out


def _total(summary: dict[str, str], key: str) -> int:
    value = summary.get(key, "0")
    return int(value) if value.isdigit() else 0


def _compaction(snapshot: Snapshot) -> bool:
    """A rewrite of data files: a ``replace`` that removed and added data files (not a manifest rewrite
    nor a clean-up of delete files, which are ``replace`` snapshots too)."""
    summary = snapshot.summary
    if summary is None or summary.operation != Operation.REPLACE:
        return False
    return _total(dict(summary.additional_properties), "deleted-data-files") > 0 and (
        _total(dict(summary.additional_properties), "added-data-files") > 0
    )


def _at(timestamp_ms: int) -> datetime:
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC)


def table_health(table: Table, identifier: str) -> TableHealth:
    metadata = table.metadata
    current = table.current_snapshot()
    summary: dict[str, str] = (
        dict(current.summary.additional_properties) if current and current.summary else {}
    )
    snapshots = sorted(metadata.snapshots, key=lambda s: s.sequence_number or 0)
    manifests = current.manifests(table.io) if current else []
    merge = ManifestMerge.of(table.properties)
    rewrites = [s for s in snapshots if _compaction(s)]
    last = rewrites[-1] if rewrites else None
    since = [s for s in snapshots if last is None or (s.sequence_number or 0) > (last.sequence_number or 0)]
    return TableHealth(
        table=identifier,
        snapshots=len(snapshots),
        data_files=_total(summary, "total-data-files"),
        delete_files=_total(summary, "total-delete-files"),
        equality_deletes=_total(summary, "total-equality-deletes"),
        position_deletes=_total(summary, "total-position-deletes"),
        records=_total(summary, "total-records"),
        data_bytes=_total(summary, "total-files-size"),
        manifests=len(manifests),
        manifests_to_rewrite=sum(merge.rewritable_manifest(m) for m in manifests),
        metadata_bytes=len(table.io.new_input(table.metadata_location)),
        commits_since_compaction=len(since),
        last_compaction=_at(last.timestamp_ms) if last else None,
        first_snapshot=_at(min(s.timestamp_ms for s in snapshots)) if snapshots else None,
        born=_born(table, snapshots),
        snapshot_times=tuple(sorted(_at(s.timestamp_ms) for s in _main_line(table))),
        gc_enabled=str(table.properties.get("gc.enabled", "true")).lower() != "false",
    )


def _born(table: Table, snapshots: list[Snapshot]) -> datetime | None:
    roots = [s.timestamp_ms for s in snapshots if s.parent_snapshot_id is None]
    if snapshots:
        return _at(min(roots)) if roots else None
    logged = [entry.timestamp_ms for entry in table.metadata.metadata_log]
    return _at(min([*logged, table.metadata.last_updated_ms]))


def _main_line(table: Table) -> list[Snapshot]:
    """The current snapshot and its ancestors (snapshots of other branches are not main's to expire)."""
    line: list[Snapshot] = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        line.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    return line
