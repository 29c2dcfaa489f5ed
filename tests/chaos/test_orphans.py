"""`icesink orphans`: files of commits that definitely failed are listed (and deleted on request); files
named by a pending precommit never are, and that plan stays committable afterwards.

Fast (no Spark): files are written in-process with the sink's own writer, the CLI runs for real.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
import yaml
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from readers import duckdb_connect
from service.commit.committer import Committer
from service.commit.plan import PendingCommit, new_snapshot_id
from service.data.files import OP_COLUMN, WriteSpec, write_files
from service.metrics import noop_metrics
from service.model.columns import column_from_config, iceberg_schema
from tests.sink.conftest import ICESINK, REPO
from txnlog import Phase, TransactionLog

COLUMNS = [column_from_config("id", "long", True, None), column_from_config("v", "string", False, None)]


@pytest.fixture
def txnlog_schema(pg_dsn: str, unique_name: Callable[[str], str]) -> str:
    return unique_name("orphans")


@pytest.fixture
def table(rest_catalog: Catalog, unique_name: Callable[[str], str]) -> Table:
    namespace = unique_name("orph")
    rest_catalog.create_namespace(namespace)
    return rest_catalog.create_table(
        f"{namespace}.t", schema=iceberg_schema(COLUMNS, ["id"]), properties={"format-version": "2"}
    )


def plan(table: Table, rows: list[tuple[int, str]], offset: int) -> PendingCommit:
    spec = WriteSpec(table.metadata, dict(table.io.properties), ["id"], upsert=True, delete_spec_id=0)
    batch = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "v": pa.array([r[1] for r in rows], pa.string()),
            OP_COLUMN: ["c"] * len(rows),
        }
    )
    written = write_files(spec, batch)
    return PendingCommit(
        table=".".join(table.name()),
        offsets={"t": {0: offset}},
        snapshot_id=new_snapshot_id(),
        data_files=written.data,
        delete_files=written.deletes,
    )


def orphans_cli(config: Path, *args: str) -> dict[str, Any]:
    res = subprocess.run(
        [*ICESINK, "orphans", "--config", str(config), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, f"icesink orphans exited {res.returncode}:\n{res.stderr}"
    report: dict[str, Any] = json.loads(res.stdout)
    return report


def test_orphans_listed_deleted_and_pending_plan_untouched(
    stack: Any,
    pg_dsn: str,
    rest_catalog: Catalog,
    table: Table,
    txnlog_schema: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    identifier = ".".join(table.name())
    sink_id = unique_name("sink")
    log = TransactionLog(pg_dsn, schema=txnlog_schema)
    try:
        committer = Committer(log, log.claim(sink_id, "a"), rest_catalog, noop_metrics(), max_attempts=3)
        committed = plan(table, [(1, "committed")], offset=1)
        committer.commit(committed)  # seq 1: in a snapshot

        aborted = plan(table, [(2, "aborted")], offset=2)  # seq 2: precommitted, then aborted
        state = log.precommit(committer.lease, aborted.to_payload())
        log.abort(committer.lease, seq=state.seq)
        crashed = plan(table, [(3, "crashed")], offset=2)  # written, the process died before precommit
        pending = plan(table, [(4, "pending")], offset=3)  # seq 3: precommitted, Iceberg not reached
        log.precommit(committer.lease, pending.to_payload())

        config = tmp_path / "sink.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "sink_id": sink_id,
                    "kafka": {"bootstrap_servers": stack.kafka_bootstrap, "topics": ["unused"]},
                    "table": {"identifier": identifier, "key": ["id"]},
                    "catalog": {"name": "rest", **stack.pyiceberg_properties()},
                    "txnlog": {"dsn": pg_dsn, "schema": txnlog_schema},
                }
            )
        )
        failed = set(aborted.file_paths()) | set(crashed.file_paths())

        young = orphans_cli(config)  # default cut-off 1h: everything is younger
        assert young["orphans"] == [] and young["too_young"] == len(failed)

        listed = orphans_cli(config, "--older-than", "0s")
        assert {o["path"] for o in listed["orphans"]} == failed
        assert listed["referenced_by_snapshots"] == len(committed.file_paths())
        assert listed["referenced_by_txnlog_plans"] == len(pending.file_paths())
        assert listed["deleted"] == 0
        io = table.io
        assert all(io.new_input(p).exists() for p in failed), "listing must not delete"

        deleted = orphans_cli(config, "--older-than", "0s", "--delete")
        assert deleted["deleted"] == len(failed)
        assert not any(io.new_input(p).exists() for p in failed)
        assert all(io.new_input(p).exists() for p in committed.file_paths() + pending.file_paths())
        assert orphans_cli(config, "--older-than", "0s")["orphans"] == []

        # The pending plan is still committable by the next owner, with the very same files.
        successor = Committer(log, log.claim(sink_id, "b"), rest_catalog, noop_metrics(), max_attempts=3)
        assert successor.recover() is not None
        assert log.state(sink_id).phase is Phase.COMMITTED  # type: ignore[union-attr]
        final = rest_catalog.load_table(identifier)
        con = duckdb_connect()
        rows = con.execute(
            f"SELECT id, v FROM iceberg_scan('{final.metadata_location}') ORDER BY id"
        ).fetchall()
        assert rows == [(1, "committed"), (4, "pending")]
    finally:
        log.close()
        engine = sa.create_engine(pg_dsn)
        with engine.begin() as conn:  # the test's own txnlog schema
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{txnlog_schema}" CASCADE'))
        engine.dispose()
