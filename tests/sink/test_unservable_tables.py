"""Tables the writer can't serve, and a plan that can never be committed.

* A v1 or v3 table is refused at start-up (exit 2, naming the table and the reason) before anything
  is written: no claim, no precommit, no file, no metadata change.
* A ``fixed[n]`` column is written as fixed-length bytes; a value of another length is a dead letter.
* A precommitted plan whose files were deleted stops start-up (exit 2) and points at
  ``icesink txnlog abandon``, which drops the plan (recorded in the log's history); the batch's records
  are then read from Kafka again and land.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.types import FixedType

from readers import duckdb_rows, spark_rows
from service.cli import EXIT_CONFIG, EXIT_OK
from service.commit.plan import PendingCommit
from service.failpoints import KILL_EXIT_CODE
from service.maintenance.orphans import data_location, list_files
from service.model.columns import column_from_config, iceberg_schema
from service.sample import table_columns
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows, topic_records
from txnlog import Action, Phase, TransactionLog


@pytest.fixture
def log(pg_dsn: str) -> Any:
    txnlog = TransactionLog(pg_dsn)
    yield txnlog
    txnlog.close()


@pytest.mark.parametrize("version", [1, 3])
def test_table_of_another_format_version_is_refused_at_start_up(
    make_sink: Callable[..., Sink], rest_catalog: Catalog, log: TransactionLog, version: int
) -> None:
    sink = make_sink(with_schema=False, columns=table_columns())
    columns = [column_from_config(c["name"], c["type"], c["required"], None) for c in table_columns()]
    namespace = sink.table.rsplit(".", 1)[0]
    rest_catalog.create_namespace(namespace)
    table = rest_catalog.create_table(
        sink.table, schema=iceberg_schema(columns, ["id"]), properties={"format-version": str(version)}
    )
    assert table.metadata.format_version == version  # the table really is v1 / v3
    sink.produce(20)

    res = sink.cli("run")

    output = res.stdout + res.stderr
    assert res.returncode == EXIT_CONFIG, f"exit {res.returncode}:\n{output[-4000:]}"
    assert f"table {sink.table}: format v{version}, but icesink writes format v2 only" in output, output
    after = rest_catalog.load_table(sink.table)
    assert after.metadata_location == table.metadata_location  # not evolved, not committed to
    assert list_files(after.io, data_location(after)) == []
    assert log.state(sink.name) is None  # never claimed, nothing precommitted


def test_fixed_column_is_written_and_wrong_lengths_dead_lettered(
    make_sink: Callable[..., Sink], rest_catalog: Catalog, spark: Any, stack: Any
) -> None:
    sink = make_sink(
        partitions=1,
        columns=[
            {"name": "id", "type": "long", "required": True},
            {"name": "h", "type": "fixed[4]"},
            {"name": "v", "type": "string"},
        ],
        commit={"retries": 2},
    )

    def record(i: int, h: bytes | None) -> tuple[str, str]:
        after = {"id": i, "h": None if h is None else base64.b64encode(h).decode(), "v": f"v{i}"}
        return json.dumps({"id": i}), json.dumps({"op": "c", "before": None, "after": after})

    sink.send([record(1, b"\x00\x01\xfe\xff"), record(2, None), record(3, b"abc"), record(4, b"abcde")])
    sink.run_until_caught_up()

    assert rest_catalog.load_table(sink.table).schema().find_field("h").field_type == FixedType(4)
    expected = [{"id": 1, "h": b"\x00\x01\xfe\xff", "v": "v1"}, {"id": 2, "h": None, "v": "v2"}]
    for reader, rows in (("spark", spark_rows(spark, sink.table)), ("duckdb", duckdb_rows(sink.table))):
        got = sorted(
            ({**r, "h": None if r["h"] is None else bytes(r["h"])} for r in rows), key=lambda r: r["id"]
        )
        assert got == expected, f"{reader} read {got}"
    letters = topic_records(stack.kafka_bootstrap, f"{sink.name}.dlq", 2)
    headers = [{k: v.decode() for k, v in m.headers() or []} for m in letters]
    reasons = {int(h["icesink.source.offset"]): h["icesink.error"] for h in headers}
    assert sorted(reasons) == [2, 3], reasons
    assert all("column h" in reason and "fixed[4]" in reason for reason in reasons.values()), reasons


def test_abandon_after_plan_files_deleted(
    make_sink: Callable[..., Sink], rest_catalog: Catalog, spark: Any, log: TransactionLog
) -> None:
    sink = make_sink(keys=50)
    sink.produce(60)
    crashed = sink.start(env={"ICESINK_FAILPOINTS": "after_precommit=kill"})
    assert crashed.wait(300) == KILL_EXIT_CODE, crashed.log()[-4000:]
    state = log.state(sink.name)
    assert state is not None and state.phase is Phase.PRECOMMIT and state.pending is not None
    plan = PendingCommit.from_payload(state.pending)
    table = rest_catalog.load_table(sink.table)
    assert plan.file_paths() and all(table.io.new_input(p).exists() for p in plan.file_paths())
    for path in plan.file_paths():  # someone deletes the plan's files
        table.io.delete(path)
    assert not any(table.io.new_input(p).exists() for p in plan.file_paths())

    refused = sink.cli("run")
    output = refused.stdout + refused.stderr
    assert refused.returncode == EXIT_CONFIG, f"exit {refused.returncode}:\n{output[-4000:]}"
    assert f"the pending plan seq {state.seq}" in output and "icesink txnlog abandon" in output, output
    assert rest_catalog.load_table(sink.table).metadata.snapshots == []  # nothing committed
    assert log.state(sink.name).phase is Phase.PRECOMMIT  # type: ignore[union-attr]

    abandoned = sink.cli("txnlog", "abandon")
    assert abandoned.returncode == EXIT_OK, abandoned.stdout + abandoned.stderr
    assert f"abandoned the pending plan seq {state.seq}" in abandoned.stdout, abandoned.stdout
    assert "read from Kafka again and written anew" in abandoned.stdout, abandoned.stdout
    after = log.state(sink.name)
    assert after is not None and after.phase is Phase.IDLE and after.pending is None
    newest = log.history(sink.name, limit=2)
    assert [h.action for h in newest] == [Action.ABORT, Action.CLAIM]
    assert all(h.owner.startswith("icesink txnlog abandon") for h in newest)
    assert newest[0].payload == state.pending  # the dropped plan is kept in the history

    sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())  # the batch was read again and landed
