"""Maintenance without servers: its settings, the Spark catalog it derives, and when each task is due."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from service import spark_jars
from service.config import ConfigError, MaintenanceConfig, SparkConfig, parse_config
from service.iceberg.row_delta import ManifestMerge
from service.iceberg.tables import metadata_properties
from service.maintenance.spark import catalog_conf, spark_catalog_name
from service.maintenance.table_health import TableHealth
from service.maintenance.tasks import (
    Compact,
    CompactionLost,
    ExpireSnapshots,
    RemoveOrphans,
    RewriteManifests,
    TaskContext,
)
from tests.unit.test_config import BASE, with_

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def health(**changes: Any) -> TableHealth:
    values: dict[str, Any] = {
        "table": "ns.t",
        "snapshots": 10,
        "data_files": 10,
        "delete_files": 0,
        "equality_deletes": 0,
        "position_deletes": 0,
        "records": 100,
        "data_bytes": 10_000,
        "manifests": 20,
        "manifests_to_rewrite": 20,
        "metadata_bytes": 5_000,
        "commits_since_compaction": 10,
        "last_compaction": None,
        "first_snapshot": NOW - timedelta(minutes=5),
        "born": None,  # its start expired: older than anything kept
    }
    return TableHealth(**{**values, **changes})


def snapshots(count: int, oldest: datetime, step: timedelta = timedelta(seconds=1)) -> TableHealth:
    """A table of ``count`` snapshots, one every ``step`` from ``oldest``."""
    times = tuple(oldest + i * step for i in range(count))
    return health(snapshots=count, first_snapshot=oldest, snapshot_times=times)


def test_expiry_waits_until_min_expirable_snapshots_can_go() -> None:
    """A table committing every second has one more expirable snapshot at every pass: expiry waits for
    ``min_expirable`` of them (each run is a Spark job and a commit); ``--once`` takes any."""
    settings = MaintenanceConfig(expiry={"older_than": "1m", "retain_last": 30, "min_expirable": 20})  # type: ignore[arg-type]
    start = NOW - timedelta(seconds=100)  # snapshots at -100 s .. -1 s: 41 older than a minute
    table = snapshots(100, start)
    assert table.expirable(timedelta(minutes=1), 30, NOW) == 41
    assert table.expirable(timedelta(minutes=1), 90, NOW) == 10  # the newest 90 stay whatever their age
    assert "41 of 100 snapshots" in (ExpireSnapshots().due(table, settings, False, NOW) or "")
    few = snapshots(100, NOW - timedelta(seconds=70))  # 11 older than a minute
    assert ExpireSnapshots().due(few, settings, False, NOW) is None
    assert ExpireSnapshots().due(few, settings, True, NOW) is not None
    assert ExpireSnapshots().due(snapshots(100, NOW - timedelta(seconds=59)), settings, True, NOW) is None
    assert "snapshot_times" not in table.to_json()


def test_defaults_suit_a_streaming_table() -> None:
    settings = parse_config(BASE, env={}).maintenance
    assert settings.interval == timedelta(minutes=5)
    assert (settings.expiry.older_than, settings.expiry.retain_last) == (timedelta(days=1), 100)
    assert settings.orphans.older_than == timedelta(days=1)
    assert settings.compaction.delete_files == 20
    assert metadata_properties(parse_config(BASE, env={})) == {
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "20",
        "commit.retry.num-retries": "20",
        "commit.retry.max-wait-ms": "1000",
    }


def test_an_orphan_age_under_ten_minutes_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match=r"maintenance\.orphans\.older_than.*at least 1h"):
        parse_config(with_(maintenance={"orphans": {"older_than": "30m"}}), env={})


def test_durations_and_sizes_parse() -> None:
    settings = parse_config(
        with_(
            maintenance={
                "interval": "30s",
                "compaction": {"target_file_size": "64MiB", "max_age": "2h"},
                "expiry": {"older_than": "2d"},
            }
        ),
        env={},
    ).maintenance
    assert settings.interval == timedelta(seconds=30)
    assert settings.compaction.target_file_size == 64 * 1024 * 1024
    assert settings.compaction.max_age == timedelta(hours=2)
    assert settings.expiry.older_than == timedelta(days=2)


def test_rest_catalog_on_s3_maps_to_sparks_iceberg_catalog() -> None:
    config = parse_config(
        with_(
            catalog={
                "type": "rest",
                "uri": "http://rest:8181",
                "credential": "id:secret",
                "header.X-Tenant": "a",
                "s3.endpoint": "http://minio:9000",
                "s3.access-key-id": "key",
                "s3.secret-access-key": "secret",
                "s3.region": "eu-west-1",
            }
        ),
        env={},
    )
    conf = catalog_conf(config, "lake")
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.uri"] == "http://rest:8181"
    assert conf["spark.sql.catalog.lake.credential"] == "id:secret"
    assert conf["spark.sql.catalog.lake.header.X-Tenant"] == "a"
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf["spark.sql.catalog.lake.s3.path-style-access"] == "true"
    assert conf["spark.sql.catalog.lake.client.region"] == "eu-west-1"
    assert conf["spark.sql.defaultCatalog"] == "lake"


def test_tables_on_gcs_use_icebergs_gcs_file_io_with_the_same_properties() -> None:
    gcs = {
        "type": "sql",
        "uri": "postgresql+psycopg://u@h/db",
        "warehouse": "gs://bucket/lake",
        "gcs.project-id": "p",
        "gcs.service.host": "http://fake-gcs:4443",
        "gcs.oauth2.token": "t",
        "gcs.oauth2.token-expires-at": "1900000000000",
    }
    conf = catalog_conf(parse_config(with_(catalog={"name": "lake", **gcs}), env={}), "lake")
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.gcp.gcs.GCSFileIO"
    for key in ("gcs.project-id", "gcs.service.host", "gcs.oauth2.token", "gcs.oauth2.token-expires-at"):
        assert conf[f"spark.sql.catalog.lake.{key}"] == gcs[key]
    on_s3 = {k: v for k, v in gcs.items() if not k.startswith("gcs.")} | {"warehouse": "s3://b/w"}
    conf = catalog_conf(parse_config(with_(catalog={"name": "lake", **on_s3}), env={}), "lake")
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"


def test_tables_on_adls_use_icebergs_adls_file_io_keyed_by_the_accounts_host() -> None:
    adls = {
        "type": "sql",
        "uri": "postgresql+psycopg://u@h/db",
        "warehouse": "abfss://lake@acct.dfs.core.windows.net/wh",
        "adls.account-name": "acct",
        "adls.account-key": "k",
        "adls.sas-token": "sv=1",
    }
    prefix = "spark.sql.catalog.lake"
    conf = catalog_conf(parse_config(with_(catalog={"name": "lake", **adls}), env={}), "lake")
    assert conf[f"{prefix}.io-impl"] == "org.apache.iceberg.azure.adlsv2.ADLSFileIO"
    assert conf[f"{prefix}.adls.auth.shared-key.account.name"] == "acct"
    assert conf[f"{prefix}.adls.auth.shared-key.account.key"] == "k"
    assert conf[f"{prefix}.adls.sas-token.acct.dfs.core.windows.net"] == "sv=1"
    assert not any(".adls.connection-string." in k for k in conf), "Azure's own endpoint unless one is named"
    emulator = {**adls, "adls.blob-storage-authority": "127.0.0.1:10000", "adls.blob-storage-scheme": "http"}
    conf = catalog_conf(parse_config(with_(catalog={"name": "lake", **emulator}), env={}), "lake")
    assert conf[f"{prefix}.adls.connection-string.acct.dfs.core.windows.net"] == "http://127.0.0.1:10000/acct"
    private = {**adls, "adls.dfs-storage-authority": ".dfs.private.example"}
    conf = catalog_conf(parse_config(with_(catalog={"name": "lake", **private}), env={}), "lake")
    assert (
        conf[f"{prefix}.adls.connection-string.acct.dfs.core.windows.net"]
        == "https://acct.dfs.private.example"
    )


def test_adls_locations_reach_pyarrow_as_container_and_path() -> None:
    """pyiceberg 0.12 keeps ``container@account.host`` in the path; icesink's FileIO drops the account."""
    from service.model.object_store import ObjectStoreIO

    for scheme in ("abfs", "abfss", "wasb", "wasbs"):
        location = f"{scheme}://lake@acct.dfs.core.windows.net/wh/t/data/f.parquet"
        assert ObjectStoreIO.parse_location(location) == (
            scheme,
            "lake@acct.dfs.core.windows.net",
            "lake/wh/t/data/f.parquet",
        )
    assert ObjectStoreIO.parse_location("s3://b/k/f") == ("s3", "b", "b/k/f")


def test_a_catalog_spark_does_not_know_needs_maintenance_spark_catalog() -> None:
    # a catalog class of one's own, as pyiceberg loads it (py-catalog-impl)
    acme = with_(catalog={"type": "acme", "py-catalog-impl": "acme.iceberg.Catalog", "warehouse": "s3://b/w"})
    with pytest.raises(ConfigError, match=r"maintenance\.spark_catalog"):
        catalog_conf(parse_config(acme, env={}))
    java = {"catalog-impl": "com.acme.iceberg.AcmeCatalog"}
    conf = catalog_conf(parse_config({**acme, "maintenance": {"spark_catalog": java}}, env={}), "c")
    assert conf["spark.sql.catalog.c.catalog-impl"] == "com.acme.iceberg.AcmeCatalog"


def test_a_sql_catalog_on_postgres_is_icebergs_jdbc_catalog_under_the_sinks_catalog_name() -> None:
    sql = with_(
        catalog={
            "name": "lake",
            "type": "sql",
            "uri": "postgresql+psycopg://ice:${PW}@db.example:6543/catalog?sslmode=require",
            "warehouse": "s3://b/w",
        }
    )
    config = parse_config(sql, env={"PW": "s3cr3t"})
    name = spark_catalog_name(config)
    assert name == "lake", "JdbcCatalog keys its rows by the catalog's name: the sink's"
    conf = catalog_conf(config, name)
    assert conf["spark.sql.catalog.lake.type"] == "jdbc"
    assert conf["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db.example:6543/catalog"
    assert conf["spark.sql.catalog.lake.jdbc.user"] == "ice"
    assert conf["spark.sql.catalog.lake.jdbc.password"] == "s3cr3t"
    assert conf["spark.sql.catalog.lake.jdbc.sslmode"] == "require"
    assert conf["spark.sql.catalog.lake.warehouse"] == "s3://b/w"
    assert conf["spark.sql.defaultCatalog"] == "lake"
    given = {"maintenance": {"spark_catalog": {"type": "jdbc", "uri": "jdbc:postgresql://other/db"}}}
    described = parse_config({**sql, **given}, env={"PW": "x"})
    assert spark_catalog_name(described) == "icesink"
    assert catalog_conf(described)["spark.sql.catalog.icesink.uri"] == "jdbc:postgresql://other/db"


def test_a_sql_catalog_name_spark_cannot_take_is_refused_naming_it() -> None:
    sql = with_(catalog={"name": "prod-cdc", "type": "SQL", "uri": "postgresql+psycopg://u@h/db"})
    with pytest.raises(ConfigError, match="a SQL catalog named 'prod-cdc' can't be a Spark catalog"):
        spark_catalog_name(parse_config(sql, env={}))


def test_a_sql_catalog_without_a_driver_icesink_ships_is_refused_naming_it() -> None:
    sqlite = with_(catalog={"type": "sql", "uri": "sqlite:////tmp/catalog.db", "warehouse": "file:///w"})
    with pytest.raises(ConfigError, match="a SQL catalog on sqlite has no JDBC driver icesink ships"):
        catalog_conf(parse_config(sqlite, env={}))


def test_jar_files_without_icebergs_runtime_are_refused_before_spark_starts(tmp_path: Path) -> None:
    jar = tmp_path / "kafka.jar"
    with zipfile.ZipFile(jar, "w") as z:
        for cls, _ in spark_jars.REQUIRED_CLASSES:
            z.writestr(cls.replace(".", "/") + ".class", b"")
    jars = spark_jars.resolve(SparkConfig(), {spark_jars.JARS_ENV: str(jar)}, iceberg=True)
    with pytest.raises(spark_jars.SparkJarsError, match="iceberg-spark-runtime"):
        spark_jars.check_files(jars)
    spark_jars.check_files(spark_jars.resolve(SparkConfig(), {spark_jars.JARS_ENV: str(jar)}))


def test_a_jar_file_that_is_no_zip_is_refused_naming_it(tmp_path: Path) -> None:
    """Refused even when the other jars already hold every class the source needs (the classes are
    looked for in the smallest jars first, and the search stops once it has them all)."""
    jar, broken = tmp_path / "kafka.jar", tmp_path / "bundle.jar"
    with zipfile.ZipFile(jar, "w") as z:
        for cls, _ in spark_jars.REQUIRED_CLASSES:
            z.writestr(cls.replace(".", "/") + ".class", b"")
    broken.write_bytes(b"<html>not found</html>" * 1000)
    jars = spark_jars.resolve(SparkConfig(), {spark_jars.JARS_ENV: f"{jar},{broken}"})
    with pytest.raises(spark_jars.SparkJarsError, match=f"not a jar .*: {re.escape(str(broken))}$"):
        spark_jars.check_files(jars)


def test_compaction_is_due_by_delete_files_commits_or_age() -> None:
    settings, task = MaintenanceConfig(), Compact()
    assert task.due(health(), settings, False, NOW) is None
    assert "delete files" in (task.due(health(delete_files=20), settings, False, NOW) or "")
    assert "commits" in (task.due(health(commits_since_compaction=200), settings, False, NOW) or "")
    old = health(delete_files=1, first_snapshot=NOW - timedelta(hours=2))
    assert "max_age" in (task.due(old, settings, False, NOW) or "")
    compacted_lately = health(
        delete_files=1, last_compaction=NOW - timedelta(minutes=1), first_snapshot=NOW - timedelta(days=1)
    )
    assert task.due(compacted_lately, settings, False, NOW) is None


def test_maintain_once_compacts_whatever_holds_a_delete_or_small_files() -> None:
    settings, task = MaintenanceConfig(), Compact()
    assert task.due(health(delete_files=1), settings, True, NOW) == "maintain --once"
    assert task.due(health(data_files=1), settings, True, NOW) is None  # nothing to do
    assert task.due(health(data_files=0), settings, True, NOW) is None
    off = MaintenanceConfig(compaction={"enabled": False})  # type: ignore[arg-type]
    assert task.due(health(delete_files=50), off, True, NOW) is None


def test_expiry_manifests_and_orphans_are_due_on_their_own_terms() -> None:
    settings = MaintenanceConfig()
    old = NOW - timedelta(days=2)
    assert ExpireSnapshots().due(snapshots(100, old), settings, False, NOW) is None  # retain_last 100
    assert ExpireSnapshots().due(snapshots(110, old), settings, False, NOW) is not None
    assert ExpireSnapshots().due(snapshots(110, NOW - timedelta(hours=1)), settings, False, NOW) is None
    assert RewriteManifests().due(health(manifests=100), settings, False, NOW) is None
    assert RewriteManifests().due(health(manifests=101), settings, False, NOW) is not None
    # Over max_manifests, but only data manifests the sink merges itself: nothing for the maintainer.
    assert RewriteManifests().due(health(manifests=101, manifests_to_rewrite=1), settings, False, NOW) is None
    assert RewriteManifests().due(health(manifests=3), settings, True, NOW) is not None
    orphans = RemoveOrphans()
    assert orphans.due(health(), settings, False, NOW) is not None  # never looked: due
    orphans.last_run["ns.t"] = NOW - timedelta(hours=1)
    assert orphans.due(health(), settings, False, NOW) is None  # orphans.interval is 6h
    assert orphans.due(health(), settings, True, NOW) == "maintain --once"


def test_orphans_of_a_table_younger_than_the_safety_age_are_not_looked_for() -> None:
    """Nothing under a table born less than ``orphans.older_than`` (1 day) ago can be removed: its first
    listing waits, so a new table's maintainer goes to compaction; ``--once`` still looks."""
    settings, orphans = MaintenanceConfig(), RemoveOrphans()
    assert orphans.due(health(born=NOW - timedelta(hours=23)), settings, False, NOW) is None
    assert orphans.due(health(born=NOW - timedelta(hours=25)), settings, False, NOW) is not None
    assert orphans.due(health(born=NOW - timedelta(hours=23)), settings, True, NOW) == "maintain --once"


class _Current:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def current_snapshot(self) -> Snapshot:
        return self.snapshot


class _FreeTurns:
    """A txnlog whose named locks are always free (the sink's turns: service.commit.turns)."""

    @contextmanager
    def named_locks(self, names: list[str], *, shared: bool, wait: timedelta) -> Iterator[bool]:
        yield True


class _Procedure(TaskContext):
    """A task context whose procedure call answers ``row`` (Spark and the catalog faked away)."""

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(parse_config(BASE, env={}), None, "rest", None, _FreeTurns(), "ns.t")  # type: ignore[arg-type]
        self.row = row

    def call(self, procedure: str, **args: str) -> list[dict[str, Any]]:
        return [self.row]


@pytest.mark.parametrize(
    ("had_deletes", "rewritten", "dangling", "lost"),
    [
        pytest.param(True, 0, 0, True, id="deletes_and_nothing_committed"),
        pytest.param(True, 3, 0, False, id="deletes_applied"),
        pytest.param(True, 0, 2, False, id="only_dangling_deletes"),
        pytest.param(False, 0, 0, False, id="small_files_below_the_bin_packing_minimum"),
    ],
)
def test_a_compaction_whose_commits_all_lost_is_a_failure(
    monkeypatch: pytest.MonkeyPatch, had_deletes: bool, rewritten: int, dangling: int, lost: bool
) -> None:
    """Partial progress drops a file group whose commit lost every retry to the sink's commits, and the
    procedure still answers, with nothing rewritten and ``failed_data_files_count`` 0: with deletes in
    the table, that is a lost compaction (counted as a conflict), not one done."""
    from service.maintenance import tasks

    monkeypatch.setattr(tasks, "_drop_dangling_deletes", lambda _ctx: dangling)
    ctx = _Procedure({"rewritten_data_files_count": rewritten, "failed_data_files_count": 0})
    summary = Summary(Operation.OVERWRITE, **{"total-equality-deletes": "40" if had_deletes else "0"})
    snapshot = Snapshot(snapshot_id=1, sequence_number=1, timestamp_ms=0, manifest_list="l", summary=summary)
    ctx.catalog = type("Catalog", (), {"load_table": lambda self, _i: _Current(snapshot)})()
    if lost:
        with pytest.raises(CompactionLost, match="committed nothing"):
            Compact().run(ctx)
    else:
        assert Compact().run(ctx).files_rewritten == rewritten


def test_the_charts_values_schema_accepts_every_maintenance_setting() -> None:
    """The chart's schema refuses unknown keys: a setting added to ``maintenance:`` must be added to
    ``config.maintenance`` in values.schema.json too, or Helm rejects the values that use it."""
    import json

    from pydantic import BaseModel

    schema = json.loads((Path(__file__).parents[2] / "deploy/helm/icesink/values.schema.json").read_text())

    def compare(model: type[BaseModel], node: dict[str, Any], where: str) -> None:
        assert set(node["properties"]) == set(model.model_fields), where
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                compare(field.annotation, node["properties"][name], f"{where}.{name}")

    compare(MaintenanceConfig, schema["properties"]["config"]["properties"]["maintenance"], "maintenance")


def test_the_maintainer_rewrites_only_manifests_the_sink_s_merge_leaves_alone() -> None:
    """The sink merges data manifests within ``target_bytes`` at each commit; a rewrite of one of those
    would race it. Delete manifests, larger data manifests, and any manifest of a table that does not
    merge are the maintainer's; a manifest of removed entries only the sink drops by itself."""
    merge = ManifestMerge.of({})
    small, big = merge.target_bytes, merge.target_bytes + 1
    assert not merge.rewritable(deletes=False, length=small, live=True)
    assert merge.rewritable(deletes=False, length=big, live=True)
    assert merge.rewritable(deletes=True, length=small, live=True)
    assert not merge.rewritable(deletes=True, length=small, live=False)
    off = ManifestMerge.of({"commit.manifest-merge.enabled": "false"})
    assert off.rewritable(deletes=False, length=small, live=True)


def test_one_blob_under_any_of_its_names_is_one_file_for_the_orphan_search() -> None:
    from service.maintenance.orphans import _normalise

    names = [
        "abfss://lake@acct.dfs.core.windows.net/wh/t/data/f.parquet",
        "abfs://lake@acct.dfs.core.windows.net/wh/t/data/f.parquet",
        "wasbs://lake@acct.blob.core.windows.net/wh/t/data/f.parquet",
    ]
    assert len({_normalise(n) for n in names}) == 1
    assert _normalise("abfss://lake@other.dfs.core.windows.net/wh/t/data/f.parquet") != _normalise(names[0])
    assert _normalise("gcs://b/t/f.parquet") == _normalise("gs://b/t/f.parquet")


def test_an_adls_location_in_another_account_is_refused_not_read_in_the_configured_one() -> None:
    from service.model.object_store import ObjectStoreIO

    with pytest.raises(ValueError, match="not in the storage account acct"):
        ObjectStoreIO.parse_location(
            "abfss://lake@other.dfs.core.windows.net/f", {"adls.account-name": "acct"}
        )


def test_a_catalog_on_two_stores_gets_the_file_io_that_picks_by_scheme() -> None:
    both = {
        "type": "rest",
        "uri": "http://rest:8181",
        "s3.endpoint": "http://minio:9000",
        "gcs.project-id": "p",
    }
    conf = catalog_conf(parse_config(with_(catalog=both), env={}), "lake")
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.io.ResolvingFileIO"


def test_a_table_with_gc_disabled_is_never_expired_nor_cleaned_of_orphans() -> None:
    """``gc.enabled=false`` (Nessie sets it: files may be shared between branches): even ``--once``
    leaves expiry and orphan removal alone, as Iceberg's own actions would refuse them."""
    times = tuple(NOW - timedelta(days=30, minutes=-i) for i in range(150))  # beyond retain_last, all old
    settings, old = MaintenanceConfig(), health(born=NOW - timedelta(days=30), snapshot_times=times)
    kept = health(born=NOW - timedelta(days=30), snapshot_times=times, gc_enabled=False)
    for task in (ExpireSnapshots(), RemoveOrphans()):
        assert task.due(old, settings, True, NOW) is not None
        assert task.due(kept, settings, True, NOW) is None


def test_a_sas_token_reaches_adls_file_io_without_its_question_mark() -> None:
    adls = {
        "type": "sql",
        "uri": "postgresql+psycopg://u@h/db",
        "warehouse": "abfss://lake@acct.dfs.core.windows.net/wh",
        "adls.account-name": "acct",
        "adls.sas-token": "?sv=1&sig=x",
    }
    conf = catalog_conf(parse_config(with_(catalog={"name": "lake", **adls}), env={}), "lake")
    assert conf["spark.sql.catalog.lake.adls.sas-token.acct.dfs.core.windows.net"] == "sv=1&sig=x"
