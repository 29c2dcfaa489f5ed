"""Bad configuration stops `icesink run` with exit code 2 before anything is written.

Each case must leave no table, no namespace and no txnlog row behind, and say what to fix. Fast: the
sink gives up before Spark starts.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

from service.cli import EXIT_CONFIG
from tests.sink.conftest import Sink
from txnlog import TransactionLog

COLUMNS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "version", "type": "int"},
]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


def refused(sink: Sink, rest_catalog: Catalog, pg_dsn: str, *needles: str) -> str:
    started = time.monotonic()
    res = sink.cli("run")
    output = res.stdout + res.stderr
    assert res.returncode == EXIT_CONFIG, f"exit {res.returncode}, expected {EXIT_CONFIG}:\n{output[-4000:]}"
    for needle in needles:
        assert needle in output, f"{needle!r} not in the output:\n{output[-4000:]}"
    namespace = sink.table.rsplit(".", 1)[0]
    assert not rest_catalog.table_exists(sink.table), f"{sink.table} was created"
    assert namespace not in {".".join(n) for n in rest_catalog.list_namespaces()}, f"{namespace} was created"
    log = TransactionLog(pg_dsn)
    try:
        assert log.state(sink.name) is None, "a txnlog row was written"
    finally:
        log.close()
    assert "claimed epoch" not in output and "consuming" not in output
    return f"{time.monotonic() - started:.1f}s"


def test_unknown_key(make_sink: Any, rest_catalog: Catalog, pg_dsn: str) -> None:
    sink: Sink = make_sink()
    sink.config["table"]["partiton_by"] = ["country"]  # misspelt
    refused(sink, rest_catalog, pg_dsn, "table.partiton_by: unknown key")


@pytest.mark.parametrize(
    ("partition_by", "needle"),
    [
        (["bucket(id)"], "partition_by: unknown transform in 'bucket(id)'"),
        (["day(name)"], "can't be applied to name"),
        (["region"], "partition_by: column 'region'"),
    ],
)
def test_bad_partition_transform(
    make_sink: Any, rest_catalog: Catalog, pg_dsn: str, partition_by: list[str], needle: str
) -> None:
    sink: Sink = make_sink(columns=COLUMNS, partition_by=partition_by)
    refused(sink, rest_catalog, pg_dsn, needle)


def test_missing_key_column(make_sink: Any, rest_catalog: Catalog, pg_dsn: str) -> None:
    sink: Sink = make_sink(columns=COLUMNS)
    sink.config["table"]["key"] = ["customer_id"]
    refused(sink, rest_catalog, pg_dsn, "customer_id")


def test_unreachable_kafka(make_sink: Any, rest_catalog: Catalog, pg_dsn: str) -> None:
    sink: Sink = make_sink(columns=COLUMNS)
    sink.config["kafka"]["bootstrap_servers"] = f"127.0.0.1:{closed_port()}"
    refused(sink, rest_catalog, pg_dsn, "did not answer")


def test_missing_topic(make_sink: Any, rest_catalog: Catalog, pg_dsn: str) -> None:
    sink: Sink = make_sink(columns=COLUMNS)
    sink.config["kafka"]["topics"] = [f"{sink.topic}-missing"]
    refused(sink, rest_catalog, pg_dsn, "is not available")
