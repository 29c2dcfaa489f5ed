"""The service's classes declare every attribute in ``__init__`` (a reader finds a class's state in one
place), stay short, and the job module stays a wiring of steps.

An attribute first assigned in another method (``self.table = ...`` in a start-up step) is state a
reader can't see from the constructor, and that a method may read before it exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = sorted((ROOT / "service").rglob("*.py"))
MAX_CLASS_LINES = 300  # a class longer than this does more than one thing
MAX_JOB_LINES = 250  # the job wires the steps (service.pipeline) and owns none of them


def _self_attributes(node: ast.AST) -> list[tuple[str, int]]:
    """``self.x`` targets of the assignments under ``node``, with their lines."""
    found = []
    for item in ast.walk(node):
        if isinstance(item, ast.Assign):
            targets = item.targets
        elif isinstance(item, ast.AnnAssign | ast.AugAssign):
            targets = [item.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == "self"
                ):
                    found.append((part.attr, item.lineno))
    return found


def _undeclared(path: Path) -> list[str]:
    problems = []
    for cls in [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]:
        methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        fields = {
            n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        declared = fields | {name for m in methods if m.name == "__init__" for name, _ in _self_attributes(m)}
        for method in methods:
            if method.name == "__init__":
                continue
            for name, line in _self_attributes(method):
                if name not in declared:
                    problems.append(
                        f"{path.relative_to(ROOT)}:{line}: {cls.name}.{method.name} creates self.{name}"
                    )
    return problems


def test_every_attribute_of_a_service_class_is_declared_in_init() -> None:
    problems = [p for path in CHECKED for p in _undeclared(path)]
    assert not problems, "declare these in __init__ (a value, or an annotation):\n" + "\n".join(problems)


def test_no_service_class_is_longer_than_300_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {cls.name} has {cls.end_lineno - cls.lineno + 1} lines"
        for path in CHECKED
        for cls in ast.walk(ast.parse(path.read_text()))
        if isinstance(cls, ast.ClassDef)
        and cls.end_lineno
        and cls.end_lineno - cls.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not long, "split these classes:\n" + "\n".join(long)


def test_the_job_module_only_wires_the_steps() -> None:
    lines = len((ROOT / "service" / "job.py").read_text().splitlines())
    assert lines <= MAX_JOB_LINES, f"service/job.py has {lines} lines: move what a step owns into its module"
