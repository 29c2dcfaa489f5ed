"""The order in which pytest-xdist's workers take the tests: the heaviest first, in units as small as
their fixtures allow.

The suite is CPU-bound on two workers, and its sink tests take 1 to 150 s each. xdist's ``loadfile``
hands out whole files, most tests first: a file of five 2-minute tests could start last on one worker
while the other sat idle. Here a unit is one test, or a whole file when the file has a fixture of
module or class scope (its tests share what that fixture built), and units go out by their measured
cost, the longest first, so the short ones fill the end of the run on both workers.

The costs are ``tests/durations.json`` (a test's setup + call + teardown seconds, from a run on two
workers); a test not in it is counted at the median of its folder's. Measure again after a large
change to the suite:

    .venv/bin/pytest -m "not chaos and not bench and not slow" -n 2 --dist loadfile \\
        --record-durations tests/durations.json
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DURATIONS = Path(__file__).with_name("durations.json")
_WIDER_FIXTURE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']""")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@cache
def _shares_fixtures(path: str) -> bool:
    """Whether a test file defines a fixture its tests share (module, class or package scope)."""
    try:
        return _WIDER_FIXTURE.search((REPO / path).read_text()) is not None
    except OSError:
        return True  # not a file we can read: keep its tests together, as loadfile would


def unit_of(nodeid: str) -> str:
    """The unit a test is handed out in: its file when the file's tests share a fixture, else itself."""
    path = _file(nodeid)
    return path if _shares_fixtures(path) else nodeid


@cache
def _measured() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()}


def costs(nodeids: Iterable[str]) -> dict[str, float]:
    """Each test's expected seconds: measured, or the median of the measured tests of its folder."""
    measured = _measured()
    by_folder: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in measured.items():
        by_folder[str(Path(_file(nodeid)).parent)].append(seconds)
    overall = statistics.median(measured.values()) if measured else 1.0
    out = {}
    for nodeid in nodeids:
        folder = by_folder.get(str(Path(_file(nodeid)).parent))
        out[nodeid] = measured.get(nodeid, statistics.median(folder) if folder else overall)
    return out


def _check_units(items: list[pytest.Item]) -> None:
    """Fail the run when a test uses a module/class/package fixture its file does not define (one from a
    conftest or imported): :func:`unit_of`, reading the file, would split tests that share it."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        wide = sorted(n for n, d in defs.items() if d and d[-1].scope in ("module", "class", "package"))
        if wide and unit_of(item.nodeid) != _file(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} uses the {wide[0]!r} fixture of scope {defs[wide[0]][-1].scope} from "
                "outside its file: tests/scheduling.py would hand its file's tests out one by one"
            )


def heaviest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: units by their total cost, longest first; a unit's tests stay in their
    file's order. Every worker sorts its collection the same way (xdist checks they agree)."""
    _check_units(items)
    cost = costs(item.nodeid for item in items)
    unit_cost: dict[str, float] = defaultdict(float)
    for item in items:
        unit_cost[unit_of(item.nodeid)] += cost[item.nodeid]
    position = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(
        key=lambda item: (-unit_cost[unit_of(item.nodeid)], unit_of(item.nodeid), position[item.nodeid])
    )


def make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduler with :func:`unit_of` as the scope, taking units in collection order
    (which :func:`heaviest_first` made), not xdist's largest-file-first reordering."""
    from xdist.scheduler import LoadScopeScheduling

    class CostOrderedScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return CostOrderedScheduling(config, log)


class DurationRecorder:
    """``--record-durations PATH``: each test's setup + call + teardown seconds, merged into the JSON at
    PATH at the end of the run (on xdist's controller, which sees every worker's reports); the tests
    the run did not run keep their figures. The test that first asks a worker for a session fixture (its
    reader Spark, the sink host) is charged that fixture's start-up too."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if getattr(session.config, "workerinput", None) is not None:
            return  # a worker: the controller writes the file
        try:
            merged = {str(k): float(v) for k, v in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError):
            merged = {}
        merged.update({k: round(v, 1) for k, v in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
