"""Chaos that only ``delete_format: position`` has: a kill in the middle of building the key index.
The random kills and every fail point run in position mode too (test_chaos_kills.py), checked by the
same assertions (and pyiceberg, which reads only position deletes)."""

from __future__ import annotations

from typing import Any

import pytest

from service.keyindex.build import live_files
from tests.chaos.harness import KILLED_BY_FAILPOINT, catalog_of, start, verify_exact, wait_exit
from tests.sink.conftest import Sink

pytestmark = pytest.mark.chaos


def test_killed_while_the_key_index_is_built(make_sink: Any, spark: Any) -> None:
    """A run's first batch builds the table's key index from its data files; the sink is killed after
    the first file of the build. Nothing of that batch was precommitted: the next run builds the index
    again from the table and lands the batch once."""
    sink: Sink = make_sink(
        keys=300, partitions=1, kafka={"max_offsets_per_trigger": 200}, table={"delete_format": "position"}
    )
    sink.produce(1200)
    sink.run_until_caught_up()
    table = catalog_of(sink).load_table(sink.table)
    assert table.properties.get("icesink.delete-format") == "position"
    assert len(live_files(table).data) >= 2, "one data file: the kill could not land mid-build"

    sink.produce(400)
    killed = start(sink, env={"ICESINK_FAILPOINTS": "during_key_index_build=kill"})
    assert wait_exit(killed, 300) == KILLED_BY_FAILPOINT, killed.log()[-4000:]
    log = killed.log()
    # The fault: the build started, read one file, and never finished.
    assert "building from" in log and "fail point during_key_index_build: killing" in log
    assert " keys from " not in log

    resumed = sink.run_until_caught_up()
    assert " keys from " in resumed.log()
    verify_exact(spark, sink)
