"""Where each key's row is, and Iceberg v2 position-delete files that name such rows.

A table in ``delete_format: position`` is written so that the sink knows the file and row position
of every key's live row (:func:`write_located`): a later change of the key deletes exactly that row,
with a position-delete file (:func:`write_position_deletes`) that every engine reads (pyiceberg and
Snowflake read no equality deletes).

The Iceberg rules that shape the files (spec, "Position Delete Files"): columns ``file_path``
(string, field id 2147483546) and ``pos`` (long, 2147483545), rows sorted by path then position; a
delete file applies only to data files of its own partition (spec and values) with a data sequence
number at most its own, so one delete file is written per partition the old rows live in; its
``file_path`` bounds are the full paths (never truncated), which is how Java's and pyiceberg's
delete indexes match a delete file to the data files it may name.

Keys are compared in one canonical form (:func:`canonical_keys`), whether they come from a task
that just wrote them or from a Parquet file read back, so the two always agree.
"""

from __future__ import annotations

import itertools
import struct
import uuid
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    _determine_partitions,
    _get_parquet_writer_kwargs,
    bin_pack_arrow_table,
    pyarrow_to_schema,
    write_file,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import TableProperties, WriteTask
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.utils.properties import property_as_int

FILE_PATH_ID = 2147483546
POS_ID = 2147483545
# The columns of a located table beside the key's: where the key's row now is (null: deleted).
FILE_COLUMN = "__icesink_file"
POS_COLUMN = "__icesink_pos"

POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID)}),
    ]
)


def canonical(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """One key column in the form both sides of a comparison share: temporal values as their stored
    integers, UUID and fixed-length values as plain binary, large strings and binaries as plain ones,
    numbers at their widest (a key column widened since a file was written reads back narrower)."""
    kind = column.type
    if isinstance(kind, pa.BaseExtensionType):  # pa.uuid() is one, not a pa.ExtensionType
        column = column.cast(kind.storage_type)
        kind = column.type
    if pa.types.is_date32(kind):
        return column.cast(pa.int32()).cast(pa.int64())
    if pa.types.is_timestamp(kind) or pa.types.is_time(kind) or pa.types.is_date64(kind):
        return column.cast(pa.int64())
    if pa.types.is_fixed_size_binary(kind) or pa.types.is_large_binary(kind):
        return column.cast(pa.binary())
    if pa.types.is_large_string(kind):
        return column.cast(pa.string())
    # A key column widened by schema evolution (int -> long, float -> double, a larger decimal
    # precision): files written before and after must give the same values.
    if pa.types.is_integer(kind):
        return column.cast(pa.int64())
    if pa.types.is_floating(kind):
        return column.cast(pa.float64())
    if pa.types.is_decimal(kind):
        return column.cast(pa.decimal128(38, kind.scale))
    return column


def canonical_keys(table: pa.Table, key: list[str]) -> list[Hashable]:
    """The key of each row as one hashable value: the column's value for a one-column key, a tuple of
    them otherwise."""
    columns = [canonical(table[name]).to_pylist() for name in key]
    if len(columns) == 1:
        return columns[0]
    return list(zip(*columns, strict=True))


def canonical_table(table: pa.Table, key: list[str]) -> pa.Table:
    """The key columns of ``table`` in their canonical form (for a file that carries keys)."""
    return pa.table([canonical(table[name]) for name in key], names=key)


def write_located(
    metadata: TableMetadata, data: pa.Table, io: FileIO, key: list[str]
) -> tuple[list[DataFile], pa.Table]:
    """Write ``data`` as data files of the table, as pyiceberg would (its partitioning, file rolling,
    statistics and names), and say where each row went: the key columns, the file path and the
    row's position in it.

    pyiceberg's ``_dataframe_to_data_files`` does not tell which row landed where; the same steps are
    taken here with each file's rows known in order (a file is its task's record batches, written in
    that order)."""
    target = property_as_int(
        metadata.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    assert target is not None
    task_schema = pyarrow_to_schema(
        data.schema, name_mapping=metadata.schema().name_mapping, format_version=metadata.format_version
    )
    spec = metadata.spec()
    groups: Iterable[tuple[Any, pa.Table]] = (
        [(None, data)]
        if spec.is_unpartitioned()
        else (
            (p.partition_key, p.arrow_table_partition)
            for p in _determine_partitions(spec=spec, schema=metadata.schema(), arrow_table=data)
        )
    )
    write_uuid, counter = uuid.uuid4(), itertools.count(0)
    tasks: list[WriteTask] = []
    keys: list[pa.Table] = []
    for partition_key, rows in groups:
        for batches in bin_pack_arrow_table(rows, target):
            tasks.append(
                WriteTask(
                    write_uuid=write_uuid,
                    task_id=next(counter),
                    record_batches=batches,
                    partition_key=partition_key,
                    schema=task_schema,
                )
            )
            keys.append(pa.Table.from_batches(batches).select(key))
    files = list(write_file(io=io, table_metadata=metadata, tasks=iter(tasks)))
    located = [
        located_rows(canonical_table(k, key), f.file_path, pa.array(np.arange(k.num_rows), pa.int64()))
        for k, f in zip(keys, files, strict=True)
    ]
    for f in files:
        f.spec_id = metadata.default_spec_id  # DataFile.from_args drops spec_id
    return files, pa.concat_tables(located) if located else located_rows(pa.table({k: [] for k in key}))


def located_rows(keys: pa.Table, path: str | None = None, positions: pa.Array | None = None) -> pa.Table:
    """A located table: ``keys`` (canonical) with the file and position of their rows; no path: the
    keys were deleted."""
    n = keys.num_rows
    # One path for all the rows: a dictionary of one value (located tables travel from the tasks).
    paths = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, np.int32)) if path is not None else pa.nulls(n, pa.int32()),
        pa.array([path] if path is not None else [], pa.string()),
    )
    return keys.append_column(FILE_COLUMN, paths).append_column(
        POS_COLUMN, positions if positions is not None else pa.nulls(n, pa.int64())
    )


def deleted_keys(keys: pa.Table, key: list[str]) -> pa.Table:
    """The located rows of keys whose last change deletes them."""
    return located_rows(canonical_table(keys, key))


def write_position_deletes(
    io: FileIO,
    metadata: TableMetadata,
    rows: pa.Table,
    spec_id: int,
    partition: Record,
    writer_properties: Mapping[str, str] | None = None,
) -> DataFile:
    """One position-delete file of ``rows`` (``file_path``, ``pos``), all in one partition, with the
    table's Parquet settings (``writer_properties``, the sink's ``write`` section, on top)."""
    ordered = rows.select(["file_path", "pos"]).sort_by([("file_path", "ascending"), ("pos", "ascending")])
    ordered = pa.table(
        [ordered["file_path"].cast(pa.string()), ordered["pos"].cast(pa.int64())],
        schema=POSITION_DELETE_SCHEMA,
    )
    provider = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
    path = provider.new_data_location(f"{uuid.uuid4()}-position-deletes.parquet")
    output = io.new_output(path)
    with output.create(overwrite=True) as stream:
        pq.write_table(
            ordered,
            stream,
            **_get_parquet_writer_kwargs({**metadata.properties, **(writer_properties or {})}),
        )
    paths, positions = ordered["file_path"], ordered["pos"]
    n = ordered.num_rows
    first_path, last_path = paths[0].as_py(), paths[n - 1].as_py()
    bounds = pc.min_max(positions)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=n,
        file_size_in_bytes=len(io.new_input(path)),
        value_counts={FILE_PATH_ID: n, POS_ID: n},
        null_value_counts={FILE_PATH_ID: 0, POS_ID: 0},
        lower_bounds={
            FILE_PATH_ID: first_path.encode(),
            POS_ID: struct.pack("<q", bounds["min"].as_py()),
        },
        upper_bounds={
            FILE_PATH_ID: last_path.encode(),
            POS_ID: struct.pack("<q", bounds["max"].as_py()),
        },
        equality_ids=None,
        sort_order_id=None,
        key_metadata=None,
    )
    delete_file.spec_id = spec_id
    return delete_file


def read_columns(io: FileIO, path: str, columns: list[str]) -> pa.Table:
    """Some columns of one Parquet file."""
    with io.new_input(path).open() as stream:
        return pq.ParquetFile(stream).read(columns=columns)


def read_located(io: FileIO, path: str, key: list[str]) -> pa.Table:
    """A data file's keys (canonical) with their rows' positions (a located table). Key columns are
    read by name: a renamed key column is not found."""
    keys = read_columns(io, path, key)
    return located_rows(canonical_table(keys, key), path, pa.array(np.arange(keys.num_rows), pa.int64()))
