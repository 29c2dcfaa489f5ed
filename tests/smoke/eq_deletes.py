"""A deliberately tiny equality-delete committer, independent of the service's writer.

It exists so the reference readers can be shown to honour equality deletes (Spark writes only position
deletes, pyiceberg writes none). Unpartitioned v2 tables only: one Parquet file of key values, one
delete manifest, one snapshot on top of the current one.
"""

from __future__ import annotations

import random
import uuid
from typing import cast

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    AvroCompressionCodec,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType


class _DeleteManifestWriter(ManifestWriterV2):
    """v2 manifest of delete files. pyiceberg types `equality_ids` as list<long>; the spec (and Java's
    reader) wants list<int>, so that one field of the manifest schema is corrected."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        schema = super()._with_partition(format_version)
        fields = []
        for f in schema.fields:
            if f.field_id == 2 and isinstance(f.field_type, StructType):
                inner = [
                    NestedField(
                        135, g.name, ListType(136, IntegerType(), element_required=True), required=False
                    )
                    if g.field_id == 135
                    else g
                    for g in f.field_type.fields
                ]
                f = NestedField(f.field_id, f.name, StructType(*inner), required=f.required)
            fields.append(f)
        return Schema(*fields)


def commit_equality_deletes(table: Table, keys: pa.Table) -> int:
    """Delete every row whose key columns (the columns of `keys`) equal a row of `keys`; returns the
    new snapshot id."""
    metadata = table.metadata
    if metadata.format_version < 2 or not metadata.spec().is_unpartitioned():
        raise ValueError("this helper handles unpartitioned v2 tables only")
    key_schema = table.schema().select(*keys.column_names)
    arrow_schema = schema_to_pyarrow(key_schema)  # carries the Parquet field ids
    path = table.location_provider().new_data_location(f"eq-delete-{uuid.uuid4()}.parquet")
    with (
        table.io.new_output(path).create(overwrite=True) as out,
        pq.ParquetWriter(out, arrow_schema) as writer,
    ):
        writer.write_table(keys.select(arrow_schema.names).cast(arrow_schema))
    infile = table.io.new_input(path)
    with infile.open() as fh:
        parquet_meta = pq.ParquetFile(fh).metadata
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_meta,
        stats_columns=compute_statistics_plan(key_schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(key_schema),
    )
    delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=len(infile),
        sort_order_id=None,
        equality_ids=[f.field_id for f in key_schema.fields],
        key_metadata=None,
        **stats.to_serialized_dict(),
    )
    delete_file.spec_id = metadata.default_spec_id  # from_args drops it

    # pyiceberg's default (gzip) for manifests: DuckDB's avro reader does not know zstandard.
    codec = cast(
        AvroCompressionCodec,
        metadata.properties.get(
            TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
        ),
    )
    snapshot_id = random.getrandbits(62)
    parent = metadata.current_snapshot()
    commit_uuid = uuid.uuid4()
    manifest_path = table.location_provider().new_metadata_location(f"{commit_uuid}-m0.avro")
    with _DeleteManifestWriter(
        spec=metadata.spec(),
        schema=metadata.schema(),
        output_file=table.io.new_output(manifest_path),
        snapshot_id=snapshot_id,
        avro_compression=codec,
    ) as manifest_writer:
        manifest_writer.add_entry(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.ADDED,
                snapshot_id=snapshot_id,
                sequence_number=None,
                file_sequence_number=None,
                data_file=delete_file,
            )
        )
    manifests = [manifest_writer.to_manifest_file()]
    if parent is not None:
        manifests += parent.manifests(io=table.io)

    sequence_number = metadata.next_sequence_number()
    list_path = table.location_provider().new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    with write_manifest_list(
        format_version=2,
        output_file=table.io.new_output(list_path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent else None,
        sequence_number=sequence_number,
        avro_compression=codec,
    ) as list_writer:
        list_writer.add_manifests(manifests)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent else None,
        sequence_number=sequence_number,
        manifest_list=list_path,
        summary=Summary(
            operation=Operation.DELETE,
            **{"added-delete-files": "1", "added-equality-deletes": str(keys.num_rows)},
        ),
        schema_id=metadata.current_schema_id,
    )
    table.catalog.commit_table(
        table,
        requirements=(
            AssertRefSnapshotId(snapshot_id=parent.snapshot_id if parent else None, ref=MAIN_BRANCH),
        ),
        updates=(
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(  # type: ignore[call-arg]
                snapshot_id=snapshot_id,
                parent_snapshot_id=parent.snapshot_id if parent else None,
                ref_name=MAIN_BRANCH,
                type=SnapshotRefType.BRANCH,
            ),
        ),
    )
    return snapshot_id
