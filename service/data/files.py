"""Parquet data files and equality-delete files for one batch, written where the rows are.

This module runs inside Spark's Python workers (through ``mapInArrow``): each task turns its share of
the batch's rows into files on the object store and hands back only their metadata. It leans on
pyiceberg for everything a table-aware writer must get right (field ids, partition values,
column statistics, file rolling at the target size) and adds the one thing pyiceberg does not do:
turning a key-only file into an equality-delete file.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyiceberg.io.pyarrow as pyiceberg_pyarrow
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import FixedType, IcebergType, ListType, TimeType, UUIDType

from service.data.position_deletes import deleted_keys, write_located
from service.model.datafile_json import to_json
from service.pyworker import freeze_survivors

# Column of the rows fed to the writer that says what a row is (see service.data.changes).
OP_COLUMN = "__icesink_op"
DELETE_OP = "d"

OUTPUT_SCHEMA = "content int, file string, located binary"
LOCATED = -1  # the content of write_partition's row that carries the located keys


class _Proxy:
    """Everything of the wrapped pyarrow object, with some of it replaced."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


class _Statistics(_Proxy):
    """A column chunk's statistics whose min and max of dates, times and timestamps are the stored
    integers (days, microseconds), which pyiceberg's ``to_bytes`` takes as they are: pyarrow turns them
    into Python ``date``/``datetime`` objects, which end at the year 9999 and start at 1, and raises
    for a BC timestamp or the date 5874897-12-31, failing the batch at every retry."""

    @property
    def min(self) -> Any:
        return self._wrapped.min_raw if self._temporal() else self._wrapped.min

    @property
    def max(self) -> Any:
        return self._wrapped.max_raw if self._temporal() else self._wrapped.max

    def _temporal(self) -> bool:
        return self._wrapped.logical_type.type in ("DATE", "TIME", "TIMESTAMP")


class _ColumnChunk(_Proxy):
    @property
    def statistics(self) -> Any:
        return _Statistics(self._wrapped.statistics)


class _RowGroup(_Proxy):
    def column(self, i: int) -> Any:
        return _ColumnChunk(self._wrapped.column(i))


class _FileMetaData(_Proxy):
    def row_group(self, i: int) -> Any:
        return _RowGroup(self._wrapped.row_group(i))


_pyiceberg_statistics = pyiceberg_pyarrow.data_file_statistics_from_parquet_metadata


def _statistics(parquet_metadata: Any, *args: Any, **kwargs: Any) -> Any:
    """pyiceberg's column statistics of a written file, over :class:`_Statistics`."""
    return _pyiceberg_statistics(_FileMetaData(parquet_metadata), *args, **kwargs)


# pyiceberg's Parquet writer looks the function up in its module when it closes a file.
pyiceberg_pyarrow.data_file_statistics_from_parquet_metadata = _statistics


def writable(metadata: TableMetadata) -> TableMetadata:
    """What a writer needs of a table's metadata: its current schema, its partition specs, properties
    and location; not its history (snapshots, their log, the metadata log, statistics).

    The history grows with every commit, and a write spec is pickled to every task of every batch:
    measured, 100 tables of 8 snapshots each were 945 KB to pickle and 57 ms to unpickle in each task
    of each batch; without their history 164 KB and 4.5 ms."""
    return metadata.model_copy(
        update={
            "schemas": [metadata.schema()],
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
        }
    )


@dataclass(frozen=True)
class WriteSpec:
    """Everything a Spark task needs to write files for one table; pickled to the executors
    (``metadata``: the table's, :func:`writable`)."""

    metadata: TableMetadata
    io_properties: dict[str, str]
    key: list[str]
    upsert: bool
    delete_spec_id: int | None
    writer_properties: dict[str, str] = field(default_factory=dict)
    # equality: an equality-delete file of the batch's keys; position: the data files' rows located
    # (service.data.position_deletes), the driver writes the position deletes from the key index
    delete_format: str = "equality"

    @property
    def positions(self) -> bool:
        return self.upsert and self.delete_format == "position"

    def data_metadata(self) -> TableMetadata:
        """The table's metadata with the sink's configured writer settings (compression, file size) on
        top: pyiceberg's writer reads its settings from the table's properties."""
        return self.metadata.model_copy(
            update={"properties": {**self.metadata.properties, **self.writer_properties}}
        )

    def delete_metadata(self) -> TableMetadata:
        """Metadata that makes pyiceberg write key-only files under the delete spec."""
        base = self.data_metadata()
        key_schema = base.schema().select(*self.key)
        return base.model_copy(
            update={
                "schemas": [key_schema],
                "current_schema_id": key_schema.schema_id,
                "default_spec_id": self.delete_spec_id,
            }
        )


_CONVERTED = (TimeType, FixedType, UUIDType)


def _converted(iceberg_type: IcebergType) -> bool:
    if isinstance(iceberg_type, ListType):
        return _converted(iceberg_type.element_type)
    return isinstance(iceberg_type, _CONVERTED)


def _to_table_type(column: pa.Array, iceberg_type: IcebergType) -> pa.Array:
    """One column's values as the Arrow type pyiceberg writes for ``iceberg_type`` (see
    :func:`_to_table_types`); a list's elements are converted the same way, in lists of the same shape."""
    if isinstance(iceberg_type, ListType):
        values = _to_table_type(pc.list_flatten(column), iceberg_type.element_type)
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
        return pa.ListArray.from_arrays(offsets, values, mask=pc.is_null(column))
    if isinstance(iceberg_type, TimeType):
        return column.cast(pa.time64("us"))
    if isinstance(iceberg_type, FixedType):
        return column.cast(pa.binary(len(iceberg_type)))
    if isinstance(iceberg_type, UUIDType):
        return pa.array(
            [None if v is None else uuid.UUID(v).bytes for v in column.to_pylist()], pa.binary(16)
        ).cast(pa.uuid())
    return column


def _to_table_types(batch: pa.Table, metadata: TableMetadata) -> pa.Table:
    """Spark has no TIME, UUID or fixed-length binary type: those columns (and list elements) arrive as
    int64 micros, text and binary; convert them (pyiceberg refuses binary for a ``fixed[n]`` column). The
    decoders have dead-lettered every fixed value of another length, so the cast can't fail on the
    records' account."""
    schema = metadata.schema()
    columns = []
    for name in batch.column_names:
        iceberg_type = schema.find_field(name).field_type
        column = batch[name]
        columns.append(
            _to_table_type(column.combine_chunks(), iceberg_type) if _converted(iceberg_type) else column
        )
    return pa.table(columns, names=batch.column_names)


def _as_equality_delete(data_file: DataFile, equality_ids: list[int], spec_id: int) -> DataFile:
    delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=data_file.file_path,
        file_format=data_file.file_format,
        partition=data_file.partition,
        record_count=data_file.record_count,
        file_size_in_bytes=data_file.file_size_in_bytes,
        column_sizes=data_file.column_sizes,
        value_counts=data_file.value_counts,
        null_value_counts=data_file.null_value_counts,
        nan_value_counts=data_file.nan_value_counts,
        lower_bounds=data_file.lower_bounds,
        upper_bounds=data_file.upper_bounds,
        split_offsets=data_file.split_offsets,
        equality_ids=equality_ids,
        sort_order_id=None,
        key_metadata=None,
    )
    delete_file.spec_id = spec_id
    return delete_file


_FILE_IOS: dict[tuple[str, tuple[tuple[str, str], ...]], FileIO] = {}
_FILE_IOS_LOCK = threading.Lock()
_MAX_FILE_IOS = 64


def file_io(spec: WriteSpec) -> FileIO:
    """The table's FileIO, one per process for the same properties: a FileIO builds its S3 client on
    first use (measured: 61 of them for one flush of 100 held tables, each a new client and
    connection), and a Spark worker writes batch after batch.

    The key is the string properties (credentials, vended ones included, and endpoints); values that
    are objects (a REST catalog's auth manager) are handed to the FileIO as they are but not keyed
    on: each task unpickles its own copy, which would make every task's key new."""
    scheme = spec.metadata.location.split("://", 1)[0] if "://" in spec.metadata.location else "file"
    key = (scheme, tuple(sorted((k, v) for k, v in spec.io_properties.items() if isinstance(v, str))))
    with _FILE_IOS_LOCK:
        io = _FILE_IOS.get(key)
        if io is None:
            if len(_FILE_IOS) >= _MAX_FILE_IOS:  # credentials vended anew: the oldest go
                del _FILE_IOS[next(iter(_FILE_IOS))]
            io = _FILE_IOS[key] = load_file_io(dict(spec.io_properties), spec.metadata.location)
        return io


@dataclass
class Written:
    """A task's files, and (``delete_format: position``) where each of its keys' rows now is."""

    data: list[DataFile] = field(default_factory=list)
    deletes: list[DataFile] = field(default_factory=list)
    located: pa.Table | None = None

    @property
    def files(self) -> list[DataFile]:
        return self.data + self.deletes


def write_files(spec: WriteSpec, rows: pa.Table) -> Written:
    """Write ``rows`` (table columns plus :data:`OP_COLUMN`): data files, and in upsert mode an
    equality-delete file of every key (``equality``) or every key located (``position``)."""
    io = file_io(spec)
    columns = [f.name for f in spec.metadata.schema().fields]
    written = Written()
    if rows.num_rows == 0:
        return written
    # One write id per kind of file: pyiceberg names files <task>-0-<write id>, counting tasks from 0
    # in each call, so a shared id would give a delete file and a data file the same path.
    removed = pc.equal(rows[OP_COLUMN], DELETE_OP)
    if spec.upsert and not spec.positions:
        if spec.delete_spec_id is None:
            raise ValueError("upsert mode needs a delete spec")
        metadata = spec.delete_metadata()
        keys = _to_table_types(rows.select(spec.key), metadata)
        equality_ids = [metadata.schema().find_field(k).field_id for k in spec.key]
        for f in _dataframe_to_data_files(metadata, keys, io, write_uuid=uuid.uuid4()):
            written.deletes.append(_as_equality_delete(f, equality_ids, spec.delete_spec_id))
    live = rows.filter(pc.invert(removed))
    metadata = spec.data_metadata()
    data = _to_table_types(live.select(columns), metadata) if live.num_rows else None
    if spec.positions:
        gone = deleted_keys(_to_table_types(rows.filter(removed).select(spec.key), metadata), spec.key)
        located = [gone]
        if data is not None:
            written.data, at = write_located(metadata, data, io, spec.key)
            located.append(at)
        written.located = pa.concat_tables(located)
    elif data is not None:
        for f in _dataframe_to_data_files(metadata, data, io, write_uuid=uuid.uuid4()):
            f.spec_id = metadata.default_spec_id  # DataFile.from_args drops spec_id
            written.data.append(f)
    return written


def ipc_bytes(table: pa.Table) -> bytes:
    """A table as Arrow IPC bytes, to hand back from a task."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def located_of(blobs: list[bytes]) -> pa.Table | None:
    """The located tables tasks handed back, as one (None when there are none)."""
    tables = [pa.ipc.open_stream(b).read_all() for b in blobs]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def write_partition(
    spec: WriteSpec, batches: Iterator[pa.RecordBatch], names: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: all rows of one Spark partition → one record batch of file metadata.
    ``names``: the rows' column names, for rows handed over under positional ones (see
    :func:`service.pipeline.table.positional`)."""
    freeze_survivors()
    collected = list(batches)
    if not collected:
        return
    rows = pa.Table.from_batches(collected)
    written = write_files(spec, rows.rename_columns(names) if names is not None else rows)
    files = written.files
    blob = ipc_bytes(written.located) if written.located is not None else None
    yield pa.RecordBatch.from_pydict(
        {
            "content": pa.array([int(f.content) for f in files] + ([LOCATED] if blob else []), pa.int32()),
            "file": pa.array([json.dumps(to_json(f)) for f in files] + ([""] if blob else []), pa.string()),
            "located": pa.array([None] * len(files) + ([blob] if blob else []), pa.binary()),
        }
    )
