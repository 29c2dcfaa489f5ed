"""One Iceberg snapshot that adds data files and equality-delete files together (a "row delta").

pyiceberg's own producers (fast append, overwrite) write only data manifests and retry a failed commit
by re-parenting it onto whatever is current. A sink can't allow either: an upsert needs a delete
manifest in the same snapshot as the new rows (so the deletes get the same sequence number and apply
only to older rows), and a commit whose outcome is unknown must be checked, not repeated. So this
producer builds the snapshot for an explicit parent and a caller-chosen snapshot id, and commits it
with exactly one request guarded by ``AssertRefSnapshotId``; deciding what to do after a failure is
the caller's job (see :mod:`service.commit.committer`). Table properties given with the snapshot are
set by the same request, so they land if and only if the snapshot does.

Like Java's row delta, it merges small data manifests as it commits (:class:`ManifestMerge`): a sink
that added a manifest per commit left a table that readers plan slowly between compactions (DuckDB
reads every manifest of the snapshot, ~0.6 ms each, more than a small data file costs it).
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)
from pyiceberg.typedef import TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

CommitRequest = tuple[tuple[TableUpdate, ...], tuple[AssertRefSnapshotId]]


@dataclass(frozen=True)
class ManifestMerge:
    """Which of the parent's data manifests of one spec a commit rewrites together with its new
    files, as Java's ``MergingSnapshotProducer`` does, by the same table properties
    (``commit.manifest-merge.enabled``, ``commit.manifest.min-count-to-merge``,
    ``commit.manifest.target-size-bytes``) but with defaults for a table committed every second or
    so: merge at 2 manifests, at most 64 KiB of them (~190 files, ~20 ms in pyiceberg), where Java
    merges at 100 up to 8 MiB. Every commit writes the merged manifest anew and keeps the old ones
    for as long as its snapshots live, so the bound is what a commit costs in time and in the object
    store on a table no compaction keeps small; on a compacted table the merged manifest stays at a
    few files. Java's own commits (the maintainer's) keep Java's defaults: with these set on the
    table for them too, a soak's compactions lost long series of commit tries to the sink
    (docs/performance.md, "Manifests")."""

    enabled: bool = True
    min_count: int = 2
    target_bytes: int = 64 * 1024

    @classmethod
    def of(cls, properties: Mapping[str, str]) -> ManifestMerge:
        def number(name: str, default: int) -> int:
            text = properties.get(name, str(default))
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"table property {name} must be a whole number, not {text!r}") from None

        enabled = properties.get(TableProperties.MANIFEST_MERGE_ENABLED, "true").strip().lower() == "true"
        return cls(
            enabled=enabled,
            min_count=number(TableProperties.MANIFEST_MIN_MERGE_COUNT, cls.min_count),
            target_bytes=number(TableProperties.MANIFEST_TARGET_SIZE_BYTES, cls.target_bytes),
        )

    def pick(self, candidates: list[ManifestFile]) -> list[ManifestFile]:
        """The manifests (of one content and spec) to merge with a commit's new one: the smallest
        first, while together they stay within ``target_bytes``; none unless the new one and these
        make ``min_count``."""
        if not self.enabled:
            return []
        picked: list[ManifestFile] = []
        total = 0
        for m in sorted(candidates, key=lambda m: m.manifest_length):
            if total + m.manifest_length > self.target_bytes:
                break
            picked.append(m)
            total += m.manifest_length
        return picked if len(picked) + 1 >= max(self.min_count, 2) else []

    def rewritable(self, deletes: bool, length: int, live: bool) -> bool:
        """Whether another writer's rewrite of a manifest (``icesink maintain``'s) can't race this
        merge: the sink's next commit may merge a data manifest within ``target_bytes`` into a new
        one, and a rewrite that deleted it would fail its retry. Larger data manifests the sink never
        rewrites, nor delete manifests but when it merges position-delete files, which it does not
        while the maintainer holds the table's turn (:mod:`service.commit.turns`); a manifest of
        removed entries only (``live`` false) it drops at its next commit, so it is left to that."""
        return live and (not self.enabled or deletes or length > self.target_bytes)

    def rewritable_manifest(self, manifest: ManifestFile) -> bool:
        """:meth:`rewritable` for a manifest of the table's current snapshot."""
        return self.rewritable(
            manifest.content == ManifestContent.DELETES,
            manifest.manifest_length,
            manifest.has_added_files() or manifest.has_existing_files(),
        )


class DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest whose entries are delete files (manifest content ``deletes``).

    pyiceberg declares ``equality_ids`` as ``list<long>``; the spec (and Java's reader, which fails on
    longs) says ``list<int>``, so the delete manifest's schema is corrected here.
    """

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    def _with_partition(self, format_version: TableVersion) -> Schema:
        schema = super()._with_partition(format_version)
        return Schema(*[_with_int_equality_ids(f) if f.field_id == 2 else f for f in schema.fields])

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def _with_int_equality_ids(data_file_field: NestedField) -> NestedField:
    struct = data_file_field.field_type
    assert isinstance(struct, StructType)
    fields = [
        NestedField(
            field_id=f.field_id,
            name=f.name,
            field_type=ListType(element_id=136, element_type=IntegerType(), element_required=True),
            required=f.required,
            doc=f.doc,
        )
        if f.field_id == 135
        else f
        for f in struct.fields
    ]
    return NestedField(
        field_id=data_file_field.field_id,
        name=data_file_field.name,
        field_type=StructType(*fields),
        required=data_file_field.required,
    )


class RowDelta:
    """Builds the snapshot; :meth:`request` returns the updates and requirements for ``commit_table``.

    The steps a subclass may want to change are :meth:`operation`, :meth:`manifests` and :meth:`summary`.
    """

    def __init__(
        self,
        table: Table,
        snapshot_id: int,
        data_files: Iterable[DataFile],
        delete_files: Iterable[DataFile],
        properties: dict[str, str],
        branch: str = MAIN_BRANCH,
        table_properties: dict[str, str] | None = None,
        removed_deletes: Iterable[str] = (),
    ) -> None:
        """``removed_deletes``: paths of live delete files this snapshot removes (merged into one of
        ``delete_files``: :mod:`service.keyindex.merge`)."""
        self._table = table
        self._metadata: TableMetadata = table.metadata
        self._io: FileIO = table.io
        self.snapshot_id = snapshot_id
        self.data_files = list(data_files)
        self.delete_files = list(delete_files)
        for f in self.delete_files:
            if f.content == DataFileContent.DATA:
                raise ValueError(f"{f.file_path} is a data file, not a delete file")
        paths = [f.file_path for f in itertools.chain(self.data_files, self.delete_files)]
        if len(paths) != len(set(paths)):
            raise ValueError(
                f"a file is listed twice in one commit: {sorted(p for p in paths if paths.count(p) > 1)}"
            )
        self.removed_deletes = set(removed_deletes)
        self._removed: list[DataFile] = []  # the removed files' entries, as the manifests are written
        self.properties = properties
        self.table_properties = table_properties or {}
        self.branch = branch
        parent = self._metadata.snapshot_by_name(branch)
        self.parent_snapshot_id: int | None = parent.snapshot_id if parent else None
        self._commit_uuid = uuid.uuid4()
        self._counter = itertools.count(0)
        self._compression = cast(
            AvroCompressionCodec,
            self._metadata.properties.get(
                TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
            ),
        )
        self.written_metadata_files: list[str] = []
        self.merge = ManifestMerge.of(self._metadata.properties)

    # -- overridable steps -------------------------------------------------------------------------

    def operation(self) -> Operation:
        """``append`` when only rows are added; ``overwrite`` when deletes come with them (as Java's RowDelta)."""
        return Operation.OVERWRITE if self.delete_files else Operation.APPEND

    def manifests(self) -> list[ManifestFile]:
        """Per spec, a manifest of the new data files, merged with those of the parent's data
        manifests of that spec :class:`ManifestMerge` picks, and one of the new delete files, with
        the entries of the delete manifests that hold a removed delete file (removed, or carried
        over); then the parent's other live manifests.

        Other delete manifests stay as they are because of a compaction's retries in Iceberg (1.11):
        when a commit try of ``rewrite_data_files`` loses to the sink, the delete files that try found
        obsolete become files the next try must remove, and the next try looks for them only in the
        delete manifests it has already read; a delete manifest rewritten meanwhile hides them and the
        compaction fails ("Missing required files to delete"). Rewritten data manifests are found.
        The sink rewrites a delete manifest only when it merges delete files, and not while
        ``icesink maintain`` compacts the table (:mod:`service.commit.turns`)."""
        self._removed = []
        existing = self._existing_manifests()
        holding = self._holding_removed(existing)
        new: list[ManifestFile] = []
        merged: set[str] = {m.manifest_path for m in holding}
        for content, files in (
            (ManifestContent.DATA, self.data_files),
            (ManifestContent.DELETES, self.delete_files),
        ):
            by_spec: dict[int, list[DataFile]] = defaultdict(list)
            for f in files:
                by_spec[f.spec_id].append(f)
            if content == ManifestContent.DELETES:
                for m in holding:
                    by_spec.setdefault(m.partition_spec_id, [])
            for spec_id, group in sorted(by_spec.items()):
                small = (
                    self.merge.pick(
                        [m for m in existing if m.content == content and m.partition_spec_id == spec_id]
                    )
                    if content == ManifestContent.DATA
                    else [m for m in holding if m.partition_spec_id == spec_id]
                )
                new.append(self._write(spec_id, content, group, small))
                merged.update(m.manifest_path for m in small)
        return new + [m for m in existing if m.manifest_path not in merged]

    def _holding_removed(self, existing: list[ManifestFile]) -> list[ManifestFile]:
        """The parent's delete manifests that hold a delete file this snapshot removes."""
        if not self.removed_deletes:
            return []
        holding: list[ManifestFile] = []
        found: set[str] = set()
        for m in existing:
            if m.content != ManifestContent.DELETES:
                continue
            paths = {e.data_file.file_path for e in m.fetch_manifest_entry(self._io, discard_deleted=True)}
            if paths & self.removed_deletes:
                holding.append(m)
                found |= paths & self.removed_deletes
        if missing := self.removed_deletes - found:
            raise ValueError(f"delete files to remove are not live in the parent snapshot: {sorted(missing)}")
        return holding

    def summary(self) -> Summary:
        schema = self._metadata.schema()
        specs = self._metadata.specs()
        collector = SnapshotSummaryCollector(
            partition_summary_limit=int(
                self._metadata.properties.get(
                    TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                    TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
                )
            )
        )
        for f in itertools.chain(self.data_files, self.delete_files):
            collector.add_file(f, schema=schema, partition_spec=specs[f.spec_id])
        for f in self._removed:
            collector.remove_file(f, schema=schema, partition_spec=specs[f.spec_id])
        parent = self._metadata.snapshot_by_id(self.parent_snapshot_id) if self.parent_snapshot_id else None
        return update_snapshot_summaries(
            summary=Summary(operation=self.operation(), **collector.build(), **self.properties),
            previous_summary=parent.summary if parent else None,
        )

    # -- the request ---------------------------------------------------------------------------------

    def request(self) -> CommitRequest:
        manifests = self.manifests()
        sequence_number = self._metadata.next_sequence_number()
        list_path = self._table.location_provider().new_metadata_location(
            f"snap-{self.snapshot_id}-0-{self._commit_uuid}.avro"
        )
        self.written_metadata_files.append(list_path)
        with write_manifest_list(
            format_version=self._metadata.format_version,
            output_file=self._io.new_output(list_path),
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.parent_snapshot_id,
            sequence_number=sequence_number,
            avro_compression=self._compression,
        ) as writer:
            writer.add_manifests(manifests)
        snapshot = Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.parent_snapshot_id,
            manifest_list=list_path,
            sequence_number=sequence_number,
            summary=self.summary(),
            schema_id=self._metadata.current_schema_id,
        )
        updates: tuple[TableUpdate, ...] = (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(
                snapshot_id=self.snapshot_id,
                parent_snapshot_id=self.parent_snapshot_id,
                ref_name=self.branch,
                type=SnapshotRefType.BRANCH,
                max_ref_age_ms=None,
                max_snapshot_age_ms=None,
                min_snapshots_to_keep=None,
            ),
        )
        if self.table_properties:
            updates += (SetPropertiesUpdate(updates=self.table_properties),)
        requirements = (AssertRefSnapshotId(snapshot_id=self.parent_snapshot_id, ref=self.branch),)
        return updates, requirements

    def commit(self) -> Table:
        """Send the commit once; the table as the catalog's answer has it (the new snapshot current).
        Raises whatever the catalog raises; nothing is retried here."""
        updates, requirements = self.request()
        response = self._table.catalog.commit_table(self._table, requirements, updates)
        return Table(
            self._table.name(),
            metadata=response.metadata,
            metadata_location=response.metadata_location,
            io=self._table.io,
            catalog=self._table.catalog,
        )

    # -- helpers -------------------------------------------------------------------------------------

    def _writer(self, spec: PartitionSpec, schema: Schema, content: ManifestContent) -> ManifestWriter:
        path = self._table.location_provider().new_metadata_location(
            f"{self._commit_uuid}-m{next(self._counter)}.avro"
        )
        self.written_metadata_files.append(path)
        writer_type = DeleteManifestWriter if content == ManifestContent.DELETES else ManifestWriterV2
        return writer_type(
            spec=spec,
            schema=schema,
            output_file=self._io.new_output(path),
            snapshot_id=self.snapshot_id,
            avro_compression=self._compression,
        )

    def _write(
        self, spec_id: int, content: ManifestContent, files: list[DataFile], merge: list[ManifestFile]
    ) -> ManifestFile:
        """One manifest: ``files`` added by this snapshot, then the live entries of ``merge`` as
        existing ones (their snapshot and sequence numbers kept: an equality delete applies by the
        data sequence number, so a merged entry must not change it)."""
        with self._writer(self._metadata.specs()[spec_id], self._metadata.schema(), content) as writer:
            for f in files:
                writer.add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self.snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=f,
                    )
                )
            for manifest in merge:
                for entry in manifest.fetch_manifest_entry(self._io, discard_deleted=True):
                    if entry.data_file.file_path in self.removed_deletes:
                        entry.data_file.spec_id = spec_id
                        self._removed.append(entry.data_file)
                        writer.delete(entry)
                    else:
                        writer.existing(entry)
        return writer.to_manifest_file()

    def _existing_manifests(self) -> list[ManifestFile]:
        if self.parent_snapshot_id is None:
            return []
        parent = self._metadata.snapshot_by_id(self.parent_snapshot_id)
        if parent is None:
            raise ValueError(f"parent snapshot {self.parent_snapshot_id} is not in the table metadata")
        return [m for m in parent.manifests(io=self._io) if m.has_added_files() or m.has_existing_files()]
