"""``Commits.close`` hands back the failure of the commit in flight, so the job can tell a fenced
replica (exit 3) from one that failed for another reason while its last commit was running."""

from __future__ import annotations

import threading
from typing import Any, cast

from service.commit.committer import Committer
from service.commit.overlap import Commits
from txnlog import Fenced


class FencedCommitter:
    """Stands in for the committer: its commit waits for ``release``, then finds the sink fenced."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def commit(self, plan: Any) -> Any:
        self.release.wait(10)
        raise Fenced("orders", 1, 2, "replica-b")


def test_the_fenced_commit_in_flight_is_returned_by_close() -> None:
    committer = FencedCommitter()
    commits = Commits(cast(Committer, committer), overlap=True)
    commits.submit(lambda: cast(Any, "plan"), lambda result, seconds: None)
    assert not commits.failed(), "the commit must still be in flight when close starts"
    committer.release.set()
    failure = commits.close()
    assert isinstance(failure, Fenced)


def test_close_returns_nothing_when_the_commit_in_flight_landed() -> None:
    landed: list[object] = []

    class Landing:
        def commit(self, plan: Any) -> Any:
            return "result"

    commits = Commits(cast(Committer, Landing()), overlap=True)
    commits.submit(lambda: cast(Any, "plan"), lambda result, seconds: landed.append(result))
    assert commits.close() is None
    assert landed == ["result"]
