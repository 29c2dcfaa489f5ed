"""The chaos suite's fixtures: the sink fixtures of tests/sink, plus figures printed at the end."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import FIGURES, write_report
from tests.sink import host
from tests.sink.conftest import REPO, make_sink

__all__ = ["make_sink"]

REPORT = Path(os.environ.get("ICESINK_CHAOS_REPORT") or REPO / ".cache" / "chaos" / "figures.json")


@pytest.fixture(autouse=True)
def _sinks_are_processes() -> Iterator[None]:
    """Sinks are killed and servers restarted at random moments here: every sink is a process of its
    own, none runs in the warm session of tests/sink/host.py."""
    with host.disabled():
        yield


@pytest.fixture(autouse=True)
def _timed(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    FIGURES.runtimes[request.node.name] = time.monotonic() - started


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES.runtimes or FIGURES.sink_starts == 0:
        return
    terminalreporter.section("icesink chaos figures")
    for line in FIGURES.lines():
        terminalreporter.write_line(line)
    write_report(REPORT)
    terminalreporter.write_line(f"(also written to {REPORT})")
