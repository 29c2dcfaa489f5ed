"""The catalog misbehaves while the sink runs: lost acknowledgements and a concurrent writer.

* Lost acknowledgement: a fault-injecting proxy (tests/chaos/proxy.py) in front of the REST catalog
  forwards a commit — it lands — and then answers 502, drops the connection, or never answers (the
  sink's request times out after ``icesink.request-timeout``). The sink must find its snapshot in the
  table and not write it twice.
* Conflicts: another writer (a plain pyiceberg append) commits to the same table while the sink runs,
  once exactly while the sink's commit is held at a fail point. The sink's commit conflicts, is
  rebuilt on the new parent, and neither side loses rows.
"""

from __future__ import annotations

import threading
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from tests.chaos import harness as h
from tests.chaos.proxy import FaultProxy
from tests.sink.conftest import Sink

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1800)]  # slow machines: beyond the default 900 s


def catalog_config(stack: Any, uri: str) -> dict[str, str]:
    return {
        "name": "rest",
        "type": "rest",
        "uri": uri,
        "s3.endpoint": stack.s3_endpoint,
        "s3.access-key-id": "${AWS_ACCESS_KEY_ID}",
        "s3.secret-access-key": "${AWS_SECRET_ACCESS_KEY}",
        "s3.region": stack.region,
    }


def test_lost_acknowledgements_are_not_committed_twice(make_sink: Any, spark: Any, stack: Any) -> None:
    proxy = FaultProxy(stack.rest_uri, hang_s=40)
    try:
        catalog = {**catalog_config(stack, proxy.url), "icesink.request-timeout": "5s"}
        sink: Sink = make_sink(keys=200, commit={"trigger_interval": "500ms"}, catalog=catalog)
        sink.produce(300)
        with h.BackgroundProducer(sink, batch=20, pause=0.5):
            run = h.start(sink)
            h.wait_for_commits(run, 1, timeout=400)
            proxy.lose_next_commits("502", "drop", "hang")
            h.wait_until(lambda: len(proxy.injected) == 3, 400, "three commits with lost answers")
            before = h.committed_count(run)
            h.wait_for_commits(run, before + 1, timeout=300)
        h.wait_caught_up(sink, run)
        h.stop_gracefully(run)
        log = run.log()
        assert [fault for fault, _ in proxy.injected] == ["502", "drop", "hang"]
        assert log.count("outcome unknown or catalog unavailable") >= 3, log[-5000:]
        assert "ReadTimeout" in log, "the hung commit did not time out on the sink's side"
        found = log.count(f"is already in {sink.table} as snapshot")
        assert found >= 3, f"only {found} lost acknowledgement(s) recognised:\n{log[-5000:]}"
        h.verify_exact(spark, sink)
    finally:
        proxy.close()


def other_writer_rows(start: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": start + i,
            "name": f"other-{start + i}",
            "country": "xx",
            "amount": Decimal("1.25"),
            "birthday": date(2000, 1, 1),
            "updated_at": datetime(2026, 1, 1, 12, 0, 0),
            "active": True,
            "version": 1,
        }
        for i in range(n)
    ]


def test_concurrent_writer_loses_nothing(make_sink: Any, spark: Any, stack: Any) -> None:
    sink: Sink = make_sink(keys=200, commit={"trigger_interval": "500ms"})
    sink.produce(300)
    catalog = h.catalog_of(sink)
    theirs: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def append(rows: list[dict[str, Any]]) -> None:
        table = catalog.load_table(sink.table)
        table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
        theirs.extend(rows)

    def keep_appending() -> None:
        try:
            while not stop.is_set():
                append(other_writer_rows(10_000 + len(theirs), 3))
                stop.wait(0.5)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with h.BackgroundProducer(sink, batch=20, pause=0.5):
        run = h.start(sink, env={"ICESINK_FAILPOINTS": "during_catalog_commit=delay:5@2"})
        run.wait_for_log("fail point during_catalog_commit: delay", timeout=400)
        append(other_writer_rows(10_000, 3))  # lands while the sink's snapshot waits at the fail point
        writer = threading.Thread(target=keep_appending, daemon=True)
        writer.start()
        try:
            before = h.committed_count(run)
            h.wait_for_commits(run, before + 4, timeout=400)
        finally:
            stop.set()
            writer.join(60)
    assert not errors, errors
    h.wait_caught_up(sink, run)
    h.stop_gracefully(run)
    log = run.log()
    assert "conflicted" in log, f"no conflict was retried:\n{log[-5000:]}"
    assert len(theirs) >= 6
    h.verify_exact(spark, sink, extra_rows=theirs)
    print(
        f"other writer: {len(theirs)} rows in {len(theirs) // 3} commits; sink conflicts: {log.count('conflicted')}"
    )
