"""Spark's Python processes import pyspark from the installed package, not from the zipped copy of it
that Spark puts first on their path.

Spark starts each Python process of a session (the workers' daemon, the Python data source's lookup,
planner and readers, the streaming source's runner) with ``$SPARK_HOME/python/lib/pyspark.zip`` and
py4j's zip at the head of ``PYTHONPATH``. With pip's pyspark, ``$SPARK_HOME`` is the installed package
itself, so those zips are copies of the very code installed beside them, and a zip importer compiles
every module it loads from source, every time (it keeps no bytecode): importing ``pyspark.sql`` and
the worker's and the stream runner's modules takes ~1.9 CPU-seconds from the zip against ~0.7 from
site-packages' compiled files, in every such process,
and each worker's ``importlib.invalidate_caches()`` before a task reads the zip's directory again.
A sink starts several of them per streaming query: see docs/performance.md.

A ``.pth`` file in site-packages (:data:`PTH_NAME`, written by :func:`install`: the bootstrap and the
Dockerfile call it) calls :func:`drop_bundled_zips` as each interpreter of the
environment starts, after ``PYTHONPATH`` is on ``sys.path`` and before the process imports anything.
It removes only the zips inside a pyspark package that is installed in a directory on the path; the
zips of a Spark distribution elsewhere (a ``$SPARK_HOME`` of its own, whose code may differ from the
installed pyspark's) stay where Spark put them. The line does nothing once icesink is uninstalled.
"""

import os
import sys

PTH_NAME = "icesink-pyspark-path.pth"
# site.py executes a .pth line that starts with "import". The line imports icesink only in a process
# whose path has a pyspark.zip (one Spark started), and stays quiet when icesink was uninstalled.
PTH_LINE = (
    "import sys; exec(\"if any(p.endswith('pyspark.zip') for p in sys.path):\\n"
    "    try:\\n        from service.pyspark_path import drop_bundled_zips\\n"
    '    except ImportError:\\n        pass\\n    else:\\n        drop_bundled_zips(sys.path)\\n")\n'
)
# Run as every interpreter starts: os.path only (pathlib or typing would be one more import for each).
_BUNDLED = os.sep + os.path.join("pyspark", "python", "lib")


def bundled_zip(entry: str, path: list[str]) -> bool:
    """Whether ``entry`` is a zip that pip's pyspark bundles (``<dir>/pyspark/python/lib/*.zip``) whose
    ``<dir>`` is also on ``path`` and holds that pyspark installed (so the same code imports from it)."""
    if not entry.endswith(".zip"):
        return False
    lib = os.path.dirname(os.path.normpath(entry))
    if not lib.endswith(_BUNDLED):
        return False
    site = lib[: -len(_BUNDLED)]
    if not os.path.isfile(os.path.join(site, "pyspark", "__init__.py")):
        return False
    others = {os.path.normpath(p) for p in path if p and p != entry}
    # Spark's $SPARK_HOME is pyspark's resolved directory; the path's entries may go through a symlink.
    return site in others or os.path.realpath(site) in {os.path.realpath(p) for p in others}


def drop_bundled_zips(path: list[str]) -> None:
    """Remove from ``path`` (``sys.path``, in place) the zips :func:`bundled_zip` names, and the zip
    importers made for them while the .pth's own import looked through them: Python 3.11's
    ``importlib.invalidate_caches()``, which a Spark worker calls before every task, would read each
    cached zip's directory again (~14 ms)."""
    dropped = [entry for entry in path if bundled_zip(entry, path)]
    path[:] = [entry for entry in path if entry not in dropped]
    for entry in dropped:
        sys.path_importer_cache.pop(entry, None)


def install(site_packages: str | None = None) -> str:
    """Write :data:`PTH_NAME` into ``site_packages`` (this interpreter's by default); its path."""
    import sysconfig

    target = os.path.join(site_packages or sysconfig.get_paths()["purelib"], PTH_NAME)
    try:
        with open(target) as existing:
            if existing.read() == PTH_LINE:
                return target
    except FileNotFoundError:
        pass
    with open(target, "w") as out:
        out.write(PTH_LINE)
    return target
