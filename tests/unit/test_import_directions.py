"""Imports point one way: every module of ``service`` sits in a layer, and imports only layers below
its own (and its own package). Imports inside functions count too; relative imports are refused.

From the bottom: ``txnlog`` (knows nothing of the service); the foundations (``service.model``,
units, retries, fail points); configuration and logging; what every part reports to (metrics, health
probes) and what starts Spark; the three planes, none of which imports another: the data plane
``service.data``, the catalog side ``service.iceberg`` and Kafka's side ``service.kafka``; the key
index of position-delete tables ``service.keyindex`` (data files read, snapshots followed); the commit
protocol ``service.commit``; the sink's batch steps ``service.pipeline`` and table maintenance
``service.maintenance``, which know nothing of each other; the operator commands ``service.ops``, the
job, the demo producer and the daemon Spark's Python workers are forked from; the CLI on top. Benchmarks and scripts use the service and the reference
readers (``readers``), never the tests.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Bottom first. A module may import the layers below its own and its own package; a package name
# covers its modules.
LAYERS: list[set[str]] = [
    {"txnlog"},
    {
        "service",
        "service.model",
        "service.units",
        "service.pyworker",
        "service.pyspark_path",
        "service.failpoints",
        "service.retrying",
    },
    {"service.config"},
    {
        "service.logs",
        "service.metrics",
        "service.health",
        "service.scratch",
        "service.spark_jars",
        "service.txnlog_client",
    },
    {"service.spark_session"},
    {"service.data", "service.iceberg", "service.kafka"},
    {"service.keyindex"},
    {"service.commit"},
    {"service.pipeline", "service.maintenance"},
    {"service.ops", "service.job", "service.sample", "service.pydaemon"},
    {"service.cli"},
]
# Outside the service: (importer, imported, why it is refused)
RULES = [
    ("bench", "tests", "benchmarks use the service and `readers`, never the tests"),
    ("scripts", "tests", "scripts use the service and `readers`, never the tests"),
    ("readers", "tests", "the reference readers stand alone"),
]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, with its line; a relative import as ``.`` followed by its name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level:
            yield node.lineno, "." * node.level + (node.module or "")
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for alias in node.names:  # `from service import job`
                yield node.lineno, f"{node.module}.{alias.name}"


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _unit(name: str) -> tuple[int, str] | None:
    """The layer and the most specific unit (package or module) of ``LAYERS`` that holds ``name``."""
    found = [(i, unit) for i, layer in enumerate(LAYERS) for unit in layer if _within(name, unit)]
    return max(found, key=lambda f: len(f[1])) if found else None


def _files() -> list[Path]:
    files = []
    for top in ("service", "txnlog", "bench", "scripts", "readers"):
        files += sorted((ROOT / top).rglob("*.py"))
    return files


def _problems(importer: str, line: int, imported: str, where: str) -> list[str]:
    at = f"{where}:{line}: {importer} imports {imported}"
    if imported.startswith("."):
        return [f"{at} (a relative import: name the module)"]
    problems = [
        f"{at} ({why})" for low, high, why in RULES if _within(importer, low) and _within(imported, high)
    ]
    mine, theirs = _unit(importer), _unit(imported)
    if mine is None or theirs is None:
        if _within(importer, "service") and mine is None:
            problems.append(f"{at} ({importer} is in no layer: place it in LAYERS)")
        return problems
    if _within(importer, "txnlog") and not _within(imported, "txnlog"):
        problems.append(f"{at} (the txnlog knows nothing of the service)")
    elif theirs[1] != mine[1] and theirs[0] >= mine[0] and theirs[1] != "service":
        problems.append(f"{at} ({theirs[1]} is not below {mine[1]})")
    return problems


def test_imports_point_one_way() -> None:
    problems = []
    for path in _files():
        importer = _module(path)
        if _within(importer, "service") and _unit(importer) is None:
            problems.append(f"{path.relative_to(ROOT)}: {importer} is in no layer: place it in LAYERS")
        for line, imported in _imports(path):
            problems += _problems(importer, line, imported, str(path.relative_to(ROOT)))
    assert not problems, "imports against the layering:\n" + "\n".join(sorted(set(problems)))


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    """A guard on the checker itself: function-level imports and `from x import y` are found."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from service.iceberg import tables\n    import service.data.files\n")
    found = [name for _, name in _imports(source)]
    assert "service.iceberg.tables" in found and "service.data.files" in found


def test_the_checker_refuses_upward_sideways_and_relative_imports() -> None:
    """A guard on the rules: each kind of import the layering refuses is reported."""
    assert _problems("service.metrics", 1, "service.maintenance.table_health", "m.py")
    assert _problems("service.data.files", 1, "service.iceberg.tables", "d.py")
    assert _problems("service.kafka.records", 1, "service.commit.plan", "k.py")
    assert _problems("service.pipeline.write", 1, "service.job", "p.py")
    assert _problems("service.ops.check", 1, ".common", "o.py")
    assert _problems("txnlog.log", 1, "service.config", "t.py")
    assert not _problems("service.pipeline.write", 1, "service.kafka.records", "p.py")
    assert not _problems("service.cli", 1, "service.job", "c.py")
