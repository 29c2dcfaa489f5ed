"""What a table's snapshots since a given one did to its data files: the steps the key index and a
commit's deletes follow (a compaction replaces files; the sink's own commits only add)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot


def since(table: Table, snapshot_id: int | None) -> list[Snapshot] | None:
    """The snapshots of the main branch after ``snapshot_id``, oldest first; None if ``snapshot_id`` is
    not an ancestor of the current one (rolled back, or expired out of the lineage)."""
    found: list[Snapshot] = []
    current = table.current_snapshot()
    while current is not None and current.snapshot_id != snapshot_id:
        found.append(current)
        parent = current.parent_snapshot_id
        current = table.metadata.snapshot_by_id(parent) if parent is not None else None
    if current is None and snapshot_id is not None:
        return None
    return found[::-1]


@dataclass
class SnapshotChanges:
    """The files one snapshot added and removed."""

    added_data: list[DataFile] = field(default_factory=list)
    removed_data: list[DataFile] = field(default_factory=list)
    added_position_deletes: list[DataFile] = field(default_factory=list)
    added_equality_deletes: list[DataFile] = field(default_factory=list)

    @property
    def replaces_data(self) -> bool:
        """Rows moved between data files (a compaction) and nothing else changed the live rows."""
        return bool(self.removed_data) and not self.added_equality_deletes and not self.added_position_deletes

    @property
    def keeps_rows(self) -> bool:
        """No live row changed place: only delete files were rewritten or dropped (or nothing)."""
        return not (self.added_data or self.removed_data or self.added_equality_deletes)


def changes(table: Table, snapshot: Snapshot) -> SnapshotChanges:
    """The entries ``snapshot`` itself wrote (added or deleted in it), from its manifests."""
    out = SnapshotChanges()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.snapshot_id != snapshot.snapshot_id or entry.status == ManifestEntryStatus.EXISTING:
                continue
            f = entry.data_file
            f.spec_id = manifest.partition_spec_id
            added = entry.status == ManifestEntryStatus.ADDED
            if f.content == DataFileContent.DATA:
                (out.added_data if added else out.removed_data).append(f)
            elif added and f.content == DataFileContent.POSITION_DELETES:
                out.added_position_deletes.append(f)
            elif added:
                out.added_equality_deletes.append(f)
    return out
