"""service.pydaemon: the Python workers of the sink's Spark session are forked from a daemon that has
imported what the tasks run."""

from __future__ import annotations

import json
import subprocess
import sys

from service.pydaemon import TASK_MODULES


def test_the_worker_daemon_preloads_every_task_module_before_it_forks() -> None:
    """In a fresh interpreter, as Spark starts the daemon: the task modules (and the heavy libraries
    they pull in) are loaded and frozen out of the collector's reach before any worker is forked."""
    probe = (
        "import gc, json, sys\n"
        "from service import pydaemon\n"
        "before = set(sys.modules)\n"
        "pydaemon.preload()\n"
        "print(json.dumps({'loaded': sorted(sys.modules), 'new': sorted(set(sys.modules) - before),"
        " 'frozen': gc.get_freeze_count()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "could not preload" not in done.stderr, done.stderr[-3000:]
    found = json.loads(done.stdout)
    missing = [
        m for m in (*TASK_MODULES, "pyarrow", "pandas", "pyiceberg.io.pyarrow") if m not in found["loaded"]
    ]
    assert not missing, f"not preloaded: {missing}"
    assert "service.data.arrow_job" in found["new"], "the daemon module alone imported the tasks' code"
    assert found["frozen"] > 100_000, found["frozen"]
