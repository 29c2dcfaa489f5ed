"""The maintainer's Spark session: the sink's catalog, as an Iceberg catalog of Spark's.

Maintenance runs Iceberg's own Spark procedures (``rewrite_data_files``, ``expire_snapshots``, ...) in
a Spark session, so the catalog the sink reaches through pyiceberg must also be reachable from the
JVM. The two libraries mostly share property names (``uri``, ``warehouse``, ``credential``, ``token``,
``s3.endpoint``, ``s3.access-key-id``, ...); this module maps the few that differ, and
``maintenance.spark_catalog`` adds or replaces any property for a catalog it does not cover.
The settings are passed to the session builder in-process: secrets never reach a command line.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pyiceberg.catalog import infer_catalog_type

from service.config import ConfigError, SinkConfig
from service.model.object_store import AZURE_SCHEMES

CATALOG = "icesink"  # the catalog's name inside the maintainer's Spark session

# pyiceberg catalog properties Iceberg's Java catalogs, S3FileIO and GCSFileIO read under the same name.
_SAME_NAME = (
    "uri",
    "warehouse",
    "credential",
    "token",
    "scope",
    "oauth2-server-uri",
    "prefix",
    "rest.sigv4-enabled",
    "rest.signing-name",
    "rest.signing-region",
    "s3.endpoint",
    "s3.access-key-id",
    "s3.secret-access-key",
    "s3.session-token",
    "glue.endpoint",
    "glue.id",
    "gcs.project-id",
    "gcs.service.host",
    "gcs.oauth2.token",
    "gcs.oauth2.token-expires-at",
    "gcs.user-project",
)
_TYPES = {"rest": "rest", "glue": "glue", "hive": "hive"}


def _inferred_type(config: SinkConfig) -> str:
    """The type pyiceberg would infer from the catalog's ``uri`` (thrift: hive, http: rest, ...)."""
    try:
        inferred = infer_catalog_type(config.catalog_name, config.catalog_properties)
    except ValueError:  # a uri pyiceberg can't place: pyiceberg itself would refuse it
        return "rest"
    return inferred.value if inferred else "rest"


def _jdbc(props: dict[str, Any]) -> dict[str, str]:
    """pyiceberg's SQL catalog on Postgres (a SQLAlchemy URL) as Iceberg's JdbcCatalog: the two keep the
    same tables (``iceberg_tables``, ``iceberg_namespace_properties``), rows keyed by the catalog's name,
    which is why the maintainer's Spark catalog takes the sink's catalog name (:func:`spark_catalog_name`).
    The driver is Postgres's JDBC jar, one of the jars icesink ships (``deploy/docker/spark-jars.txt``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(str(props.get("uri", "")))
    except ArgumentError:
        raise ConfigError("catalog.uri: not a SQLAlchemy database URL") from None
    if url.get_backend_name() != "postgresql":
        raise ConfigError(
            f"maintenance: a SQL catalog on {url.get_backend_name()} has no JDBC driver icesink ships "
            "(Postgres has); describe it to Spark in maintenance.spark_catalog (type: jdbc, uri, jdbc.user, "
            "and the driver's jar in spark.jars)"
        )
    host = url.host or "localhost"
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    conf = {
        "type": "jdbc",
        "uri": f"jdbc:postgresql://{host}:{url.port or 5432}/{url.database or ''}",
    }
    if url.username:
        conf["jdbc.user"] = url.username
    if url.password:
        conf["jdbc.password"] = str(url.password)
    for key, value in url.query.items():  # sslmode, ... are properties of the Postgres driver too
        conf[f"jdbc.{key}"] = value if isinstance(value, str) else value[-1]
    return conf


def _adls(props: dict[str, Any]) -> dict[str, str]:
    """pyiceberg's ADLS properties as Iceberg's ADLSFileIO reads them. The Java side keys an endpoint
    and a SAS token by the storage account's host (``<account>.dfs.core.windows.net``, the location's
    host); pyiceberg names the account and, for an emulator or a private endpoint, the authority and
    scheme to reach it at. Without a key or SAS token ADLSFileIO takes Azure's default credential chain
    (``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, workload identity, managed
    identity): pyiceberg's ``adls.tenant-id``/``client-id``/``client-secret`` have no ADLSFileIO
    counterpart, so a service principal reaches the maintainer through those variables."""
    conf = {"io-impl": "org.apache.iceberg.azure.adlsv2.ADLSFileIO"}
    account = props.get("adls.account-name")
    if not isinstance(account, str):
        return conf
    warehouse = urlsplit(str(props.get("warehouse", "")))
    given = warehouse.netloc.rpartition("@")[2] if warehouse.scheme in AZURE_SCHEMES else ""
    # Keyed by the location's host as written (a port included); a REST catalog's warehouse is a name,
    # and its tables may be on either host of the account.
    hosts = {given} if given else {f"{account}.dfs.core.windows.net", f"{account}.blob.core.windows.net"}
    if isinstance(key := props.get("adls.account-key"), str):
        conf["adls.auth.shared-key.account.name"] = account
        conf["adls.auth.shared-key.account.key"] = key
    if isinstance(sas := props.get("adls.sas-token"), str):  # without the "?" (pyarrow's wants it)
        conf.update({f"adls.sas-token.{host}": sas.removeprefix("?") for host in hosts})
    authority = props.get("adls.dfs-storage-authority") or props.get("adls.blob-storage-authority")
    if isinstance(authority, str):
        scheme = props.get("adls.dfs-storage-scheme") or props.get("adls.blob-storage-scheme") or "https"
        # As pyarrow reads it: a domain suffix (".dfs.example.net") follows the account, any other
        # authority (an emulator's host:port) is the server and the account the first path segment.
        url = (
            f"{scheme}://{account}{authority}"
            if authority.startswith(".")
            else f"{scheme}://{authority}/{account}"
        )
        conf.update({f"adls.connection-string.{host}": url for host in hosts})
    return conf


def _stores(props: dict[str, Any]) -> set[str]:
    """The object stores the catalog's tables are on: those its properties configure (``s3.*``,
    ``gcs.*``, ``adls.*``) and its warehouse's."""
    scheme = urlsplit(str(props.get("warehouse", ""))).scheme
    by_scheme = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gcs", **dict.fromkeys(AZURE_SCHEMES, "adls")}
    stores = {store for store in ("s3", "gcs", "adls") if any(k.startswith(f"{store}.") for k in props)}
    return stores | ({by_scheme[scheme]} if scheme in by_scheme else set())


def spark_catalog_name(config: SinkConfig) -> str:
    """The catalog's name in the maintainer's Spark session: the sink's own for a SQL catalog, whose rows
    are keyed by it (:func:`_jdbc`); ``icesink`` otherwise."""
    kind = str(config.catalog_properties.get("type") or _inferred_type(config)).lower()
    if kind != "sql" or {"type", "catalog-impl"} & set(config.maintenance.spark_catalog):
        return CATALOG
    name = config.catalog_name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in ("spark_catalog", "system", "session"):
        raise ConfigError(
            f"maintenance: a SQL catalog named {name!r} can't be a Spark catalog of that name (letters, "
            "digits and _, not spark_catalog); give the catalog another name (catalog.name)"
        )
    return name


def catalog_conf(config: SinkConfig, name: str = CATALOG) -> dict[str, str]:
    """Spark settings for an Iceberg catalog ``name`` that reaches the sink's tables.

    Raises :class:`ConfigError` for a catalog type this mapping does not know and
    ``maintenance.spark_catalog`` does not describe (``type`` or ``catalog-impl``).
    """
    props: dict[str, Any] = config.catalog_properties
    given = dict(config.maintenance.spark_catalog)
    kind = str(props.get("type") or _inferred_type(config)).lower()
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.cache-enabled": "false",
        # Iceberg's actions name the metadata tables they read without a catalog (`ns.t.files`).
        "spark.sql.defaultCatalog": name,
    }
    if kind in _TYPES:
        conf[f"{prefix}.type"] = _TYPES[kind]
    elif kind == "sql" and not ({"type", "catalog-impl"} & set(given)):
        conf.update({f"{prefix}.{k}": v for k, v in _jdbc(props).items()})
    elif not ({"type", "catalog-impl"} & set(given)):
        raise ConfigError(
            f"maintenance: the catalog type {kind!r} has no Spark equivalent icesink knows; describe the "
            "catalog to Spark in maintenance.spark_catalog (type or catalog-impl, and its properties)"
        )
    for key in _SAME_NAME:
        if isinstance(props.get(key), str):
            conf.setdefault(f"{prefix}.{key}", props[key])
    conf.update(
        {f"{prefix}.{k}": v for k, v in props.items() if k.startswith("header.") and isinstance(v, str)}
    )
    if "s3.region" in props:
        conf[f"{prefix}.client.region"] = str(props["s3.region"])
    if "glue.region" in props:
        conf[f"{prefix}.client.region"] = str(props["glue.region"])
    stores = _stores(props)
    if "s3" in stores:
        conf[f"{prefix}.io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        # pyiceberg addresses a custom endpoint by path unless told otherwise; S3FileIO by host.
        virtual = str(props.get("s3.force-virtual-addressing", "false")).lower() == "true"
        if "s3.endpoint" in props:
            conf[f"{prefix}.s3.path-style-access"] = "false" if virtual else "true"
    if "gcs" in stores:
        conf[f"{prefix}.io-impl"] = "org.apache.iceberg.gcp.gcs.GCSFileIO"
    if "adls" in stores:
        conf.update({f"{prefix}.{k}": v for k, v in _adls(props).items()})
    if len(stores) > 1:  # tables on more than one store: the FileIO each file's scheme needs
        conf[f"{prefix}.io-impl"] = "org.apache.iceberg.io.ResolvingFileIO"
    conf.update({f"{prefix}.{k}": v for k, v in given.items()})
    return conf
