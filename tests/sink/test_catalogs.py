"""Catalog types other than REST, end to end against their real servers: the sink lands a stream in
upsert mode exactly, survives a SIGKILL mid-workload, and `icesink maintain --once` (Spark's Iceberg
catalog of the same type) compacts the table without changing a row. docs/configuration.md's matrix
names each test.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from readers import duckdb_connect, trino_catalog, trino_rows
from service.config import parse_config
from service.maintenance.spark import CATALOG, catalog_conf, spark_catalog_name
from tests.conftest import azure_account_sas
from tests.google_oauth import GcsCredentialCheck, GoogleTokenService
from tests.http_stub import Reply, Request, StubServer
from tests.sink.conftest import Sink
from tests.sink.expect import diff
from tests.sink.test_end_to_end import _catalog
from tests.sink.test_restarts import sigkill_mid_workload
from txnlog import Phase


def _spark_catalog(spark: Any, sink: Sink) -> str:
    """The sink's catalog added to the test's Spark session, as icesink maps it for its maintainer
    (:func:`service.maintenance.spark.catalog_conf`), under a name of its own; that name."""
    config = parse_config(sink.config)
    name = spark_catalog_name(config)
    if name == CATALOG:  # a catalog whose Spark name is free: one per test (Spark keeps each it made)
        name = f"cat_{uuid.uuid4().hex[:8]}"
    for key, value in catalog_conf(config, name).items():
        if key != "spark.sql.defaultCatalog":
            spark.conf.set(key, value)
    return name


def _trino_properties(sink: Sink, gcs_key: Path | None = None) -> dict[str, str]:
    """The sink's catalog as a Trino Iceberg catalog of the same type, its warehouse on the stack's S3
    or, with a service account's key (``gcs_key``: Trino's GCS file system takes no bare token), on the
    GCS emulator; the secrets as Trino's ``${ENV:...}`` (dev/stack gives Trino the S3 keys and Postgres's
    password)."""
    catalog = sink.config["catalog"]
    if gcs_key is not None:
        store = {
            "fs.native-gcs.enabled": "true",
            "gcs.project-id": catalog["gcs.project-id"],
            "gcs.endpoint": catalog["gcs.service.host"],
            "gcs.json-key-file-path": str(gcs_key),
        }
    else:
        store = {
            "fs.native-s3.enabled": "true",
            "s3.endpoint": catalog["s3.endpoint"],
            "s3.region": catalog["s3.region"],
            "s3.path-style-access": "true",
            "s3.aws-access-key": "${ENV:AWS_ACCESS_KEY_ID}",
            "s3.aws-secret-key": "${ENV:AWS_SECRET_ACCESS_KEY}",
        }
    if catalog["type"] == "rest":
        return {"iceberg.catalog.type": "rest", "iceberg.rest-catalog.uri": catalog["uri"], **store}
    if catalog["type"] == "hive":
        return {"iceberg.catalog.type": "hive_metastore", "hive.metastore.uri": catalog["uri"], **store}
    if catalog["type"] == "glue":
        return {
            "iceberg.catalog.type": "glue",
            "hive.metastore.glue.region": catalog["glue.region"],
            "hive.metastore.glue.endpoint-url": catalog["glue.endpoint"],
            "hive.metastore.glue.aws-access-key": "${ENV:AWS_ACCESS_KEY_ID}",
            "hive.metastore.glue.aws-secret-key": "${ENV:AWS_SECRET_ACCESS_KEY}",
            **store,
        }
    url = urlsplit(catalog["uri"])  # postgresql+psycopg://user:password@host:port/db
    assert catalog["type"] == "sql" and url.scheme.startswith("postgresql"), (
        f"no Trino mapping: {catalog['type']}"
    )
    return {
        "iceberg.catalog.type": "jdbc",
        "iceberg.jdbc-catalog.catalog-name": catalog["name"],
        "iceberg.jdbc-catalog.driver-class": "org.postgresql.Driver",
        "iceberg.jdbc-catalog.connection-url": f"jdbc:postgresql://{url.hostname}:{url.port or 5432}{url.path}",
        "iceberg.jdbc-catalog.connection-user": unquote(url.username or ""),
        "iceberg.jdbc-catalog.connection-password": "${ENV:ICESINK_PG_PASSWORD}",
        "iceberg.jdbc-catalog.default-warehouse-dir": catalog["warehouse"],
        **store,
    }


def read_everywhere(spark: Any, sink: Sink, gcs_key: Path | None = None) -> list[str]:
    """The table read through pyiceberg's catalog and through Spark's catalog of the same type; by DuckDB
    from its current metadata where DuckDB reaches the table's store here (S3, GCS: not an emulator's
    ADLS), and by Trino through its catalog of the same type where Trino does (S3, and GCS with a
    service account's key, ``gcs_key``): what each reader found wrong."""
    table = _catalog(sink).load_table(sink.table)
    store = urlsplit(table.location()).scheme
    assert store in ("s3", "gs", "abfs", "abfss"), f"which readers reach {table.location()}?"
    expected = sink.source.expected_rows()
    problems = [diff(expected, table.scan().to_arrow().to_pylist(), "pyiceberg")]
    rows = spark.table(f"{_spark_catalog(spark, sink)}.{sink.table}").collect()
    problems.append(diff(expected, [r.asDict() for r in rows], "spark"))
    if store == "s3" or (store == "gs" and gcs_key is not None):
        with trino_catalog(f"cat_{uuid.uuid4().hex[:8]}", _trino_properties(sink, gcs_key)) as trino:
            problems.append(diff(expected, trino_rows(sink.table, catalog=trino), "trino"))
    if store in ("s3", "gs"):
        con = duckdb_connect()
        try:
            if store == "gs":  # the database is the process's: the secret goes with this read
                _duckdb_gcs_secret(con, parse_config(sink.config).catalog_properties)
            cursor = con.execute(f"SELECT * FROM iceberg_scan('{table.metadata_location}')")
            names = [d[0] for d in cursor.description or []]
            problems.append(
                diff(expected, [dict(zip(names, r, strict=True)) for r in cursor.fetchall()], "duckdb")
            )
        finally:
            if store == "gs":
                con.execute("DROP SECRET IF EXISTS icesink_gcs")
            con.close()
    return [p for p in problems if p]


def _duckdb_gcs_secret(con: Any, props: dict[str, Any]) -> None:
    """DuckDB's secret for GCS from the catalog's pyiceberg properties: the bearer token
    (``gcs.oauth2.token``) and, for an emulator or a private endpoint, ``gcs.service.host``."""
    endpoint = urlsplit(props.get("gcs.service.host", "https://storage.googleapis.com"))
    con.execute(
        """CREATE OR REPLACE SECRET icesink_gcs (TYPE gcs, BEARER_TOKEN $token, ENDPOINT $endpoint,
           URL_STYLE 'path', USE_SSL $ssl)""",
        {"token": props["gcs.oauth2.token"], "endpoint": endpoint.netloc, "ssl": endpoint.scheme == "https"},
    )


def _s3(stack: Any) -> dict[str, str]:
    return {
        "s3.endpoint": stack.s3_endpoint,
        "s3.access-key-id": "${AWS_ACCESS_KEY_ID}",
        "s3.secret-access-key": "${AWS_SECRET_ACCESS_KEY}",
        "s3.region": stack.region,
    }


def test_sql_catalog_on_postgres_with_s3_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, unique_name: Any, trino: str
) -> None:
    name = unique_name("sqlcat")
    catalog = {
        "name": name,  # pyiceberg's SqlCatalog and Iceberg's JdbcCatalog key their rows by it
        "type": "sql",
        "uri": stack.pg_dsn,
        "warehouse": f"{stack.warehouse.rstrip('/')}/{name}",
        **_s3(stack),
    }
    _lands_survives_a_kill_and_is_maintained(make_sink(catalog=catalog, **_SINK), spark)


def test_glue_catalog_with_s3_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, glue: str, unique_name: Any, trino: str
) -> None:
    catalog = {
        "name": "glue",
        "type": "glue",
        "glue.endpoint": glue,  # moto's server (dev/stack); AWS's by default
        "glue.region": stack.region,
        "warehouse": f"{stack.warehouse.rstrip('/')}/{unique_name('glue')}",
        **_s3(stack),
    }
    _lands_survives_a_kill_and_is_maintained(make_sink(catalog=catalog, **_SINK), spark)


def test_nessie_rest_catalog_with_s3_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, nessie: str, trino: str
) -> None:
    """Another server behind the REST protocol: Nessie's Iceberg REST API (its own warehouse on S3, its
    branch ``main`` the REST prefix it hands out in its config)."""
    catalog = {"name": "nessie", "type": "rest", "uri": nessie, **_s3(stack)}
    _lands_survives_a_kill_and_is_maintained(make_sink(catalog=catalog, **_SINK), spark)


def test_hive_metastore_catalog_with_s3_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, hive: str, trino: str
) -> None:
    """A Hive metastore (4.0.0, its database on Postgres): pyiceberg's HiveCatalog for the sink, Iceberg's
    HiveCatalog through Spark's Hive client for the maintainer, each commit under the metastore's lock.
    The tables are where the metastore puts a new namespace, on the S3 server."""
    catalog = {"name": "hive", "type": "hive", "uri": hive, **_s3(stack)}
    sink = make_sink(catalog=catalog, **_SINK)
    _lands_survives_a_kill_and_is_maintained(sink, spark)
    location = _catalog(sink).load_table(sink.table).location()
    assert location.startswith("s3://warehouse/hive/"), location


def test_hive_metastore_3_catalog_with_s3_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, hive3: str, trino: str
) -> None:
    """A Hive metastore of the 3.x line (3.1.3) behind the same catalog type: pyiceberg's HiveCatalog
    commits under its lock (a lock a killed sink held expires in its housekeeper), Spark's Hive 2.3
    client compacts, Trino reads through its own metastore client."""
    catalog = {"name": "hive3", "type": "hive", "uri": hive3, **_s3(stack)}
    sink = make_sink(catalog=catalog, **_SINK)
    _lands_survives_a_kill_and_is_maintained(sink, spark)
    location = _catalog(sink).load_table(sink.table).location()
    assert location.startswith("s3://warehouse/hive3/"), location


def gcs_catalog(stack: Any, gcs: str, name: str) -> dict[str, str]:
    """A SQL catalog on the stack's Postgres whose warehouse is on the GCS emulator: a bearer token from
    ``$ICESINK_TEST_GCS_TOKEN`` (any: the emulator checks none), with the expiry pyarrow requires."""
    return {
        "name": name,
        "type": "sql",
        "uri": stack.pg_dsn,
        "warehouse": f"gs://warehouse/{name}",
        "gcs.service.host": gcs,
        "gcs.project-id": "icesink",
        "gcs.oauth2.token": "${ICESINK_TEST_GCS_TOKEN}",
        "gcs.oauth2.token-expires-at": str(int((time.time() + 86400) * 1000)),
    }


def test_sql_catalog_with_gcs_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, gcs: str, gcs_service_account: Any, unique_name: Any
) -> None:
    """Tables on Google Cloud Storage (the stack's emulator): pyarrow's GCS client writes them for the
    sink, Iceberg's GCSFileIO for the maintainer and the Spark reader, both given a token; DuckDB reads
    them with the token, Trino with a service account's key (a token from the stand-in it names)."""
    name = unique_name("gcscat")
    sink = make_sink(catalog=gcs_catalog(stack, gcs, name), **_SINK)
    issued = gcs_service_account.tokens_issued("key")
    _lands_survives_a_kill_and_is_maintained(sink, spark, gcs_service_account.key_file)
    assert gcs_service_account.tokens_issued("key") > issued, "Trino read without the service account's key"
    files = [str(f) for f in _catalog(sink).load_table(sink.table).inspect.files()["file_path"].to_pylist()]
    assert files and all(f.startswith(f"gs://warehouse/{name}/") for f in files), files[:3]


def test_sql_catalog_with_gcs_and_application_default_credentials_lands_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, gcs: str, gcs_service_account: Any, unique_name: Any
) -> None:
    """No token in the configuration: Google's application-default credentials, a service account's key
    that ``GOOGLE_APPLICATION_CREDENTIALS`` names, for the sink (pyarrow's GCS client sends a JWT it signs
    with the key) and the maintainer (Iceberg's GCSFileIO trades the key for a token at its ``token_uri``,
    the stand-in)."""
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(gcs_service_account.key_file)}
    seen = _lands_and_is_maintained_with_credentials_from(
        env, make_sink, spark, stack, gcs, gcs_service_account, unique_name("gcsadc")
    )
    assert seen["sink"] == {"self-signed"} and seen["maintainer"] >= {"key"}, seen


def _no_google_credentials(tmp_path: Path) -> dict[str, str | None]:
    """No key, and no gcloud login of whoever runs the tests (an empty gcloud configuration directory):
    Google's libraries look for both before the metadata server."""
    return {"GOOGLE_APPLICATION_CREDENTIALS": None, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")}


def test_sql_catalog_with_gcs_and_the_metadata_server_lands_and_is_maintained(
    make_sink: Any,
    spark: Any,
    stack: Any,
    gcs: str,
    gcs_service_account: Any,
    unique_name: Any,
    tmp_path: Path,
) -> None:
    """No token and no key: the service account's tokens come from the metadata server, as on Compute
    Engine or on GKE with workload identity. The stand-in serves it; both libraries are pointed at it
    as Google documents for a metadata server at another address (``GCE_METADATA_ROOT`` for pyarrow's
    C++ client, ``GCE_METADATA_HOST`` for the Java one the maintainer's GCSFileIO uses)."""
    host = gcs_service_account.metadata_host
    env = {"GCE_METADATA_ROOT": host, "GCE_METADATA_HOST": host, **_no_google_credentials(tmp_path)}
    seen = _lands_and_is_maintained_with_credentials_from(
        env, make_sink, spark, stack, gcs, gcs_service_account, unique_name("gcsmeta")
    )
    assert seen == {"sink": {"metadata"}, "maintainer": {"metadata"}}, seen


def test_check_gives_up_on_a_gcs_store_it_finds_no_credentials_for(
    make_sink: Any, stack: Any, gcs: str, unique_name: Any, tmp_path: Path
) -> None:
    """No token, no key, and a metadata server that answers only 503: pyarrow's GCS client would go on
    asking it for 15 minutes. `icesink check` gives up on the object store at its time limit and says
    where GCS credentials come from; the checks before it pass."""
    asked: list[str] = []

    def unavailable(request: Request) -> Reply:
        asked.append(request.path)
        return Reply(503)

    metadata = StubServer(unavailable)
    host = metadata.start().removeprefix("http://")
    catalog = {k: v for k, v in gcs_catalog(stack, gcs, unique_name("gcsnone")).items() if "oauth2" not in k}
    sink = make_sink(catalog=catalog, **_SINK)
    env = {"GCE_METADATA_ROOT": host, "GCE_METADATA_HOST": host, **_no_google_credentials(tmp_path)}
    try:
        started = time.monotonic()
        done = sink.cli("check", "--timeout", "10s", env=env, timeout=300)
        took = time.monotonic() - started
    finally:
        metadata.stop()
    assert asked, "the GCS client never asked the metadata server for credentials"
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "ok   catalog:" in done.stdout, done.stdout
    assert "FAIL object store: NoAnswer: no answer within 10 s; with no gcs.oauth2.token" in done.stdout, (
        done.stdout
    )
    assert took < 120, f"check took {took:.0f} s"


def _lands_and_is_maintained_with_credentials_from(
    env: Mapping[str, str | None],
    make_sink: Any,
    spark: Any,
    stack: Any,
    gcs: str,
    service: GoogleTokenService,
    name: str,
) -> dict[str, set[str]]:
    """The sink lands the stream and `icesink maintain --once` compacts it, both taking their GCS
    credentials from ``env`` alone; they reach the emulator through a check that refuses any request the
    service account did not authenticate, and the readers then read the table with a token, straight
    from the emulator. How the sink's and the maintainer's requests were authenticated."""
    check = GcsCredentialCheck(gcs, service)
    endpoint = check.start()
    direct = gcs_catalog(stack, gcs, name)
    from_env = {k: v for k, v in direct.items() if not k.startswith("gcs.oauth2.")}
    sink = make_sink(catalog={**from_env, "gcs.service.host": endpoint}, **_SINK)
    try:
        sink.produce(300)
        sink.run_until_caught_up(env=env)
        by_sink = Counter(check.seen)
        done = sink.cli("maintain", "--once", env=env, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        (maintained,) = json.loads(done.stdout)["tables"]
        assert maintained["failed"] == {} and "compact" in maintained["tasks"], maintained
    finally:
        check.stop()
    assert check.refused == 0, f"{check.refused} requests refused: {dict(check.seen)}"
    sink.config["catalog"] = direct
    problems = read_everywhere(spark, sink)
    assert not problems, "\n".join(problems)
    return {"sink": set(+by_sink), "maintainer": set(+(check.seen - by_sink))}


def adls_catalog(stack: Any, azurite: dict[str, str], name: str) -> dict[str, str]:
    """A SQL catalog on the stack's Postgres whose warehouse is on Azurite, at the canonical abfs://
    location; icesink's FileIO named for the test's pyiceberg reader (the sink's default already)."""
    account = azurite["adls.account-name"]
    return {
        "name": name,
        "type": "sql",
        "uri": stack.pg_dsn,
        "warehouse": f"abfs://warehouse@{account}.dfs.core.windows.net/{name}",
        "py-io-impl": "service.model.object_store.ObjectStoreIO",
        **azurite,
    }


def test_sql_catalog_with_adls_lands_survives_a_kill_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, azurite: dict[str, str], unique_name: Any
) -> None:
    """Tables on Azure Blob Storage / ADLS (Azurite) at their canonical abfs:// locations, the account's
    shared key: pyarrow's AzureFileSystem writes them for the sink, Iceberg's ADLSFileIO for the
    maintainer and the Spark reader. pyiceberg reads them through icesink's FileIO (``py-io-impl``):
    pyiceberg 0.12's own PyArrowFileIO takes ``container@account`` for the container.

    The maintainer's orphan task is off: Iceberg's ADLSFileIO lists a prefix with the Data Lake API
    (``listPaths`` on the dfs endpoint), which Azurite does not serve (HTTP 400). `icesink orphans`
    (pyarrow's Blob listing) runs instead, and must name every listed file as the table does."""
    catalog = adls_catalog(stack, azurite, unique_name("adlscat"))
    sink = make_sink(catalog=catalog, maintenance={"orphans": {"enabled": False}}, **_SINK)
    _lands_survives_a_kill_and_is_maintained(sink, spark)
    files = [str(f) for f in _catalog(sink).load_table(sink.table).inspect.files()["file_path"].to_pylist()]
    assert files and all(f.startswith(catalog["warehouse"] + "/") for f in files), files[:3]
    listing = sink.cli("orphans")
    assert listing.returncode == 0, listing.stderr[-3000:]
    report = json.loads(listing.stdout)
    assert report["files_listed"] >= len(files), report
    assert report["referenced_by_snapshots"] >= len(files), f"listed names unlike the table's: {report}"


def test_sql_catalog_with_adls_and_a_sas_token_lands_and_is_maintained(
    make_sink: Any, spark: Any, stack: Any, azurite_sas: dict[str, str], unique_name: Any
) -> None:
    """The same store reached with an account SAS token instead of the key, given without its leading
    "?" (as `az storage account generate-sas` prints it): pyarrow's AzureFileSystem writes with it for the
    sink (which needs the "?", :class:`service.model.object_store.ObjectStoreIO`), Iceberg's ADLSFileIO
    compacts and reads with it (``adls.sas-token.<host>``)."""
    catalog = adls_catalog(stack, azurite_sas, unique_name("adlssas"))
    assert "adls.account-key" not in catalog
    assert not os.environ["ICESINK_TEST_AZURE_SAS_TOKEN"].startswith("?")
    sink = make_sink(catalog=catalog, maintenance={"orphans": {"enabled": False}}, **_SINK)
    sink.produce(300)
    sink.run_until_caught_up()
    problems = read_everywhere(spark, sink)
    assert not problems, "\n".join(problems)
    _is_maintained_exactly(sink, spark)


def test_check_refuses_an_adls_sas_token_signed_with_another_key(
    make_sink: Any, stack: Any, azurite: dict[str, str], unique_name: Any
) -> None:
    """A SAS token Azure does not accept (signed with a key not the account's) fails `icesink check` at
    its object-store probe, before anything is written, and the token is not printed."""
    other_key = base64.b64encode(b"not the account key" * 3).decode()
    token = azure_account_sas(azurite["adls.account-name"], other_key)
    props = {k: v for k, v in azurite.items() if k != "adls.account-key"}
    catalog = adls_catalog(stack, {**props, "adls.sas-token": "${BAD_SAS_TOKEN}"}, unique_name("adlsbad"))
    sink = make_sink(catalog=catalog)
    refused = sink.cli("check", env={"BAD_SAS_TOKEN": token})
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "FAIL object store" in refused.stdout, refused.stdout + refused.stderr
    assert "AuthorizationFailure" in refused.stdout or "403" in refused.stdout, refused.stdout
    printed = refused.stdout + refused.stderr
    signature = parse_qs(token)["sig"][0]  # as given (URL-encoded in the token) and decoded
    assert not any(s in printed for s in (token, signature, quote(signature, safe=""))), printed


_SINK: dict[str, Any] = {
    "keys": 150,
    "table": {"delete_format": "position"},  # pyiceberg reads position deletes, not equality deletes
    "commit": {"trigger_interval": "500ms"},
    "kafka": {"max_offsets_per_trigger": 60},  # many small commits: something for maintenance to compact
}


def _lands_survives_a_kill_and_is_maintained(sink: Sink, spark: Any, gcs_key: Path | None = None) -> None:
    """Exact after a SIGKILL mid-workload and the resume, by every reader; then exact again after
    `icesink maintain --once` compacted the table through Spark's catalog of the same type."""
    sink.produce(300)
    run = sink.start(process=True)
    run.wait_for_log("committed seq", timeout=240)
    left = sigkill_mid_workload(sink, run, lambda: sink.produce(300))
    sink.produce(200)
    last = sink.run_until_caught_up()
    if left.phase is Phase.PRECOMMIT:  # the kill landed mid-commit: the next run finished that plan
        assert f"recovering sink {sink.name}: plan seq {left.seq} " in last.log(), last.log()[-4000:]
    problems = read_everywhere(spark, sink, gcs_key)
    assert not problems, "\n".join(problems)
    _is_maintained_exactly(sink, spark, gcs_key)


def _is_maintained_exactly(sink: Sink, spark: Any, gcs_key: Path | None = None) -> None:
    """`icesink maintain --once` compacts the table through Spark's catalog of the same type, and every
    reader still gets exactly the rows."""
    table = _catalog(sink).load_table(sink.table)
    files_before = len(table.inspect.files())
    # Files, not snapshots: Nessie's REST API hands out a table's current snapshot only.
    assert files_before >= 3, f"several files to compact: {files_before}"
    done = sink.cli("maintain", "--once", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (maintained,) = json.loads(done.stdout)["tables"]
    assert maintained["failed"] == {}, maintained
    assert "compact" in maintained["tasks"], maintained  # Spark's catalog reached the table
    files_after = len(_catalog(sink).load_table(sink.table).inspect.files())
    assert files_after < files_before, f"maintenance left {files_after} files of {files_before}"
    problems = read_everywhere(spark, sink, gcs_key)
    assert not problems, "after maintenance:\n" + "\n".join(problems)
