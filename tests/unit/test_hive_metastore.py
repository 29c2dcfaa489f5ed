"""A Hive metastore that no longer serves ``get_table`` (Hive 4.0.1+) is refused when the catalog opens.

The metastore's Thrift client is faked here; against the stack's real metastore (4.0.0) the check
passes in every Hive test of tests/sink/test_catalogs.py."""

from __future__ import annotations

from typing import Any

import pytest
from hive_metastore.ttypes import NoSuchObjectException
from pyiceberg.catalog.hive import HiveCatalog
from thrift.Thrift import TApplicationException

from service.config import ConfigError
from service.iceberg.hive import check_metastore_calls


class _Client:
    def __init__(self, answer: Exception) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str]] = []

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def get_table(self, dbname: str, tbl_name: str) -> None:
        self.calls.append((dbname, tbl_name))
        raise self.answer


def _catalog(answer: Exception, uri: str) -> tuple[HiveCatalog, _Client]:
    catalog = HiveCatalog("hms", uri=uri)
    client = _Client(answer)
    catalog._client = client  # type: ignore[assignment]
    return catalog, client


def test_a_metastore_without_get_table_is_refused_with_the_reason() -> None:
    unknown = TApplicationException(TApplicationException.UNKNOWN_METHOD, "Invalid method name: 'get_table'")
    catalog, client = _catalog(unknown, "thrift://hive401:9083")
    with pytest.raises(ConfigError, match=r"thrift://hive401:9083 does not serve get_table .*Hive 4\.0\.0"):
        check_metastore_calls(catalog)
    assert client.calls, "the metastore was asked"
    with pytest.raises(ConfigError):  # and asked again by the next catalog: a refusal is not remembered
        check_metastore_calls(catalog)


def test_a_metastore_that_knows_no_such_table_passes() -> None:
    missing = NoSuchObjectException(message="icesink_probe.icesink_probe table not found")
    catalog, client = _catalog(missing, "thrift://hive400:9083")
    check_metastore_calls(catalog)
    assert client.calls == [("icesink_probe", "icesink_probe")]
    check_metastore_calls(catalog)  # each commit thread's catalog: the metastore was checked already
    assert len(client.calls) == 1, client.calls


def test_another_metastore_failure_is_not_taken_for_a_missing_call() -> None:
    catalog, _ = _catalog(TApplicationException(TApplicationException.INTERNAL_ERROR, "boom"), "thrift://h:1")
    with pytest.raises(TApplicationException):
        check_metastore_calls(catalog)


@pytest.mark.timeout(60)  # without the bound the call would wait for good
def test_a_metastore_that_never_answers_times_out() -> None:
    """A listening socket that accepts and never answers: the catalog's call ends at the timeout, with a
    transport error (an unknown outcome to the retry loop), instead of waiting for good."""
    import socket
    import time

    from thrift.transport.TTransport import TTransportException

    from service.iceberg.hive import bound_metastore_calls

    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        catalog = HiveCatalog("hms", uri=f"thrift://127.0.0.1:{port}")
        bound_metastore_calls(catalog, 0.5)
        started = time.monotonic()
        with pytest.raises(TTransportException):
            catalog.list_namespaces()
        assert time.monotonic() - started < 10
        started = time.monotonic()
        with pytest.raises(TTransportException):  # the next call's transport too
            catalog.list_namespaces()
        assert time.monotonic() - started < 10
