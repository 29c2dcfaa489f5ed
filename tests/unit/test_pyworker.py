"""What a Python worker sets up per task: what lives is frozen, and every SWEEP_EVERY-th task it is not."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service import pyworker


@pytest.fixture
def fresh_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(pyworker, "_tasks", 0)
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_task_start_freezes_what_lives_so_the_collection_after_it_walks_only_what_it_made(
    fresh_worker: None,
) -> None:
    alive = ["made before the task"]
    pyworker.freeze_survivors()
    assert gc.get_freeze_count() > 1000  # the modules this process imported, at least

    made = ["made by the task"]
    walked = {id(o) for o in gc.get_objects()}  # what a collection walks: frozen objects are not
    assert id(made) in walked
    assert id(alive) not in walked


class _Node:
    me: object


def test_every_sweep_every_th_task_unfreezes_so_garbage_frozen_in_a_cycle_is_freed(
    fresh_worker: None,
) -> None:
    node = _Node()
    node.me = node  # a reference cycle: only the collector frees it
    alive = weakref.ref(node)
    for _ in range(pyworker.SWEEP_EVERY - 1):
        pyworker.freeze_survivors()
    del node
    gc.collect()
    assert alive() is not None  # garbage, but frozen: the collection after a task leaves it

    pyworker.freeze_survivors()  # the SWEEP_EVERY-th task
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None
