"""Orphan files: data and delete files under the table's data location that nothing will ever read.

A batch writes its Parquet files before its precommit; if the process dies before the precommit, or
the batch's file write is retried, or a plan is aborted, those files belong to no snapshot and no
plan. They are *orphans* — harmless to readers, but they cost storage.

A file is an orphan only when all of these hold:

* it lies under the table's data location (``write.data.path``, default ``<location>/data``);
* no snapshot of the table references it (every manifest of every snapshot still in the metadata,
  including entries marked deleted);
* no plan in the txnlog references it — the pending (precommitted) plan and the last committed
  plan of every sink whose plan names this table: a precommitted plan must stay committable
  (design rule 5), whatever its age;
* it is older than the cut-off (``--older-than``, default 1h), so that files a running batch has
  written but not yet precommitted are never taken for orphans.

The order of the reads matters: files are listed first, then the txnlog is read, then the table.
A file listed before its plan was precommitted is then seen in the log; a plan that moved from
``precommit`` to ``committed`` between the two reads is seen in the table's snapshots.

Only ``icesink orphans --delete`` deletes; metadata files (manifests of failed commits) are left to
Spark's ``remove_orphan_files``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from service.config import SinkConfig
from service.model.object_store import AZURE_SCHEMES, ObjectStoreIO
from service.txnlog_client import open_txnlog
from txnlog import TransactionLog

logger = logging.getLogger(__name__)

DEFAULT_OLDER_THAN = timedelta(hours=1)


@dataclass(frozen=True)
class StoredFile:
    path: str
    size: int
    modified: datetime


@dataclass
class OrphanReport:
    table: str
    data_location: str
    older_than: timedelta
    listed: int = 0
    referenced: int = 0
    in_plans: int = 0
    too_young: int = 0
    orphans: list[StoredFile] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "data_location": self.data_location,
            "older_than_s": self.older_than.total_seconds(),
            "files_listed": self.listed,
            "referenced_by_snapshots": self.referenced,
            "referenced_by_txnlog_plans": self.in_plans,
            "too_young": self.too_young,
            "orphans": [
                {"path": f.path, "size": f.size, "modified": f.modified.isoformat()} for f in self.orphans
            ],
            "orphan_bytes": sum(f.size for f in self.orphans),
            "deleted": len(self.deleted),
        }


def data_location(table: Table) -> str:
    return table.location_provider().data_path.rstrip("/")


def list_files(io: FileIO, location: str) -> list[StoredFile]:
    """Every file under ``location`` with its size and modification time, named as the table names its
    files: pyarrow lists ``bucket/key`` (``container/path`` on ADLS) under the path it was given, and
    each name is ``location`` followed by what comes after that path."""
    from pyarrow import fs as pafs

    if not isinstance(io, PyArrowFileIO):
        io = ObjectStoreIO(io.properties)
    scheme, netloc, path = io.parse_location(location, io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    root, listed_root = location.rstrip("/"), path.rstrip("/")
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    files = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        modified = info.mtime or datetime.fromtimestamp(0, UTC)
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=UTC)
        if not info.path.startswith(listed_root + "/"):
            raise ValueError(f"listing {location}: {info.path} is not under {listed_root}")
        files.append(StoredFile(root + info.path[len(listed_root) :], int(info.size or 0), modified))
    return files


def snapshot_files(table: Table) -> set[str]:
    """Paths of every data and delete file any snapshot in the metadata references."""
    io = table.io
    paths: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return paths


def plan_files(log: TransactionLog, table: str) -> set[str]:
    """Files named by any sink's pending or last committed plan for ``table``."""
    paths: set[str] = set()
    for state in log.list_sinks():
        for payload in (state.payload, state.committed_payload):
            # A plan of several tables nests one plan per table (service.commit.plan.BatchPlan).
            for plan in (payload or {}).get("tables") or ([payload] if payload else []):
                if plan.get("table") != table:
                    continue
                for key in ("data_files", "delete_files"):
                    for f in plan.get(key) or []:
                        path = f.get("file_path") if isinstance(f, dict) else None
                        if path:
                            paths.add(path)
                if plan.get("position_keys"):  # delete_format: position (service.keyindex.resolve)
                    paths.add(plan["position_keys"])
    return paths


def _normalise(path: str) -> str:
    """``s3a://b/k`` and ``s3://b/k`` name the same object, ``gcs://`` and ``gs://`` too; an ADLS blob
    is the same under abfs, abfss, wasb and wasbs, at the account's dfs or blob host; ``file:/x`` and
    ``/x`` name the same file."""
    for prefix in ("s3a://", "s3n://"):
        if path.startswith(prefix):
            return "s3://" + path[len(prefix) :]
    if path.startswith("gcs://"):
        return "gs://" + path[len("gcs://") :]
    scheme, _, rest = path.partition("://")
    if scheme in AZURE_SCHEMES and "@" in rest.split("/", 1)[0]:
        authority, _, key = rest.partition("/")
        container, _, host = authority.partition("@")
        return f"azure://{container}@{host.split('.', 1)[0]}/{key}"
    for prefix in ("file://", "file:"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def find_orphans(
    config: SinkConfig,
    older_than: timedelta = DEFAULT_OLDER_THAN,
    *,
    identifier: str | None = None,
    catalog: Any = None,
    log: TransactionLog | None = None,
    now: datetime | None = None,
) -> OrphanReport:
    """The orphans of one table: the sink's one table, or ``identifier`` (one of a sink of many)."""
    from service.iceberg.tables import open_catalog

    identifier = identifier or config.table.identifier
    catalog = catalog or open_catalog(config)
    table = catalog.load_table(identifier)
    location = data_location(table)
    report = OrphanReport(table=identifier, data_location=location, older_than=older_than)

    listed = list_files(table.io, location)  # 1. the files
    own_log = log is None
    log = log or open_txnlog(config, "orphans")
    try:
        in_plans = {_normalise(p) for p in plan_files(log, identifier)}  # 2. the plans
    finally:
        if own_log:
            log.close()
    table = catalog.load_table(identifier)  # 3. the snapshots, as of now
    referenced = {_normalise(p) for p in snapshot_files(table)}

    cutoff = (now or datetime.now(UTC)) - older_than
    report.listed = len(listed)
    for f in listed:
        key = _normalise(f.path)
        if key in referenced:
            report.referenced += 1
        elif key in in_plans:
            report.in_plans += 1
        elif f.modified > cutoff:
            report.too_young += 1
        else:
            report.orphans.append(f)
    return report


def delete_orphans(config: SinkConfig, report: OrphanReport, *, catalog: Any = None) -> list[str]:
    """Delete the report's orphans; returns the paths deleted."""
    from service.iceberg.tables import open_catalog

    catalog = catalog or open_catalog(config)
    io = catalog.load_table(report.table).io
    for f in report.orphans:
        io.delete(f.path)
        report.deleted.append(f.path)
        logger.info("deleted orphan %s (%d bytes)", f.path, f.size)
    return report.deleted


def find_sink_orphans(config: SinkConfig, older_than: timedelta = DEFAULT_OLDER_THAN) -> list[OrphanReport]:
    """The orphans of every table of the sink (:func:`service.commit.sink_tables.sink_tables`), table by table."""
    from service.commit.sink_tables import existing_sink_tables
    from service.iceberg.tables import open_catalog

    catalog = open_catalog(config)
    log = open_txnlog(config, "orphans")
    try:
        return [
            find_orphans(config, older_than, identifier=identifier, catalog=catalog, log=log)
            for identifier in existing_sink_tables(config, catalog, log)
        ]
    finally:
        log.close()
