"""Schema creation: idempotent, safe under concurrent first use, versioned."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import inspect, text

from txnlog import SCHEMA_VERSION, SchemaVersionError, TransactionLog
from txnlog.schema import MIGRATIONS, tables

MakeLog = Callable[..., TransactionLog]


def test_schema_created_on_first_use_and_version_recorded(
    log: TransactionLog, admin_engine: Any, sink_id: str
) -> None:
    log.claim(sink_id, "pod-a")
    with admin_engine.connect() as conn:
        rows = conn.execute(
            text(f'SELECT version, description FROM "{log.schema}".schema_version ORDER BY version')
        ).all()
    assert [tuple(r) for r in rows] == [(m.version, m.description) for m in MIGRATIONS]
    assert rows[-1][0] == SCHEMA_VERSION
    assert log.ensure_schema() == SCHEMA_VERSION  # idempotent


def test_tables_match_the_core_definitions(log: TransactionLog, admin_engine: Any) -> None:
    """The hand-written DDL and the SQLAlchemy tables used for queries must not drift apart."""
    log.ensure_schema()
    insp = inspect(admin_engine)
    t = tables(log.schema)
    for table in (t.sinks, t.history, t.schema_version):
        columns = {c["name"]: c for c in insp.get_columns(table.name, schema=log.schema)}
        assert set(columns) == {c.name for c in table.columns}, table.name
        for col in table.columns:
            assert columns[col.name]["nullable"] == col.nullable, f"{table.name}.{col.name}"


def test_concurrent_first_use(make_log: MakeLog, admin_engine: Any) -> None:
    """Several processes' worth of logs start at once against an empty schema: all succeed, once."""
    logs = [make_log() for _ in range(6)]
    barrier = threading.Barrier(len(logs))
    errors: list[BaseException] = []
    epochs: list[int] = []

    def start(log: TransactionLog) -> None:
        try:
            barrier.wait(timeout=10)
            epochs.append(log.claim("shared", "pod").epoch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(log,)) for log in logs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert sorted(epochs) == list(range(1, len(logs) + 1))
    with admin_engine.connect() as conn:
        n = conn.execute(text(f'SELECT count(*) FROM "{logs[0].schema}".schema_version')).scalar_one()
    assert n == len(MIGRATIONS)


def test_newer_schema_version_is_refused(log: TransactionLog, make_log: MakeLog, admin_engine: Any) -> None:
    log.ensure_schema()
    with admin_engine.begin() as conn:
        conn.execute(
            text(f"INSERT INTO \"{log.schema}\".schema_version (version, description) VALUES (:v, 'future')"),
            {"v": SCHEMA_VERSION + 1},
        )
    fresh = make_log()  # a process starting against the newer schema
    with pytest.raises(SchemaVersionError, match=f"version {SCHEMA_VERSION + 1}"):
        fresh.claim("s", "pod")


@pytest.mark.parametrize("name", ["", "Upper", "has-dash", "x; DROP TABLE y", "a" * 64, "1abc"])
def test_schema_name_is_validated(txnlog_dsn: str, name: str) -> None:
    with pytest.raises(ValueError, match="invalid schema name"):
        TransactionLog(txnlog_dsn, schema=name)
