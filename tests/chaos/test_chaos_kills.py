"""Kill the sink again and again while a keyed CDC stream keeps flowing; the table still ends exact.

Each step starts a sink process and kills it: either by a fail point with ``kill`` (``os._exit``, as
abrupt as SIGKILL) in the commit path — on the streaming path or on the recovery path of a plan an
earlier kill left precommitted — or by SIGKILL at a random moment (start-up, claim, recovery, Spark
start, a batch in flight). At the end one more run catches up, and the table must equal the model
through Spark and DuckDB: no missing key, no duplicate key, the latest version of every row, and the
sink's ``icesink.seq`` values unique and increasing along the table's history.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from service.failpoints import POINTS
from service.sample import table_columns
from tests.chaos import harness as h
from tests.sink.conftest import Sink

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1800)]  # slow machines: beyond the default 900 s

RANDOM_KILLS = int(os.environ.get("ICESINK_CHAOS_RANDOM_KILLS", "14"))
SEED = int(os.environ.get("ICESINK_CHAOS_SEED", "20261122"))


@dataclass
class Step:
    failpoints: str | None = None  # ICESINK_FAILPOINTS for this run, or None: SIGKILL after `delay`
    delay: float = 0.0
    after: str = "start"  # the delay counts from: the start, "consuming" (Spark started), a first commit

    def describe(self) -> str:
        if self.failpoints:
            return self.failpoints
        return f"SIGKILL {self.delay:.1f}s after {self.after}"


# Every fail point on the streaming path and on the recovery path of a plan an earlier kill left
# precommitted (the comments say where the kill happens and the state it leaves).
FAILPOINT_STEPS = [
    "before_precommit=kill",  # streaming, 1st batch: files written, nothing precommitted
    "after_precommit=kill",  # streaming: plan precommitted, not in Iceberg
    "during_catalog_commit=kill",  # recovery of that plan: snapshot built, not sent
    "after_catalog_commit=kill",  # recovery: in Iceberg, log still says precommit
    "after_log_commit=kill",  # recovery: found in Iceberg, log committed
    "during_catalog_commit=kill",  # streaming: plan precommitted, not in Iceberg
    "after_log_commit=kill",  # recovery: committed from the plan's files
    "after_catalog_commit=kill",  # streaming: in Iceberg, log still says precommit
    "after_catalog_commit=kill",  # recovery: found in Iceberg, killed before the log's commit again
    "after_log_commit=kill@2",  # recovery finishes the plan, then the 1st batch dies after the log
]


def schedule(rng: random.Random) -> list[Step]:
    """The fail point steps in order (the path each takes depends on it), then the random SIGKILLs.

    Half the random moments fall in the first seconds of a process (start-up, claim, recovery of a
    pending plan, Spark's start), half while it streams: counted from "consuming" or from its first
    commit, so that they land in batches whatever the machine's speed (decoding, writing files,
    precommit, commit, between batches).
    """
    kinds = [
        ("start", 0.5, 10.0),
        ("consuming", 0.0, 15.0),
        ("start", 0.5, 10.0),
        ("first commit", 0.0, 10.0),
    ]
    randoms = []
    for i in range(RANDOM_KILLS):
        after, low, high = kinds[i % len(kinds)]
        randoms.append(Step(delay=rng.uniform(low, high), after=after))
    rng.shuffle(randoms)
    return [Step(failpoints=f) for f in FAILPOINT_STEPS] + randoms


def kill_path(log: str, point: str) -> str:
    """Whether the fail point fired while finishing a precommitted plan or on a streaming batch."""
    at = log.find(f"fail point {point}: kill")
    recovering = log.find("recovering sink")
    return "recovery" if 0 <= recovering < at and "consuming" not in log[:at] else "streaming"


@pytest.mark.parametrize("delete_format", ["equality", "position"])
def test_killed_at_random_moments_and_at_every_fail_point(
    make_sink: Any, spark: Any, delete_format: str
) -> None:
    rng = random.Random(SEED)
    # Events without a schema section (columns from the configuration), on the Arrow path like the
    # other stories but the outages one (Spark's decoder); both paths share the commit protocol.
    sink: Sink = make_sink(
        partition_by=["country"],
        with_schema=False,
        columns=table_columns(),
        keys=300,
        seed=SEED % 1000,
        commit={"trigger_interval": "500ms"},
        kafka={"max_offsets_per_trigger": 2000},
        table={"delete_format": delete_format},
    )
    sink.produce(500)
    steps = schedule(rng)
    recovered = 0
    paths: Counter[str] = Counter()
    with h.BackgroundProducer(sink, batch=20, pause=0.5):
        for number, step in enumerate(steps, 1):
            started = time.monotonic()
            if step.failpoints is not None:
                run = h.start(sink, env={"ICESINK_FAILPOINTS": step.failpoints})
                code = h.wait_exit(run, timeout=300)
                point = step.failpoints.split("=")[0]
                assert code == h.KILLED_BY_FAILPOINT, (
                    f"step {number} ({step.describe()}): exit {code}, expected the fail point to kill it:\n"
                    f"{run.log()[-4000:]}"
                )
                assert f"fail point {point}: kill" in run.log()
                paths[f"{point} ({kill_path(run.log(), point)})"] += 1
                h.FIGURES.failpoint_kills += 1
                h.FIGURES.kills_survived += 1
            else:
                run = h.start(sink)
                if step.after == "consuming":
                    run.wait_for_log("consuming", timeout=300)
                elif step.after == "first commit":
                    h.wait_for_commits(run, 1, timeout=400)
                time.sleep(step.delay)
                assert run.process.poll() is None, (
                    f"step {number}: the sink exited by itself ({run.process.returncode}):\n{run.log()[-4000:]}"
                )
                h.sigkill(run)
                h.FIGURES.sigkill_moments[step.after] += 1
            recovered += run.log().count("recovering sink")
            print(
                f"step {number}/{len(steps)}: {step.describe()} → {h.committed_count(run)} commit(s), "
                f"{time.monotonic() - started:.1f}s"
            )
    final = sink.run_until_caught_up(timeout=400)
    recovered += final.log().count("recovering sink")

    # Files of batches killed before their precommit are orphans: delete them, then read the table.
    res = sink.cli("orphans", "--older-than", "0s", "--delete")
    assert res.returncode == 0, res.stderr[-3000:]
    orphans = json.loads(res.stdout)
    h.FIGURES.orphans_deleted += orphans["deleted"]
    h.verify_exact(spark, sink)
    # Every fail point of the sink's commit path (the maintainer's: tests/chaos/test_chaos_maintenance.py;
    # the key index build's: tests/chaos/test_chaos_position.py).
    sink_points = {p for p in POINTS if not p.startswith("maintenance_") and p != "during_key_index_build"}
    points = {p for p in sink_points if f"fail point {p}: kill" in "".join(r.log() for r in sink.runs)}
    assert points == sink_points, f"fail points that never fired: {sink_points - points}"
    assert recovered >= 4, f"only {recovered} run(s) found a precommitted plan to finish"
    h.FIGURES.failpoint_kill_paths.update(paths)
    assert any("(streaming)" in p for p in paths) and any("(recovery)" in p for p in paths), paths
    print(
        f"{len(steps)} kills, {recovered} recoveries of a precommitted plan, {len(sink.history)} changes, "
        f"{orphans['deleted']} orphan files deleted"
    )
