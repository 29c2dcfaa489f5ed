"""Fail points: what their specification accepts, and a wait that holds until its file appears."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from service import failpoints


def test_a_wait_point_holds_its_caller_until_the_file_appears(tmp_path: Path) -> None:
    release = tmp_path / "release"
    failpoints.configure(f"during_catalog_commit=wait:{release}@2")
    try:
        failpoints.failpoint("during_catalog_commit")  # the first time: not armed for it
        timer = threading.Timer(0.5, release.touch)
        started = time.monotonic()
        timer.start()
        failpoints.failpoint("during_catalog_commit")
        held = time.monotonic() - started
        timer.join()
    finally:
        failpoints.configure("")
    assert release.exists() and held >= 0.5, held


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("during_catalog_commit=wait", "needs the file to wait for"),
        ("during_catalog_commit=delay:soon", "needs seconds"),
        ("during_catalog_commit=sleep:3", "unknown action 'sleep'"),
        ("during_commit=kill", "unknown fail point 'during_commit'"),
        ("during_catalog_commit=wait:/tmp/a@b/release", "is not a count"),
    ],
)
def test_a_bad_specification_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        failpoints.parse(spec)
