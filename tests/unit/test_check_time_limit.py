"""`icesink check` gives each server a time limit, so a client that retries for long answers in time."""

from __future__ import annotations

import argparse
import threading
import time

import pytest

from service.cli import _positive_duration
from service.ops.check import Check, NoAnswer, _within


def test_a_check_that_does_not_answer_in_time_fails_with_its_hint() -> None:
    release = threading.Event()

    def hang(config: object) -> str:
        release.wait(30)
        return "late"

    slow = Check("store", hang, hint=lambda config: "; why")
    started = time.monotonic()
    with pytest.raises(NoAnswer, match=r"^no answer within 0\.2 s; why$"):
        _within(0.2, slow, config=None)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    release.set()


def test_a_failing_check_raises_its_own_error() -> None:
    def refuse(config: object) -> str:
        raise PermissionError("403 AuthorizationFailure")

    with pytest.raises(PermissionError, match="403"):
        _within(5, Check("store", refuse), config=None)  # type: ignore[arg-type]


def test_a_time_limit_must_be_more_than_zero() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="0s: must be more than 0"):
        _positive_duration("0s")
    assert _positive_duration("2m").total_seconds() == 120


def test_an_unbounded_check_takes_as_long_as_it_needs() -> None:
    def download(config: object) -> str:
        time.sleep(0.5)
        return "resolved"

    assert _within(0.1, Check("spark jars", download, bounded=False), config=None) == "resolved"  # type: ignore[arg-type]
