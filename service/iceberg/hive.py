"""A Hive metastore as the sink's catalog: what pyiceberg's HiveCatalog leaves to the caller.

pyiceberg opens its Thrift sockets without a timeout, and Hive 4.0.1 dropped a call that pyiceberg and
Spark's Hive client make; both are settled when the catalog opens (:func:`service.iceberg.tables.open_catalog`).
"""

from __future__ import annotations

from pyiceberg.catalog import Catalog

from service.config import ConfigError


def bound_metastore_calls(catalog: Catalog, timeout_s: float) -> None:
    """Give a Hive metastore's calls a timeout; pyiceberg opens its Thrift sockets with none.

    A metastore that accepts a connection and never answers would otherwise hold the sink (a commit, or
    start-up) for good. pyiceberg makes a transport per call: each gets the timeout. A call that times
    out is an unknown outcome (:func:`service.retrying.catalog_answer`), as a REST request's is."""
    from pyiceberg.catalog.hive import HiveCatalog
    from thrift.transport.TSocket import TSocket
    from thrift.transport.TTransport import TTransportBase

    if not isinstance(catalog, HiveCatalog):
        return
    client = catalog._client
    make = client._init_thrift_transport

    def bounded(transport: TTransportBase) -> TTransportBase:
        for inner in vars(transport).values():  # buffered or SASL: the socket is one of its fields
            if isinstance(inner, TSocket):
                inner.setTimeout(timeout_s * 1000)
        return transport

    client._init_thrift_transport = lambda: bounded(make())  # type: ignore[method-assign]
    client._transport = bounded(client._transport)


_METASTORES_CHECKED: set[str] = set()


def check_metastore_calls(catalog: Catalog) -> None:
    """Refuse a Hive metastore that no longer serves ``get_table``, before anything is written.

    Hive 4.0.1 dropped the call from its Thrift API; pyiceberg's HiveCatalog (the sink's) reads every
    table through it, and so does the Hive client Iceberg's HiveCatalog uses in Spark (the maintainer's).
    Against such a metastore a namespace could be created and every table load would then fail: one call
    for a table nobody has tells the two apart (an unknown table is the answer that passes).
    """
    from pyiceberg.catalog.hive import HiveCatalog

    uri = str(catalog.properties.get("uri"))
    if not isinstance(catalog, HiveCatalog) or uri in _METASTORES_CHECKED:
        return
    from hive_metastore.ttypes import NoSuchObjectException
    from thrift.Thrift import TApplicationException

    try:
        with catalog._client as client:
            client.get_table(dbname="icesink_probe", tbl_name="icesink_probe")
    except NoSuchObjectException:
        _METASTORES_CHECKED.add(uri)  # once a process: each commit thread opens a catalog of its own
        return
    except TApplicationException as exc:
        if exc.type != TApplicationException.UNKNOWN_METHOD:
            raise
        raise ConfigError(
            f"catalog {catalog.name}: the Hive metastore at {uri} does not serve "
            "get_table (Hive 4.0.1 and later dropped it; pyiceberg's HiveCatalog and Spark's Hive client "
            "call it): use a metastore of Hive 4.0.0 or earlier"
        ) from None
