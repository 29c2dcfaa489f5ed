"""A sink killed again and again keeps its scratch bounded: each start removes what the killed process
left in Spark's local directory, and local mode copies no jar there.

The local directory stands for the chart's ``scratch.sparkLocal`` volume (``SPARK_LOCAL_DIRS``, an
emptyDir that survives container restarts inside a pod): before, every SIGKILL left a
``spark-*/userFiles-*`` copy of the jars (116 MB) there, and a crash-looping sink filled it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import harness as h
from tests.sink.conftest import Sink

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(2400)]

KILLS = 20
# A running sink's scratch without jar copies: Spark's block manager and PySpark's files, the stream's
# checkpoint (a few MB); one copy of the jars alone is 116 MB.
BOUND = 40 * 1024 * 1024
# What the kills left in all, measured after the last one (before, each kill left 116 MB of jars).
LEFT_BOUND = 50 * 1024 * 1024


def _size(path: Path) -> int:
    """Bytes under ``path``; a running sink renames its checkpoint's files meanwhile."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += (Path(directory) / name).stat().st_size
    return total


def _own_directories(local: Path) -> list[Path]:
    return sorted(d for d in local.iterdir() if d.name.startswith("icesink-"))


def test_a_sink_killed_twenty_times_keeps_one_scratch_directory_without_jars(
    make_sink: Any, spark: Any, tmp_path: Path
) -> None:
    local = tmp_path / "spark-local"
    env = {"SPARK_LOCAL_DIRS": str(local)}
    sink: Sink = make_sink(keys=100, commit={"trigger_interval": "500ms"})
    sink.produce(300)
    left: Path | None = None
    for number in range(1, KILLS + 1):
        run = h.start(sink, env=env)
        # streaming (the first runs: a batch committed; then as soon as the stream has started, which
        # is when Spark's scratch and the checkpoint are in use)
        run.wait_for_log("committed seq" if number <= 2 else "consuming ", timeout=400)
        own = _own_directories(local)
        # The killed process's directory went at this start; only the running sink's is there.
        assert len(own) == 1 and own[0] != left, (number, own, left)
        if left is not None:
            assert f"removed {left}, the scratch a stopped process left behind" in run.log()
        assert (own[0] / ".owner.lock").exists()
        jars = [name for _, _, files in os.walk(local) for name in files if name.endswith(".jar")]
        assert not jars, jars[:5]  # read in place
        assert any(own[0].glob("checkpoint-*")), list(own[0].iterdir())  # the stream's checkpoint too
        size = _size(local)
        assert size < BOUND, f"run {number}: {size} bytes of scratch"
        h.sigkill(run)  # the whole process group: no shutdown hook runs
        assert run.process.returncode == -signal.SIGKILL, run.process.returncode
        left = own[0]
        assert left.is_dir() and any(left.glob("spark-*")), "the kill left no scratch behind to remove"
        # the driver JVM's temporary directory is there too (Spark's session makes its artifacts-*)
        assert any(left.glob("artifacts-*")), sorted(p.name for p in left.iterdir())
        print(f"run {number}: killed with {size / 1e3:.0f} kB of scratch in {left.name}")
        sink.produce(100)
    left_in_all = _size(local)
    print(f"after {KILLS} SIGKILLs: {left_in_all / 1e3:.0f} kB of scratch left in all")
    assert left_in_all < LEFT_BOUND, f"{left_in_all} bytes left after {KILLS} kills"

    final = h.start(sink, "--until-caught-up", env=env)
    assert h.wait_exit(final, timeout=400) == 0, final.log()[-4000:]
    assert f"removed {left}" in final.log()
    assert not _own_directories(local), "a sink that stops removes its own scratch"
    h.verify_exact(spark, sink)
