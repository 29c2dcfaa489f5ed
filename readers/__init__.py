"""Reference readers: what an Iceberg table holds, as seen by four independent engines.

* :func:`spark_rows` reads through Spark with the Iceberg runtime (the `spark` fixture's catalog `rest`).
* :func:`duckdb_rows` reads through DuckDB 1.5.5's iceberg extension, loaded offline from the files of
  the PyPI packages ``duckdb-extension-iceberg/-avro/-httpfs`` (autoinstall/autoload off), attached to
  the REST catalog with an S3 secret for the local endpoint.
* :func:`trino_rows` reads through the stack's Trino server (catalog ``iceberg``: the REST catalog with
  native S3, see docs/trino.md) with the ``trino`` client from PyPI.

* :func:`pyiceberg_rows` reads through pyiceberg's own scan (REST catalog, PyArrow FileIO).

Spark, DuckDB and Trino honour position and equality deletes; pyiceberg (0.12) reads position deletes
and refuses a table with equality deletes ("does not yet support equality deletes"). Each gives a
table's live rows, now or at a snapshot.
Rows come back as ``list[dict]`` in no particular order; sort them before comparing. Endpoints are read
from the environment (the variables of ``dev/stack env``; tests/conftest.py loads them).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    import trino
    from pyspark.sql import SparkSession

DUCKDB_EXTENSIONS = ("httpfs", "avro", "iceberg")


def _parts(identifier: str | tuple[str, ...]) -> list[str]:
    parts = list(identifier) if isinstance(identifier, tuple) else identifier.split(".")
    if len(parts) < 2:
        raise ValueError(f"expected <namespace>.<table>, got {identifier!r}")
    return parts


def _quote(parts: list[str], q: str) -> str:
    return ".".join(q + p.replace(q, q + q) + q for p in parts)


def spark_conf(env: Mapping[str, str] | None = None, catalog: str = "rest", cores: int = 2) -> dict[str, str]:
    """Spark settings for a local reader with an Iceberg catalog `catalog` on the stack's REST catalog and S3.

    The catalog's table cache is off: with Iceberg's default (`cache-enabled`, 30 s) a read soon after
    another one can be served from the cached metadata and miss the snapshots committed in between.
    """
    env = os.environ if env is None else env
    prefix = f"spark.sql.catalog.{catalog}"
    return {
        # On the class path, read in place: as spark.jars a local session copies them into its scratch.
        "spark.driver.extraClassPath": os.pathsep.join(
            j.strip() for j in env["ICESINK_SPARK_JARS"].split(",") if j.strip()
        ),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "rest",
        f"{prefix}.uri": env["ICESINK_REST_URI"].rstrip("/"),
        f"{prefix}.cache-enabled": "false",
        f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        f"{prefix}.s3.endpoint": env["ICESINK_S3_ENDPOINT"],
        f"{prefix}.s3.path-style-access": "true",
        f"{prefix}.s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
        f"{prefix}.s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
        f"{prefix}.client.region": env.get("AWS_REGION", "us-east-1"),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "2g",
    }


def spark_rows(
    spark: SparkSession,
    identifier: str | tuple[str, ...],
    snapshot_id: int | None = None,
    catalog: str = "rest",
) -> list[dict[str, Any]]:
    """Rows of `<namespace>.<table>` in Spark's Iceberg catalog `catalog`, at `snapshot_id` if given."""
    sql = f"SELECT * FROM {_quote([catalog, *_parts(identifier)], '`')}"
    if snapshot_id is not None:
        sql += f" VERSION AS OF {int(snapshot_id)}"
    return [row.asDict(recursive=True) for row in spark.sql(sql).collect()]


@functools.cache
def duckdb_extension_path(name: str) -> Path:
    """The .duckdb_extension file shipped by the PyPI package `duckdb-extension-<name>` (looked for once
    a process: every connection loads it)."""
    import importlib

    import duckdb

    package = importlib.import_module(f"duckdb_extension_{name}")
    root = Path(package.__file__ or "").parent
    version = f"v{duckdb.__version__}"
    found = sorted(root.rglob(f"{name}.duckdb_extension"))
    matching = [p for p in found if version in p.parts] or found
    if not matching:
        raise FileNotFoundError(f"no {name}.duckdb_extension under {root}")
    return matching[0]


@functools.cache
def _duckdb_database(s3: tuple[tuple[str, Any], ...]) -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB a process for each S3 set-up, its extensions loaded and its S3 secret made.

    A ``LOAD`` reads and checks the whole extension file (83 MB for the three): ~0.35 CPU-s a
    connection, most of a DuckDB read of a small table, and pytest workers make hundreds. The
    connections :func:`duckdb_connect` hands out are cursors of this database, so they share what it
    loaded (secrets and attached catalogs are the database's, not a cursor's)."""
    import duckdb

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    # A read fetches the files from S3 each time, as a new DuckDB would: the database outlives many
    # reads, and its cache of remote files would grow with every table a worker reads.
    con.execute("SET enable_external_file_cache = false")
    for name in DUCKDB_EXTENSIONS:
        con.execute(f"LOAD '{duckdb_extension_path(name)}'")
    con.execute(
        """CREATE SECRET icesink_s3 (TYPE s3, KEY_ID $key, SECRET $secret, REGION $region,
           ENDPOINT $endpoint, URL_STYLE 'path', USE_SSL $ssl)""",
        dict(s3),
    )
    return con


def duckdb_connect(env: Mapping[str, str] | None = None, catalog: str = "cat") -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the extensions loaded from their package files (never downloaded),
    an S3 secret for the local endpoint, and the REST catalog attached as `catalog`.

    The catalog is attached again at every call (``OR REPLACE``), so a connection reads the catalog as
    it is now, never what an earlier connection of the process saw; a connection still open under the
    same name then reads through the new one."""
    import duckdb

    env = os.environ if env is None else env
    endpoint = env["ICESINK_S3_ENDPOINT"]
    s3 = {
        "key": env["AWS_ACCESS_KEY_ID"],
        "secret": env["AWS_SECRET_ACCESS_KEY"],
        "region": env.get("AWS_REGION", "us-east-1"),
        "endpoint": endpoint.split("://", 1)[-1].rstrip("/"),
        "ssl": endpoint.startswith("https://"),
    }
    rest_uri = env["ICESINK_REST_URI"].rstrip("/")
    attach = (
        f"ATTACH OR REPLACE 'warehouse' AS {catalog} "
        f"(TYPE iceberg, ENDPOINT '{rest_uri}', AUTHORIZATION_TYPE 'none')"
    )
    try:
        return _duckdb_database(tuple(s3.items())).cursor().execute(attach)
    except duckdb.Error as exc:
        # DuckDB invalidates a database after a fatal error in any of its connections: later reads of
        # the process start from a new one, as each did before the database was shared.
        if "invalidated" not in str(exc):
            raise
        _duckdb_database.cache_clear()
        return _duckdb_database(tuple(s3.items())).cursor().execute(attach)


def duckdb_rows(
    identifier: str | tuple[str, ...],
    snapshot_id: int | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Rows of `<namespace>.<table>` through DuckDB's iceberg extension, at `snapshot_id` if given."""
    con = duckdb_connect(env)
    try:
        sql = f"SELECT * FROM {_quote(['cat', *_parts(identifier)], chr(34))}"
        if snapshot_id is not None:
            sql += f" AT (VERSION => {int(snapshot_id)})"
        cursor = con.execute(sql)
        columns = [d[0] for d in cursor.description or []]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()


def trino_connect(env: Mapping[str, str] | None = None, catalog: str = "iceberg") -> trino.dbapi.Connection:
    """A connection to the stack's Trino (``ICESINK_TRINO_URI``) with `catalog` as its default catalog."""
    from urllib.parse import urlsplit

    import trino

    env = os.environ if env is None else env
    uri = urlsplit(env["ICESINK_TRINO_URI"])
    return trino.dbapi.connect(
        host=uri.hostname,
        port=uri.port,
        http_scheme=uri.scheme,
        user="icesink",
        catalog=catalog,
        request_timeout=120,
    )


def trino_query(sql: str, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The rows of one Trino statement, as dicts."""
    con = trino_connect(env)
    try:
        cursor = con.cursor()
        cursor.execute(sql)
        rows = cursor.fetchall()
        columns = [d[0] for d in cursor.description or []]
        return [dict(zip(columns, row, strict=True)) for row in rows]
    finally:
        con.close()


@contextlib.contextmanager
def trino_catalog(
    name: str, properties: Mapping[str, str], env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """An Iceberg catalog added to the stack's Trino for the ``with`` block (``CREATE CATALOG``: its
    ``catalog.management`` is dynamic), dropped after it; its name. Secrets belong in ``properties`` as
    ``${ENV:NAME}``, resolved from Trino's own environment: Trino logs the statement whole."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"a Trino catalog name of lower-case letters, digits and _: {name!r}")
    options = ", ".join(f"{_quote([k], chr(34))} = {_quote([v], chr(39))}" for k, v in properties.items())
    trino_query(f"CREATE CATALOG {name} USING iceberg WITH ({options})", env)
    try:
        yield name
    except BaseException:
        with contextlib.suppress(Exception):  # the block's own error is the one to see
            trino_query(f"DROP CATALOG IF EXISTS {name}", env)
        raise
    trino_query(f"DROP CATALOG IF EXISTS {name}", env)


def trino_table(identifier: str | tuple[str, ...], catalog: str = "iceberg") -> str:
    """`<namespace>.<table>` as a quoted Trino name in `catalog`."""
    return _quote([catalog, *_parts(identifier)], chr(34))


def trino_rows(
    identifier: str | tuple[str, ...],
    snapshot_id: int | None = None,
    env: Mapping[str, str] | None = None,
    catalog: str = "iceberg",
) -> list[dict[str, Any]]:
    """Rows of `<namespace>.<table>` through Trino's Iceberg connector, at `snapshot_id` if given."""
    sql = f"SELECT * FROM {trino_table(identifier, catalog)}"
    if snapshot_id is not None:
        sql += f" FOR VERSION AS OF {int(snapshot_id)}"
    return trino_query(sql, env)


def pyiceberg_catalog(env: Mapping[str, str] | None = None) -> Any:
    """The stack's REST catalog through pyiceberg, with the local S3 endpoint."""
    from pyiceberg.catalog import load_catalog

    env = os.environ if env is None else env
    return load_catalog(
        "rest",
        type="rest",
        uri=env["ICESINK_REST_URI"],
        **{
            "s3.endpoint": env["ICESINK_S3_ENDPOINT"],
            "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
            "s3.region": env.get("AWS_REGION", "us-east-1"),
        },
    )


def pyiceberg_rows(
    identifier: str | tuple[str, ...],
    snapshot_id: int | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Rows of `<namespace>.<table>` through pyiceberg's scan, at `snapshot_id` if given; raises for a
    table whose deletes include equality deletes."""
    table = pyiceberg_catalog(env).load_table(".".join(_parts(identifier)))
    rows: list[dict[str, Any]] = table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return rows
