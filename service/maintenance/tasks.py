"""The maintenance tasks: each a small class that says when it is due and runs one Iceberg procedure.

Spark's Iceberg procedures and Iceberg's own Java API do the work (design brief: do not re-implement
them). icesink deletes files itself in two places: data-location orphans, because only the txnlog
knows which unreferenced files a pending plan still needs (:mod:`service.maintenance.orphans`), and the files
Iceberg's snapshot expiry names, which it counts before deleting them in one bulk request.

Why the defaults are safe next to a running sink:

* compaction keeps ``use-starting-sequence-number`` (Iceberg's default): rewritten files take the
  sequence number of the snapshot the rewrite started from, so an equality delete the sink commits
  meanwhile still applies to them, and no deleted row comes back (Iceberg issue 10312). The sink's
  own commit conflicts with the rewrite's at most once per rewrite: it reloads and commits again
  (:mod:`service.commit.committer`); the rewrite's conflicts are Iceberg's to validate and retry;
* expiry never removes a file a pending plan needs: such files are in no snapshot yet, and the proof
  that a plan landed is kept in table properties that expiry does not touch
  (:mod:`service.commit.marks`);
* orphans must be older than ``maintenance.orphans.older_than``, and a file any txnlog plan names is
  never one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from py4j.protocol import Py4JJavaError

from service.commit.turns import compaction_turn
from service.config import MaintenanceConfig, SinkConfig
from service.iceberg.row_delta import ManifestMerge
from service.maintenance.table_health import TableHealth
from service.model.object_store import AZURE_SCHEMES
from service.spark_session import sql_literal

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

    from txnlog import TransactionLog

logger = logging.getLogger(__name__)

# How long a compaction waits for the sink's commit in flight: a commit takes about a second, so a
# longer wait means a commit stuck on its catalog; the rewrite then goes ahead without its turn.
TURN_WAIT = timedelta(minutes=2)


@dataclass
class TaskContext:
    """What a task runs with: one table of the sink, the maintainer's Spark session and servers."""

    config: SinkConfig
    spark: SparkSession
    spark_catalog: str
    catalog: Catalog
    log: TransactionLog
    identifier: str
    # Raises if the task's lease was lost meanwhile: called before each commit icesink itself makes.
    check_lease: Callable[[], None] = lambda: None

    @property
    def settings(self) -> MaintenanceConfig:
        return self.config.maintenance

    @property
    def spark_name(self) -> str:
        """The table in the maintainer's Spark catalog, every part quoted (``orders-v2`` needs it)."""
        parts = [self.spark_catalog, *self.identifier.split(".")]
        return ".".join("`" + part.replace("`", "``") + "`" for part in parts)

    def call(self, procedure: str, **args: str) -> list[dict[str, Any]]:
        """``CALL <catalog>.system.<procedure>(table => '<catalog>.<ns.table>', <args>)``; args are SQL
        expressions."""
        table = sql_literal(self.spark_name)
        arguments = ", ".join([f"table => {table}", *(f"{k} => {v}" for k, v in args.items())])
        sql = f"CALL {self.spark_catalog}.system.{procedure}({arguments})"
        logger.debug("maintenance of %s: %s", self.identifier, sql)
        return [row.asDict() for row in self.spark.sql(sql).collect()]


class CompactionLost(RuntimeError):
    """A compaction that had files to rewrite committed none of them."""


@dataclass
class TaskResult:
    """What a task changed; ``detail`` is the procedure's own answer."""

    files_rewritten: int = 0
    files_added: int = 0
    files_removed: int = 0
    bytes_rewritten: int = 0
    snapshots_expired: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


class Task:
    """One kind of maintenance. ``due`` says why it should run now (None: not due); ``force`` is
    ``icesink maintain --once``, which runs every task that has anything to do."""

    name = ""

    def due(self, health: TableHealth, settings: MaintenanceConfig, force: bool, now: datetime) -> str | None:
        raise NotImplementedError

    def run(self, ctx: TaskContext) -> TaskResult:
        raise NotImplementedError


class Compact(Task):
    """``rewrite_data_files``: data files rewritten with their deletes applied, small files bin-packed,
    dangling delete files removed; partial progress commits every few file groups, so a long rewrite
    keeps what it did if it is stopped, and conflicts with the sink's commits stay small."""

    name = "compact"

    def due(self, health: TableHealth, settings: MaintenanceConfig, force: bool, now: datetime) -> str | None:
        cfg = settings.compaction
        if not cfg.enabled or health.data_files == 0:
            return None
        if force:
            return "maintain --once" if health.delete_files or health.data_files > 1 else None
        if health.delete_files >= cfg.delete_files:
            return f"{health.delete_files} delete files (compaction.delete_files: {cfg.delete_files})"
        if health.commits_since_compaction >= cfg.commits:
            return f"{health.commits_since_compaction} commits since the last compaction (compaction.commits: {cfg.commits})"
        since = health.last_compaction or health.first_snapshot
        if (
            cfg.max_age is not None
            and health.delete_files
            and since is not None
            and now - since >= cfg.max_age
        ):
            return f"deletes and no compaction since {since:%Y-%m-%d %H:%M:%S}Z (compaction.max_age: {cfg.max_age})"
        return None

    def run(self, ctx: TaskContext) -> TaskResult:
        cfg = ctx.settings.compaction
        options = {
            "delete-file-threshold": "1",
            # Dangling deletes are removed by _drop_dangling_deletes: Iceberg's own clean-up takes a
            # global delete for dangling while it still applies.
            "remove-dangling-deletes": "false",
            "partial-progress.enabled": "true",
            "partial-progress.max-commits": "10",
            "max-concurrent-file-group-rewrites": str(cfg.max_concurrent_groups),
            # The groups with the most files first: those are where the deletes piled up.
            "rewrite-job-order": "files-desc",
        }
        if cfg.target_file_size is not None:
            options["target-file-size-bytes"] = str(cfg.target_file_size)
        current = ctx.catalog.load_table(ctx.identifier).current_snapshot()
        summary = current.summary.additional_properties if current and current.summary else {}
        had_deletes = (
            int(summary.get("total-equality-deletes", "0")) + int(summary.get("total-position-deletes", "0"))
            > 0
        )
        # In turn with the sink's commits of position deletes (service.commit.turns).
        with _turn(ctx):
            rows = ctx.call("rewrite_data_files", options=_map(options))
            dropped = _drop_dangling_deletes(ctx)
        row = rows[0] if rows else {}
        rewritten = int(row.get("rewritten_data_files_count") or 0)
        if had_deletes and not rewritten and not dropped:
            # With delete-file-threshold 1 every data file a delete applies to is rewritten, and
            # one that applies to none is dangling: if neither happened, partial progress dropped
            # the file groups whose commit kept losing to the sink's commits (Iceberg retries
            # commit.retry.num-retries times; the procedure's failed_data_files_count counts
            # rewrite failures, not these), or (delete_format: position, a rewrite that went ahead
            # without its turn) whose files the sink committed position deletes for meanwhile, which
            # Iceberg's validation refuses to drop ("found new position delete for replaced data
            # file"): the work is lost.
            raise CompactionLost(
                f"compaction of {ctx.identifier} committed nothing: its commits failed (Iceberg's "
                "validation or retries lost to concurrent commits); the next pass tries again"
            )
        return TaskResult(
            files_rewritten=rewritten,
            files_added=int(row.get("added_data_files_count") or 0),
            files_removed=int(row.get("removed_delete_files_count") or 0) + dropped,
            bytes_rewritten=int(row.get("rewritten_bytes_count") or 0),
            detail={**row, "dangling_deletes_removed": dropped},
        )


class RewritePositionDeletes(Task):
    """``rewrite_position_delete_files``: position deletes compacted (a table in ``delete_format:
    position`` gets a delete file per partition per commit), and those whose data files are gone
    dropped."""

    name = "rewrite_position_deletes"

    def due(self, health: TableHealth, settings: MaintenanceConfig, force: bool, now: datetime) -> str | None:
        if health.position_deletes and settings.compaction.enabled:
            return f"{health.position_deletes} position deletes"
        return None

    def run(self, ctx: TaskContext) -> TaskResult:
        with _turn(ctx):  # the sink's commits merge delete files too (service.keyindex.merge)
            rows = ctx.call("rewrite_position_delete_files", options=_map({"rewrite-all": "true"}))
        row = rows[0] if rows else {}
        return TaskResult(
            files_rewritten=int(row.get("rewritten_delete_files_count") or 0),
            files_added=int(row.get("added_delete_files_count") or 0),
            bytes_rewritten=int(row.get("rewritten_bytes_count") or 0),
            detail=row,
        )


class ExpireSnapshots(Task):
    """``expire_snapshots``: snapshots older than ``expiry.older_than`` beyond the newest
    ``expiry.retain_last``, and the files only they referenced.

    Due once ``expiry.min_expirable`` snapshots can go, not as soon as one can: each expiry is a
    commit and a clean-up of about a second, and a table committing every second has a snapshot to
    expire at every pass, so expiring them one pass at a time would take more of the maintainer's time
    than compaction and delay the compaction that keeps reads fast.
    """

    name = "expire_snapshots"

    def due(self, health: TableHealth, settings: MaintenanceConfig, force: bool, now: datetime) -> str | None:
        cfg = settings.expiry
        if not cfg.enabled or not health.gc_enabled:
            return None
        expirable = health.expirable(cfg.older_than, cfg.retain_last, now)
        if expirable == 0 or (not force and expirable < cfg.min_expirable):
            return None
        return (
            f"{expirable} of {health.snapshots} snapshots older than {cfg.older_than} beyond the newest "
            f"{cfg.retain_last}"
        )

    def run(self, ctx: TaskContext) -> TaskResult:
        """Iceberg's ``ExpireSnapshots`` through its Java API rather than the Spark procedure: for a
        table with a linear history its clean-up reads only the expired snapshots' manifest lists and
        manifests, where the procedure runs Spark jobs over every manifest of every snapshot (8 s
        instead of 3 s for 50 snapshots here), and expiry runs on every busy table. Iceberg names
        each file it would delete; they are counted, then deleted in bulk through the table's FileIO."""
        from pyspark.java_gateway import ensure_callback_server_started

        cfg = ctx.settings.expiry
        spark_context = ctx.spark.sparkContext
        jvm = spark_context._jvm
        assert jvm is not None and spark_context._gateway is not None
        ensure_callback_server_started(spark_context._gateway)
        table = _java_table(ctx)
        before = {int(snapshot.snapshotId()) for snapshot in table.snapshots()}
        expired = _Collect()
        cutoff_ms = int((datetime.now(UTC) - cfg.older_than).timestamp() * 1000)
        ctx.check_lease()
        try:
            (
                table.expireSnapshots()
                .expireOlderThan(cutoff_ms)
                .retainLast(cfg.retain_last)
                .deleteWith(expired)
                .commit()
            )
        finally:  # whatever Iceberg named before a failure is deleted too
            failed = _delete_files(jvm, table.io(), expired.paths)
        if failed:
            logger.warning(
                "maintenance of %s: %d of %d expired file(s) not deleted (orphan removal takes them later)",
                ctx.identifier,
                failed,
                len(expired.paths),
            )
        table.refresh()
        # Counted by id: the sink's commits that landed meanwhile are not expiry's business.
        gone = before - {int(snapshot.snapshotId()) for snapshot in table.snapshots()}
        metadata = sum(1 for p in expired.paths if _is_manifest(p))
        detail = {
            "deleted_files": len(expired.paths) - metadata,  # data, delete and statistics files
            "deleted_manifests_and_lists": metadata,
            "not_deleted": failed,
        }
        return TaskResult(files_removed=detail["deleted_files"], snapshots_expired=len(gone), detail=detail)


def _is_manifest(path: str) -> bool:
    """A manifest list or manifest: an Avro file under the table's ``metadata/`` (data files live
    elsewhere, whatever their format)."""
    return path.endswith(".avro") and "/metadata/" in path


class _Collect:
    """A ``java.util.function.Consumer<String>`` served by py4j's callback server: the files Iceberg's
    expiry would delete, collected instead of deleted one request at a time."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def accept(self, path: str) -> None:
        self.paths.append(path)

    class Java:
        implements: ClassVar[list[str]] = ["java.util.function.Consumer"]


def _delete_files(jvm: Any, io: Any, paths: list[str]) -> int:
    """Delete ``paths`` through a Java FileIO, in bulk where it can (S3FileIO); returns how many failed."""
    if not paths:
        return 0
    if jvm.org.apache.iceberg.io.SupportsBulkOperations._java_lang_class.isInstance(io):
        batch = jvm.java.util.ArrayList()
        for path in paths:
            batch.add(path)
        try:
            io.deleteFiles(batch)
        except Py4JJavaError as exc:
            failure = exc.java_exception
            if failure.getClass().getSimpleName() == "BulkDeletionFailureException":
                return int(failure.numberFailedObjects())
            return len(paths)
        return 0
    failed = 0
    for path in paths:
        try:
            io.deleteFile(path)
        except Exception:
            failed += 1
    return failed


class RewriteManifests(Task):
    """Manifests rewritten into few: the sink adds a delete manifest per commit (and a data manifest,
    on a table that does not merge them); every commit try and every scan reads them all."""

    name = "rewrite_manifests"

    def due(self, health: TableHealth, settings: MaintenanceConfig, force: bool, now: datetime) -> str | None:
        if health.manifests_to_rewrite < 2:
            return None
        if health.manifests > settings.max_manifests or (force and health.manifests > 2):
            return (
                f"{health.manifests} manifests, {health.manifests_to_rewrite} to rewrite "
                f"(max_manifests: {settings.max_manifests})"
            )
        return None

    def run(self, ctx: TaskContext) -> TaskResult:
        """Iceberg's Spark action (what the ``rewrite_manifests`` procedure runs), spec by spec, on
        the manifests the sink's own merge of data manifests can't race
        (:meth:`service.iceberg.row_delta.ManifestMerge.rewritable`: on a table whose data manifests
        the sink merges, its delete manifests and data manifests too big to merge): a rewrite that
        replaced a data manifest the sink's next commit merged into a new one would fail its retry
        ("Deleted manifest ... could not be found")."""
        from pyspark.java_gateway import ensure_callback_server_started

        table = ctx.catalog.load_table(ctx.identifier)
        snapshot = table.current_snapshot()
        if snapshot is None:
            return TaskResult()
        merge = ManifestMerge.of(table.properties)
        per_spec = Counter(
            m.partition_spec_id for m in snapshot.manifests(table.io) if merge.rewritable_manifest(m)
        )
        spark_context = ctx.spark.sparkContext
        jvm = spark_context._jvm
        assert jvm is not None and spark_context._gateway is not None
        ensure_callback_server_started(spark_context._gateway)
        java_table = _java_table(ctx)
        actions = jvm.org.apache.iceberg.spark.actions.SparkActions.get(ctx.spark._jsparkSession)
        size = jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables.size
        rewritten = added = 0
        # In the table's turn: a sink's commit that merges position-delete files rewrites the delete
        # manifests that held them (service.keyindex.merge), which would fail this rewrite's retry.
        with _turn(ctx):
            for spec_id in sorted(spec for spec, count in per_spec.items() if count > 1):
                action = actions.rewriteManifests(java_table).specId(spec_id).rewriteIf(_Rewritable(merge))
                ctx.check_lease()
                result = action.execute()
                rewritten += int(size(result.rewrittenManifests()))
                added += int(size(result.addedManifests()))
        detail = {
            "rewritten_manifests_count": rewritten,
            "added_manifests_count": added,
            "data_manifests_merged_by_the_sink": merge.enabled,
        }
        return TaskResult(files_rewritten=rewritten, files_added=added, detail=detail)


class _Rewritable:
    """A ``java.util.function.Predicate<ManifestFile>`` served by py4j's callback server (Iceberg asks
    it on the driver): :meth:`ManifestMerge.rewritable` for a Java manifest."""

    def __init__(self, merge: ManifestMerge) -> None:
        self.merge = merge

    def test(self, manifest: Any) -> bool:
        return self.merge.rewritable(
            str(manifest.content().name()) == "DELETES",
            int(manifest.length()),
            bool(manifest.hasAddedFiles() or manifest.hasExistingFiles()),
        )

    class Java:
        implements: ClassVar[list[str]] = ["java.util.function.Predicate"]


class RemoveOrphans(Task):
    """Orphan files: under the data location with icesink's txnlog-aware listing (a file a pending or
    committed plan names is never one), under the metadata location with ``remove_orphan_files``
    (manifests and metadata files of commits that failed)."""

    name = "remove_orphans"

    def __init__(self) -> None:
        self.last_run: dict[str, datetime] = {}  # table → when this maintainer last looked

    def due(self, health: TableHealth, settings: MaintenanceConfig, force: bool, now: datetime) -> str | None:
        cfg = settings.orphans
        if not cfg.enabled or not health.gc_enabled:
            return None
        if not force and health.born is not None and now - health.born < cfg.older_than:
            # The table's first snapshot is younger than the safety age: what its listing could
            # remove is only what a killed first batch left before it, which can wait for the table
            # to age, while the listing would hold a new table's first compaction back.
            return None
        last = self.last_run.get(health.table)
        if force or last is None or now - last >= cfg.interval:
            return "maintain --once" if force else f"orphans.interval ({cfg.interval}) since the last look"
        return None

    def run(self, ctx: TaskContext) -> TaskResult:
        from service.maintenance.orphans import delete_orphans, find_orphans

        cfg = ctx.settings.orphans
        self.last_run[ctx.identifier] = datetime.now(UTC)
        report = find_orphans(
            ctx.config, cfg.older_than, identifier=ctx.identifier, catalog=ctx.catalog, log=ctx.log
        )
        ctx.check_lease()
        deleted = delete_orphans(ctx.config, report, catalog=ctx.catalog)
        metadata_orphans: int | str = _delete_metadata_orphans(ctx, cfg.older_than)
        return TaskResult(
            files_removed=len(deleted) + (metadata_orphans if isinstance(metadata_orphans, int) else 0),
            detail={
                "data_orphans": len(deleted),
                "data_orphan_bytes": sum(f.size for f in report.orphans),
                "kept_for_txnlog_plans": report.in_plans,
                "metadata_orphans": metadata_orphans,
            },
        )


def _turn(ctx: TaskContext) -> AbstractContextManager[float]:
    return compaction_turn(ctx.log, ctx.config.sink_id, [ctx.identifier], rewrite=True, wait=TURN_WAIT)


def _java_table(ctx: TaskContext) -> Any:
    """The table as Iceberg's Java API in the maintainer's Spark session sees it."""
    jvm = ctx.spark.sparkContext._jvm
    assert jvm is not None
    return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(ctx.spark._jsparkSession, ctx.spark_name)


def _drop_dangling_deletes(ctx: TaskContext) -> int:
    """Remove the delete files that apply to no live data file any more; returns the count.

    A delete file applies to the data files of its own spec and partition, except one written with an
    unpartitioned spec: that is an unpartitioned table's, or one of the *global* equality deletes
    icesink writes for a table partitioned by a non-key column (an extra unpartitioned spec,
    service.iceberg.tables ``delete_spec``), which apply to the data files of every partition and spec.
    Iceberg's ``remove-dangling-deletes`` gets neither right: it skips an unpartitioned table (leaving
    it to a later Java commit, which a sink committing through pyiceberg never makes), and it joins
    every delete to the data files of its own spec and partition, so a global delete, whose spec holds
    no data file, looks dangling even while it still applies, and removing it would bring deleted rows
    back. The rule here is Iceberg's, over the data files a delete can reach: an equality delete is
    dangling when its sequence number is at most the lowest of theirs, a position delete when it is
    lower. After a compaction every rewritten file has the rewrite's starting sequence number, so every
    older delete goes. A delete committed after the snapshot read here has a higher number than every
    data file it can reach and stays; data files added since have higher numbers too, and a delete
    applies only to lower ones. One ``RewriteFiles`` commit, after checking the lease is still ours.
    """
    jvm = ctx.spark.sparkContext._jvm
    assert jvm is not None
    table = _java_table(ctx)
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return 0
    specs, io, files = table.specs(), table.io(), jvm.org.apache.iceberg.ManifestFiles

    def live(manifests: Any, read: Any) -> list[Any]:
        found = []
        for i in range(manifests.size()):
            reader = read(manifests.get(i))
            try:
                iterator = reader.iterator()
                while iterator.hasNext():
                    found.append(iterator.next().copy())
            finally:
                reader.close()
        return found

    deletes = live(snapshot.deleteManifests(io), lambda m: files.readDeleteManifest(m, io, specs))
    if not deletes:
        return 0

    def scope(f: Any) -> tuple[int, str]:
        return f.specId(), specs.get(f.specId()).partitionToPath(f.partition())

    lowest_everywhere: int | None = None
    lowest: dict[tuple[int, str], int] = {}
    for f in live(snapshot.dataManifests(io), lambda m: files.read(m, io, specs)):
        seq = f.dataSequenceNumber()
        lowest_everywhere = seq if lowest_everywhere is None else min(lowest_everywhere, seq)
        where = scope(f)
        lowest[where] = min(lowest.get(where, seq), seq)
    equality = jvm.org.apache.iceberg.FileContent.EQUALITY_DELETES
    dangling = []
    for f in deletes:
        floor = lowest_everywhere if specs.get(f.specId()).isUnpartitioned() else lowest.get(scope(f))
        seq = f.dataSequenceNumber()
        if floor is None or seq < floor or (f.content() == equality and seq == floor):
            dangling.append(f)
    if not dangling:
        return 0
    rewrite = table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
    for f in dangling:
        rewrite.deleteFile(f)
    ctx.check_lease()
    rewrite.commit()
    return len(dangling)


def _delete_metadata_orphans(ctx: TaskContext, older_than: timedelta) -> int | str:
    """Iceberg's ``DeleteOrphanFiles`` action over the table's metadata location; returns the count, or
    why it was not run.

    The action, not the ``remove_orphan_files`` procedure: the procedure refuses ages under 24 hours,
    while ``maintenance.orphans.older_than`` may be as short as an hour (no icesink commit is
    anywhere near that long in flight).

    Not on ADLS: ADLSFileIO's prefix listing (Iceberg 1.11) names files relative to the container, which
    the action compares with the table's full ``abfs://`` names: every metadata file would be taken for
    an orphan, the live ones too.
    """
    jvm = ctx.spark.sparkContext._jvm
    assert jvm is not None
    session = ctx.spark._jsparkSession
    table = _java_table(ctx)
    if urlsplit(str(table.location())).scheme in AZURE_SCHEMES:
        return "skipped on ADLS: Iceberg's prefix listing there names files unlike the table does"
    cutoff_ms = int((datetime.now(UTC) - older_than).timestamp() * 1000)
    result = (
        jvm.org.apache.iceberg.spark.actions.SparkActions.get(session)
        .deleteOrphanFiles(table)
        .location(table.location().rstrip("/") + "/metadata")
        .olderThan(cutoff_ms)
        .usePrefixListing(True)  # list through the table's FileIO (S3FileIO), not a Hadoop file system
        .execute()
    )
    count: int = jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables.size(
        result.orphanFileLocations()
    )
    return count


def default_tasks() -> list[Task]:
    """In the order they run: manifests first (every commit attempt of a compaction reads them all, and
    next to a sink committing every second an attempt over hundreds of manifests takes seconds and
    loses to the sink's next commit), then compaction (it turns deletes into dangling files and old
    snapshots), expiry (which removes what compaction replaced), orphans."""
    return [RewriteManifests(), Compact(), RewritePositionDeletes(), ExpireSnapshots(), RemoveOrphans()]


def _map(options: dict[str, str]) -> str:
    return "map(" + ", ".join(f"{sql_literal(k)}, {sql_literal(v)}" for k, v in options.items()) + ")"
