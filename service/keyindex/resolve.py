"""A batch's changes → position-delete files, with the key index; and a commit's deletes resolved
again when the rows they name were moved meanwhile (a compaction committed first).

The deletes of a batch are resolved against the index as of a snapshot (``resolved_at``). Beside its
delete files the batch keeps one more file, its *position keys*: each deleted row's key, file and
position, and which delete file holds it. The plan in the txnlog names it, so whichever process
finishes the plan (this one, or a replica after a crash) can resolve the rows again from the table's
lineage alone, without an index: pyiceberg does not check, as Java's row delta does, that the data
files a position delete names are still live.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from service.data.position_deletes import (
    FILE_COLUMN,
    POS_COLUMN,
    read_located,
    write_position_deletes,
)
from service.keyindex.build import build
from service.keyindex.index import KeyIndex
from service.keyindex.lineage import changes, since

logger = logging.getLogger(__name__)

_DELETE_FILE = "__icesink_delete_file"  # which of the plan's delete files holds the row; -1: none yet


class PositionPlan(Protocol):
    """What :func:`refresh` reads of a table's plan (``service.commit.plan.PendingCommit``)."""

    delete_files: list[DataFile]
    position_keys: str | None
    resolved_at: int | None


@dataclass(frozen=True)
class Resolved:
    """A batch's position deletes: the delete files, and the file of their keys (None: no deletes)."""

    delete_files: list[DataFile]
    position_keys: str | None


def resolve(
    index: KeyIndex,
    table: Table,
    written: list[DataFile],
    located: pa.Table,
    writer_properties: Mapping[str, str] | None = None,
) -> Resolved:
    """Apply a batch's located keys to ``index`` and write the deletes of the rows they replace: one
    position-delete file per partition those rows live in (``writer_properties``: the sink's Parquet
    settings over the table's)."""
    old = index.apply(located, written)
    if not old.file_numbers:
        return Resolved([], None)
    named = sorted(set(old.file_numbers))  # the index knows every file it ever saw: only these
    slot = {n: i for i, n in enumerate(named)}
    paths = pa.DictionaryArray.from_arrays(
        pa.array([slot[n] for n in old.file_numbers], pa.int32()),
        pa.array([index.files[n].path for n in named], pa.string()),
    )
    rows = old.keys.append_column(FILE_COLUMN, paths.cast(pa.string()))
    rows = rows.append_column(POS_COLUMN, pa.array(old.positions, pa.int64()))
    places = {
        index.files[n].path: (index.files[n].spec_id, index.files[n].partition) for n in set(old.file_numbers)
    }
    return _write(table, rows, places, writer_properties=writer_properties)


def _write(
    table: Table,
    rows: pa.Table,
    places: dict[str, tuple[int, Record]],
    keep_keys: bool = True,
    writer_properties: Mapping[str, str] | None = None,
) -> Resolved:
    """The delete files of ``rows`` (key columns, file path, position), one per partition, and (with
    ``keep_keys``) the position-keys file that records them."""
    # Grouped by the partition of each row's file, vectorised: a batch deletes ~100,000 rows of a few
    # dozen files, and a Python loop over the rows cost more than the rest of the resolution.
    encoded = pc.dictionary_encode(rows[FILE_COLUMN]).combine_chunks()
    files = encoded.dictionary.to_pylist()
    groups: dict[tuple[int, tuple[object, ...]], int] = {}
    partitions: list[tuple[int, Record]] = []
    group_of_file = np.empty(len(files), np.int32)
    for i, path in enumerate(files):
        spec_id, partition = places[path]
        group = (spec_id, tuple(partition[j] for j in range(len(partition))))
        if group not in groups:
            groups[group] = len(partitions)
            partitions.append((spec_id, partition))
        group_of_file[i] = groups[group]
    ordinals = group_of_file[encoded.indices.to_numpy(zero_copy_only=False)]
    delete_files: list[DataFile] = []
    for ordinal, (spec_id, partition) in enumerate(partitions):
        part = rows.filter(pa.array(ordinals == ordinal))
        delete_files.append(
            write_position_deletes(
                table.io,
                table.metadata,
                part.select([FILE_COLUMN, POS_COLUMN]).rename_columns(["file_path", "pos"]),
                spec_id,
                partition,
                writer_properties,
            )
        )
    if not keep_keys:
        return Resolved(delete_files, None)
    keys = rows.append_column(_DELETE_FILE, pa.array(ordinals, pa.int32()))
    provider = load_location_provider(
        table_location=table.metadata.location, table_properties=table.metadata.properties
    )
    path = provider.new_data_location(f"{uuid.uuid4()}-position-keys.parquet")
    with table.io.new_output(path).create(overwrite=True) as stream:
        pq.write_table(keys, stream, compression="zstd")
    return Resolved(delete_files, path)


def refresh(
    table: Table,
    plan: PositionPlan,
    ours: Callable[[Snapshot], bool],
    beat: Callable[[], None] = lambda: None,
) -> Resolved | None:
    """The plan's deletes resolved again against ``table`` if a snapshot since ``plan.resolved_at``
    that is not the sink's own removed a data file they name; None if they still hold.

    Each such snapshot is followed in order (a row compacted twice moves twice): a deleted row whose
    file it removed is looked for, by its key, in the data files it added; a row found nowhere is gone
    already and needs no delete. When ``resolved_at`` is not in the lineage any more, the rows are
    found in a key index of the table built afresh."""
    assert plan.position_keys is not None
    after = since(table, plan.resolved_at)
    if after is not None:
        steps = [c for s in after if not ours(s) and (c := changes(table, s)).removed_data]
        if not steps:
            return None
    with table.io.new_input(plan.position_keys).open() as stream:
        rows = pq.ParquetFile(stream).read()
    key = [c for c in rows.column_names if c not in (FILE_COLUMN, POS_COLUMN, _DELETE_FILE)]
    places = {
        p: (f.spec_id, f.partition)
        for ordinal, f in enumerate(plan.delete_files)
        for p in rows.filter(pc.equal(rows[_DELETE_FILE], ordinal))[FILE_COLUMN].unique().to_pylist()
    }
    moved = 0
    if after is None:
        index = build(table, ".".join(table.name()), key, beat)
        located = index.locate(rows.select(key))
        moved = rows.num_rows
        rows = located
        places.update({f.path: (f.spec_id, f.partition) for f in index.files})
    else:
        for step in steps:
            removed = pa.array(sorted(f.file_path for f in step.removed_data), pa.string())
            stale = pc.is_in(rows[FILE_COLUMN], value_set=removed)
            count = pc.sum(stale).as_py() or 0
            if not count:
                continue
            moved += count
            added = []
            for f in step.added_data:
                added.append(read_located(table.io, f.file_path, key))
                beat()
            found = pa.concat_tables(added).cast(_located_schema(rows, key)) if added else None
            kept = rows.filter(pc.invert(stale))
            relocated = (
                rows.filter(stale).select(key).join(found, keys=key, join_type="inner", use_threads=False)
                if found is not None
                else rows.filter(pa.array([False] * rows.num_rows))
            )
            rows = pa.concat_tables(
                [
                    kept.select([*key, FILE_COLUMN, POS_COLUMN]),
                    relocated.select([*key, FILE_COLUMN, POS_COLUMN]),
                ]
            )
            places.update({f.file_path: (f.spec_id, f.partition) for f in step.added_data})
        if not moved:
            return None
    logger.info(
        "position deletes of %s: %d row(s) were moved by another commit since snapshot %s; resolved again",
        ".".join(table.name()),
        moved,
        plan.resolved_at,
    )
    if rows.num_rows == 0:
        return Resolved([], None)
    return _write(table, rows.select([*key, FILE_COLUMN, POS_COLUMN]), places, keep_keys=False)


def _located_schema(rows: pa.Table, key: list[str]) -> pa.Schema:
    return pa.schema(
        [rows.schema.field(k) for k in key]
        + [pa.field(FILE_COLUMN, pa.string()), pa.field(POS_COLUMN, pa.int64())]
    )
