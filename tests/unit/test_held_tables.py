"""A sink of many tables holding each table's changes until they are due (service.pipeline.held)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest

from service.config import ConfigError, load_config
from service.data.arrow_job import ArrowResult
from service.data.files import OP_COLUMN
from service.pipeline.cadence import CommitCadence
from service.pipeline.held import HeldChanges, HeldTables


def _batch(ids: list[int], names: list[str], ops: list[str]) -> ArrowResult:
    rows = pa.table({"id": ids, "name": names, OP_COLUMN: ops})
    return ArrowResult(rows=[rows], records=len(ids), by_op={"u": len(ids)})


class _Spec:
    def __init__(self, upsert: bool) -> None:
        self.upsert = upsert
        self.key = ["id"]


def test_the_newest_held_batch_wins_per_key_deletes_included() -> None:
    held = HeldChanges("lake.t")
    held.add(_batch([1, 2, 3], ["a", "b", "c"], ["c", "c", "c"]), {"t": {0: 3}}, now=0.0)
    held.add(_batch([2, 3], ["b2", "c"], ["u", "d"]), {"t": {0: 5}}, now=1.0)
    rows = held.rows(_Spec(upsert=True))  # type: ignore[arg-type]
    assert sorted(
        zip(rows["id"].to_pylist(), rows["name"].to_pylist(), rows[OP_COLUMN].to_pylist(), strict=True)
    ) == [
        (1, "a", "c"),
        (2, "b2", "u"),
        (3, "c", "d"),  # the delete is kept: its equality delete removes the row from older snapshots
    ]
    assert held.offsets == {"t": {0: 5}} and held.records == 5 and held.since == 0.0


def test_append_mode_keeps_every_held_row() -> None:
    held = HeldChanges("lake.t")
    held.add(_batch([1, 1], ["a", "b"], ["c", "u"]), {"t": {0: 2}}, now=0.0)
    held.add(_batch([1], ["c"], ["u"]), {"t": {0: 3}}, now=1.0)
    assert held.rows(_Spec(upsert=False)).num_rows == 3  # type: ignore[arg-type]


def test_a_table_is_due_by_count_or_by_the_age_of_its_oldest_change() -> None:
    tables = HeldTables(CommitCadence(min_size=10, max_period=timedelta(seconds=30)), concurrency=2)
    assert tables.to_hold("lake.a", new_records=9)
    assert not tables.to_hold("lake.a", new_records=10)  # the batch alone is due: the tasks write it
    assert not tables.add("lake.a", _batch([1] * 4, ["x"] * 4, ["u"] * 4), {"a": {0: 4}}, now=100.0)
    assert tables.big_batches({"lake.a": 50, "lake.b": 9}) == ["lake.a"]  # held rows land first
    assert not tables.add("lake.b", _batch([1], ["x"], ["u"]), {"b": {0: 1}}, now=110.0)
    assert tables.due(now=129.0) == []
    assert tables.due(now=130.0) == ["lake.a"]  # 30 s after its first held change
    assert tables.add("lake.b", _batch(list(range(9)), ["x"] * 9, ["u"] * 9), {"b": {0: 10}}, now=131.0)
    assert tables.topics(lambda t: [t.split(".")[1]]) == {"a", "b"}


def test_a_batch_of_only_markers_holds_nothing() -> None:
    tables = HeldTables(CommitCadence(min_size=10), concurrency=1)
    assert not tables.add("lake.a", ArrowResult(), {"a": {0: 7}}, now=0.0)
    assert tables.tables() == [] and "lake.a" not in tables


def _config(tmp_path: Any, commit: dict[str, Any], identifier: str = "lake.{topic}") -> Any:
    import yaml

    raw = {
        "sink_id": "s",
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": "shop\\..*"},
        "table": {"identifier": identifier, "key": ["id"]},
        "catalog": {"uri": "http://127.0.0.1:8181"},
        "txnlog": {"dsn": "postgresql://127.0.0.1/x"},
        "commit": commit,
    }
    path = tmp_path / "sink.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def test_the_table_cadence_needs_a_sink_of_many_tables(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"commit\.table_min_records and commit\.table_max_period hold"):
        _config(tmp_path, {"table_min_records": 100}, identifier="lake.orders")


def test_the_table_cadence_and_the_sinks_cadence_exclude_each_other(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="can't be combined"):
        _config(tmp_path, {"table_max_period": "30s", "max_period": "10s"})


def test_the_table_cadence_parses(tmp_path: Any) -> None:
    commit = _config(tmp_path, {"table_min_records": 500, "table_max_period": "2m"}).commit
    assert commit.table_min_records == 500 and commit.table_max_period == timedelta(minutes=2)
