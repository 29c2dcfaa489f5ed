"""The Python workers of the sink's Spark session are forked from icesink's daemon
(``service.pydaemon``), which imported what the tasks run before its first fork, and import the
installed pyspark (``service.pyspark_path``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sink import host
from tests.sink.conftest import Sink


def _processes() -> dict[int, tuple[int, str]]:
    """Every process of this machine: pid -> (parent pid, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return found


def _descendants(root: int, processes: dict[int, tuple[int, str]]) -> dict[int, str]:
    out: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, cmdline) in processes.items():
            if ppid == parent and pid not in out:
                out[pid] = cmdline
                frontier.append(pid)
    return out


@pytest.mark.skipif(not host.ENABLED, reason="ICESINK_TEST_SINK_HOST=0: every run is a process")
def test_the_sinks_python_workers_are_forked_from_icesinks_daemon(make_sink: Any) -> None:
    sink: Sink = make_sink(keys=20)
    sink.produce(40)
    run = sink.run_until_caught_up()
    assert "committed seq 1 to" in run.log(), run.log()[-3000:]
    assert isinstance(run.process, host.HostedProcess), "the run was not hosted"
    the_host = host._host().process
    assert the_host is not None

    processes = _processes()
    tree = _descendants(the_host.pid, processes)
    daemons = [pid for pid, cmdline in tree.items() if "-m service.pydaemon" in cmdline]
    assert daemons, "no service.pydaemon under the sink's Spark:\n" + "\n".join(
        c[-160:] for c in tree.values()
    )
    # (Spark's Python data source workers, the stream source's, come from pyspark's daemon.)
    assert not [c for c in tree.values() if "-m pyspark.daemon pyspark.worker" in c], (
        "pyspark's daemon ran tasks"
    )
    workers = [pid for pid, (ppid, _) in processes.items() if ppid in daemons]
    assert workers, "the batch's tasks ran in no worker forked from the daemon (workers are kept a minute)"


def test_sparks_python_workers_import_the_installed_pyspark_not_its_zipped_copy(spark: Any) -> None:
    """Spark puts pyspark's bundled zips first on its Python processes' path; the environment's
    icesink-pyspark-path.pth (service/pyspark_path.py) takes them off, so a worker imports the installed,
    compiled pyspark instead of compiling the zip's sources."""
    import py4j
    import pyspark

    def imported_from(_: object) -> Iterator[str]:  # pickled by value: a worker can't import this file
        import py4j
        import pyspark

        yield pyspark.__file__ or ""
        yield py4j.__file__ or ""

    found = spark.sparkContext.parallelize([0], 1).mapPartitions(imported_from).collect()
    assert found == [pyspark.__file__, py4j.__file__], found
