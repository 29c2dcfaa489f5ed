"""A table's position-delete files kept few: a commit whose partition would hold more than
:data:`MAX_FILES` of them merges the smallest into one, in the same snapshot.

Why: each commit adds a delete file per partition it touched, naming rows of many data files, so
their ``file_path`` bounds span most of the partition and a reader matches every data file with
nearly every delete file; and each commit's delete manifest stays (delete manifests are never
merged). Without compaction a scan paid for every commit: after 600 commits DuckDB read the table in
17.9x, Spark in 4.1x the time of its live data files alone (docs/performance.md). Merged, a partition
holds at most :data:`MAX_FILES` delete files and the table about as many delete manifests, whatever
the number of commits; the merges are size-tiered (:func:`pick`), so a position is rewritten a few
times (log2 of the partition's deletes at most), not at every commit.

The merge is decided at each commit attempt, from the table the attempt commits to, under the
txnlog row's lock like the rest of the attempt (:mod:`service.commit.committer`); it is not part of
the plan, so a plan finished after a crash merges against the table as it then is. A merged file an
attempt wrote is discarded if the attempt fails, and the plan's own delete files it merged are
deleted once the plan is committed (until then a replica finishing the plan may still need them).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.table import Table

from service.data.position_deletes import POSITION_DELETE_SCHEMA, read_columns, write_position_deletes

logger = logging.getLogger(__name__)

MAX_FILES = 8  # position-delete files per partition after a commit

PartitionKey = tuple[int, tuple[object, ...]]


def partition_key(f: DataFile) -> PartitionKey:
    return f.spec_id, tuple(f.partition[i] for i in range(len(f.partition)))


@dataclass
class DeleteMerge:
    """What a commit attempt adds and removes instead of its plan's delete files."""

    add: list[DataFile] = field(default_factory=list)  # delete files to add (merged ones and the rest)
    remove: set[str] = field(default_factory=set)  # live delete files the merged ones replace
    written: list[str] = field(default_factory=list)  # merged files this attempt wrote
    merged_away: list[str] = field(default_factory=list)  # the plan's own files it does not commit


def live_position_deletes(table: Table) -> dict[PartitionKey, list[DataFile]]:
    """The current snapshot's live position-delete files by partition (delete manifests only)."""
    found: dict[PartitionKey, list[DataFile]] = defaultdict(list)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return found
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            if f.content == DataFileContent.POSITION_DELETES:
                f.spec_id = manifest.partition_spec_id
                found[partition_key(f)].append(f)
    return found


def merge_deletes(
    table: Table,
    new: list[DataFile],
    writer_properties: Mapping[str, str] | None = None,
    beat: Callable[[], None] = lambda: None,
) -> DeleteMerge:
    """The delete files to commit for ``new`` (a plan's position and equality delete files): where a
    partition would hold more than :data:`MAX_FILES` position-delete files, its smallest are merged
    (:func:`pick`). ``beat`` is called after each file read."""
    out = DeleteMerge()
    by_partition: dict[PartitionKey, list[DataFile]] = defaultdict(list)
    for f in new:
        if f.content == DataFileContent.POSITION_DELETES:
            by_partition[partition_key(f)].append(f)
        else:
            out.add.append(f)
    if not by_partition:
        return out
    live = live_position_deletes(table)
    for key, files in by_partition.items():
        # Only Parquet files can be merged here (another writer's may be ORC or Avro); they count anyway.
        existing = live.get(key, [])
        picked = pick(
            [f for f in existing if f.file_format == FileFormat.PARQUET] + files, len(existing) + len(files)
        )
        if not picked:
            out.add.extend(files)
            continue
        parts = []
        for f in picked:
            rows = read_columns(table.io, f.file_path, ["file_path", "pos"])
            parts.append(rows.cast(POSITION_DELETE_SCHEMA))
            beat()
        rows = pa.concat_tables(parts).group_by(["file_path", "pos"]).aggregate([])
        merged = write_position_deletes(
            table.io, table.metadata, rows, files[0].spec_id, files[0].partition, writer_properties
        )
        ours = {f.file_path for f in files}
        picked_paths = {f.file_path for f in picked}
        out.add.append(merged)
        out.add.extend(f for f in files if f.file_path not in picked_paths)
        out.written.append(merged.file_path)
        out.remove.update(p for p in picked_paths if p not in ours)
        out.merged_away.extend(p for p in picked_paths if p in ours)
        logger.info(
            "position deletes of %s: %d file(s) of %d row(s) merged into one of %d in partition %s",
            ".".join(table.name()),
            len(picked),
            sum(f.record_count for f in picked),
            merged.record_count,
            key[1] or "(unpartitioned)",
        )
    return out


def pick(candidates: list[DataFile], count: int) -> list[DataFile]:
    """Which of a partition's ``count`` delete files (``candidates``: the mergeable ones) to merge:
    none while ``count`` is within :data:`MAX_FILES`; else the smallest two, and each next smallest
    while it holds no more rows than those picked together. So a merged file holds at least twice the
    rows of each file it replaced, and a position is rewritten at most log2(its partition's deletes)
    times before a compaction drops it (a merge of everything but the largest few would rewrite
    most of them at every merge)."""
    if count <= MAX_FILES or len(candidates) < 2:
        return []
    ordered = sorted(candidates, key=lambda f: (f.record_count, f.file_path))
    picked, total = ordered[:2], ordered[0].record_count + ordered[1].record_count
    for f in ordered[2:]:
        if f.record_count > total:
            break
        picked.append(f)
        total += f.record_count
    return picked
