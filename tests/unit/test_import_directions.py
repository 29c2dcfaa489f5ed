"""Imports point one way: a layer may import the layers below it, never those above or beside it.

From the bottom: ``txnlog`` (knows nothing of the service); ``service.model`` (columns, data-file
JSON, offsets: shared by everything); the data plane ``service.data``, the catalog side
``service.iceberg`` and Kafka's side ``service.kafka``, none of which imports another; the commit protocol ``service.commit``; the
pipeline; the job, which only the CLI imports. Benchmarks and scripts use the service and the
reference readers (``readers``), never the tests. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (importer prefix, imported prefix, why it is refused)
RULES = [
    ("service.data", "service.iceberg", "the data plane never imports the catalog side"),
    ("service.iceberg", "service.data", "the catalog side never imports the data plane"),
    ("service.data", "service.commit", "the data plane never imports the commit protocol"),
    ("service.iceberg", "service.commit", "the catalog side never imports the commit protocol"),
    ("service.data", "service.pipeline", "the data plane is below the pipeline"),
    ("service.iceberg", "service.pipeline", "the catalog side is below the pipeline"),
    ("service.commit", "service.pipeline", "the commit protocol is below the pipeline"),
    ("service.kafka", "service.data", "Kafka's side never imports the data plane"),
    ("service.kafka", "service.iceberg", "Kafka's side never imports the catalog side"),
    ("service.kafka", "service.pipeline", "Kafka's side is below the pipeline"),
    ("service.data", "service.kafka", "the data plane never imports Kafka's side"),
    ("service.iceberg", "service.kafka", "the catalog side never imports Kafka's side"),
    ("service.config", "service.data", "configuration is below the data plane"),
    ("service.config", "service.iceberg", "configuration is below the catalog side"),
    ("service.data", "service.maintenance", "maintenance is above the data plane"),
    ("service.commit", "service.maintenance", "maintenance is above the commit protocol"),
    ("service.pipeline", "service.maintenance", "the sink's pipeline knows nothing of maintenance"),
    ("service.maintenance", "service.pipeline", "maintenance works on tables, not on the sink's pipeline"),
    ("txnlog", "service", "the txnlog knows nothing of the service"),
    ("bench", "tests", "benchmarks use the service and `readers`, never the tests"),
    ("scripts", "tests", "scripts use the service and `readers`, never the tests"),
    ("readers", "tests", "the reference readers stand alone"),
]
# The job is imported only by the CLI (and the profiler, which runs it in-process).
JOB_IMPORTERS = ("service.cli", "bench.profile")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from service import job`
                yield node.lineno, f"{node.module}.{alias.name}"


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _files() -> list[Path]:
    files = []
    for top in ("service", "txnlog", "bench", "scripts", "readers"):
        files += sorted((ROOT / top).rglob("*.py"))
    return files


def test_imports_point_one_way() -> None:
    problems = []
    for path in _files():
        importer = _module(path)
        for line, imported in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}: {importer} imports {imported}"
            for low, high, why in RULES:
                if _within(importer, low) and _within(imported, high):
                    problems.append(f"{where} ({why})")
            if (
                _within(importer, "service.model")
                and _within(imported, "service")
                and not _within(imported, "service.model")
            ):
                problems.append(f"{where} (service.model is a leaf)")
            job_importer = any(_within(importer, allowed) for allowed in (*JOB_IMPORTERS, "service.job"))
            if _within(imported, "service.job") and not job_importer:
                problems.append(f"{where} (only the CLI runs the job)")
    assert not problems, "imports against the layering:\n" + "\n".join(sorted(set(problems)))


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    """A guard on the checker itself: function-level imports and `from x import y` are found."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from service.iceberg import tables\n    import service.data.files\n")
    found = [name for _, name in _imports(source)]
    assert "service.iceberg.tables" in found and "service.data.files" in found
