"""The catalog answers with an error that passes: a 429, a 400 for a stale sequence number, a 5xx at
start-up. One story per test, against the real REST catalog behind the fault proxy
(tests/chaos/proxy.py), which proves the answer really was given before the outcome is checked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from readers import duckdb_connect
from service.commit.committer import Committer
from service.config import load_config
from service.failpoints import configure as configure_failpoints
from service.job import SinkJob
from service.metrics import noop_metrics
from tests.chaos.proxy import CONFIG_PATH, NAMESPACES_PATH, TABLE_PATH, TABLES_PATH, FaultProxy
from tests.sink.conftest import Sink
from tests.sink.test_commit_protocol import COLUMNS, pending_for
from txnlog import Phase, TransactionLog

ARROW_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


@pytest.fixture
def proxy(stack: Any) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(stack.rest_uri)
    yield fault_proxy
    fault_proxy.close()


@pytest.fixture
def proxied(stack: Any, proxy: FaultProxy) -> Catalog:
    """A catalog client whose requests go through the proxy."""
    return load_catalog("proxied", **{**stack.pyiceberg_properties(), "uri": proxy.url})


@pytest.fixture
def log(pg_dsn: str) -> Iterator[TransactionLog]:
    txnlog = TransactionLog(pg_dsn, schema="icesink_protocol_tests")
    yield txnlog
    txnlog.close()


@pytest.fixture
def table(rest_catalog: Catalog, unique_name: Callable[[str], str]) -> Table:
    from service.model.columns import iceberg_schema

    namespace = unique_name("answers")
    rest_catalog.create_namespace(namespace)
    return rest_catalog.create_table(
        f"{namespace}.t", schema=iceberg_schema(COLUMNS, ["id"]), properties={"format-version": "2"}
    )


def rows_of(table: Table, catalog: Catalog) -> list[tuple[Any, ...]]:
    current = catalog.load_table(".".join(table.name()))
    con = duckdb_connect()
    return con.execute(
        f"SELECT id, v FROM iceberg_scan('{current.metadata_location}') ORDER BY id"
    ).fetchall()


def test_rate_limited_commit_is_retried(
    log: TransactionLog,
    proxied: Catalog,
    proxy: FaultProxy,
    rest_catalog: Catalog,
    table: Table,
    unique_name: Callable[[str], str],
) -> None:
    sink_id = unique_name("sink")
    committer = Committer(log, log.claim(sink_id, "a"), proxied, noop_metrics(), max_attempts=5)
    pending = pending_for(table, [(1, "x", "c")], offset=1)
    proxy.answer_next("POST", TABLE_PATH, 429, "rate limit exceeded", headers={"Retry-After": "2"})

    started = time.monotonic()
    result = committer.commit(pending)

    assert [(status, method) for status, method, _ in proxy.answered] == [(429, "POST")]
    assert proxy.upstream_errors == []  # the commit that went through was the catalog's only answer
    assert time.monotonic() - started >= 2, "the Retry-After the catalog asked for was not honoured"
    assert result.attempts == 2
    landed = rest_catalog.load_table(".".join(table.name()))
    assert [s.snapshot_id for s in landed.metadata.snapshots] == [pending.snapshot_id]
    assert log.state(sink_id).phase is Phase.COMMITTED  # type: ignore[union-attr]
    assert rows_of(table, rest_catalog) == [(1, "x")]


def test_stale_sequence_number_from_another_branch_is_retried_like_a_conflict(
    log: TransactionLog,
    proxied: Catalog,
    proxy: FaultProxy,
    rest_catalog: Catalog,
    table: Table,
    unique_name: Callable[[str], str],
) -> None:
    """A commit on another branch raises the table's last sequence number while our snapshot waits at
    a fail point: the catalog refuses ours with a 400 (not a 409), and it is built again."""
    name = ".".join(table.name())
    table.append(pa.table({"id": [10], "v": ["main"]}, schema=ARROW_SCHEMA))
    table = rest_catalog.load_table(name)
    main = table.current_snapshot()
    assert main is not None  # the append above made it
    table.manage_snapshots().create_branch(main.snapshot_id, "audit").commit()
    sink_id = unique_name("sink")
    committer = Committer(log, log.claim(sink_id, "a"), proxied, noop_metrics(), max_attempts=5)
    pending = pending_for(table, [(1, "ours", "c")], offset=1)
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            committer.commit(pending)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    configure_failpoints("during_catalog_commit=delay:3")
    try:
        worker = threading.Thread(target=commit)
        worker.start()
        time.sleep(1.5)  # our snapshot is built on sequence number 2, waiting at the fail point
        rest_catalog.load_table(name).append(
            pa.table({"id": [20], "v": ["audit"]}, schema=ARROW_SCHEMA), branch="audit"
        )
        worker.join(60)
    finally:
        configure_failpoints("")

    stale = [
        body
        for status, method, _, body in proxy.upstream_errors
        if status == 400 and method == "POST" and "older than last sequence number" in body
    ]
    assert len(stale) == 1, proxy.upstream_errors
    assert not errors, errors
    final = rest_catalog.load_table(name)
    ours = final.current_snapshot()
    assert ours is not None and ours.snapshot_id == pending.snapshot_id
    audit = final.snapshot_by_name("audit")
    # cast: every snapshot of a format-version 2 table has a sequence number
    assert audit is not None and cast(int, ours.sequence_number) > cast(int, audit.sequence_number)
    assert rows_of(table, rest_catalog) == [(1, "ours"), (10, "main")]
    assert log.state(sink_id).phase is Phase.COMMITTED  # type: ignore[union-attr]


def test_server_error_at_start_up_is_retried(
    make_sink: Callable[..., Sink], proxy: FaultProxy, rest_catalog: Catalog, stack: Any
) -> None:
    """A catalog whose database connection was just reset answers one 500 to each start-up step."""
    sink = make_sink(
        columns=[{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}],
        catalog={**stack.pyiceberg_properties(), "name": "rest", "uri": proxy.url},
    )
    sink.save()
    for method, path in (
        ("GET", CONFIG_PATH),
        ("GET", TABLE_PATH),
        ("POST", NAMESPACES_PATH),
        ("POST", TABLES_PATH),
    ):
        proxy.answer_next(method, path, 500, "Database connection was reset")

    job = SinkJob(load_config(str(sink.path)))
    job.start()

    assert sorted((status, method) for status, method, _ in proxy.answered) == [
        (500, "GET"),
        (500, "GET"),
        (500, "POST"),
        (500, "POST"),
    ]
    assert not proxy.answers, f"not every 500 was answered: {proxy.answers}"
    assert rest_catalog.table_exists(sink.table)
    assert job.lease is not None and job.lease.epoch == 1 and job.positions.committed == {}
    job.log.close()
