"""A sink of three tables killed at each fail point of one batch's commit, between the tables too.

The batch's plan holds the three tables' files; with ``commit.concurrency: 1`` they are committed one
after the other, in the plan's order, so ``during_catalog_commit@2`` lands in the middle of the second
table's commit after the first table's snapshot landed, and ``after_catalog_commit@1`` between the
first and the second. Each test proves the kill landed where it was meant to (the plan still pending,
exactly the expected tables holding their snapshot), then restarts the sink: every table must end
equal to its source through Spark and DuckDB, with no snapshot of the plan committed twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

from service.commit.committer import find_commit
from service.commit.plan import BatchPlan
from service.failpoints import KILL_EXIT_CODE
from service.sample import SampleSource, ensure_topic, produce
from tests.sink.conftest import Sink
from tests.sink.expect import appended_rows, assert_rows, assert_seqs_increasing
from txnlog import Phase, TransactionLog

pytestmark = pytest.mark.chaos

NAMES = ["a_customers", "b_orders", "c_events"]  # the plan's (sorted) order


@pytest.mark.parametrize(
    ("failpoint", "landed_before_restart"),
    [
        ("after_precommit=kill", 0),
        ("during_catalog_commit=kill@1", 0),
        ("after_catalog_commit=kill@1", 1),  # between the first and the second table
        ("during_catalog_commit=kill@2", 1),  # in the second table's commit, the first one landed
        ("after_catalog_commit=kill@2", 2),  # between the second and the third
        ("after_catalog_commit=kill@3", 3),  # every table landed, the txnlog not told
    ],
)
def test_a_kill_between_two_tables_commits_leaves_every_table_exact(
    failpoint: str,
    landed_before_restart: int,
    make_sink: Callable[..., Sink],
    unique_name: Callable[[str], str],
    spark: Any,
    rest_catalog: Catalog,
    pg_dsn: str,
) -> None:
    prefix, namespace = unique_name("db"), unique_name("lake")
    sink = make_sink(
        kafka={"topics": [f"{prefix}.{name}" for name in NAMES]},
        table={"identifier": f"{namespace}.{{source.table}}", "key": []},
        tables={f"{namespace}.c_events": {"mode": "append"}},
        commit={"trigger_interval": "1s", "concurrency": 1},
    )
    sources = {name: SampleSource(keys=60, seed=i, table=name) for i, name in enumerate(NAMES)}
    history: dict[str, list[Any]] = {}
    for name in NAMES:
        ensure_topic(sink.bootstrap, f"{prefix}.{name}", 2)
        history[name] = [sources[name].next_change() for _ in range(200)]
        produce(sink.bootstrap, f"{prefix}.{name}", history[name])

    killed = sink.start("--until-caught-up", env={"ICESINK_FAILPOINTS": failpoint})
    assert killed.wait() == KILL_EXIT_CODE, killed.log()[-4000:]
    point = failpoint.split("=")[0]
    assert f"fail point {point}: killing the process" in killed.log()

    # Where the kill landed: the plan of all three tables pending, exactly the expected ones committed.
    state = TransactionLog(pg_dsn, schema="icesink").state(sink.name)
    assert state is not None and state.phase is Phase.PRECOMMIT and state.pending is not None
    plan = BatchPlan.from_payload(state.pending)
    assert [p.table for p in plan.tables] == [f"{namespace}.{n}" for n in NAMES]
    landed = [
        p.table
        for p in plan.tables
        if p.snapshot_id is not None
        and find_commit(rest_catalog.load_table(p.table), sink.name, p.snapshot_id) is not None
    ]
    assert landed == [p.table for p in plan.tables][:landed_before_restart]

    recovered = sink.run_until_caught_up()
    assert f"recovering sink {sink.name}: plan seq {state.seq}" in recovered.log()
    for name in NAMES:
        table = f"{namespace}.{name}"
        expected = appended_rows(history[name]) if name == "c_events" else sources[name].expected_rows()
        assert_rows(spark, table, expected)
        seqs = assert_seqs_increasing(rest_catalog, table, sink.name)
        assert seqs.count(state.seq) == 1, f"{table}: seq {state.seq} committed {seqs.count(state.seq)} times"
